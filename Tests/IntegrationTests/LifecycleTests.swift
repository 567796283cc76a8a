import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// Start / update / end against the real server and database: the rules as a client sees them, and the outbox rows
/// they leave behind.
@Suite("Live activity lifecycle")
struct LifecycleTests {
    /// A tenant with an activity type, a person with two iPhones (push-to-start tokens) and one Android phone.
    struct World {
        var fixture: RegistryFixture.Running
        var tenant: TestTenant
        var type: String
        var person: String
        var iphones: [String]
        var pushToStart: [String]
        var pixel: String
        var api: API { fixture.api }

        func start(_ extra: [String: Any] = [:], headers: [String: String] = [:]) async throws -> HTTP.Response {
            var body: [String: Any] = [
                "identifiers": ["id": person], "notification_type": type, "attributes": ["order": "42"],
                "content_state": ["status": "preparing", "eta": 600],
                "push_payload": ["alert": ["title": "Order 42", "body": "Preparing"]],
            ]
            body.merge(extra) { _, new in new }
            return try await api.call(
                "POST", "/v1/live_notifications/start", key: tenant.app, json: body, headers: headers)
        }

        func update(_ body: [String: Any], headers: [String: String] = [:]) async throws -> HTTP.Response {
            try await api.call("POST", "/v1/live_notifications/update", key: tenant.app, json: body, headers: headers)
        }

        func end(_ body: [String: Any]) async throws -> HTTP.Response {
            try await api.call("POST", "/v1/live_notifications/end", key: tenant.app, json: body)
        }

        /// Registers an activity token for every iPhone, as the SDK does once the activity runs.
        func registerActivityTokens(_ instance: String) async throws -> [String] {
            var tokens: [String] = []
            for iphone in iphones {
                let token = Fake.hex()
                let r = try await api.call(
                    "PUT", "/v1/live_notifications/\(instance)/tokens/\(iphone)", key: tenant.sdk,
                    json: ["token": token])
                guard r.status == 200 else { throw TestFailure("token: \(r.text)") }
                tokens.append(token)
            }
            return tokens
        }

        func deliveries(_ instance: String) async throws -> [[String: Any]] {
            let r = try await api.call(
                "GET", "/v1/live_notifications/\(instance)/deliveries?limit=200", key: tenant.app)
            guard r.status == 200 else { throw TestFailure("deliveries: \(r.text)") }
            return try r.json().array("data")
        }

        func instance(_ id: String) async throws -> [String: Any] {
            let r = try await api.call("GET", "/v1/live_notifications/\(id)", key: tenant.app)
            guard r.status == 200 else { throw TestFailure("get: \(r.text)") }
            return try r.json()
        }
    }

    static func world(
        schema: [String: Any]? = nil, dateFields: [String: String] = [:], profile: String = "marquee",
        fixture shared: RegistryFixture = .shared
    ) async throws -> World {
        let fixture = try await shared.running()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let type = Fake.activityType()
        var typeBody: [String: Any] = [
            "attributes_type": "DeliveryAttributes", "date_fields": dateFields, "payload_profile": profile,
        ]
        if let schema { typeBody["content_state_schema"] = schema }
        let created = try await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: typeBody)
        guard created.status == 201 else { throw TestFailure("type: \(created.text)") }
        let person = Fake.id("ann")
        var iphones: [String] = []
        var pushToStart: [String] = []
        for _ in 0..<2 {
            let iphone = Fake.hex()
            let token = Fake.hex()
            _ = try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(iphone)", key: tenant.sdk, json: ["platform": "ios"])
            let r = try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(iphone)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": token])
            guard r.status == 200 else { throw TestFailure("push-to-start: \(r.text)") }
            iphones.append(iphone)
            pushToStart.append(token)
        }
        let pixel = Fake.fcm()
        _ = try await api.call(
            "PUT", "/v1/people/\(person)/devices/\(pixel)", key: tenant.sdk, json: ["platform": "android"])
        return World(
            fixture: fixture, tenant: tenant, type: type, person: person, iphones: iphones, pushToStart: pushToStart,
            pixel: pixel)
    }

    @Test("a start for a person with two iPhones and one Android phone queues three deliveries with the instance")
    func startFansOut() async throws {
        let w = try await Self.world()
        let instance = Fake.id("order")
        let r = try await w.start(["instance_id": instance])
        #expect(r.status == 200, "\(r.text)")
        let body = try r.json()
        #expect(body["instance_id"] as? String == instance)
        #expect(body["state"] as? String == "pending")
        #expect(body["targets"] as? Int == 3)
        let deliveries = try await w.deliveries(instance)
        #expect(deliveries.count == 3)
        #expect(Set(deliveries.compactMap { $0.string("token_kind") }) == ["push_to_start", "fcm"])
        #expect(deliveries.allSatisfy { $0.string("status") == "queued" && $0.string("operation") == "start" })
        #expect(deliveries.allSatisfy { ($0.string("id") ?? "").count == 26 }, "delivery IDs are ULIDs")
        // The rows hold the real tokens the worker will use.
        let tokens = try await w.fixture.pool.query(
            "SELECT token FROM deliveries WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)")
        #expect(Set(try tokens.map { try $0.decode(String.self, "token") }) == Set(w.pushToStart + [w.pixel]))
        let got = try await w.instance(instance)
        #expect(got.string("state") == "pending")
        #expect((got.object("person"))?["id"] as? String == w.person)
        #expect(got.object("last_delivery")?["operation"] as? String == "start")
    }

    @Test("a failure inside the start's transaction leaves neither the instance nor any delivery")
    func startIsAtomic() async throws {
        let w = try await Self.world()
        let instance = Fake.id("atomic")
        // A trigger that fails the third delivery row of this instance, after the instance and two rows are written.
        let fn = "fail_" + Fake.hex(8)
        try await w.fixture.pool.execute(
            PostgresQuery(
                unsafeSQL: """
                    CREATE FUNCTION \(fn)() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN
                        IF NEW.instance_id = '\(instance)' AND NEW.token = '\(w.pixel)' THEN
                            RAISE EXCEPTION 'forced failure';
                        END IF;
                        RETURN NEW;
                    END $$;
                    CREATE TRIGGER \(fn) BEFORE INSERT ON delivery_queue FOR EACH ROW EXECUTE FUNCTION \(fn)();
                    """))
        let r = try await w.start(["instance_id": instance])
        try await w.fixture.pool.execute(PostgresQuery(unsafeSQL: "DROP TRIGGER \(fn) ON delivery_queue"))
        #expect(r.status == 500, "\(r.text)")
        #expect(!r.text.contains("forced failure"), "500s carry only the request ID")
        let counts = try await w.fixture.pool.query(
            """
            SELECT (SELECT count(*)::int FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)) AS i,
                   (SELECT count(*)::int FROM deliveries WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)) AS d
            """)
        #expect(try counts[0].decode(Int.self, "i") == 0)
        #expect(try counts[0].decode(Int.self, "d") == 0)
        // And the same request goes through once the fault is gone.
        #expect(try await w.start(["instance_id": instance]).status == 200)
    }

    @Test("content_state_patch merges (RFC 7396); full content_state replaces; versions and timestamps increase")
    func mergePatch() async throws {
        let w = try await Self.world()
        let instance = Fake.id("merge")
        _ = try await w.start([
            "instance_id": instance, "content_state": ["status": "preparing", "eta": 600, "driver": ["name": "Bo"]],
        ])
        _ = try await w.registerActivityTokens(instance)
        let r = try await w.update([
            "instance_id": instance, "content_state_patch": ["eta": 300, "driver": ["name": NSNull(), "car": "red"]],
        ])
        #expect(r.status == 200, "\(r.text)")
        #expect(try r.json()["version"] as? Int == 2)
        #expect(try r.json()["targets"] as? Int == 3, "two activity tokens and the Android phone")
        var state = try await w.instance(instance).object("content_state") ?? [:]
        #expect(state["status"] as? String == "preparing")
        #expect(state["eta"] as? Int == 300)
        #expect(state["driver"] as? [String: String] == ["car": "red"])
        _ = try await w.update(["instance_id": instance, "content_state": ["status": "delivered"]])
        state = try await w.instance(instance).object("content_state") ?? [:]
        #expect(state.count == 1 && state["status"] as? String == "delivered")
        let both = try await w.update([
            "instance_id": instance, "content_state": ["a": 1], "content_state_patch": ["b": 2],
        ])
        expectProblem(both, 422, "invalid-field", field: "content_state_patch")
        let timestamps = try await w.fixture.pool.query(
            "SELECT content_timestamp, version FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
        #expect(try timestamps[0].decode(Int.self, "version") == 3)
    }

    @Test("an update that changes nothing is suppressed and queues nothing")
    func noOpSuppressed() async throws {
        let w = try await Self.world()
        let instance = Fake.id("noop")
        _ = try await w.start(["instance_id": instance])
        _ = try await w.registerActivityTokens(instance)
        let first = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 100]])
        #expect(try first.json()["suppressed"] as? Bool == false)
        let before = try await w.deliveries(instance).count
        let same = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 100]])
        #expect(same.status == 200)
        #expect(try same.json()["suppressed"] as? Bool == true)
        #expect(try await w.deliveries(instance).count == before)
        // The same state with an alert is not a no-op: the alert must be shown.
        let alerted = try await w.update([
            "instance_id": instance, "content_state_patch": ["eta": 100],
            "push_payload": ["alert": ["title": "Still", "body": "coming"]],
        ])
        #expect(try alerted.json()["suppressed"] as? Bool == false)
        #expect(try await w.deliveries(instance).count > before)
    }

    @Test("a schema violation answers 422 with a JSON pointer to the value")
    func schemaViolation() async throws {
        let w = try await Self.world(schema: [
            "type": "object", "required": ["status"],
            "properties": [
                "status": ["type": "string", "enum": ["preparing", "moving"]],
                "stops": ["type": "array", "items": ["type": "object", "properties": ["n": ["type": "integer"]]]],
            ],
        ])
        let bad = try await w.start(["content_state": ["status": "lost"]])
        expectProblem(bad, 422, "schema-violation", field: "content_state/status")
        let nested = try await w.start(["content_state": ["status": "moving", "stops": [["n": 1], ["n": "two"]]]])
        expectProblem(nested, 422, "schema-violation", field: "content_state/stops/1/n")
        let instance = Fake.id("schema")
        #expect(try await w.start(["instance_id": instance, "content_state": ["status": "moving"]]).status == 200)
        let patch = try await w.update(["instance_id": instance, "content_state_patch": ["status": NSNull()]])
        expectProblem(patch, 422, "schema-violation", field: "content_state/status")
    }

    @Test("date fields are stored in the type's encoding, from epoch seconds or ISO 8601")
    func dateEncodings() async throws {
        let w = try await Self.world(dateFields: [
            "/eta": "apple_reference", "/placed": "epoch_seconds", "/due": "iso8601",
        ])
        let instance = Fake.id("dates")
        let r = try await w.start([
            "instance_id": instance,
            "content_state": [
                "eta": "2026-01-01T00:00:00Z", "placed": "2026-01-01T01:00:00+01:00", "due": 1_767_225_600,
            ],
        ])
        #expect(r.status == 200, "\(r.text)")
        let state = try await w.instance(instance).object("content_state") ?? [:]
        #expect(state["eta"] as? Int == 1_767_225_600 - 978_307_200)
        #expect(state["placed"] as? Int == 1_767_225_600)
        #expect(state["due"] as? String == "2026-01-01T00:00:00Z")
        _ = try await w.registerActivityTokens(instance)
        // A patch brings dates in API form; only the patch is encoded, the stored values stay as they are.
        _ = try await w.update(["instance_id": instance, "content_state_patch": ["due": "2026-01-02T00:00:00Z"]])
        let after = try await w.instance(instance).object("content_state") ?? [:]
        #expect(after["eta"] as? Int == 1_767_225_600 - 978_307_200)
        #expect(after["due"] as? String == "2026-01-02T00:00:00Z")
        let bad = try await w.start(["content_state": ["eta": "next tuesday"]])
        expectProblem(bad, 422, "invalid-field", field: "content_state/eta")
    }

    @Test("a stale date in the past is not forwarded and is reported in warnings")
    func pastStaleDate() async throws {
        let w = try await Self.world()
        let instance = Fake.id("stale")
        let r = try await w.start(["instance_id": instance, "stale_date": Date().timeIntervalSince1970 - 60])
        #expect(r.status == 200)
        #expect(try r.json()["warnings"] as? [String] == ["stale_date_in_past"])
        let options = try await w.fixture.pool.query(
            "SELECT options FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
        #expect(!(try options[0].decode(PostgresJSON.self, "options").string.contains("stale_date")))
        let future = try await w.start(["stale_date": Date().timeIntervalSince1970 + 600])
        #expect(try future.json()["warnings"] as? [String] == [])
    }

    @Test("after end, update and end answer 409; an expired instance answers 409 too")
    func closedInstances() async throws {
        let w = try await Self.world()
        let instance = Fake.id("closed")
        _ = try await w.start(["instance_id": instance])
        _ = try await w.registerActivityTokens(instance)
        let ended = try await w.end(["instance_id": instance, "dismissal_policy": "immediate"])
        #expect(ended.status == 200, "\(ended.text)")
        #expect(try ended.json()["state"] as? String == "ended")
        expectProblem(
            try await w.update(["instance_id": instance, "content_state_patch": ["eta": 1]]), 409, "instance-closed")
        expectProblem(try await w.end(["instance_id": instance]), 409, "instance-closed")
        #expect(try await w.instance(instance).string("state") == "ended")

        let short = Fake.id("expiring")
        _ = try await w.start(["instance_id": short, "expiration": Date().timeIntervalSince1970 + 2])
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(20)
        var state = try await w.instance(short).string("state")
        while state != "expired" && clock.now < deadline {
            try await Task.sleep(for: .milliseconds(100))
            state = try await w.instance(short).string("state")
        }
        #expect(state == "expired")
        expectProblem(
            try await w.update(["instance_id": short, "content_state_patch": ["eta": 1]]), 409, "instance-closed")
        let tooFar = try await w.start(["expiration": Date().timeIntervalSince1970 + 9 * 3600])
        expectProblem(tooFar, 422, "invalid-field", field: "expiration")
    }

    @Test("the APNs size limit: a state just under 4096 bytes is accepted, just over answers 413")
    func sizeLimit() async throws {
        let w = try await Self.world()
        // Find the largest padding that fits, by asking the server (the composed size includes attribution).
        var low = 3000
        var high = 4100
        while low < high {
            let mid = (low + high + 1) / 2
            let r = try await w.start([
                "platform": "ios", "content_state": ["pad": String(repeating: "x", count: mid)],
            ])
            if r.status == 200 { low = mid } else { high = mid - 1 }
        }
        let fits = try await w.start(["platform": "ios", "content_state": ["pad": String(repeating: "x", count: low)]])
        #expect(fits.status == 200)
        let over = try await w.start([
            "platform": "ios", "content_state": ["pad": String(repeating: "x", count: low + 1)],
        ])
        expectProblem(over, 413, "push-too-large")
        let problem = try over.json()
        #expect(problem["platform"] as? String == "ios")
        #expect(problem["over_by"] as? String == "1")
        #expect(problem["limit"] as? String == "4096")
        #expect(low > 3500, "most of the 4 KiB is the team's")
    }

    @Test("a start is size-checked for both platforms unless it names one, whatever devices the person has now")
    func sizeCheckedForBothPlatforms() async throws {
        let w = try await Self.world()
        // An iPhone-only person: an Android phone may become a target later, and its updates and end would not fit.
        let removed = try await w.api.call("DELETE", "/v1/people/\(w.person)/devices/\(w.pixel)", key: w.tenant.sdk)
        #expect(removed.status == 204, "\(removed.text)")
        // A progress bar of 80 segments: the FCM data map carries it twice (the content state, progress_segments),
        // over 4096 bytes; the APNs payload once, well under.
        let segments = Array(repeating: ["length": 1, "color": "#3366FF"] as [String: Any], count: 80)
        let state: [String: Any] = ["progress": ["current": 0, "max": 80, "segments": segments]]
        let both = try await w.start(["content_state": state])
        expectProblem(both, 413, "push-too-large")
        #expect(try both.json()["platform"] as? String == "android", "\(both.text)")
        let ios = try await w.start(["content_state": state, "platform": "ios"])
        #expect(ios.status == 200, "\(ios.text)")
        #expect(try ios.json()["targets"] as? Int == 2, "\(ios.text)")
    }

    @Test("a start retried with its Idempotency-Key after its expiration passed gets its first answer, not a 422")
    func replayAfterExpiration() async throws {
        let w = try await Self.world()
        let key = "exp-" + Fake.hex(8)
        let expiration = Date().timeIntervalSince1970.rounded(.up) + 2
        let body: [String: Any] = ["instance_id": Fake.id("short"), "expiration": expiration]
        let first = try await w.start(body, headers: ["Idempotency-Key": key])
        #expect(first.status == 200, "\(first.text)")
        try await eventually("the expiration passed") { Date().timeIntervalSince1970 > expiration + 0.5 }
        let retried = try await w.start(body, headers: ["Idempotency-Key": key])
        #expect(retried.status == 200, "\(retried.text)")
        #expect(retried.header("Idempotent-Replayed") == "true")
        #expect(try retried.json() as NSDictionary == (try first.json()) as NSDictionary)
        // Another request under the key is refused as any reuse of a key is; the same one without a key is checked.
        var other = body
        other["content_state"] = ["status": "different"]
        expectProblem(
            try await w.start(other, headers: ["Idempotency-Key": key]), 422, "invalid-field", field: "Idempotency-Key")
        expectProblem(try await w.start(body), 422, "invalid-field", field: "expiration")
    }

    @Test("Idempotency-Key and a repeated client instance_id replay the first answer and queue nothing twice")
    func idempotentReplay() async throws {
        let w = try await Self.world()
        let instance = Fake.id("idem")
        let first = try await w.start(["instance_id": instance])
        let again = try await w.start(["instance_id": instance, "content_state": ["status": "other"]])
        #expect(again.status == 200)
        #expect(try again.json() as NSDictionary == (try first.json()) as NSDictionary)
        #expect(try await w.deliveries(instance).count == 3)

        let key = "key-" + Fake.hex(8)
        let a = try await w.start([:], headers: ["Idempotency-Key": key])
        let b = try await w.start([:], headers: ["Idempotency-Key": key])
        #expect(a.status == 200 && b.status == 200)
        #expect(try a.json()["instance_id"] as? String == (try b.json()["instance_id"] as? String))
        #expect(b.header("Idempotent-Replayed") == "true")
        let other = try await w.start(["content_state": ["status": "different"]], headers: ["Idempotency-Key": key])
        expectProblem(other, 422, "invalid-field", field: "Idempotency-Key")

        _ = try await w.registerActivityTokens(instance)
        let updateKey = "upd-" + Fake.hex(8)
        let u1 = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 5]], headers: ["Idempotency-Key": updateKey])
        let count = try await w.deliveries(instance).count
        let u2 = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 5]], headers: ["Idempotency-Key": updateKey])
        #expect(try u1.json() as NSDictionary == (try u2.json()) as NSDictionary)
        #expect(try await w.deliveries(instance).count == count)
        // An update that changes nothing writes only its answer under its key: replayed, and the key stays taken.
        let noopKey = "noop-" + Fake.hex(8)
        let n1 = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 5]], headers: ["Idempotency-Key": noopKey])
        #expect(n1.status == 200)
        let stored = try await w.fixture.pool.query(
            "SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(w.tenant.uuid) AND key = \(noopKey)")
        #expect(try stored[0].decode(Int.self, "n") == 1)
        let n2 = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 5]], headers: ["Idempotency-Key": noopKey])
        #expect(try n1.json() as NSDictionary == (try n2.json()) as NSDictionary)
        let reused = try await w.update(
            ["instance_id": instance, "content_state_patch": ["eta": 6]], headers: ["Idempotency-Key": noopKey])
        expectProblem(reused, 422, "invalid-field", field: "Idempotency-Key")
        #expect(try await w.deliveries(instance).count == count)
    }

    @Test("no token to target: accepted, and the instance is failed with the reason, at once")
    func noTargets() async throws {
        let w = try await Self.world()
        let nobody = try await w.start(["identifiers": ["id": Fake.id("ghost")]])
        #expect(nobody.status == 200)
        #expect(try nobody.json()["state"] as? String == "failed")
        #expect(try nobody.json()["failure_reason"] as? String == "no_push_to_start_token")
        let id = try #require(try nobody.json()["instance_id"] as? String)
        #expect(try await w.instance(id).string("failure_reason") == "no_push_to_start_token")

        let instance = Fake.id("lonely")
        _ = try await w.start(["instance_id": instance, "platform": "ios"])
        let update = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 2]])
        #expect(try update.json()["state"] as? String == "failed")
        #expect(try update.json()["failure_reason"] as? String == "no_activity_token")
    }

    @Test("targets: latest wins — a newer queued update supersedes the older one to the same token")
    func supersede() async throws {
        let w = try await Self.world()
        let instance = Fake.id("latest")
        _ = try await w.start(["instance_id": instance])
        _ = try await w.registerActivityTokens(instance)
        _ = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 1]])
        _ = try await w.update(["instance_id": instance, "content_state_patch": ["eta": 2]])
        let updates = try await w.deliveries(instance).filter { $0.string("operation") == "update" }
        #expect(updates.count == 6)
        #expect(updates.filter { $0.string("status") == "superseded" }.count == 3)
        #expect(updates.filter { $0.string("status") == "queued" }.allSatisfy { $0["instance_version"] as? Int == 3 })
    }

    @Test("a hot instance: 40 concurrent updates are all accepted, each with its own version, and the last one wins")
    func hotInstance() async throws {
        let w = try await Self.world()
        let instance = Fake.id("hot")
        _ = try await w.start(["instance_id": instance])
        _ = try await w.registerActivityTokens(instance)
        let answers = try await withThrowingTaskGroup(of: (Int, HTTP.Response).self) { group in
            for n in 1...40 {
                group.addTask {
                    (n, try await w.update(["instance_id": instance, "content_state_patch": ["eta": n]]))
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.allSatisfy { $0.1.status == 200 }, "\(answers.filter { $0.1.status != 200 }.map(\.1.text))")
        // Every update is a version of its own: 2...41, none lost and none twice.
        let versions = try answers.map { try $0.1.json()["version"] as? Int ?? 0 }
        #expect(versions.sorted() == Array(2...41))
        // The instance shows the update with the highest version, and its newest pushes carry that state.
        let newest = try #require(
            answers.max { try $0.1.json()["version"] as? Int ?? 0 < $1.1.json()["version"] as? Int ?? 0 })
        let shown = try await w.instance(instance)
        #expect(shown["version"] as? Int == 41)
        #expect(shown.object("content_state")?["eta"] as? Int == newest.0)
        let queued = try await w.fixture.pool.query(
            """
            SELECT instance_version, content_state->>'eta' AS eta FROM deliveries
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) AND status = 'queued'
              AND operation = 'update'
            """)
        #expect(queued.count == 3, "one push per target is left queued, the newest")
        for row in queued {
            #expect(try row.decode(Int.self, "instance_version") == 41)
            #expect(try row.decode(String.self, "eta") == String(newest.0))
        }
    }

    @Test("validation: identifiers, alert for iOS starts, unknown type, bad fields")
    func validation() async throws {
        let w = try await Self.world()
        expectProblem(
            try await w.start(["identifiers": ["id": "a", "email": "a@b.c"]]), 422, "invalid-field",
            field: "identifiers")
        // identifiers.email by the rule of every email: an address, of at most 320 bytes (these are 172 characters).
        for email in ["not-an-address", String(repeating: "é", count: 160) + "@example.com"] {
            expectProblem(
                try await w.start(["identifiers": ["email": email]]), 422, "invalid-field", field: "identifiers.email")
        }
        expectProblem(try await w.start(["push_payload": NSNull()]), 422, "missing-field", field: "push_payload.alert")
        #expect(try await w.start(["push_payload": NSNull(), "platform": "android"]).status == 200)
        expectProblem(
            try await w.start(["notification_type": "com.example.unknown"]), 422, "invalid-field",
            field: "notification_type")
        expectProblem(try await w.start(["attributes": [:]]), 422, "invalid-field", field: "attributes")
        expectProblem(try await w.start(["instance_id": "has space"]), 422, "invalid-field", field: "instance_id")
        expectProblem(try await w.start(["priority": 7]), 422, "invalid-field", field: "priority")
        expectProblem(try await w.start(["surprise": 1]), 422, "invalid-field", field: "surprise")
        expectProblem(
            try await w.update(["instance_id": Fake.id("missing"), "content_state": ["a": 1]]), 404, "not-found")
        expectProblem(try await w.update(["instance_id": Fake.id("x")]), 422, "missing-field", field: "content_state")
        let sdk = try await w.api.call(
            "POST", "/v1/live_notifications/start", key: w.tenant.sdk, json: ["identifiers": ["id": w.person]])
        expectProblem(sdk, 403, "forbidden")
    }

    @Test("lists filter by person, type and state, with cursor pagination")
    func listing() async throws {
        let w = try await Self.world()
        var ids: [String] = []
        for i in 0..<5 {
            let r = try await w.start(["instance_id": "list-\(i)-" + Fake.hex(6)])
            ids.append(try #require(try r.json()["instance_id"] as? String))
        }
        var seen: [String] = []
        var cursor: String?
        repeat {
            let path = "/v1/live_notifications?person=\(w.person)&limit=2" + (cursor.map { "&cursor=\($0)" } ?? "")
            let page = try await w.api.call("GET", path, key: w.tenant.app)
            #expect(page.status == 200, "\(page.text)")
            let json = try page.json()
            seen += json.array("data").compactMap { $0.string("instance_id") }
            cursor = json["next_cursor"] as? String
        } while cursor != nil
        #expect(Set(seen) == Set(ids) && seen.count == 5)
        let pending = try await w.api.call(
            "GET", "/v1/live_notifications?state=pending&notification_type=\(w.type)", key: w.tenant.app)
        #expect(try pending.json().array("data").count == 5)
        let ended = try await w.api.call("GET", "/v1/live_notifications?state=ended", key: w.tenant.app)
        #expect(try ended.json().array("data").isEmpty)
        expectProblem(
            try await w.api.call("GET", "/v1/live_notifications?state=nope", key: w.tenant.app), 422, "invalid-field",
            field: "state")
        expectProblem(
            try await w.api.call("GET", "/v1/live_notifications?cursor=zzz", key: w.tenant.app), 422, "invalid-field",
            field: "cursor")
    }
}
