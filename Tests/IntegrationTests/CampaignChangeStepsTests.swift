import Foundation
import MarqueeCore
import PostgresClient
import Testing

@testable import MarqueeStore

/// A campaign-wide change writes the campaign's open instances a chunk at a time (CampaignRunner.change): each step
/// commits its instances and pushes and where it got to, so that pushes leave while the next chunk is written.
extension CampaignTests {
    @Test(
        "a campaign-wide change writes a chunk a step, in instance order; a single update between steps is kept; a cancel keeps it; the next change waits"
    )
    func changeInSteps() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let (id, instances) = try await Self.campaignOfEight(t)
        // One of them reports its activity token (the others stay pending: no token, no push).
        let device = try await pool.query(
            """
            SELECT d.token FROM instances i JOIN devices d ON d.tenant_id = i.tenant_id AND d.person_id = i.person_id
            WHERE i.tenant_id = \(tenant) AND i.id = \(instances[4])
            """)[0].decode(String.self, "token")
        let token = try await t.api.call(
            "PUT", "/v1/live_notifications/\(instances[4])/tokens/\(device)", key: t.tenant.sdk,
            json: ["token": Fake.hex()])
        #expect(token.status == 200, "\(token.text)")
        // Due at the campaign's start_at, an hour ahead: no worker runs it; the test runs its steps.
        let posted = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(posted.status == 202, "\(posted.text)")
        let (scheduleID, change) = try await Self.changeSchedule(pool, tenant, id, .update)
        func step(_ progress: JSONValue?) async throws -> (result: JSONValue, representative: String?, done: Bool) {
            try await Self.changeStep(pool, tenant, id, change, scheduleID, progress: progress, chunk: 3)
        }
        func states() async throws -> [(home: Int, away: Int, version: Int)] {
            try await pool.query(
                """
                SELECT (content_state ->> 'home')::int AS home, (content_state ->> 'away')::int AS away, version
                FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id) ORDER BY id
                """
            ).map {
                (try $0.decode(Int.self, "home"), try $0.decode(Int.self, "away"), try $0.decode(Int.self, "version"))
            }
        }

        let versions = try await states().map(\.version)
        let first = try await step(nil)
        #expect(!first.done && first.result["phase"]?.stringValue == "changing", "\(first.result)")
        #expect(first.result["after"]?.stringValue == instances[2])
        #expect(try await states().map(\.home) == [1, 1, 1, 0, 0, 0, 0, 0], "the first chunk is committed alone")

        // Between steps, a single update of an instance the change has not reached: the change applies on top of it.
        let single = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instances[4], "content_state_patch": ["away": 5]])
        #expect(single.status == 200, "\(single.text)")
        // A cancel now leaves the change, which has begun, to finish.
        let cancelled = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app)
        #expect(cancelled.status == 200, "\(cancelled.text)")
        #expect(try cancelled.json()["schedules_cancelled"] as? Int == 0, "\(cancelled.text)")
        // The next change of the campaign waits for this one: its write is busy while this one is pending.
        let next = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 2]])
        #expect(next.status == 202, "\(next.text)")
        let nextRow = try await pool.query(
            """
            SELECT id, change FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND operation = 'update' AND id <> \(scheduleID)
            """)[0]
        let nextChange = CampaignChange(operation: .update, json: try nextRow.decode(JSONValue.self, "change"))
        await #expect(throws: CampaignRunner.Busy.self) {
            try await pool.transaction { c in
                try c.enterSystem()
                try c.enterTenant(tenant)
                _ = try CampaignRunner.change(
                    c, tenant, id, nextChange, scope: .broadcastFirst, schedule: try nextRow.decode(UUID.self, "id"))
            }
        }

        let second = try await step(first.result)
        #expect(!second.done && second.result["after"]?.stringValue == instances[5], "\(second.result)")
        #expect(try await states().map(\.home) == [1, 1, 1, 1, 1, 1, 0, 0])
        let last = try await step(second.result)
        #expect(last.done, "\(last.result)")
        // The counts of all three steps (the single update's push may have been sent or superseded by now).
        #expect(last.result["instances"]?.intValue == 8, "\(last.result)")
        #expect(last.result["deliveries"] == .object(["apns": .int(1), "fcm": .int(0)]), "\(last.result)")
        #expect(last.result["broadcasts"]?.intValue == 0 && last.result["phase"] == nil, "\(last.result)")
        let final = try await states()
        #expect(final.map(\.home) == Array(repeating: 1, count: 8))
        #expect(final.map(\.away) == [0, 0, 0, 0, 5, 0, 0, 0], "the single update between steps was kept")
        #expect(
            final.map(\.version) == versions.enumerated().map { $0.offset == 4 ? $0.element + 2 : $0.element + 1 },
            "each instance written once by the change")
    }

    @Test("a campaign-wide change's first steps grow from the floor, its last chunk is written in halves down to it")
    func changeEndsInHalves() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let (id, instances) = try await Self.campaignOfEight(t)
        let posted = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(posted.status == 202, "\(posted.text)")
        let (scheduleID, change) = try await Self.changeSchedule(pool, tenant, id, .update)
        // Chunks of 4 and a floor of 1: 1, 1 and 2 (each at most what the steps before covered), then the last 4 as
        // 2, 1 and 1 (no half of a single one).
        var progress: JSONValue?
        var reached: [String] = []
        var steps = 0
        while true {
            let step = try await Self.changeStep(
                pool, tenant, id, change, scheduleID, progress: progress, chunk: 4, tailFloor: 1)
            steps += 1
            if step.done {
                #expect(step.result["instances"]?.intValue == 8, "\(step.result)")
                break
            }
            reached.append(step.result["after"]?.stringValue ?? "")
            progress = step.result
            try #require(steps < 10)
        }
        #expect(reached == [instances[0], instances[1], instances[3], instances[5], instances[6]])
        #expect(steps == 6)
        let homes = try await pool.query(
            "SELECT (content_state ->> 'home')::int AS home FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id)"
        ).map { try $0.decode(Int.self, "home") }
        #expect(homes == Array(repeating: 1, count: 8))
    }

    /// A campaign started here for eight people, and its instances' IDs in order.
    static func campaignOfEight(_ t: Tenant) async throws -> (id: String, instances: [String]) {
        let id = try await campaignStartedHere(t, people: 8)
        let instances = try await t.fixture.pool.query(
            "SELECT id FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id) ORDER BY id"
        ).map { try $0.decode(String.self, "id") }
        try #require(instances.count == 8)
        return (id, instances)
    }

    @Test("a campaign-wide end in steps: the campaign is marked ended by its last step only; a runner runs every step")
    func endInSteps() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let id = try await Self.campaignStartedHere(t, people: 7)
        let end = try await t.api.call("POST", "/v1/campaigns/\(id)/end", key: t.tenant.app, json: [:])
        #expect(end.status == 202, "\(end.text)")
        let endID = try await Self.scheduleIDs(pool, tenant, id, "end")[0]
        // Due now, run here: a worker of the fixture may run a step too; either way each step runs once.
        try await pool.execute(
            "UPDATE campaign_schedules SET due_at = now() WHERE tenant_id = \(tenant) AND id = \(endID)")
        func endedAt() async throws -> Date? {
            try await pool.query("SELECT ended_at FROM campaigns WHERE tenant_id = \(tenant) AND id = \(id)")[0]
                .decode(Date?.self, "ended_at")
        }
        let runner = CampaignRunner(database: TenantDatabase(pool: pool), chunk: 3)
        var states: [String] = []
        try await eventually("the end ran to its last step") {
            if let run = try await runner.run(endID) { states.append(run.state) }
            if states.last == "changing" {
                #expect(try await endedAt() == nil, "the campaign was marked ended before its last step")
            }
            return try await pool.query(
                "SELECT state FROM campaign_schedules WHERE tenant_id = \(tenant) AND id = \(endID)")[0].decode(
                    String.self, "state") == "done"
        }
        #expect(try await endedAt() != nil)
        let open = try await pool.query(
            """
            SELECT count(*)::int AS n FROM instances
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND state IN ('pending', 'active')
            """)[0].decode(Int.self, "n")
        #expect(open == 0)
        let result = try await t.campaign(id).array("schedules").last?["result"] as? [String: Any]
        #expect(result?["instances"] as? Int == 7, "\(String(describing: result))")
    }
}
