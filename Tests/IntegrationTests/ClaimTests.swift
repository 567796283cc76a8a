import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// Claims by row lock (migration 0055): what a claim holds while it sends, what other writers do with held rows, and
/// what happens to a claim whose worker dies or whose sends are slow. Against the real database, without a worker.
@Suite("Claims by row lock")
struct ClaimTests {
    /// A pool whose sessions carry `name` as their application_name, so a test can end them as a crash would.
    static func namedPool(_ w: LifecycleTests.World, _ name: String) throws -> PostgresPool {
        var configuration = try PostgresConfiguration(url: w.fixture.databaseURL)
        configuration.startupSettings["application_name"] = name
        return PostgresPool(configuration, options: .init(maxConnections: 2))
    }

    /// Statuses of the instance's deliveries of `operation` (all when nil), counted.
    static func statuses(
        _ w: LifecycleTests.World, _ instance: String, operation: String? = nil
    ) async throws -> [String: Int] {
        let rows = try await w.fixture.pool.query(
            """
            SELECT status, count(*)::int AS n FROM deliveries
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)
              AND (\(operation)::text IS NULL OR operation = \(operation))
            GROUP BY status
            """)
        var counts: [String: Int] = [:]
        for row in rows { counts[try row.decode(String.self, "status")] = try row.decode(Int.self, "n") }
        return counts
    }

    @Test("held rows: other claims skip them, an end never waits on them, and they are due again once the claimer dies")
    func heldRows() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("held")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let name = "claim-test-" + Fake.hex(8)
        let claimer = try Self.namedPool(w, name)
        defer { claimer.close() }
        let held = AsyncGate()
        let dead = AsyncGate()
        let holding = Task {
            try await DeliveryQueue(pool: claimer).claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) {
                batch in
                held.open(batch.count)
                await dead.wait()
                return ClaimResults(
                    results: batch.map {
                        DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                    })
            }
        }
        #expect(try await held.value(within: .seconds(30)) == 3, "the claim holds the start's three deliveries")
        let queue = DeliveryQueue(pool: w.fixture.pool)
        // Another claim skips them rather than wait.
        let other = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            ClaimResults(results: [])
        }
        #expect(other == 0)
        // The end answers at once and leaves the held starts to finish (they may be reaching devices now).
        let clock = ContinuousClock()
        let began = clock.now
        let end = try await w.end(["instance_id": instance])
        #expect(end.status == 200, "\(end.text)")
        #expect(clock.now - began < .seconds(10), "the end did not wait for the held rows")
        #expect(try await Self.statuses(w, instance, operation: "start") == ["queued": 3])
        // The claimer dies (its session ends as a killed process's would): its rows are due at once, not after a lease.
        _ = try await w.fixture.pool.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = \(name)")
        let deadline = clock.now + .seconds(20)
        var rescued = 0
        while rescued == 0 && clock.now < deadline {
            rescued = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
                ClaimResults(
                    results: batch.map {
                        DeliveryResult(
                            tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .superseded,
                            reason: "instance_ended")
                    })
            }
            if rescued == 0 { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(rescued == 3)
        dead.open(0)
        // The dead claim's record and commit failed: nothing it held was written by it.
        await #expect(throws: (any Error).self) { try await holding.value }
        #expect(try await Self.statuses(w, instance, operation: "start") == ["superseded": 3])
    }

    @Test("a batch's deliveries each carry their own content state and options, repeated or not")
    func batchKeepsEachRowsContent() async throws {
        // A claim parses each distinct content state and set of options once per batch (it keeps the last four):
        // seven instances, five distinct contents, repeats before and after the oldest is dropped.
        let w = try await LifecycleTests.world(fixture: .holding)
        let contents = [0, 1, 0, 2, 3, 4, 0]
        var expected: [String: Int] = [:]
        for (index, content) in contents.enumerated() {
            let instance = Fake.id("batch\(index)")
            expected[instance] = content
            let started = try await w.start([
                "instance_id": instance, "content_state": ["status": "s\(content)", "eta": content],
                "push_payload": ["alert": ["title": "t\(content)", "body": "b\(content)"]],
            ])
            #expect(started.status == 200, "\(started.text)")
        }
        var seen = 0
        try await DeliveryQueue(pool: w.fixture.pool).claim(
            limit: 100, hold: .seconds(60), tenants: [w.tenant.uuid]
        ) { batch in
            for d in batch {
                guard let content = expected[d.instanceID] else {
                    Issue.record("claimed a delivery of another instance: \(d.instanceID)")
                    continue
                }
                #expect(d.contentState == .object(["status": .string("s\(content)"), "eta": .int(Int64(content))]))
                #expect(d.options.alert?.title == "t\(content)" && d.options.alert?.body == "b\(content)")
                seen += 1
            }
            return ClaimResults(results: [])
        }
        #expect(seen == contents.count * 3, "each start's three deliveries")
    }

    @Test("a push that gets through marks its instance active only if the claim found it waiting for one")
    func settleLeavesNewerState() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("settle")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        _ = try await w.registerActivityTokens(instance)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        func sent(_ batch: [ClaimedDelivery]) -> ClaimResults {
            ClaimResults(
                results: batch.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                })
        }
        // The start's pushes reach the devices: the pending instance becomes active.
        var states: [InstanceState] = []
        try await queue.claim(limit: 100, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            states = batch.map(\.instanceState)
            return sent(batch)
        }
        #expect(!states.isEmpty && states.allSatisfy { $0 == .pending })
        #expect(try await w.instance(instance)["state"] as? String == "active")
        let update = try await w.update([
            "instance_id": instance, "content_state": ["status": "on_the_way", "eta": 300],
        ])
        #expect(update.status == 200, "\(update.text)")
        states = []
        try await queue.claim(limit: 100, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            states = batch.map(\.instanceState)
            // While the update is sent, a newer change finds no target (its tokens were gone): the instance fails.
            _ = try? await w.fixture.pool.execute(
                """
                UPDATE instances SET state = 'failed', failure_reason = 'no_activity_token'
                WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)
                """)
            return sent(batch)
        }
        #expect(!states.isEmpty && states.allSatisfy { $0 == .active })
        #expect(
            try await w.instance(instance)["state"] as? String == "failed",
            "the older update reaching a device does not hide that the newer change reached none")
    }

    @Test("a claim locks only what it sends: of two versions queued for one token it holds the older alone")
    func locksOnlyWhatItSends() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("versions")
        #expect(try await w.start(["instance_id": instance, "platform": "android"]).status == 200)
        #expect(
            try await w.update(["instance_id": instance, "content_state": ["status": "ready", "eta": 0]]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        let probe = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            #expect(batch.map(\.operation.rawValue) == ["start"])
            // Seen from another session while the claim is open: the start is held, the newer update is not.
            var held: [(String, Bool)] = []
            if let rows = try? await w.fixture.pool.query(
                """
                SELECT operation, marquee_delivery_in_flight(tenant_id, id) AS held FROM deliveries
                WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) ORDER BY instance_version
                """)
            {
                for row in rows {
                    held.append(
                        (
                            (try? row.decode(String.self, "operation")) ?? "",
                            (try? row.decode(Bool.self, "held")) ?? false
                        ))
                }
            }
            #expect(held.map(\.0) == ["start", "update"] && held.map(\.1) == [true, false], "\(held)")
            return ClaimResults(
                results: batch.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                })
        }
        #expect(probe == 1)
        // Once the start is recorded, the update is next.
        let next = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            #expect(batch.map(\.operation.rawValue) == ["update"])
            return ClaimResults(
                results: batch.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                })
        }
        #expect(next == 1)
        #expect(try await Self.statuses(w, instance) == ["sent": 2])
    }

    @Test("a claim walks the lanes from the one it starts at, oldest first in each, and locks only its share")
    func lanes() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        // 24 deliveries, one per instance; delivery j goes to lane j % 8 and is due before delivery j + 1.
        let prefix = Fake.id("lanes")
        for j in 0..<24 {
            #expect(try await w.start(["instance_id": "\(prefix)-\(j)", "platform": "android"]).status == 200)
        }
        let placed = try await w.fixture.pool.execute(
            """
            UPDATE delivery_queue SET lane = substring(instance_id from '[0-9]+$')::int % marquee_queue_lanes(),
                   next_attempt_at = now() - interval '1 hour' + substring(instance_id from '[0-9]+$')::int * interval '1 s'
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id LIKE \(prefix + "-%")
            """)
        #expect(placed == 24)
        let configuration = try PostgresConfiguration(url: w.fixture.databaseURL)
        let first = try PostgresConnection(connecting: configuration)
        let second = try PostgresConnection(connecting: configuration)
        defer {
            _ = try? first.execute("ROLLBACK")
            _ = try? second.execute("ROLLBACK")
        }
        func claim(_ connection: PostgresConnection, share: Int, from lane: Int) throws -> [Int] {
            try connection.execute("BEGIN")
            let rows = try connection.query(
                DeliveryQueue.lockQuery(
                    tenants: [w.tenant.uuid], shares: [share], excluding: [], providers: ["apns", "fcm"],
                    startingLane: lane))
            return try DeliveryQueue.claimedDeliveries(rows, lease: SendingLease(microseconds: 0)).deliveries.map {
                Int($0.instanceID.split(separator: "-").last!)!
            }
        }
        // Lane 6's three, oldest first, then lane 7's two oldest (a starting lane past the last one wraps around).
        #expect(try claim(first, share: 5, from: 6 + 8 * 3).sorted() == [6, 7, 14, 15, 22])
        let inFlight = try await w.fixture.pool.query(
            """
            SELECT count(*)::int AS n FROM delivery_queue
            WHERE tenant_id = \(w.tenant.uuid) AND marquee_delivery_in_flight(tenant_id, id)
            """
        ).first!.decode(Int.self, "n")
        #expect(inFlight == 5, "the claim holds its share and no more")
        // A claim starting at the same lane skips what the first holds and, wrapping around to lane 0, takes the rest.
        let rest = try claim(second, share: 100, from: 6)
        #expect(rest.count == 19 && Set(rest).isDisjoint(with: [6, 7, 14, 15, 22]), "\(rest)")
    }

    /// The lease `d` carries in the queue, as the microseconds of its `next_attempt_at` and `sending_until`, and how
    /// many seconds of it are left by the database's clock.
    static func lease(_ w: LifecycleTests.World, _ d: ClaimedDelivery) async throws -> (
        due: Int64?, sendingUntil: Int64?, left: Double?
    ) {
        let row = try await w.fixture.pool.query(
            """
            SELECT (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS due,
                   (extract(epoch FROM sending_until) * 1000000)::int8 AS sending_until,
                   extract(epoch FROM sending_until - now())::float8 AS left
            FROM delivery_queue WHERE tenant_id = \(d.tenantID) AND id = \(d.id)
            """
        ).first
        return (
            try row?.decode(Int64?.self, "due"), try row?.decode(Int64?.self, "sending_until"),
            try row?.decode(Double?.self, "left")
        )
    }

    /// Leaves every claimed delivery still being sent.
    static func stillSending(_ batch: [ClaimedDelivery]) -> ClaimResults {
        ClaimResults(results: [], stillSending: batch.map { ($0.tenantID, $0.instanceID, $0.id) })
    }

    @Test(
        "a slow send is leased past the claim's commit for the claim's hold by the database's clock, and its late result is written only under that lease, to the microsecond"
    )
    func lateResults() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("late")
        #expect(try await w.start(["instance_id": instance, "platform": "android"]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        var slow: ClaimedDelivery?
        let claimed = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            slow = batch.first
            return Self.stillSending(batch)
        }
        #expect(claimed == 1)
        let d = try #require(slow)
        // The lease is the claim's hold from its start by the database's clock (a worker's clock behind the
        // database's wrote a lease already over: another worker sent the push again meanwhile), and the row carries
        // exactly the lease the claim handed out with the delivery.
        let (due, sendingUntil, left) = try await Self.lease(w, d)
        #expect(due == d.lease.microseconds && sendingUntil == d.lease.microseconds)
        #expect(left.map { (50...60).contains($0) } == true, "\(String(describing: left)) s of a 60 s hold left")
        // Committed without it: not held, not due until the lease ends, so no other claim takes it.
        #expect(
            try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { _ in .init(results: []) }
                == 0)
        // A result under another lease (here one a microsecond off) is not written…
        var other = d
        other.lease = SendingLease(microseconds: d.lease.microseconds - 1)
        try await queue.recordLate(
            ClaimResults(results: [
                DeliveryResult(
                    tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .failed, reason: "stale")
            ]), claimed: [other])
        #expect(try await Self.statuses(w, instance) == ["queued": 1])
        // …the one under this lease is.
        try await queue.recordLate(
            ClaimResults(results: [
                DeliveryResult(
                    tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .sent, providerID: "p1")
            ]), claimed: [d])
        #expect(try await Self.statuses(w, instance) == ["sent": 1])
        let attempts = try await w.fixture.pool.count(
            "SELECT attempts AS n FROM deliveries WHERE tenant_id = \(w.tenant.uuid) AND id = \(d.id)")
        #expect(attempts == 1)
        #expect(try await w.instance(instance)["state"] as? String == "active", "the start got through")
    }

    @Test(
        "a lease that ran out by the database's clock: another claim takes the delivery over, and the first worker's late result leaves it alone"
    )
    func leaseTakenOver() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("taken-over")
        #expect(try await w.start(["instance_id": instance, "platform": "android"]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        var first: [ClaimedDelivery] = []
        // A short hold, not the shortest: the hold is also the claim's idle-in-transaction timeout, and on a loaded
        // machine a claim held for one second was ended by PostgreSQL between its lock and its commit.
        try await queue.claim(limit: 10, hold: .seconds(5), tenants: [w.tenant.uuid]) { batch in
            first = batch
            return Self.stillSending(batch)
        }
        let d = try #require(first.first)
        // Once its hold is over, the delivery is due again: another worker takes it, and is slow too.
        var second: [ClaimedDelivery] = []
        try await eventually("another claim takes the delivery over", timeout: .seconds(30)) {
            try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
                second = batch
                return Self.stillSending(batch)
            } == 1
        }
        let taken = try #require(second.first)
        #expect(taken.id == d.id && taken.lease != d.lease)
        #expect(try await Self.lease(w, d).due == taken.lease.microseconds)
        // The first worker's push ends (failed): the second's lease stands.
        try await queue.recordLate(
            ClaimResults(results: [
                DeliveryResult(
                    tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .failed, reason: "late")
            ]), claimed: first)
        #expect(try await Self.statuses(w, instance) == ["queued": 1])
        #expect(try await Self.lease(w, d).sendingUntil == taken.lease.microseconds, "still the second claim's")
        try await queue.recordLate(
            ClaimResults(results: [
                DeliveryResult(
                    tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .sent, providerID: "p2")
            ]), claimed: second)
        #expect(try await Self.statuses(w, instance) == ["sent": 1])
    }

    @Test("a start still being sent past its claim is in flight: an end waits for the tokens and lets it finish")
    func leasedStartIsInFlight() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("leased")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        var slow: [ClaimedDelivery] = []
        try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            slow = batch
            return Self.stillSending(batch)
        }
        #expect(slow.count == 3, "two push-to-starts and the Android phone's start, all slow")
        // The end comes while they are being sent: none is cancelled, and with no activity token registered yet the
        // end waits for them (else the activities the starts create would never end).
        let end = try await w.end(["instance_id": instance])
        #expect(end.status == 200, "\(end.text)")
        #expect(try await Self.statuses(w, instance, operation: "start") == ["queued": 3])
        let pending = try await w.fixture.pool.query(
            "SELECT pending_end FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
        #expect(try pending.first?.decode(Bool.self, "pending_end") == true)
        // They get through, and are recorded as sent.
        try await queue.recordLate(
            ClaimResults(
                results: slow.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                }), claimed: slow)
        #expect(try await Self.statuses(w, instance, operation: "start") == ["sent": 3])
        // The started activities report their tokens: the end goes to each of them too.
        _ = try await w.registerActivityTokens(instance)
        #expect(try await Self.statuses(w, instance, operation: "end") == ["queued": 3])
    }

    @Test("a delivery still being sent past its claim is not parked when its credential breaks")
    func leasedRowIsNotParked() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let (sending, waiting) = (Fake.id("leased-park"), Fake.id("queued-park"))
        try await w.fixture.pool.execute(
            """
            INSERT INTO apns_credentials (tenant_id, team_id, key_id, bundle_id, environment, sealed_private_key)
            VALUES (\(w.tenant.uuid), 'TEAM', 'KEY', 'com.example.app', 'sandbox', '\\x00'::bytea)
            """)
        #expect(try await w.start(["instance_id": sending]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { Self.stillSending($0) }
        #expect(try await w.start(["instance_id": waiting]).status == 200)
        try await w.fixture.pool.execute(
            "UPDATE apns_credentials SET status = 'broken' WHERE tenant_id = \(w.tenant.uuid)")
        #expect(try await Self.statuses(w, sending, operation: "start") == ["queued": 3], "left to its worker")
        let parked = try await Self.statuses(w, waiting, operation: "start")
        #expect(parked == ["parked": 2, "queued": 1], "\(parked)")
    }

    @Test(
        "a delivery parked by a late result is due as soon as its credential is replaced, not at its claim's lease end")
    func lateParkIsDueWhenReplaced() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("late-park")
        try await w.fixture.pool.execute(
            """
            INSERT INTO apns_credentials (tenant_id, team_id, key_id, bundle_id, environment, sealed_private_key)
            VALUES (\(w.tenant.uuid), 'TEAM', 'KEY', 'com.example.app', 'sandbox', '\\x00'::bytea)
            """)
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        var slow: [ClaimedDelivery] = []
        try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            slow = batch.filter { $0.provider == .apns }
            return Self.stillSending(batch)
        }
        #expect(slow.count == 2)
        // APNs refuses the credential for the slow sends: it is marked broken, and their late results are parks.
        try await w.fixture.pool.execute(
            "UPDATE apns_credentials SET status = 'broken' WHERE tenant_id = \(w.tenant.uuid)")
        try await queue.recordLate(
            ClaimResults(
                results: slow.map {
                    DeliveryResult(
                        tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .parked,
                        httpStatus: 403, reason: "InvalidProviderToken")
                }), claimed: slow)
        #expect(try await Self.statuses(w, instance, operation: "start") == ["parked": 2, "queued": 1])
        // The tenant replaces it within the claim's hold: they are due now, the lease having ended with the record.
        try await w.fixture.pool.execute(
            "UPDATE apns_credentials SET status = 'ok' WHERE tenant_id = \(w.tenant.uuid)")
        for d in slow {
            let (due, sendingUntil, _) = try await Self.lease(w, d)
            #expect(sendingUntil == nil)
            let now = try await w.fixture.pool.query(
                "SELECT (extract(epoch FROM now()) * 1000000)::int8 AS t")[0].decode(Int64.self, "t")
            #expect(try #require(due) <= now, "due \((due ?? 0) - now) µs from now")
        }
    }

    @Test("a late result marks its instance active only if the claim found it waiting for one")
    func lateSettleLeavesNewerState() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("late-settle")
        #expect(try await w.start(["instance_id": instance, "platform": "android"]).status == 200)
        let queue = DeliveryQueue(pool: w.fixture.pool)
        func sent(_ batch: [ClaimedDelivery]) -> [DeliveryResult] {
            batch.map { DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent) }
        }
        try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) {
            ClaimResults(results: sent($0))
        }
        #expect(try await w.instance(instance)["state"] as? String == "active")
        let update = try await w.update([
            "instance_id": instance, "content_state": ["status": "on_the_way", "eta": 300],
        ])
        #expect(update.status == 200, "\(update.text)")
        // The update's push is slow: the claim commits without it, leased.
        var slow: [ClaimedDelivery] = []
        try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            slow = batch
            return Self.stillSending(batch)
        }
        #expect(slow.count == 1 && slow.allSatisfy { $0.instanceState == .active })
        // Meanwhile a newer change finds no target: the instance fails. Then the slow push gets through.
        #expect(
            try await w.fixture.pool.execute(
                """
                UPDATE instances SET state = 'failed', failure_reason = 'no_activity_token'
                WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)
                """) == 1)
        try await queue.recordLate(ClaimResults(results: sent(slow)), claimed: slow)
        #expect(try await Self.statuses(w, instance, operation: "update") == ["sent": 1])
        #expect(
            try await w.instance(instance)["state"] as? String == "failed",
            "the older update reaching a device does not hide that the newer change reached none")
    }

    @Test("a row that cannot be read is recorded failed (unreadable), and another tenant's rows of its claim are sent")
    func unreadableRow() async throws {
        let bad = try await LifecycleTests.world(fixture: .holding)
        let good = try await LifecycleTests.world(fixture: .holding)
        let deepInstance = Fake.id("deep")
        let fineInstance = Fake.id("fine")
        #expect(try await bad.start(["instance_id": deepInstance]).status == 200)
        #expect(try await good.start(["instance_id": fineInstance]).status == 200)
        // One tenant's start carries attributes nested one level deeper than any document may be (as a campaign's
        // `$person` fill could write them), which no claim can parse.
        let depth = JSONValue.maxDepth + 1
        let deep = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        #expect(
            try await bad.fixture.pool.execute(
                """
                UPDATE delivery_queue SET attributes = \(deep)::jsonb
                WHERE tenant_id = \(bad.tenant.uuid) AND instance_id = \(deepInstance)
                """) == 3)
        var sentIDs: [UUID] = []
        var reported: [UnreadableDelivery] = []
        func report(_ rows: [UnreadableDelivery]) { reported += rows }
        let claimed = try await DeliveryQueue(pool: good.fixture.pool).claim(
            limit: 100, hold: .seconds(60), tenants: [bad.tenant.uuid, good.tenant.uuid], unreadable: report
        ) { batch in
            sentIDs = batch.map(\.id)
            return ClaimResults(
                results: batch.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                })
        }
        #expect(claimed == 6, "both tenants' rows were claimed")
        #expect(sentIDs.count == 3, "only the readable ones were handed over to be sent")
        #expect(try await Self.statuses(good, fineInstance) == ["sent": 3])
        #expect(try await Self.statuses(bad, deepInstance) == ["failed": 3])
        let reasons = try await bad.fixture.pool.query(
            """
            SELECT DISTINCT reason FROM deliveries
            WHERE tenant_id = \(bad.tenant.uuid) AND instance_id = \(deepInstance)
            """
        ).map { try $0.decode(String?.self, "reason") }
        #expect(reasons == ["unreadable"])
        #expect(reported.count == 3 && reported.allSatisfy { $0.tenantID == bad.tenant.uuid && $0.provider != nil })
    }

    @Test("a retry is due its delay after the record, by the database's clock, not the worker's")
    func retryDueByDatabaseClock() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("retry-clock")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let pool = w.fixture.pool
        func databaseMicroseconds() async throws -> Int64 {
            try await pool.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS t")[0]
                .decode(Int64.self, "t")
        }
        let before = try await databaseMicroseconds()
        // What a worker records for a 503 with a delay of 8 s. (Its clock may be ten minutes behind the database's:
        // a due time it computed was in the past, and every retry went out at once.)
        let claimed = try await DeliveryQueue(pool: pool).claim(
            limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]
        ) { batch in
            ClaimResults(
                results: batch.map {
                    DeliveryResult(
                        tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .queued, httpStatus: 503,
                        reason: "ServiceUnavailable", retryDelay: .seconds(8))
                })
        }
        #expect(claimed == 3)
        let after = try await databaseMicroseconds()
        let due = try await pool.query(
            """
            SELECT (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS due FROM delivery_queue
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)
            """
        ).map { try $0.decode(Int64.self, "due") }
        #expect(due.count == 3)
        for at in due {
            #expect(at >= before + 8_000_000 && at <= after + 8_000_000, "due \(at - before) µs after the claim began")
        }
    }
}

/// Opens once with a value; waiters get it (or time out).
final class AsyncGate: Sendable {
    private let state = Mutex<(value: Int?, waiters: [CheckedContinuation<Int, Never>])>((nil, []))

    func open(_ value: Int) {
        let waiters = state.withLock { state -> [CheckedContinuation<Int, Never>] in
            guard state.value == nil else { return [] }
            state.value = value
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: value) }
    }

    func wait() async {
        _ = await withCheckedContinuation { (continuation: CheckedContinuation<Int, Never>) in
            let value = state.withLock { state -> Int? in
                if state.value == nil { state.waiters.append(continuation) }
                return state.value
            }
            if let value { continuation.resume(returning: value) }
        }
    }

    /// The value once opened, polling until `within` has passed.
    func value(within limit: Duration) async throws -> Int {
        let clock = ContinuousClock()
        let deadline = clock.now + limit
        while clock.now < deadline {
            if let value = state.withLock({ $0.value }) { return value }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw TestFailure("not opened within \(limit)")
    }
}
