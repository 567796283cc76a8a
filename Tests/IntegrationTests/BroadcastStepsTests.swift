import Foundation
import MarqueeCore
import PostgresClient
import Testing

@testable import MarqueeStore

/// A channel-backed campaign change in steps: its first half (one instance and the broadcast), then the rest of the
/// instances a chunk at a time, the first half's instance left out.
extension BroadcastInstanceTests {
    @Test("a channel change's rest runs in steps: every instance written once, one broadcast, the counts of all steps")
    func broadcastRestInSteps() async throws {
        let t = try await ChannelTests.tenant()
        let channel = try #require(try await t.create("none").json().string("channel_id"))
        let fans = (0..<5).map { _ in Fake.id("fan") }
        for fan in fans { _ = try await Self.iphone(t, person: fan, osVersion: "18.2") }
        let pool = PostgresPool(
            try PostgresConfiguration(url: t.fixture.databaseURL),
            options: .init(maxConnections: 2, acquireTimeout: .seconds(60)))
        defer { pool.close() }
        let tenant = t.tenant.uuid
        let campaign = Fake.id("final")
        // Its start and change are due an hour ahead: no worker runs them; the test runs their parts.
        let created = try await Self.matchCampaign(
            t, campaign, channel: channel, fans: fans, startAt: Date().addingTimeInterval(3600))
        #expect(created.status == 202, "\(created.text)")
        try await CampaignTests.startHere(pool, tenant, campaign)
        let r = try await t.api.call(
            "POST", "/v1/campaigns/\(campaign)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(r.status == 202, "\(r.text)")
        let scheduleID = try await CampaignTests.scheduleIDs(pool, tenant, campaign, "update")[0]
        let change = CampaignChange(
            operation: .update,
            json: try await pool.query(
                "SELECT change FROM campaign_schedules WHERE tenant_id = \(tenant) AND id = \(scheduleID)")[0].decode(
                    JSONValue.self, "change"))
        func versions() async throws -> [String: Int] {
            var out: [String: Int] = [:]
            for row in try await pool.query(
                "SELECT id, version FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(campaign)")
            {
                out[try row.decode(String.self, "id")] = try row.decode(Int.self, "version")
            }
            return out
        }
        let before = try await versions()
        try #require(before.count == 5)

        /// One run, as the runner does it: the first half, or the next step of the rest.
        func run(_ progress: JSONValue?) async throws -> (result: JSONValue, representative: String?, done: Bool) {
            try await pool.transaction { c in
                try c.enterSystem()
                try c.enterTenant(tenant)
                let step = try CampaignRunner.change(
                    c, tenant, campaign, change,
                    scope: progress == nil ? .broadcastFirst : .rest(progress?["representative"]?.stringValue),
                    schedule: scheduleID, progress: progress, chunk: 2)
                return (step.result, step.representative, step.done)
            }
        }
        let first = try await run(nil)
        let representative = try #require(first.representative, "\(first.result)")
        #expect(first.result["broadcasts"]?.intValue == 1 && first.result["instances"]?.intValue == 1)
        var progress: JSONValue = .object([
            "phase": .string("broadcast"), "representative": .string(representative), "broadcast": first.result,
        ])
        var steps = 0
        while true {
            let step = try await run(progress)
            steps += 1
            if step.done {
                progress = step.result
                break
            }
            #expect(step.result["representative"]?.stringValue == representative, "\(step.result)")
            progress = step.result
            try #require(steps < 5, "the rest did not end: \(step.result)")
        }
        #expect(steps == 2, "four instances in chunks of two")
        #expect(progress["instances"]?.intValue == 5 && progress["broadcasts"]?.intValue == 1, "\(progress)")
        let after = try await versions()
        #expect(after == before.mapValues { $0 + 1 }, "every instance written once, the first half's too")
        let broadcasts = try await pool.query(
            "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(tenant) AND token_kind = 'channel'")[0]
            .decode(Int.self, "n")
        let sent = try await pool.query(
            """
            SELECT count(*)::int AS n FROM delivery_history
            WHERE tenant_id = \(tenant) AND token_kind = 'channel' AND operation = 'update'
            """)[0].decode(Int.self, "n")
        #expect(broadcasts + sent == 1, "one broadcast for the change")
    }
}
