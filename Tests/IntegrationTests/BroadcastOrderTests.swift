import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// The first half of a channel-backed campaign change (its broadcast, on one instance) runs while earlier changes'
/// bulk writes may still be pending: the instance it writes must already have every earlier change.
extension BroadcastInstanceTests {
    @Test("a change's broadcast waits for the earlier change's, and is written on that change's own instance")
    func broadcastsInOrder() async throws {
        let (t, pool, campaign) = try await Self.channelCampaignStartedHere(fans: 3)
        defer { pool.close() }
        let tenant = t.tenant.uuid
        for home in [1, 2] {
            let r = try await t.api.call(
                "POST", "/v1/campaigns/\(campaign)/update", key: t.tenant.app,
                json: ["content_state_patch": ["home": home]])
            #expect(r.status == 202, "\(r.text)")
        }
        let changes = try await pool.query(
            """
            SELECT id, change FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(campaign) AND operation = 'update' ORDER BY id
            """
        ).map { (try $0.decode(UUID.self, "id"), try $0.decode(JSONValue.self, "change")) }
        try #require(changes.count == 2)
        /// The first half of change `n`, as a worker runs it: its broadcast and the instance that carried it.
        func firstHalf(_ n: Int) async throws -> String? {
            try await pool.transaction { c in
                try c.enterSystem()
                try c.enterTenant(tenant)
                let (id, json) = changes[n]
                let first = try CampaignRunner.change(
                    c, tenant, campaign, CampaignChange(operation: .update, json: json), scope: .broadcastFirst,
                    schedule: id)
                let result: JSONValue = .object([
                    "phase": .string("broadcast"),
                    "representative": first.representative.map(JSONValue.string) ?? .null,
                ])
                try c.execute(
                    "UPDATE campaign_schedules SET result = \(result) WHERE tenant_id = \(tenant) AND id = \(id)")
                return first.representative
            }
        }

        // The newer change's broadcast waits while the older one's has not gone.
        await #expect(throws: CampaignRunner.Busy.self) { try await firstHalf(1) }
        let representative = try #require(try await firstHalf(0))
        // The older change's rest has not run: every instance but `representative` lacks it. While that instance is
        // held (by another run), the newer broadcast waits rather than take another instance.
        let release = DispatchSemaphore(value: 0)
        let holding = Mutex(false)
        let holder = Task {
            try await pool.transaction { c in
                try c.execute(
                    """
                    SELECT 1 FROM instances WHERE tenant_id = \(tenant) AND id = \(representative) FOR UPDATE
                    """)
                holding.withLock { $0 = true }
                release.wait()
            }
        }
        defer { release.signal() }
        try await eventually("the instance is held") { holding.withLock { $0 } }
        await #expect(throws: CampaignRunner.Busy.self) { try await firstHalf(1) }
        release.signal()
        try await holder.value
        #expect(try await firstHalf(1) == representative)
        let broadcasts = try await pool.query(
            """
            SELECT instance_id, content_state ->> 'home' AS home FROM delivery_queue
            WHERE tenant_id = \(tenant) AND token_kind = 'channel' ORDER BY id
            """)
        // The older broadcast was still queued: the newer one replaced it (latest wins), on the same instance.
        #expect(try broadcasts.map { try $0.decode(String.self, "instance_id") } == [representative])
        #expect(try broadcasts.map { try $0.decode(String.self, "home") } == ["2"])
    }

    /// A channel campaign for `fans` new people with an iPhone on iOS 18.2 each, started here, with a pool on its
    /// database. Its start and changes are due an hour ahead: no worker runs them; a test runs their parts.
    static func channelCampaignStartedHere(fans count: Int) async throws -> (Tenant, PostgresPool, String) {
        let t = try await ChannelTests.tenant()
        let channel = try #require(try await t.create("none").json().string("channel_id"))
        let fans = (0..<count).map { _ in Fake.id("fan") }
        for fan in fans { _ = try await Self.iphone(t, person: fan, osVersion: "18.2") }
        let pool = PostgresPool(
            try PostgresConfiguration(url: t.fixture.databaseURL),
            options: .init(maxConnections: 3, acquireTimeout: .seconds(60)))
        let campaign = Fake.id("final")
        let created = try await Self.matchCampaign(
            t, campaign, channel: channel, fans: fans, startAt: Date().addingTimeInterval(3600))
        guard created.status == 202 else { throw TestFailure("campaign: \(created.text)") }
        try await CampaignTests.startHere(pool, t.tenant.uuid, campaign)
        return (t, pool, campaign)
    }
}
