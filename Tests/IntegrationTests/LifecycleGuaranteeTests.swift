import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Synchronization
import Testing

/// No push after `end`, no lost end, order per token, snapshots (issue 9, section 3): the rows the API and the queue
/// leave behind, checked without a worker.
@Suite("Lifecycle guarantees")
struct LifecycleGuaranteeTests {
    typealias World = LifecycleTests.World

    static func statuses(_ w: World, _ instance: String) async throws -> [(String, String, String)] {
        let rows = try await w.fixture.pool.query(
            """
            SELECT operation, token, status FROM deliveries
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) ORDER BY id
            """)
        return try rows.map {
            (
                try $0.decode(String.self, "operation"), try $0.decode(String.self, "token"),
                try $0.decode(String.self, "status")
            )
        }
    }

    @Test("end cancels every unsent delivery of the instance, queued starts included, in the same write")
    func endSupersedesQueuedStart() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("ghost")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let end = try await w.end(["instance_id": instance])
        #expect(end.status == 200, "\(end.text)")
        #expect(try end.json().string("state") == "ended")
        let rows = try await Self.statuses(w, instance)
        let starts = rows.filter { $0.0 == "start" }
        #expect(starts.count == 3)
        #expect(starts.allSatisfy { $0.2 == "superseded" }, "\(rows)")
        #expect(!rows.contains { $0.2 == "queued" && $0.0 != "end" }, "\(rows)")
    }

    @Test("an end that finds no activity token after a sent start is kept, and sent when the token registers")
    func pendingEndWaitsForActivityToken() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("late-token")
        #expect(try await w.start(["instance_id": instance, "platform": "ios"]).status == 200)
        // The push-to-start starts went out (as a worker records them).
        try await w.fixture.pool.recordOutcome(tenant: w.tenant.uuid, instance: instance, status: "sent")
        let end = try await w.end(["instance_id": instance])
        #expect(end.status == 200, "\(end.text)")
        #expect(try end.json().string("state") == "ended", "not failed: the end is kept")
        #expect(try await w.instance(instance).string("state") == "ended")
        // The activity tokens arrive after the end: each gets the end, once.
        let tokens = try await w.registerActivityTokens(instance)
        let rows = try await Self.statuses(w, instance)
        let ends = rows.filter { $0.0 == "end" }
        #expect(Set(ends.map(\.1)) == Set(tokens), "\(rows)")
        #expect(ends.allSatisfy { $0.2 == "queued" })
        // The end carries the end's own version timestamp.
        let stamps = try await w.fixture.pool.query(
            """
            SELECT d.content_timestamp, i.content_timestamp AS current FROM deliveries d
            JOIN instances i ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
            WHERE d.tenant_id = \(w.tenant.uuid) AND d.instance_id = \(instance) AND d.operation = 'end'
            """)
        #expect(
            try stamps.allSatisfy { try $0.decode(Int64.self, "content_timestamp") == $0.decode(Int64.self, "current") }
        )
        // The same token reported again (an app relaunch) gets no second end: one was already queued for it.
        for (iphone, token) in zip(w.iphones, tokens) {
            let again = try await w.api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(iphone)", key: w.tenant.sdk, json: ["token": token])
            #expect(again.status == 200, "\(again.text)")
        }
        #expect(try await Self.statuses(w, instance).filter { $0.0 == "end" }.count == tokens.count)
        _ = try await w.registerActivityTokens(instance)
        #expect(
            try await Self.statuses(w, instance).filter { $0.0 == "end" }.count == 2 * tokens.count,
            "a rotated token gets the end too")
    }

    @Test("catch-up ends: at most three to a device whatever it registers, and an Android device's through FCM")
    func catchUpEndsBounded() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("late-tokens")
        #expect(try await w.start(["instance_id": instance, "platform": "ios"]).status == 200)
        try await w.fixture.pool.recordOutcome(tenant: w.tenant.uuid, instance: instance, status: "sent")
        #expect(try await w.end(["instance_id": instance]).status == 200)
        // One iPhone registers token after token (a client looping with the public sdk key): three ends, no more.
        for _ in 0..<6 {
            let r = try await w.api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(w.iphones[0])", key: w.tenant.sdk,
                json: ["token": Fake.hex()])
            #expect(r.status == 200, "\(r.text)")
        }
        // The Android phone registers an activity token after the end: its end goes through FCM, as the planner
        // sends an Android device's activity token.
        let pixelToken = Fake.fcm()
        let r = try await w.api.call(
            "PUT", "/v1/live_notifications/\(instance)/tokens/\(w.pixel)", key: w.tenant.sdk,
            json: ["token": pixelToken])
        #expect(r.status == 200, "\(r.text)")
        let ends = try await w.fixture.pool.query(
            """
            SELECT device_token, provider, token_kind, token FROM deliveries
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) AND operation = 'end'
            """)
        let rows = try ends.map {
            (
                device: try $0.decode(String.self, "device_token"), provider: try $0.decode(String.self, "provider"),
                kind: try $0.decode(String.self, "token_kind"), token: try $0.decode(String.self, "token")
            )
        }
        #expect(rows.filter { $0.device == w.iphones[0] }.count == 3, "\(rows)")
        #expect(rows.filter { $0.device == w.iphones[0] }.allSatisfy { $0.provider == "apns" && $0.kind == "activity" })
        let pixel = rows.filter { $0.device == w.pixel }
        #expect(pixel.count == 1 && pixel.first?.token == pixelToken, "\(rows)")
        #expect(pixel.first?.provider == "fcm" && pixel.first?.kind == "fcm", "\(rows)")
    }

    @Test("a token registering while an end is being written waits for it, then gets the end")
    func registrationWaitsForEnd() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("end-lock")
        #expect(try await w.start(["instance_id": instance, "platform": "ios"]).status == 200)
        try await w.fixture.pool.recordOutcome(tenant: w.tenant.uuid, instance: instance, status: "sent")
        // An end being written: its transaction holds the instance's row until it commits, as the API's does.
        let ending = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            try c.execute(
                """
                UPDATE instances SET state = 'ended', ended_at = now(), pending_end = true, version = version + 1
                WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)
                """)
        }
        let registering = Task { try await w.registerActivityTokens(instance) }
        // The registration waits for the end's transaction rather than reading the instance as still open.
        try await ending.waitedOn(via: w.fixture.pool, "the registration waits for the end")
        try await ending.commit()
        let tokens = try await registering.value
        let ends = try await Self.statuses(w, instance).filter { $0.0 == "end" }
        #expect(Set(ends.map(\.1)) == Set(tokens) && ends.count == tokens.count, "\(ends)")
    }

    @Test("a device event waits for the device's move to another person, then is refused: nothing joins it back")
    func eventWaitsForDeviceMove() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("moving")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let buyer = Fake.id("buyer")
        #expect(
            try await w.api.call("PUT", "/v1/people/\(buyer)", key: w.tenant.app, json: [String: Any]()).status == 200)
        // The Android phone changes hands: the move's transaction holds the device (its trigger, migration 0086, has
        // swept the previous person's device states) while the phone reports an event of the previous person's
        // activity.
        let moving = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            try c.execute(
                "UPDATE devices SET person_id = \(buyer) WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel)")
        }
        let reporting = Task {
            try await w.api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: w.tenant.sdk,
                json: ["event": "started", "device_token": w.pixel, "at": Date().timeIntervalSince1970])
        }
        try await moving.waitedOn(via: w.fixture.pool, "the event waits for the move")
        try await moving.commit()
        let reported = try await reporting.value
        expectProblem(reported, 404, "not-found")
        let states = try await w.fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM instance_devices
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) AND device_token = \(w.pixel)
            """)
        #expect(states == 0, "the previous person's activity would reach the phone")
    }

    @Test("a person erased while a start of theirs is being written keeps nothing of it")
    func erasureWaitsForStart() async throws {
        // Not in the shared fixture: there, another test's start failing the statement this start shares (an ID
        // taken, a device gone) rolls the batch back and writes this start again alone, after the erasure (which
        // the rollback let through); then it is a start of someone unknown, and its device-less instance stays.
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("erased")
        // Something holds the Android phone (as a registration's write would): the start's write waits for it, its
        // instance written, and the person's erasure begins meanwhile.
        let holding = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            _ = try c.query(
                "SELECT 1 FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel) FOR UPDATE")
        }
        let starting = Task { try await w.start(["instance_id": instance]) }
        try await holding.waitedOn(via: w.fixture.pool, "the start waits for the phone")
        let erasing = Task { try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app) }
        try await holding.waitedOn(by: 2, via: w.fixture.pool, "the erasure waits too")
        try await holding.commit()
        let started = try await starting.value
        #expect(started.status == 200, "\(started.text)")
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        // Neither the instance nor a push to the person's devices outlives the erasure.
        let left = try await w.fixture.pool.count(
            """
            SELECT ((SELECT count(*) FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance))
                  + (SELECT count(*) FROM delivery_queue WHERE tenant_id = \(w.tenant.uuid)))::int AS n
            """)
        #expect(left == 0)
    }

    @Test("a start whose device goes before its write is planned again: its answer names only the targets it queued")
    func startPlannedAgainWhenATargetGoes() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("replanned")
        // The Android phone is being removed (FCM called it unregistered): the start, planned with it, waits for the
        // removal's transaction in its write, then finds the phone gone.
        let removing = try await HeldTransaction.open(
            w.fixture.databaseURL,
            begin: { c in
                _ = try c.query(
                    "SELECT 1 FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel) FOR UPDATE")
            },
            end: { c in
                try c.execute("DELETE FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel)")
            })
        let starting = Task { try await w.start(["instance_id": instance]) }
        try await removing.waitedOn(via: w.fixture.pool, "the start waits for the removal")
        try await removing.commit()
        let started = try await starting.value
        #expect(started.status == 200, "\(started.text)")
        let queued = try await w.fixture.pool.count(
            "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)"
        )
        #expect(queued == 2, "the two iPhones")
        #expect(try started.json()["targets"] as? Int == queued, "\(started.text)")
        // The replayed answer is the same.
        #expect(try await w.start(["instance_id": instance]).json()["targets"] as? Int == queued)
    }

    @Test("a start whose push-to-start token rotates while it waits to write goes to the new token")
    func startFollowsARotatedPushToStartToken() async throws {
        let w = try await LifecycleTests.world()
        let tenant = w.tenant.uuid
        let instance = Fake.id("rotated")
        let (iphone, old, new) = (w.iphones[0], w.pushToStart[0], Fake.hex())
        // The iPhone registers a new push-to-start token, as marquee_register_push_to_start does: the device first,
        // then the old token retired and the new one stored. The start, planned with the old token, waits for the
        // device in its write.
        let rotating = try await HeldTransaction.open(
            w.fixture.databaseURL,
            begin: { c in
                _ = try c.query("SELECT 1 FROM devices WHERE tenant_id = \(tenant) AND token = \(iphone) FOR UPDATE")
            },
            end: { c in
                try c.execute(
                    """
                    UPDATE push_to_start_tokens SET status = 'retired', retired_reason = 'rotated', retired_at = now()
                    WHERE tenant_id = \(tenant) AND device_token = \(iphone) AND token = \(old)
                    """)
                try c.execute(
                    """
                    INSERT INTO push_to_start_tokens (tenant_id, device_token, activity_type, token)
                    VALUES (\(tenant), \(iphone), \(w.type), \(new))
                    """)
            })
        let starting = Task { try await w.start(["instance_id": instance]) }
        try await rotating.waitedOn(via: w.fixture.pool, "the start waits for the registration")
        try await rotating.commit()
        let started = try await starting.value
        #expect(started.status == 200, "\(started.text)")
        #expect(try started.json()["targets"] as? Int == 3, "\(started.text)")
        let tokens = try await w.fixture.pool.query(
            "SELECT token FROM delivery_queue WHERE tenant_id = \(tenant) AND instance_id = \(instance)")
        #expect(Set(try tokens.map { try $0.decode(String.self, "token") }) == [new, w.pushToStart[1], w.pixel])
    }

    @Test("a person erased while pushes of theirs are being sent keeps no record of them")
    func erasureWaitsForSend() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("sending")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        // A worker's claim, as it holds the pushes while it sends them, then records them (queue rows deleted,
        // history rows written) and commits.
        let sending = try await HeldTransaction.open(
            w.fixture.databaseURL,
            begin: { c in
                _ = try c.query(
                    "SELECT 1 FROM delivery_queue WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) FOR UPDATE"
                )
            },
            end: { c in
                try c.execute(
                    """
                    WITH gone AS (
                        DELETE FROM delivery_queue d WHERE d.tenant_id = \(w.tenant.uuid) AND d.instance_id = \(instance)
                        RETURNING d
                    )
                    INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'sent') h
                    """)
            })
        let erasing = Task { try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app) }
        try await sending.waitedOn(via: w.fixture.pool, "the erasure waits for the send")
        try await sending.commit()
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM delivery_history WHERE tenant_id = \(w.tenant.uuid)") == 0)
    }

    @Test("an update that comes while a person is erased is not sent and recorded after their history went")
    func erasureHoldsInstances() async throws {
        // The holding fixture: the erasure is stopped at a table lock no other test should meet.
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("erased")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        // A worker's claim, as it sends what is due and records it sent.
        func send() async throws -> Int {
            try await DeliveryQueue(pool: w.fixture.pool).claim(
                limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]
            ) { batch in
                ClaimResults(
                    results: batch.map {
                        DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                    })
            }
        }
        #expect(try await send() == 3, "the start went out")
        // The erasure stopped midway, where it deletes the metrics.
        let metrics = try await HeldTransaction.open(
            w.fixture.databaseURL, begin: { c in try c.execute("LOCK delivery_metrics IN SHARE MODE") })
        let erasing = Task { try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app) }
        try await metrics.waitedOn(via: w.fixture.pool, "the erasure reaches the metrics")
        // An update of the person's instance meanwhile: it waits for the erasure, or it is written (and then a worker
        // claims, sends and records it).
        let answered = Mutex(false)
        let updating = Task {
            defer { answered.withLock { $0 = true } }
            return try await w.update(["instance_id": instance, "content_state": ["status": "ready", "eta": 0]])
        }
        try await eventually("the update is written, or waits for the erasure") {
            if answered.withLock({ $0 }) { return true }
            return try await metrics.waiting(via: w.fixture.pool) >= 2
        }
        if answered.withLock({ $0 }) { #expect(try await send() == 1, "the update went out") }
        try await metrics.commit()
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        let updated = try await updating.value
        expectProblem(updated, 404, "not-found")
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM deliveries WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)"
            )
                == 0, "no delivery of the erased instance is left, queued or recorded")
    }

    @Test("a deleted instance takes its device states and tokens with it: its ID used again reaches only the new")
    func deletedInstanceLeavesNoTargets() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("reused")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        _ = try await w.registerActivityTokens(instance)
        let db = w.fixture.pool
        func left() async throws -> Int {
            try await db.count(
                """
                SELECT ((SELECT count(*) FROM instance_devices WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance))
                      + (SELECT count(*) FROM activity_tokens WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)))::int AS n
                """)
        }
        #expect(try await left() == 3, "the Android phone's state and the two iPhones' tokens")
        // Retention's delete (0020), as it removes an instance past its time.
        #expect(
            try await db.execute("DELETE FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)") == 1)
        #expect(try await left() == 0)
        // The ID started again for another person (no devices): nothing of the first person's is targeted.
        #expect(
            try await w.api.call("PUT", "/v1/people/other-\(instance)", key: w.tenant.sdk, json: [:]).status == 200)
        let again = try await w.start(["instance_id": instance, "identifiers": ["id": "other-\(instance)"]])
        #expect(again.status == 200, "\(again.text)")
        let ended = try await w.end(["instance_id": instance])
        #expect(ended.status == 200, "\(ended.text)")
        #expect(try await Self.statuses(w, instance).isEmpty, "no push to the first person's phones")
    }

    @Test("an ended instance stays ended, whatever a later write sets")
    func endedIsFinal() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("final")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        #expect(try await w.end(["instance_id": instance]).status == 200)
        for state in ["active", "pending", "failed"] {
            try await w.fixture.pool.execute(
                "UPDATE instances SET state = \(state) WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
            #expect(try await w.instance(instance).string("state") == "ended")
        }
    }

    @Test("a queued start keeps its own alert and attributes when an update comes before it is sent")
    func startKeepsItsSnapshot() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("snapshot")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let update = try await w.update([
            "instance_id": instance, "content_state": ["status": "on its way", "eta": 60],
            "attributes": ["order": "43"],
        ])
        #expect(update.status == 200, "\(update.text)")
        let rows = try await w.fixture.pool.query(
            """
            SELECT operation, attributes, content_state, options, content_timestamp FROM deliveries
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) AND operation = 'start'
            """)
        #expect(rows.count == 3)
        for row in rows {
            let options = try row.decode(JSONValue.self, "options")
            #expect(options["alert"]?["title"]?.stringValue == "Order 42", "\(options)")
            #expect(try row.decode(JSONValue.self, "attributes")["order"]?.stringValue == "42")
            #expect(try row.decode(JSONValue.self, "content_state")["status"]?.stringValue == "preparing")
        }
    }

    @Test("a retry of version N is superseded when N+1 is queued for the same token")
    func retryDoesNotOvertakeNewerVersion() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("order")
        #expect(try await w.start(["instance_id": instance, "platform": "android"]).status == 200)
        // A worker holds the start to the Android phone (its claim's row lock)…
        let queue = DeliveryQueue(pool: w.fixture.pool)
        let claimed = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [w.tenant.uuid]) { batch in
            // …an update is queued for the same token meanwhile: it skips the held start rather than wait for it…
            let update = try? await w.update(["instance_id": instance, "content_state": ["status": "ready", "eta": 0]])
            #expect(update?.status == 200, "\(update?.text ?? "no answer")")
            // …and the start fails with a retryable error: it must not be sent after the update.
            return ClaimResults(
                results: batch.map {
                    DeliveryResult(
                        tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .queued,
                        reason: "Unavailable",
                        retryDelay: .seconds(1))
                })
        }
        #expect(claimed == 1)
        let rows = try await Self.statuses(w, instance)
        #expect(rows.first { $0.0 == "start" }?.2 == "superseded", "\(rows)")
        #expect(rows.first { $0.0 == "update" }?.2 == "queued", "\(rows)")
    }
}
