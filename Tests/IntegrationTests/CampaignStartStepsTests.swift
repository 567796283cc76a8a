import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// A start writes its audience a chunk at a time (CampaignRunner): each step commits its instances and deliveries
/// and where it got to.
extension CampaignTests {
    @Test(
        "a start writes a chunk a step, committed and paced across steps; a cancel keeps a started start; changes wait")
    func startInSteps() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        var lines: [[String: Any]] = []
        for _ in 0..<8 { lines.append(Self.iosPerson(Fake.id("s"), type: t.type, attributes: ["team": "S"]).0) }
        try await t.importPeople(lines)
        let id = Fake.id("steps")
        // An hour ahead: no worker runs it; the test runs its steps.
        let created = try await t.create([
            "campaign_id": id, "audience": ["people": lines.compactMap { $0.string("id") }],
            "rate_limit_per_second": 10, "start_at": Date().timeIntervalSince1970 + 3600,
        ])
        #expect(created.status == 202, "\(created.text)")
        let (scheduleID, plan) = try await Self.startSchedule(pool, tenant, id)
        func step(_ progress: JSONValue?) async throws -> (result: JSONValue, done: Bool) {
            try await Self.startStep(pool, tenant, id, scheduleID, plan, progress: progress, chunk: 3)
        }
        func written() async throws -> (instances: Int, queued: Int) {
            let row = try await pool.query(
                """
                SELECT (SELECT count(*) FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id))::int AS i,
                       (SELECT count(*) FROM delivery_queue d JOIN instances i
                          ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
                        WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(id))::int AS q
                """)[0]
            return (try row.decode(Int.self, "i"), try row.decode(Int.self, "q"))
        }

        let first = try await step(nil)
        #expect(!first.done && first.result["phase"]?.stringValue == "starting", "\(first.result)")
        #expect(try await written() == (3, 3), "the first chunk is committed, its pushes queued")
        #expect(try await t.campaign(id).string("state") == "scheduled", "stored state until the last step")

        // Mid-start, a cancel keeps the start (the campaign has begun) and cancels nothing of it.
        let cancelled = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app)
        #expect(cancelled.status == 200, "\(cancelled.text)")
        #expect(try cancelled.json()["campaign_cancelled"] as? Bool == false)
        #expect(try cancelled.json()["schedules_cancelled"] as? Int == 0)

        // A campaign-wide change waits for the start: the runner does not take it while the start is pending. (Due
        // now: a change is due at the campaign's start_at at the earliest.)
        try await pool.execute("UPDATE campaigns SET start_at = now() WHERE tenant_id = \(tenant) AND id = \(id)")
        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(update.status == 202, "\(update.text)")
        let updateID = try await Self.scheduleIDs(pool, tenant, id, "update")[0]
        let runner = CampaignRunner(database: TenantDatabase(pool: pool))
        #expect(try await runner.run(updateID) == nil, "the update ran before the start finished")

        let second = try await step(first.result)
        #expect(!second.done)
        #expect(try await written() == (6, 6))
        let last = try await step(second.result)
        #expect(last.done)
        #expect(try await written() == (8, 8))
        #expect(
            last.result
                == .object([
                    "audience": .int(8), "instances": .int(8),
                    "deliveries": .object(["apns": .int(8), "fcm": .int(0)]), "skipped": .object([:]),
                ]), "\(last.result)")
        let campaign = try await t.campaign(id)
        #expect(campaign.string("state") == "active" && campaign["audience_size"] as? Int == 8, "\(campaign)")

        // Paced at 10 a second over all three steps: eight distinct due times, 100 ms apart from the first.
        let due = try await pool.query(
            """
            SELECT count(DISTINCT d.next_attempt_at)::int AS n,
                   extract(epoch FROM max(d.next_attempt_at) - min(d.next_attempt_at))::float8 AS spread
            FROM delivery_queue d JOIN instances i ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
            WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(id)
            """)[0]
        #expect(try due.decode(Int.self, "n") == 8)
        #expect(abs(try due.decode(Double.self, "spread") - 0.7) < 0.001)
        try await pool.execute(
            "UPDATE campaign_schedules SET state = 'done', executed_at = now() WHERE tenant_id = \(tenant) AND id = \(scheduleID)"
        )
    }

    @Test(
        "a start's first steps grow from a floor, its last chunk is written in halves down to it; whole chunks between")
    func stepSizes() {
        // 100,000 in chunks of 10,000: 1,000, 1,000, 2,000, 4,000, 8,000 (each at most what the steps before
        // wrote), eight whole chunks, then the last 4,000 in halves: 2,000, 1,000 and 1,000.
        var left = 100_000
        var steps: [Int] = []
        while left > 0 {
            let size = min(left, CampaignRunner.stepSize(remaining: left, written: 100_000 - left, chunk: 10_000))
            steps.append(size)
            left -= size
        }
        #expect(
            steps == [1_000, 1_000, 2_000, 4_000, 8_000] + Array(repeating: 10_000, count: 8) + [2_000, 1_000, 1_000])
        #expect(CampaignRunner.stepSize(remaining: 25_000, written: 50_000, chunk: 10_000) == 10_000)
        #expect(CampaignRunner.stepSize(remaining: 25_000, written: 0, chunk: 10_000) == 1_000)
        #expect(CampaignRunner.stepSize(remaining: 25_000, written: 3_000, chunk: 10_000) == 3_000)
        #expect(
            CampaignRunner.stepSize(remaining: 2 * CampaignRunner.tailFloor, written: 50_000, chunk: 10_000) == 1_000)
        #expect(CampaignRunner.stepSize(remaining: 1_998, written: 50_000, chunk: 10_000) == 1_998)
        // An audience within the floor is one step.
        #expect(CampaignRunner.stepSize(remaining: 999, written: 0, chunk: 10_000) == 999)
        // Small chunks are neither grown nor split; nor is anything but the first steps when the audience's size is
        // not known.
        #expect(CampaignRunner.stepSize(remaining: 2, written: 0, chunk: 3) == 2)
        #expect(CampaignRunner.stepSize(remaining: nil, written: 0, chunk: 3) == 3)
        #expect(CampaignRunner.stepSize(remaining: nil, written: 50_000, chunk: 10_000) == 10_000)
        #expect(CampaignRunner.stepSize(remaining: nil, written: 0, chunk: 10_000) == 1_000)
    }

    @Test("a start whose audience fills its last step ends in that step; one recorded without its size still ends")
    func startEndsInItsLastFullStep() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        for known in [true, false] {
            let id = try await Self.campaignAnHourAhead(t, people: 6)
            let (scheduleID, plan) = try await Self.startSchedule(pool, tenant, id)
            let first = try await Self.startStep(pool, tenant, id, scheduleID, plan, progress: nil, chunk: 3)
            #expect(!first.done && first.result["members"]?.intValue == 6, "\(first.result)")
            // A start recorded partway by a version that did not keep the audience's size goes on in whole chunks,
            // and learns it is done from a step that finds no one left.
            var progress = first.result
            if !known, case .object(var fields) = progress {
                fields["members"] = nil
                progress = .object(fields)
            }
            let second = try await Self.startStep(pool, tenant, id, scheduleID, plan, progress: progress, chunk: 3)
            #expect(second.done == known, "\(second.result)")
            if !known {
                let third = try await Self.startStep(
                    pool, tenant, id, scheduleID, plan, progress: second.result, chunk: 3)
                #expect(third.done && third.result["audience"]?.intValue == 6, "\(third.result)")
            } else {
                #expect(second.result["audience"]?.intValue == 6, "\(second.result)")
            }
            let campaign = try await t.campaign(id)
            #expect(campaign.string("state") == "active" && campaign["audience_size"] as? Int == 6, "\(campaign)")
            try await pool.execute(
                """
                UPDATE campaign_schedules SET state = 'done', executed_at = now()
                WHERE tenant_id = \(tenant) AND id = \(scheduleID)
                """)
        }
    }

    @Test("a start failing after its first steps leaves its campaign active with what it started, which can be ended")
    func startFailingMidway() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let id = try await Self.campaignAnHourAhead(t, people: 5)
        let (scheduleID, plan) = try await Self.startSchedule(pool, tenant, id)
        // The first step (3 of 5) commits, as a worker's would; the schedule stays pending with its progress.
        let first = try await Self.startStep(pool, tenant, id, scheduleID, plan, progress: nil, chunk: 3)
        #expect(!first.done)
        // The rest of the start can never succeed (its stored plan is corrupted, as a bug might); due now, it is run
        // here or by any worker.
        try await pool.execute(
            """
            UPDATE campaign_schedules SET change = jsonb_set(change, '{fills}', '"not an array"'), due_at = now()
            WHERE tenant_id = \(tenant) AND id = \(scheduleID)
            """)
        let runner = CampaignRunner(database: TenantDatabase(pool: pool), chunk: 3)
        _ = try await runner.run(scheduleID)
        try await eventually("the start's schedule failed") {
            try await t.campaign(id).array("schedules").first?.string("state") == "failed"
        }
        let campaign = try await t.campaign(id)
        #expect(campaign.string("state") == "active", "\(campaign)")
        #expect(campaign.string("failure_reason") == "database_error")
        #expect(campaign["audience_size"] as? Int == 5 && campaign.string("started_at") != nil, "\(campaign)")
        let result = campaign.array("schedules").first?["result"] as? [String: Any]
        #expect(campaign.array("schedules").first?.string("state") == "failed")
        #expect(result?["reason"] as? String == "database_error" && result?["instances"] as? Int == 3, "\(campaign)")
        // Its members: three started (no reason), the two it never reached `not_started` (not listed as started).
        let members = try await t.api.call("GET", "/v1/campaigns/\(id)/people?limit=10", key: t.tenant.app)
        #expect(members.status == 200, "\(members.text)")
        let reasons = try members.json().array("data").map { $0["skipped_reason"] as? String ?? "started" }
        #expect(reasons.sorted() == ["not_started", "not_started", "started", "started", "started"], "\(reasons)")

        // What it started can be ended campaign-wide (due now: a change is due at the campaign's start_at at the
        // earliest).
        try await pool.execute("UPDATE campaigns SET start_at = now() WHERE tenant_id = \(tenant) AND id = \(id)")
        let end = try await t.api.call("POST", "/v1/campaigns/\(id)/end", key: t.tenant.app, json: [:])
        #expect(end.status == 202, "\(end.text)")
        let endID = try await Self.scheduleIDs(pool, tenant, id, "end")[0]
        _ = try await runner.run(endID)
        try await eventually("the end ran") {
            try await t.campaign(id).array("schedules").last?.string("state") == "done"
        }
        let open = try await pool.query(
            """
            SELECT count(*)::int AS n FROM instances
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND state IN ('pending', 'active')
            """)[0].decode(Int.self, "n")
        #expect(open == 0)
    }

    @Test("a campaign-wide change is accepted at once while a worker is still writing the previous one")
    func acceptedDuringBulkWrite() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        // Started here; its changes are due at its start_at, an hour ahead, so no worker runs them.
        let id = try await Self.campaignStartedHere(t, people: 3)
        let first = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(first.status == 202, "\(first.text)")
        let change = try await pool.query(
            """
            SELECT change FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND operation = 'update'
            """)[0].decode(JSONValue.self, "change")

        // A worker's bulk write of that change, its transaction held open.
        let writing = Mutex(false)
        let release = DispatchSemaphore(value: 0)
        let bulk = Task {
            try await pool.transaction { c in
                try c.enterSystem()
                try c.enterTenant(tenant)
                let written = try CampaignRunner.change(
                    c, tenant, id, CampaignChange(operation: .update, json: change), scope: .broadcastFirst)
                writing.withLock { $0 = true }
                release.wait()
                return written.result
            }
        }
        defer { release.signal() }
        try await eventually("the bulk write holds its campaign") { writing.withLock { $0 } }
        // The next change is accepted without waiting for it.
        let second = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 2]],
            timeout: 10)
        #expect(second.status == 202, "\(second.text)")
        // Due now, it is busy for any worker: run, it neither waits for the write nor writes anything.
        let secondID = try #require(try await Self.scheduleIDs(pool, tenant, id, "update").last)
        try await pool.execute(
            "UPDATE campaign_schedules SET due_at = now() WHERE tenant_id = \(tenant) AND id = \(secondID)")
        let runner = CampaignRunner(database: TenantDatabase(pool: pool))
        let deadline = Task {
            // Should the run wait for the write after all, the write ends here, and the test fails below.
            try await Task.sleep(for: .seconds(20))
            release.signal()
        }
        defer { deadline.cancel() }
        try await eventually("a run of the second change is busy") {
            try await runner.run(secondID)?.state == "busy"
        }
        release.signal()
        #expect(try await bulk.value["instances"]?.intValue == 3)
        try await eventually("the second change ran after the first") {
            if try await runner.run(secondID)?.state == "done" { return true }
            return try await pool.query(
                "SELECT state FROM campaign_schedules WHERE tenant_id = \(tenant) AND id = \(secondID)")[0].decode(
                    String.self, "state") == "done"
        }
    }

    @Test("a campaign's bulk writes run in the order of their schedules: a newer one waits for an older one pending")
    func bulkWritesInOrder() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let id = try await Self.campaignStartedHere(t, people: 1)
        for home in [1, 2] {
            let r = try await t.api.call(
                "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": home]])
            #expect(r.status == 202, "\(r.text)")
        }
        let changes = try await Self.scheduleIDs(pool, tenant, id, "update")
        try #require(changes.count == 2)
        let change = try await pool.query(
            "SELECT change FROM campaign_schedules WHERE tenant_id = \(tenant) AND id = \(changes[1])")[0].decode(
                JSONValue.self, "change")
        // Both are due at the campaign's start_at (an hour ahead: no worker runs them); the newer one's write is run
        // here, as a worker would run it, while the older one is pending.
        func writeNewer() async throws -> JSONValue {
            try await pool.transaction { c in
                try c.enterSystem()
                try c.enterTenant(tenant)
                return try CampaignRunner.change(
                    c, tenant, id, CampaignChange(operation: .update, json: change), scope: .broadcastFirst,
                    schedule: changes[1]
                ).result
            }
        }
        func version() async throws -> Int {
            try await pool.query(
                "SELECT version FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id)")[0].decode(
                    Int.self, "version")
        }
        let before = try await version()
        await #expect(throws: CampaignRunner.Busy.self) { try await writeNewer() }
        #expect(try await version() == before, "the newer change wrote before the older one")
        // Once the older one is no longer pending, the newer one writes.
        try await pool.execute(
            "UPDATE campaign_schedules SET state = 'cancelled' WHERE tenant_id = \(tenant) AND id = \(changes[0])")
        #expect(try await writeNewer()["instances"]?.intValue == 1)
    }

    /// A campaign for `people` new people with an iPhone each, starting an hour from now (no worker runs its start or
    /// its changes; a test runs them).
    static func campaignAnHourAhead(_ t: Tenant, people: Int) async throws -> String {
        var lines: [[String: Any]] = []
        for _ in 0..<people { lines.append(Self.iosPerson(Fake.id("p"), type: t.type, attributes: ["team": "P"]).0) }
        try await t.importPeople(lines)
        let id = Fake.id("c")
        let created = try await t.create([
            "campaign_id": id, "audience": ["people": lines.compactMap { $0.string("id") }],
            "start_at": Date().timeIntervalSince1970 + 3600,
        ])
        guard created.status == 202 else { throw TestFailure("campaign: \(created.text)") }
        return id
    }

    /// A campaign for `people` new people with an iPhone each, started here, its changes due an hour ahead.
    static func campaignStartedHere(_ t: Tenant, people: Int) async throws -> String {
        let id = try await campaignAnHourAhead(t, people: people)
        try await startHere(t.fixture.pool, t.tenant.uuid, id)
        return id
    }

    /// The IDs of the campaign's schedules of `operation`, oldest first.
    static func scheduleIDs(_ pool: PostgresPool, _ tenant: UUID, _ id: String, _ operation: String) async throws
        -> [UUID]
    {
        try await pool.query(
            """
            SELECT id FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND operation = \(operation) ORDER BY id
            """
        ).map { try $0.decode(UUID.self, "id") }
    }

    /// The campaign's start schedule: its ID and its stored plan.
    static func startSchedule(_ pool: PostgresPool, _ tenant: UUID, _ id: String) async throws -> (UUID, JSONValue) {
        let row = try await pool.query(
            """
            SELECT id, change FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND operation = 'start'
            """)[0]
        return (try row.decode(UUID.self, "id"), try row.decode(JSONValue.self, "change"))
    }

    /// Starts the campaign here, whole, as a worker would, and marks its start done.
    static func startHere(_ pool: PostgresPool, _ tenant: UUID, _ id: String) async throws {
        let (scheduleID, plan) = try await startSchedule(pool, tenant, id)
        let step = try await startStep(pool, tenant, id, scheduleID, plan, progress: nil, chunk: 10_000)
        guard step.done else { throw TestFailure("start: \(step.result)") }
        try await pool.execute(
            """
            UPDATE campaign_schedules SET state = 'done', executed_at = now()
            WHERE tenant_id = \(tenant) AND id = \(scheduleID)
            """)
    }

    /// The campaign's one change schedule of `operation`: its ID and its stored change.
    static func changeSchedule(
        _ pool: PostgresPool, _ tenant: UUID, _ id: String, _ operation: CampaignChange.Operation
    )
        async throws -> (UUID, CampaignChange)
    {
        let row = try await pool.query(
            """
            SELECT id, change FROM campaign_schedules
            WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND operation = \(operation.rawValue)
            """)[0]
        return (
            try row.decode(UUID.self, "id"),
            CampaignChange(operation: operation, json: try row.decode(JSONValue.self, "change"))
        )
    }

    /// One step of a campaign-wide change, run as a worker runs it (its first half without `progress`, else the next
    /// chunk of the rest), its progress kept on the schedule (which stays pending).
    static func changeStep(
        _ pool: PostgresPool, _ tenant: UUID, _ id: String, _ change: CampaignChange, _ scheduleID: UUID,
        progress: JSONValue?, chunk: Int, tailFloor: Int = CampaignRunner.tailFloor
    ) async throws -> (result: JSONValue, representative: String?, done: Bool) {
        try await pool.transaction { c in
            try c.enterSystem()
            try c.enterTenant(tenant)
            let step = try CampaignRunner.change(
                c, tenant, id, change,
                scope: progress == nil ? .broadcastFirst : .rest(progress?["representative"]?.stringValue),
                schedule: scheduleID, progress: progress, chunk: chunk, tailFloor: tailFloor)
            try c.execute(
                "UPDATE campaign_schedules SET result = \(step.result) WHERE tenant_id = \(tenant) AND id = \(scheduleID)"
            )
            return step
        }
    }

    /// One step of a start, run as a worker runs it, its progress kept on the schedule (which stays pending).
    static func startStep(
        _ pool: PostgresPool, _ tenant: UUID, _ id: String, _ scheduleID: UUID, _ plan: JSONValue, progress: JSONValue?,
        chunk: Int
    ) async throws -> (result: JSONValue, done: Bool) {
        try await pool.transaction { c in
            try c.enterSystem()
            try c.enterTenant(tenant)
            let step = try CampaignRunner.start(
                c, tenant, id, plan, lifetime: Lifetime.maximum, progress: progress, chunk: chunk)
            try c.execute(
                "UPDATE campaign_schedules SET result = \(step.result) WHERE tenant_id = \(tenant) AND id = \(scheduleID)"
            )
            return step
        }
    }
}
