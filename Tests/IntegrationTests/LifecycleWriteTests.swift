import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// Concurrent starts, updates and ends of one tenant are written by one set-based statement per batch and kind: each
/// keeps its own outcome (written, version conflict, instance ID or key taken), supersedes, ends and idempotency
/// records as if written alone, and two writes of one instance in one batch apply in the order they came.
@Suite("Lifecycle writes, set-based")
struct LifecycleWriteTests {
    @Test("a batch of changes of two tenants writes each as if alone, in order per instance")
    func batchEqualsAlone() async throws {
        let a = try await LifecycleTests.world()
        let b = try await LifecycleTests.world()
        var x: [String] = []
        for i in 0..<5 {
            let id = Fake.id("set-a")
            #expect(try await a.start(["instance_id": id]).status == 200)
            if i < 2 { _ = try await a.registerActivityTokens(id) }
            x.append(id)
        }
        let y = Fake.id("set-b")
        #expect(try await b.start(["instance_id": y]).status == 200)
        _ = try await b.registerActivityTokens(y)
        // x0 has an update queued (to be superseded); x4's key K0 is taken by an update of x2.
        #expect(try await a.update(["instance_id": x[0], "content_state_patch": ["eta": 0]]).status == 200)
        let taken = "k0-" + Fake.hex(8)
        let kept = try await a.update(
            ["instance_id": x[2], "content_state_patch": ["eta": 9]], headers: ["Idempotency-Key": taken])
        #expect(kept.status == 200)

        let (pool, committer, store) = try Self.oneConnection(a.fixture.databaseURL)
        let (ta, tb) = (a.tenant.uuid, b.tenant.uuid)
        let newKey = "k1-" + Fake.hex(8)

        let leadWrite = try await Self.plan(store, tb, y, .update, eta: 7)
        let first = try await Self.plan(store, ta, x[0], .update, eta: 1)
        let second = try await Self.plan(store, ta, x[0], .update, eta: 2, after: first)
        var stale = try await Self.plan(store, ta, x[2], .update, eta: 3)
        stale.plan.expectedVersion -= 1
        let writes: [(UUID, ChangeWrite)] = [
            (ta, try await Self.plan(store, ta, x[1], .update, eta: 4, key: newKey)),
            (ta, stale),
            (ta, try await Self.plan(store, ta, x[3], .end, eta: nil)),
            (ta, try await Self.plan(store, ta, x[4], .update, eta: 5, key: taken)),
            (tb, try await Self.plan(store, tb, y, .update, eta: 6, after: leadWrite)),
        ]

        // The pool's one connection is held: the first writer waits for it, the others queue behind and are
        // written together once it is free. The two changes of x0 are queued in order.
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in release.wait() } }
        try await eventually("the connection is held") { pool.statistics.idle == 0 && pool.statistics.open == 1 }
        let lead = Task { try await store.change(tenant: tb, leadWrite) }
        try await eventually("a writer waits for the connection") { pool.statistics.waiting == 1 }
        let firstTask = Task { try await store.change(tenant: ta, first) }
        try await eventually("x0's first change queued") { committer.queued == 1 }
        let secondTask = Task { try await store.change(tenant: ta, second) }
        try await eventually("x0's second change queued") { committer.queued == 2 }
        let others = writes.map { tenant, write in Task { try await store.change(tenant: tenant, write) } }
        try await eventually("every change queued") { committer.queued == 2 + writes.count }
        release.signal()
        try await holder.value
        _ = try await lead.value
        let outcomes = [try await firstTask.value, try await secondTask.value] + (try await others.asyncValues())
        pool.close()

        // The lead's batch, then one with the seven others.
        #expect(committer.statistics == .init(batches: 2, statements: 8, fallbacks: 0))
        // x0: both changes written, the second on top of the first.
        #expect(outcomes[0] == .written(version: first.plan.version, deliveries: 3))
        #expect(outcomes[1] == .written(version: first.plan.version + 1, deliveries: 3))
        #expect(outcomes[2] == .written(version: 2, deliveries: 3))  // x1, with a new key
        #expect(outcomes[3] == .versionConflict)  // x2, planned from an old version
        #expect(outcomes[4] == .written(version: 2, deliveries: 1))  // x3 ended: its Android phone
        #expect(outcomes[5] == .alreadyExists)  // x4 with a key taken
        // y: the lead's change, then this one.
        #expect(outcomes[6] == .written(version: 3, deliveries: 3))

        let db = a.fixture.pool
        func count(_ sql: PostgresQuery) async throws -> Int {
            try await db.query(sql)[0].decode(Int.self, "n")
        }
        // x0: the newest content; only the second change's pushes wait; the earlier update's and the first
        // change's were superseded.
        let x0 = try await a.instance(x[0])
        #expect((x0["content_state"] as? [String: Any])?["eta"] as? Int == 2)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(ta) AND instance_id = \(x[0]) AND operation = 'update'"
            ) == 3)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_history WHERE tenant_id = \(ta) AND instance_id = \(x[0]) AND status = 'superseded'"
            ) == 6)
        // x1: the answer stored under its key.
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(ta) AND key = \(newKey) AND response ->> 'coalesced' = 'false'"
            ) == 1)
        // x2 and x4 unchanged.
        #expect(try await a.instance(x[2])["version"] as? Int == 2)
        #expect(try await a.instance(x[4])["version"] as? Int == 1)
        // x3 ended: its start's pushes cancelled, the end's one queued.
        #expect(try await a.instance(x[3])["state"] as? String == "ended")
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(ta) AND instance_id = \(x[3])") == 1)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_history WHERE tenant_id = \(ta) AND instance_id = \(x[3]) AND operation = 'start' AND status = 'superseded'"
            ) == 3)
        // y, the other tenant's.
        #expect((try await b.instance(y)["content_state"] as? [String: Any])?["eta"] as? Int == 6)
    }

    @Test("a batch of starts of two tenants writes each as if alone; a taken instance ID or key writes nothing")
    func startsEqualAlone() async throws {
        let a = try await LifecycleTests.world()
        let b = try await LifecycleTests.world()
        let existing = Fake.id("set-s")
        #expect(try await a.start(["instance_id": existing]).status == 200)
        let taken = "k0-" + Fake.hex(8)
        let keyed = Fake.id("set-s")
        #expect(try await a.start(["instance_id": keyed], headers: ["Idempotency-Key": taken]).status == 200)

        let (pool, committer, store) = try Self.oneConnection(a.fixture.databaseURL)
        let (ta, tb) = (a.tenant.uuid, b.tenant.uuid)
        let (fresh, twice, other) = (Fake.id("set-s"), Fake.id("set-s"), Fake.id("set-s"))
        let newKey = "k1-" + Fake.hex(8)
        let writes: [(UUID, StartWrite)] = [
            (tb, try await Self.start(store, b, Fake.id("set-lead"))),
            (ta, try await Self.start(store, a, fresh, key: newKey)),
            (ta, try await Self.start(store, a, twice, eta: 1)),
            (ta, try await Self.start(store, a, twice, eta: 2)),  // the same ID again in the same batch
            (ta, try await Self.start(store, a, existing)),  // an ID already started
            (ta, try await Self.start(store, a, Fake.id("set-s"), key: taken)),  // a key already used
            (tb, try await Self.start(store, b, other)),
        ]
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in release.wait() } }
        try await eventually("the connection is held") { pool.statistics.idle == 0 && pool.statistics.open == 1 }
        var tasks: [Task<WriteOutcome, any Error>] = []
        for (n, (tenant, write)) in writes.enumerated() {
            tasks.append(Task { try await store.start(tenant: tenant, write) })
            // In order: the first waits for the connection, the others queue behind it.
            try await eventually("start \(n) queued") {
                n == 0 ? pool.statistics.waiting == 1 : committer.queued == n
            }
        }
        release.signal()
        try await holder.value
        let outcomes = try await tasks.asyncValues()
        pool.close()

        // The first start's batch, then one with the six others.
        #expect(committer.statistics == .init(batches: 2, statements: 7, fallbacks: 0))
        // Two iPhones with push-to-start tokens and an Android phone each.
        #expect(outcomes[1] == .written(version: 1, deliveries: 3))
        #expect(outcomes[2] == .written(version: 1, deliveries: 3))
        #expect(outcomes[3] == .alreadyExists)
        #expect(outcomes[4] == .alreadyExists)
        #expect(outcomes[5] == .alreadyExists)
        #expect(outcomes[6] == .written(version: 1, deliveries: 3))
        let db = a.fixture.pool
        func count(_ sql: PostgresQuery) async throws -> Int { try await db.query(sql)[0].decode(Int.self, "n") }
        // The first start of `twice` won, with its own content, deliveries and Android device.
        #expect((try await a.instance(twice)["content_state"] as? [String: Any])?["eta"] as? Int == 1)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(ta) AND instance_id = \(twice)") == 3
        )
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM instance_devices WHERE tenant_id = \(ta) AND instance_id = \(twice)")
                == 1)
        // The existing instance kept its three deliveries, and the key's owner its own.
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(ta) AND instance_id = \(existing)")
                == 3)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(ta) AND key = \(newKey) AND status = 200"
            ) == 1)
        #expect(
            try await count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(ta) AND id LIKE 'set-s%'") == 4)
        #expect(try await b.instance(other)["state"] as? String == "pending")
    }

    @Test("a change or start that loses its race records no Idempotency-Key: a retry with the key is written")
    func lostWritesRecordNoKey() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        let db = w.fixture.pool
        func recorded(_ key: String) async throws -> Int {
            try await db.count(
                "SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(tenant) AND key = \(key)")
        }
        // A change planned, then another writer (a campaign-wide change, another API replica) moves the instance on.
        let instance = Fake.id("lost-change")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let changeKey = "lost-" + Fake.hex(8)
        let change = try await Self.plan(store, tenant, instance, .update, eta: 1, key: changeKey)
        #expect(
            try await db.execute(
                "UPDATE instances SET version = version + 1 WHERE tenant_id = \(tenant) AND id = \(instance)") == 1)
        #expect(try await store.change(tenant: tenant, change) == .versionConflict)
        #expect(try await recorded(changeKey) == 0, "the key of a change that was not written is not recorded")
        let retried = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 1]], headers: ["Idempotency-Key": changeKey])
        #expect(retried.status == 200 && retried.header("Idempotent-Replayed") == nil, "\(retried.text)")
        #expect((try await w.instance(instance)["content_state"] as? [String: Any])?["eta"] as? Int == 1)
        // A start planned, then its instance ID taken by another start.
        let taken = Fake.id("lost-start")
        let startKey = "lost-" + Fake.hex(8)
        let start = try await Self.start(store, w, taken, key: startKey)
        #expect(try await w.start(["instance_id": taken]).status == 200)
        #expect(try await store.start(tenant: tenant, start) == .alreadyExists)
        #expect(try await recorded(startKey) == 0, "the key of a start that was not written is not recorded")
    }

    @Test("an end planned before the activity tokens registered still reaches them")
    func endReachesTokensRegisteredMeanwhile() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        func ends(_ instance: String) async throws -> [String] {
            try await w.fixture.pool.query(
                """
                SELECT token FROM deliveries
                WHERE tenant_id = \(tenant) AND instance_id = \(instance) AND operation = 'end'
                """
            ).map { try $0.decode(String.self, "token") }
        }
        // Planned while no activity token is known; the tokens register before it is written: its plan is out of
        // date, so nothing of it is written, and planned again it ends on them.
        let before = Fake.id("end-race")
        #expect(try await w.start(["instance_id": before, "platform": "ios"]).status == 200)
        try await w.fixture.pool.recordOutcome(tenant: tenant, instance: before, status: "sent")
        let stale = try await Self.plan(store, tenant, before, .end, eta: nil)
        var tokens = try await w.registerActivityTokens(before)
        #expect(try await store.change(tenant: tenant, stale) == .versionConflict)
        let again = try await Self.plan(store, tenant, before, .end, eta: nil)
        guard case .written = try await store.change(tenant: tenant, again) else {
            throw TestFailure("the end was not written")
        }
        var found = try await ends(before)
        #expect(Set(found) == Set(tokens) && found.count == tokens.count, "\(found)")

        // The tokens register while the end is being written: the registration holds the instance's row (as
        // marquee_register_activity_token does), the end's write waits for it, then finds its instance at the
        // version it planned from, and writes. Its statement did not see the tokens, the statement after it does
        // (ChangeWrite.afterwards, migration 0076).
        let during = Fake.id("end-race")
        #expect(try await w.start(["instance_id": during, "platform": "ios"]).status == 200)
        try await w.fixture.pool.recordOutcome(tenant: tenant, instance: during, status: "sent")
        let end = try await Self.plan(store, tenant, during, .end, eta: nil)
        tokens = w.iphones.map { _ in Fake.hex() }
        let registering = try await HeldTransaction.open(
            w.fixture.databaseURL,
            begin: { c in
                _ = try c.query(
                    "SELECT 1 FROM instances WHERE tenant_id = \(tenant) AND id = \(during) FOR NO KEY UPDATE")
            },
            end: { [tokens] c in
                for (iphone, token) in zip(w.iphones, tokens) {
                    try c.execute(
                        """
                        INSERT INTO activity_tokens (tenant_id, instance_id, device_token, token)
                        VALUES (\(tenant), \(during), \(iphone), \(token))
                        """)
                }
            })
        let ending = Task { try await store.change(tenant: tenant, end) }
        try await registering.waitedOn(via: w.fixture.pool, "the end waits for the registration")
        try await registering.commit()
        guard case .written = try await ending.value else { throw TestFailure("the end was not written") }
        found = try await ends(during)
        #expect(Set(found) == Set(tokens) && found.count == tokens.count, "\(found)")
    }

    @Test("a change planned while its instance was pending keeps it active if a push got through meanwhile")
    func changeKeepsSettledState() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let instance = Fake.id("settle-race")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let update = try await Self.plan(store, w.tenant.uuid, instance, .update, eta: 5)
        #expect(update.plan.state == .pending)
        // A worker's start got through: it settles the instance active (DeliveryQueue.settle; no new version).
        #expect(
            try await w.fixture.pool.execute(
                "UPDATE instances SET state = 'active' WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)") == 1)
        guard case .written = try await store.change(tenant: w.tenant.uuid, update) else {
            throw TestFailure("the update was not written")
        }
        #expect(try await w.instance(instance)["state"] as? String == "active")
    }

    @Test("a change planned before its instance was marked expired writes nothing: planned again, it is closed")
    func changeAfterExpiry() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let instance = Fake.id("expiry-race")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let update = try await Self.plan(store, w.tenant.uuid, instance, .update, eta: 5)
        // The instance expires, and is marked so (markExpired leaves the version alone), before the write.
        #expect(
            try await w.fixture.pool.execute(
                """
                UPDATE instances SET expires_at = now() - interval '1 second'
                WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)
                """) == 1)
        try await store.markExpired(tenant: w.tenant.uuid, instanceID: instance)
        #expect(try await store.change(tenant: w.tenant.uuid, update) == .versionConflict)
        #expect(try await w.instance(instance)["state"] as? String == "expired")
        let stored = try await w.fixture.pool.query(
            "SELECT state, version FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
        #expect(try stored[0].decode(String.self, "state") == "expired", "the row keeps its state")
        #expect(try stored[0].decode(Int.self, "version") == 1)
        // Over the API the update is answered as closed.
        let answer = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 6]])
        #expect(answer.status == 409, "\(answer.text)")
    }

    @Test("a change with an Idempotency-Key planned before its instance was marked expired records no key")
    func keyedChangeAfterExpiry() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        let instance = Fake.id("expiry-key")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let key = "expiry-" + Fake.hex(8)
        let update = try await Self.plan(store, tenant, instance, .update, eta: 5, key: key)
        // Another process marks the instance expired (at its version) between the plan and the write.
        #expect(
            try await w.fixture.pool.execute(
                """
                UPDATE instances SET expires_at = now() - interval '1 second'
                WHERE tenant_id = \(tenant) AND id = \(instance)
                """) == 1)
        try await store.markExpired(tenant: tenant, instanceID: instance)
        #expect(try await store.change(tenant: tenant, update) == .versionConflict)
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(tenant) AND key = \(key)") == 0,
            "the key of a change that was not written is not recorded (it would replay a version that never existed)")
        // A retry with the key is planned again, and finds the instance closed.
        let retried = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 5]], headers: ["Idempotency-Key": key])
        expectProblem(retried, 409, "instance-closed")
    }

    @Test("a paced change's replay says what its first answer said: coalesced behind an update a worker took meanwhile")
    func pacedReplayAsAnswered() async throws {
        let w = try await LifecycleTests.world()
        let tenant = w.tenant.uuid
        let paced = try await w.api.call(
            "PUT", "/v1/activity_types/\(w.type)", key: w.tenant.app,
            json: ["attributes_type": "DeliveryAttributes", "min_update_interval_ms": 60_000])
        #expect(paced.status == 200, "\(paced.text)")
        let instance = Fake.id("paced")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        _ = try await w.registerActivityTokens(instance)
        // An update waits in the queue (no worker): nothing went out, so the next one is not paced behind it.
        let first = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 1]])
        #expect(try first.json()["coalesced"] as? Bool == false, "\(first.text)")
        // The next one, with a key, waits for the instance (another writer holds it), and meanwhile a worker takes
        // the first update and sends it: the next one is paced behind it.
        let held = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            _ = try c.query(
                "SELECT 1 FROM instances WHERE tenant_id = \(tenant) AND id = \(instance) FOR NO KEY UPDATE")
        }
        let key = ["Idempotency-Key": "paced-" + Fake.hex(8)]
        func update() async throws -> HTTP.Response {
            try await w.update(["instance_id": instance, "content_state_patch": ["eta": 2]], headers: key)
        }
        let second = Task { try await update() }
        try await held.waitedOn(via: w.fixture.pool, "the keyed update waits for the instance")
        #expect(
            try await w.fixture.pool.execute(
                """
                UPDATE delivery_queue SET sending_until = now() + interval '1 minute'
                WHERE tenant_id = \(tenant) AND instance_id = \(instance) AND operation = 'update'
                """) > 0)
        try await held.commit()
        let answered = try await second.value
        #expect(answered.status == 200, "\(answered.text)")
        #expect(try answered.json()["coalesced"] as? Bool == true, "\(answered.text)")
        let replayed = try await update()
        #expect(replayed.header("Idempotent-Replayed") == "true", "\(replayed.text)")
        #expect(
            try replayed.json()["coalesced"] as? Bool == answered.json()["coalesced"] as? Bool,
            "first: \(answered.text), replay: \(replayed.text)")
    }

    @Test("recording a suppressed no-op's key tells whether it was taken meanwhile (the route then replays it)")
    func noopKeyTaken() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let record = IdempotencyRecord(
            key: "noop-" + Fake.hex(8), requestHash: [1], status: 200, response: .object(["ok": .bool(true)]))
        #expect(try await store.recordIdempotent(tenant: w.tenant.uuid, record))
        #expect(try await !store.recordIdempotent(tenant: w.tenant.uuid, record))
    }

    @Test("a start whose Android device was deleted after it was planned writes nothing; planned again, no push to it")
    func startWithoutDeletedDevice() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let instance = Fake.id("gone-device")
        let start = try await Self.start(store, w, instance)
        #expect(start.plan.androidDevices == [w.pixel])
        // FCM called the phone unregistered meanwhile: the worker deleted it.
        #expect(
            try await w.fixture.pool.execute(
                "DELETE FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel)") == 1)
        // The plan is out of date (its answer would count the phone): nothing of it is written (migration 0087).
        #expect(try await store.start(tenant: w.tenant.uuid, start) == .versionConflict)
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
                == 0)
        let again = try await Self.start(store, w, instance)
        #expect(again.plan.androidDevices.isEmpty)
        #expect(try await store.start(tenant: w.tenant.uuid, again) == .written(version: 1, deliveries: 2))
        #expect(
            try await w.fixture.pool.count(
                """
                SELECT ((SELECT count(*) FROM instance_devices
                         WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance))
                      + (SELECT count(*) FROM delivery_queue
                         WHERE tenant_id = \(w.tenant.uuid) AND device_token = \(w.pixel)))::int AS n
                """) == 0)
    }

    @Test("a start planned before its push-to-start tokens rotated or were retired writes nothing, then uses them")
    func startAfterPushToStartTokensChanged() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        let instance = Fake.id("p2s-changed")
        let start = try await Self.start(store, w, instance)
        #expect(Set(start.plan.deliveries.map(\.token)) == Set(w.pushToStart + [w.pixel]))
        // Meanwhile the first iPhone registered a new push-to-start token (the planned one is retired as rotated),
        // and APNs called the second one's dead (a worker retired it).
        let rotated = Fake.hex()
        let registered = try await w.api.call(
            "PUT", "/v1/people/\(w.person)/devices/\(w.iphones[0])/push_to_start/\(w.type)", key: w.tenant.sdk,
            json: ["token": rotated])
        #expect(registered.status == 200, "\(registered.text)")
        #expect(
            try await w.fixture.pool.execute(
                """
                UPDATE push_to_start_tokens SET status = 'retired', retired_reason = 'Unregistered', retired_at = now()
                WHERE tenant_id = \(tenant) AND device_token = \(w.iphones[1]) AND status = 'active'
                """) == 1)
        // The plan is out of date: nothing of it is written, rather than a start to two dead tokens.
        #expect(try await store.start(tenant: tenant, start) == .versionConflict)
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(tenant) AND id = \(instance)") == 0)
        let again = try await Self.start(store, w, instance)
        #expect(try await store.start(tenant: tenant, again) == .written(version: 1, deliveries: 2))
        let tokens = try await w.fixture.pool.query(
            "SELECT token FROM delivery_queue WHERE tenant_id = \(tenant) AND instance_id = \(instance)")
        #expect(Set(try tokens.map { try $0.decode(String.self, "token") }) == [rotated, w.pixel])
    }

    @Test("a start planned before its Android phone moved to another person writes nothing, then leaves the phone out")
    func startAfterDeviceMoved() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        let instance = Fake.id("moved-device")
        let start = try await Self.start(store, w, instance)
        #expect(start.plan.androidDevices == [w.pixel])
        // Someone else signed in on the phone meanwhile: it is theirs now.
        let moved = try await w.api.call(
            "PUT", "/v1/people/\(Fake.id("bob"))/devices/\(w.pixel)", key: w.tenant.sdk, json: ["platform": "android"])
        #expect(moved.status == 200, "\(moved.text)")
        #expect(try await store.start(tenant: tenant, start) == .versionConflict)
        let again = try await Self.start(store, w, instance)
        #expect(again.plan.androidDevices.isEmpty)
        #expect(try await store.start(tenant: tenant, again) == .written(version: 1, deliveries: 2))
        // Neither a start to the phone nor the phone as a target of the instance's later updates.
        #expect(
            try await w.fixture.pool.count(
                """
                SELECT ((SELECT count(*) FROM instance_devices WHERE tenant_id = \(tenant) AND instance_id = \(instance))
                      + (SELECT count(*) FROM delivery_queue WHERE tenant_id = \(tenant) AND device_token = \(w.pixel))
                       )::int AS n
                """) == 0)
    }

    @Test("an update planned before its targets changed writes nothing; planned again, it goes to the targets now")
    func changeAfterTargetsChanged() async throws {
        let w = try await LifecycleTests.world()
        let (pool, _, store) = try Self.oneConnection(w.fixture.databaseURL)
        defer { pool.close() }
        let tenant = w.tenant.uuid
        let instance = Fake.id("moving-targets")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        var (version, eta): (Int, Int64) = (1, 0)
        /// Plans an update, lets `meanwhile` change the instance's targets (it returns the targets then), writes the
        /// plan (out of date: nothing is written), then plans and writes again: the update's pushes are queued to the
        /// targets now, and to nothing else.
        func update(_ what: Comment, meanwhile: () async throws -> Set<String>) async throws {
            eta += 1
            let stale = try await Self.plan(store, tenant, instance, .update, eta: eta)
            let expected = try await meanwhile()
            #expect(try await store.change(tenant: tenant, stale) == .versionConflict, what)
            eta += 1
            let again = try await Self.plan(store, tenant, instance, .update, eta: eta)
            version = again.plan.version
            #expect(
                try await store.change(tenant: tenant, again)
                    == .written(version: version, deliveries: expected.count), what)
            let queued = try await w.fixture.pool.query(
                """
                SELECT token FROM delivery_queue
                WHERE tenant_id = \(tenant) AND instance_id = \(instance) AND operation = 'update'
                  AND instance_version = \(version)
                """)
            #expect(Set(try queued.map { try $0.decode(String.self, "token") }) == expected, what)
        }
        func post(_ event: String, _ device: String) async throws {
            let r = try await w.api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: w.tenant.sdk,
                json: ["event": event, "device_token": device, "at": Date().timeIntervalSince1970.rounded()])
            #expect(r.status == 202, "\(r.text)")
        }

        // Planned before the activity tokens registered: the Android phone alone (and the instance `failed` if it
        // had none), the iPhones' first update lost.
        var tokens: [String] = []
        try await update("first tokens") {
            tokens = try await w.registerActivityTokens(instance)
            return Set(tokens + [w.pixel])
        }
        // The first iPhone's token rotated: the update went to the retired token, not the new one.
        try await update("rotated") {
            tokens[0] = Fake.hex()
            let r = try await w.api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(w.iphones[0])", key: w.tenant.sdk,
                json: ["token": tokens[0]])
            #expect(r.status == 200, "\(r.text)")
            return Set(tokens + [w.pixel])
        }
        // APNs called the second iPhone's token dead (a worker retired it).
        try await update("retired") {
            let retired = try await w.fixture.pool.execute(
                """
                UPDATE activity_tokens SET status = 'retired', retired_reason = 'Unregistered', retired_at = now()
                WHERE tenant_id = \(tenant) AND instance_id = \(instance) AND token = \(tokens[1])
                """)
            #expect(retired == 1)
            return [tokens[0], w.pixel]
        }
        // The Android phone's user dismissed the notification.
        try await update("dismissed") {
            try await post("dismissed", w.pixel)
            return [tokens[0]]
        }
        // The first iPhone was removed (its pushes go with it, migration 0083: a push queued after would not).
        try await update("removed") {
            let removed = try await w.fixture.pool.execute(
                "DELETE FROM devices WHERE tenant_id = \(tenant) AND token = \(w.iphones[0])")
            #expect(removed == 1)
            return []
        }
        #expect(try await w.instance(instance).string("state") == "failed")
    }

    @Test("a worker's settle deletes devices before it retires tokens, in the order a start holds them")
    func settleTakesDevicesFirst() {
        // A start holds its devices, then its push-to-start tokens until it commits: a settle retiring an iPhone's
        // token, then deleting the same person's Android phone, waited for the start while the start waited for it.
        let tenant = UUID()
        let retire = [
            TokenRetirement(
                tenantID: tenant, kind: .pushToStart, deviceToken: "iphone", token: "p2s", reason: "Unregistered",
                unregisteredAt: nil),
            TokenRetirement(
                tenantID: tenant, kind: .activity, deviceToken: "iphone", token: "activity", reason: "BadDeviceToken",
                unregisteredAt: nil),
            TokenRetirement(
                tenantID: tenant, kind: .fcm, deviceToken: "pixel", token: "pixel", reason: "UNREGISTERED",
                unregisteredAt: nil),
        ]
        let statements = DeliveryQueue.settleStatements(sentTo: [], retire: retire).map(\.sql)
        let devices = statements.firstIndex { $0.contains("DELETE FROM devices") }
        let tokens = statements.firstIndex { $0.contains("push_to_start_tokens") || $0.contains("activity_tokens") }
        #expect(devices != nil && tokens != nil && devices! < tokens!, "\(statements)")
    }

    static func start(
        _ store: LiveActivityStore, _ w: LifecycleTests.World, _ instance: String, eta: Int64 = 0, key: String? = nil
    ) async throws -> StartWrite {
        let tenant = w.tenant.uuid
        let context = try await store.startContext(
            tenant: tenant, activityType: w.type, personID: w.person, email: nil, instanceID: instance,
            idempotencyKey: nil)
        let request = LifecyclePlanner.StartRequest(
            instanceID: instance, activityType: w.type, attributes: .object(["order": .string("42")]),
            contentState: .object(["status": .string("preparing"), "eta": .int(eta)]),
            options: StoredOptions(alert: LiveActivityAlert(title: "Order 42", body: "Preparing")),
            expiresAt: Date().addingTimeInterval(3600))
        let decision = try LifecyclePlanner.planStart(
            request, facts: .init(activityType: context.activityType, candidates: context.candidates), now: Date(),
            newID: { UUID() })
        guard case .write(let plan) = decision else { throw TestFailure("not a write: \(decision)") }
        let response = JSONValue.object(["instance_id": .string(instance)])
        return StartWrite(
            request: request, plan: plan, personID: w.person, personEmail: nil, response: response,
            idempotency: key.map { IdempotencyRecord(key: $0, requestHash: [4, 5], status: 200, response: response) })
    }

    /// A store whose group committer (one writer) has a pool of one connection, so that a test holding that connection
    /// makes writes queue into one batch.
    static func oneConnection(_ url: String) throws -> (PostgresPool, GroupCommitter, LiveActivityStore) {
        let pool = PostgresPool(
            try PostgresConfiguration(url: url), options: .init(maxConnections: 1, acquireTimeout: .seconds(60)))
        let committer = GroupCommitter(
            pool: pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil))
        return (pool, committer, LiveActivityStore(database: TenantDatabase(pool: pool), committer: committer))
    }

    /// A change of `instance` planned from its stored state (or on top of `after`, as the API plans changes of one
    /// instance that arrive together).
    static func plan(
        _ store: LiveActivityStore, _ tenant: UUID, _ instance: String, _ operation: LifecyclePlanner.Operation,
        eta: Int64?, after: ChangeWrite? = nil, key: String? = nil
    ) async throws -> ChangeWrite {
        let context = try await store.changeContext(tenant: tenant, instanceID: instance, idempotencyKey: nil)
        var record = try #require(context.instance)
        let now = Date()
        if let after { record.apply(after.plan, operation: after.operation, now: now) }
        let request = LifecyclePlanner.ChangeRequest(
            operation: operation, content: eta.map { ContentChange.patch(.object(["eta": .int($0)])) } ?? .none)
        let decision = try LifecyclePlanner.planChange(
            request,
            facts: .init(
                instance: record, activityType: try #require(context.activityType), targets: context.targets,
                channel: context.channel),
            now: now, newID: { UUID() })
        guard case .write(let plan) = decision else { throw TestFailure("not a write: \(decision)") }
        return ChangeWrite(
            instanceID: instance, operation: operation, plan: plan,
            idempotency: key.map {
                IdempotencyRecord(key: $0, requestHash: [1, 2, 3], status: 200, response: .object(["ok": .bool(true)]))
            })
    }
}

extension Array {
    /// The values of tasks, in order.
    func asyncValues<T: Sendable>() async throws -> [T] where Element == Task<T, any Error> {
        var values: [T] = []
        for task in self { values.append(try await task.value) }
        return values
    }
}
