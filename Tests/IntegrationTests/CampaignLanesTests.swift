import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// A start of more than one chunk is split into lanes (CampaignRunner, migration 0066) that workers write at the same
/// time, each a step at a time; the step that finishes the last lane finishes the start.
extension CampaignTests {
    @Test(
        "a start in lanes: a lane is written while another worker holds one; the lane finishing last finishes the start, once"
    )
    func startInLanes() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        // No worker runs in this suite unless a test starts one: the runs below are the only ones.
        let id = try await Self.campaignAnHourAhead(t, people: 8)
        let (scheduleID, plan) = try await Self.startSchedule(pool, tenant, id)
        try await pool.execute(
            "UPDATE campaign_schedules SET due_at = now() WHERE tenant_id = \(tenant) AND id = \(scheduleID)")
        let runner = CampaignRunner(database: TenantDatabase(pool: pool), chunk: 3, lanes: 2)
        func count(_ sql: PostgresQuery) async throws -> Int { try await pool.query(sql)[0].decode(Int.self, "n") }
        func instances() async throws -> Int {
            try await count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id)")
        }
        func lanes() async throws -> [Int] {
            try await pool.query(
                """
                SELECT written FROM campaign_start_lanes
                WHERE tenant_id = \(tenant) AND schedule_id = \(scheduleID) ORDER BY lane
                """
            ).map { try $0.decode(Int.self, "written") }
        }

        // The first step resolves the eight members, splits them into two lanes of four and writes three of the
        // first lane.
        let first = try #require(try await runner.run(scheduleID))
        #expect(first.state == "starting", "\(first.result)")
        #expect(first.result["lanes"]?.intValue == 2 && first.result["members"]?.intValue == 8, "\(first.result)")
        #expect(try await instances() == 3)
        #expect(try await lanes() == [3, 0])

        // A worker writes the first lane's last member and holds its transaction open.
        let holding = Mutex<(lane: Int, done: Bool)?>(nil)
        let release = DispatchSemaphore(value: 0)
        let held = Task {
            try await pool.transaction { c in
                try c.enterSystem()
                let row = try #require(try CampaignRunner.claimLane(c, scheduleID, skipping: []))
                let lane = try CampaignRunner.StartLane(row)
                try c.enterTenant(tenant)
                let step = try CampaignRunner.startLane(
                    c, tenant, id, scheduleID, plan, lane, lifetime: Lifetime.maximum, chunk: 3)
                holding.withLock { $0 = (lane.lane, step.done) }
                release.wait()
            }
        }
        defer { release.signal() }
        let timedOut = Mutex(false)
        let deadline = Task {
            // Should a run below wait for the held lane after all, the hold ends here, and the test fails below.
            try await Task.sleep(for: .seconds(30))
            timedOut.withLock { $0 = true }
            release.signal()
        }
        defer { deadline.cancel() }
        try await eventually("the first lane's step holds its lane") { holding.withLock { $0 != nil } }
        #expect(holding.withLock { $0?.lane } == 0)
        #expect(holding.withLock { $0?.done } == false, "a lane finished the start while another had members left")

        // Meanwhile another worker writes the second lane: its claim skips the held lane, and the campaign's lock is
        // shared between lanes.
        let second = try #require(try await runner.run(scheduleID))
        #expect(second.state == "starting" && second.result["lane"]?.intValue == 1, "\(second.result)")
        #expect(!timedOut.withLock { $0 }, "the second lane's step waited for the held one")
        #expect(try await lanes() == [3, 3], "the held step is not committed; the second lane's is")

        // The second lane's last step finishes while the first lane's (done, not committed) is still held: it waits
        // for that commit, then sees every lane done and finishes the start.
        let lastRan = Mutex(false)
        let last = Task {
            defer { lastRan.withLock { $0 = true } }
            return try await runner.run(scheduleID)
        }
        // Released once that step waits for a lock (or, were it not to wait, once it returned).
        try await eventually("the second lane's last step waits for the held one") {
            if lastRan.withLock({ $0 }) { return true }
            return try await count(
                """
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'
                """) > 0
        }
        release.signal()
        try await held.value
        let finished = try #require(try await last.value)
        #expect(finished.state == "done", "the start was left pending with every lane done: \(finished.result)")
        #expect(
            finished.result
                == .object([
                    "audience": .int(8), "instances": .int(8),
                    "deliveries": .object(["apns": .int(8), "fcm": .int(0)]), "skipped": .object([:]),
                ]), "\(finished.result)")
        #expect(try await runner.run(scheduleID) == nil, "a finished start ran again")

        // Each member once: eight instances, eight pushes queued, no lane left.
        #expect(try await instances() == 8)
        #expect(
            try await count(
                """
                SELECT count(*)::int AS n FROM delivery_queue d JOIN instances i
                  ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
                WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(id)
                """) == 8)
        #expect(try await lanes() == [])
        let campaign = try await t.campaign(id)
        #expect(campaign.string("state") == "active" && campaign["audience_size"] as? Int == 8, "\(campaign)")
        let schedule = try #require(campaign.array("schedules").first)
        #expect(schedule.string("state") == "done", "\(schedule)")
        #expect((schedule["result"] as? [String: Any])?["instances"] as? Int == 8, "\(schedule)")
    }

    @Test("a paced start, or one of a single chunk, is not split into lanes")
    func startsWithoutLanes() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let runner = CampaignRunner(database: TenantDatabase(pool: pool), chunk: 3, lanes: 4)
        for (people, rate) in [(8, 10 as Int?), (3, nil)] {
            let id = try await Self.campaignAnHourAhead(t, people: people)
            try await pool.execute(
                """
                UPDATE campaigns SET rate_limit_per_second = \(rate) WHERE tenant_id = \(tenant) AND id = \(id)
                """)
            let (scheduleID, _) = try await Self.startSchedule(pool, tenant, id)
            try await pool.execute(
                "UPDATE campaign_schedules SET due_at = now() WHERE tenant_id = \(tenant) AND id = \(scheduleID)")
            let first = try #require(try await runner.run(scheduleID))
            #expect(first.result["lanes"] == nil, "\(first.result)")
            var state = first.state
            for _ in 0..<10 where state != "done" { state = try #require(try await runner.run(scheduleID)).state }
            #expect(state == "done")
            let lanes = try await pool.query(
                "SELECT count(*)::int AS n FROM campaign_start_lanes WHERE tenant_id = \(tenant)")[0].decode(
                    Int.self, "n")
            #expect(lanes == 0)
        }
    }
}
