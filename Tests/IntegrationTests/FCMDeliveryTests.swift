import ClientMirrors
import Crypto
import Foundation
import HTTP2
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Synchronization
import Testing

/// `marquee serve`, in-process APNs and FCM simulators, and `marquee worker` processes started on demand, on a
/// database of their own — so these workers never claim the APNs suite's deliveries, and fault rules set here never
/// hit its pushes.
actor FCMDeliveryFixture {
    static let shared = FCMDeliveryFixture()
    /// The campaign suite's own: its three workers never claim this suite's deliveries.
    static let campaigns = FCMDeliveryFixture()
    /// The console's browser tests' own.
    static let console = FCMDeliveryFixture()

    static let projectID = "marquee-sim"
    static let clientEmail = "live-updates@marquee-sim.iam.gserviceaccount.com"
    static let privateKeyID = "sim-key-1"

    struct Running: Sendable {
        let databaseURL: String
        let serve: MarqueeProcess
        let pool: PostgresPool
        let apns: APNsSimulator
        let fcm: FCMSimulator
        /// Both simulators' CA certificates in one file (the worker takes one `MARQUEE_CA_FILE`).
        let caFile: String
        let apnsKey: ES256PrivateKey
        let fcmKey: RS256PrivateKey
        let teamID = "TEAMSIM123"
        let keyID = "KEYSIM1234"
        var api: API { API(baseURL: serve.baseURL) }

        /// The `PUT /v1/credentials/fcm` body: a Google service-account JSON pointed at the simulator.
        var fcmCredentials: [String: Any] {
            [
                "service_account": [
                    "type": "service_account", "project_id": FCMDeliveryFixture.projectID,
                    "private_key_id": FCMDeliveryFixture.privateKeyID, "private_key": fcmKey.pkcs8PEM,
                    "client_email": FCMDeliveryFixture.clientEmail, "client_id": "1234567890",
                    "token_uri": "https://127.0.0.1:\(fcm.port)/token",
                ],
                "endpoint": "https://127.0.0.1:\(fcm.port)",
            ]
        }

        /// The `PUT /v1/credentials/apns` body pointed at the APNs simulator.
        var apnsCredentials: [String: Any] {
            [
                "team_id": teamID, "key_id": keyID, "private_key": apnsKey.pkcs8PEM, "bundle_id": "com.example.app",
                "environment": "sandbox", "endpoint": "https://127.0.0.1:\(apns.port)",
            ]
        }

        /// Starts a worker process against this fixture.
        func worker(_ extra: [String: String] = [:]) throws -> MarqueeProcess {
            var env = [
                "DATABASE_URL": databaseURL, "MARQUEE_CA_FILE": caFile, "MARQUEE_RETRY_INITIAL_MS": "200",
                "MARQUEE_WORKER_BATCH": "64", "MARQUEE_LOG_LEVEL": "info",
            ]
            env.merge(extra) { _, new in new }
            let port = TestEnvironment.freePort()
            env["MARQUEE_METRICS_LISTEN"] = "127.0.0.1:\(port)"
            return try MarqueeProcess(["worker"], environment: env, port: port)
        }
    }

    private var starting: Task<Running, any Error>?

    static func get() async throws -> Running { try await shared.running() }

    func running() async throws -> Running {
        if let starting { return try await starting.value }
        let task = Task { try await Self.start() }
        starting = task
        return try await task.value
    }

    private static func start() async throws -> Running {
        let url = try await TestEnvironment.makeDatabase()
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        let migrate = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        guard migrate.status == 0 else { throw TestFailure("migrate: \(migrate.output)") }
        let serve = try MarqueeProcess(["serve"], environment: env, port: TestEnvironment.freePort())
        try await serve.waitUntilServing()

        let apnsKey = ES256PrivateKey.generate()
        let apns = try APNsSimulator(
            configuration: .init(
                port: 0, keys: [.init(keyID: "KEYSIM1234", teamID: "TEAMSIM123", publicKey: apnsKey.publicKey)]))
        let fcmKey = try RS256PrivateKey.generate()
        let fcm = try FCMSimulator(
            configuration: .init(
                port: 0,
                accounts: [.init(clientEmail: clientEmail, projectID: projectID, publicKey: fcmKey.publicKey)]))
        try apns.start()
        try fcm.start()
        // Handlers run inside `run()`; both serve for the life of the test process.
        Task.detached { try? await apns.run() }
        Task.detached { try? await fcm.run() }
        let caFile = NSTemporaryDirectory() + "sim-ca-fcm-\(UUID().uuidString).pem"
        try (apns.caCertificatePEM + "\n" + fcm.caCertificatePEM).write(
            toFile: caFile, atomically: true, encoding: .utf8)

        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 4))
        return Running(
            databaseURL: url, serve: serve, pool: pool, apns: apns, fcm: fcm, caFile: caFile, apnsKey: apnsKey,
            fcmKey: fcmKey)
    }
}

@Suite("FCM delivery end to end", .serialized)
struct FCMDeliveryTests {
    struct Tenant {
        var fixture: FCMDeliveryFixture.Running
        var tenant: TestTenant
        var type: String
        var person: String
        var api: API { fixture.api }
        var fcm: FCMSimulator { fixture.fcm }

        func deliveries(_ instance: String) async throws -> [[String: Any]] {
            let r = try await api.call(
                "GET", "/v1/live_notifications/\(instance)/deliveries?limit=200", key: tenant.app)
            guard r.status == 200 else { throw TestFailure("deliveries: \(r.status) \(r.text)") }
            return try r.json().array("data")
        }

        /// Waits until `count` deliveries of `instance` exist and none is `queued`.
        func settled(_ instance: String, count: Int, timeout: Duration = .seconds(30)) async throws
            -> [[String: Any]]
        {
            let clock = ContinuousClock()
            let deadline = clock.now + timeout
            var last: [[String: Any]] = []
            while clock.now < deadline {
                last = try await deliveries(instance)
                if last.count == count, last.allSatisfy({ $0.string("status") != "queued" }) { return last }
                try await Task.sleep(for: .milliseconds(100))
            }
            let statuses = Dictionary(grouping: last) { $0.string("status") ?? "?" }.mapValues(\.count)
            throw TestFailure(
                "\(last.count) deliveries of \(instance), not \(count), or not settled: \(statuses) \(last.prefix(3))")
        }

        /// Registers an Android device of `person`; its device token is its FCM registration token.
        @discardableResult
        func android(person: String? = nil, tokenPrefix: String = "") async throws -> String {
            let token = tokenPrefix + Fake.fcm()
            let r = try await api.call(
                "PUT", "/v1/people/\(person ?? self.person)/devices/\(token)", key: tenant.sdk,
                json: ["platform": "android", "app_version": "1.0"])
            guard r.status == 200 || r.status == 201 else { throw TestFailure("android device: \(r.text)") }
            return token
        }

        /// Registers an iPhone with a push-to-start token; returns the push-to-start token.
        func iphone() async throws -> String {
            let device = Fake.hex()
            let token = Fake.hex()
            _ = try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"])
            let r = try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": token])
            guard r.status == 200 else { throw TestFailure("push-to-start: \(r.text)") }
            return token
        }

        func start(
            _ instance: String, person: String? = nil, state: [String: Any] = ["status": "preparing", "eta": 15]
        ) async throws -> [String: Any] {
            let body: [String: Any] = [
                "identifiers": ["id": person ?? self.person], "notification_type": type, "instance_id": instance,
                "attributes": ["order": "42", "items": 3], "content_state": state,
                "push_payload": ["alert": ["title": "Order 42", "body": "Preparing"]],
            ]
            let r = try await api.call("POST", "/v1/live_notifications/start", key: tenant.app, json: body)
            guard r.status == 200 else { throw TestFailure("start: \(r.status) \(r.text)") }
            return try r.json()
        }

        func fcmCredential() async throws -> [String: Any] {
            let r = try await api.call("GET", "/v1/credentials/fcm", key: tenant.app)
            guard r.status == 200 else { throw TestFailure("GET credentials: \(r.status) \(r.text)") }
            return try r.json()
        }

        func uploadFCMCredentials() async throws {
            let r = try await api.call("PUT", "/v1/credentials/fcm", key: tenant.app, json: fixture.fcmCredentials)
            guard r.status == 200 else { throw TestFailure("FCM credentials: \(r.status) \(r.text)") }
        }

        /// Devices of this tenant with `token`, read from the database.
        func deviceCount(_ token: String) async throws -> Int {
            try await fixture.pool.count(
                "SELECT count(*)::int AS n FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(token)")
        }
    }

    /// A tenant with FCM credentials (and APNs ones with `apns`) and an activity type of `profile`.
    static func tenant(profile: String = "marquee", apns: Bool = false) async throws -> Tenant {
        let fixture = try await FCMDeliveryFixture.get()
        let api = fixture.api
        let created = try await api.createTenant()
        let type = Fake.activityType()
        let r = try await api.call(
            "PUT", "/v1/activity_types/\(type)", key: created.app,
            json: ["attributes_type": "DeliveryAttributes", "payload_profile": profile])
        guard r.status == 200 || r.status == 201 else { throw TestFailure("activity type: \(r.text)") }
        let t = Tenant(fixture: fixture, tenant: created, type: type, person: Fake.id("ann"))
        try await t.uploadFCMCredentials()
        if apns {
            let creds = try await api.call(
                "PUT", "/v1/credentials/apns", key: created.app, json: fixture.apnsCredentials)
            guard creds.status == 200 else { throw TestFailure("APNs credentials: \(creds.text)") }
        }
        return t
    }

    /// The `data` map of a simulator record.
    static func data(_ record: JSONValue) -> [String: JSONValue] {
        record["message"]?["data"]?.objectValue ?? [:]
    }

    @Test("start → update → end reach FCM as data messages with the marquee profile's fields, and are all sent")
    func endToEnd() async throws {
        let t = try await Self.tenant(profile: "marquee")
        let credential = try await t.fcmCredential()
        #expect(credential.string("status") == "ok")
        #expect(credential.string("project_id") == FCMDeliveryFixture.projectID)
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let token = try await t.android()
        let instance = Fake.id("fcm-e2e")

        let started = try await t.start(instance)
        #expect(started["targets"] as? Int == 1)
        let first = try await t.settled(instance, count: 1)
        #expect(first[0].string("status") == "sent", "\(first)")
        #expect(first[0].string("provider") == "fcm")
        #expect(first[0].string("token_kind") == "fcm")

        let update = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["status": "on_the_way", "eta": 5]])
        #expect(try update.json()["targets"] as? Int == 1, "\(update.text)")
        _ = try await t.settled(instance, count: 2)
        let end = try await t.api.call(
            "POST", "/v1/live_notifications/end", key: t.tenant.app,
            json: [
                "instance_id": instance, "content_state_patch": ["status": "delivered"],
                "dismissal_policy": "immediate",
            ])
        #expect(end.status == 200, "\(end.text)")
        let all = try await t.settled(instance, count: 3)
        #expect(all.allSatisfy { $0.string("status") == "sent" }, "\(all)")

        let records = t.fcm.messages(token: token)
        try #require(records.count == 3, "\(records)")
        let data = records.map(Self.data)
        #expect(data.map { $0["event"]?.stringValue } == ["start", "update", "end"])
        for (record, map) in zip(records, data) {
            #expect(record["project_id"]?.stringValue == FCMDeliveryFixture.projectID)
            #expect(record["client_email"]?.stringValue == FCMDeliveryFixture.clientEmail)
            #expect(record["message"]?["android"]?["priority"]?.stringValue?.lowercased() == "high")
            #expect(record["message"]?["android"]?["ttl"]?.stringValue?.hasSuffix("s") == true)
            // One collapse key per instance: a device back online gets the latest state only.
            #expect(record["message"]?["android"]?["collapse_key"]?.stringValue == instance)
            // No stale date here: kept until the instance expires (8 hours by default), never more.
            let ttl = record["message"]?["android"]?["ttl"]?.stringValue.flatMap { Int($0.dropLast()) } ?? -1
            #expect((28_000...28_800).contains(ttl), "ttl \(ttl)")
            let nonStrings = map.filter { $0.value.stringValue == nil }.keys.sorted()
            #expect(nonStrings.isEmpty, "every data value is a string: \(nonStrings)")
            #expect(map["instance_id"]?.stringValue == instance)
            #expect(map["notification_type"]?.stringValue == t.type)
            #expect(map["delivery_token"]?.stringValue?.isEmpty == false)
            let attributes = try JSONValue.parse(Array((map["attributes"]?.stringValue ?? "").utf8))
            #expect(attributes["order"]?.stringValue == "42")
            #expect(attributes["items"]?.intValue == 3)
        }
        // An alert belongs to the request that carries it: only the start re-notifies.
        #expect(data.map { $0["alert_title"]?.stringValue } == ["Order 42", nil, nil])
        let states = try data.map { try JSONValue.parse(Array(($0["content_state"]?.stringValue ?? "").utf8)) }
        #expect(states.map { $0["status"]?.stringValue } == ["preparing", "on_the_way", "delivered"])
        #expect(states.map { $0["eta"]?.intValue } == [15, 5, 5], "a patch keeps the fields it does not name")
        #expect(data[2]["dismissal_date"]?.stringValue.flatMap(Int64.init) != nil, "the end says when to dismiss")
        #expect(data[0]["dismissal_date"] == nil && data[1]["dismissal_date"] == nil)

        let timestamps = data.compactMap { $0["timestamp"]?.stringValue.flatMap(Int64.init) }
        #expect(timestamps.count == 3)
        #expect(zip(timestamps, timestamps.dropFirst()).allSatisfy { $0 < $1 }, "strictly increasing: \(timestamps)")

        // Each delivery is attributed to its own message: its ID is in the data, the message name is the provider ID.
        let byID = Dictionary(uniqueKeysWithValues: all.compactMap { d in d.string("id").map { ($0, d) } })
        for (record, map) in zip(records, data) {
            let delivery = try #require(map["delivery_id"]?.stringValue.flatMap { byID[$0] }, "\(map)")
            #expect(delivery.string("provider_id") == record["name"]?.stringValue)
            #expect(delivery.string("operation") == map["event"]?.stringValue)
        }
        #expect(
            try await t.api.call("GET", "/v1/live_notifications/\(instance)", key: t.tenant.app).json()["state"]
                as? String == "ended")
    }

    @Test("a person with an iPhone and an Android phone: one start reaches APNs and FCM, both recorded sent")
    func mixedPerson() async throws {
        let t = try await Self.tenant(profile: "customerio", apns: true)
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let pushToStart = try await t.iphone()
        let fcmToken = try await t.android()
        let instance = Fake.id("mixed")
        let started = try await t.start(instance)
        #expect(started["targets"] as? Int == 2)
        let settled = try await t.settled(instance, count: 2)
        #expect(settled.allSatisfy { $0.string("status") == "sent" }, "\(settled)")
        #expect(Set(settled.compactMap { $0.string("provider") }) == ["apns", "fcm"])

        let pushes = t.fixture.apns.pushes(token: pushToStart)
        try #require(pushes.count == 1)
        #expect(pushes[0]["payload"]?["aps"]?["event"]?.stringValue == "start")
        #expect(pushes[0]["payload"]?["aps"]?["attributes"]?["cioInstanceId"]?.stringValue == instance)
        // The recorded push decodes as Customer.io's iOS SDK decodes it.
        let apnsDelivery = try #require(settled.first { $0.string("provider") == "apns" })
        let metadata = try decodeLikeActivityKit(
            CustomerIO.CIOLiveActivityMetadata.self,
            from: try #require(pushes[0]["payload"]?["aps"]?["content-state"]?["cioMetadata"]).bytes)
        #expect(metadata.deliveryId == apnsDelivery.string("id"))
        #expect(metadata.deliveryToken?.isEmpty == false)

        // What Customer.io's Android SDK routes to its live handler: activity_id, milliseconds, title and body.
        let messages = t.fcm.messages(token: fcmToken)
        try #require(messages.count == 1)
        let data = Self.data(messages[0])
        #expect(data["activity_id"]?.stringValue == instance)
        #expect(data["cioInstanceId"] == nil)
        #expect(data["event"]?.stringValue == "start")
        #expect((data["timestamp"]?.stringValue.flatMap(Int64.init) ?? 0) > 1_000_000_000_000, "milliseconds")
        #expect(data["title"]?.stringValue == "Order 42")
        #expect(data["body"]?.stringValue == "Preparing")
        #expect(data["CIO-Delivery-Token"]?.stringValue?.isEmpty == false)
        let payload = try JSONValue.parse(Array((data["payload"]?.stringValue ?? "").utf8))
        #expect(payload["status"]?.stringValue == "preparing")
        #expect(payload["order"]?.stringValue == "42", "customerio merges attributes into the payload")
        let fcmDelivery = try #require(settled.first { $0.string("provider") == "fcm" })
        #expect(data["CIO-Delivery-ID"]?.stringValue == fcmDelivery.string("id"))
    }

    @Test("capacitor: the recorded APNs start decodes as the plugin's LiveActivityAttributes and ContentState")
    func capacitorProfile() async throws {
        let t = try await Self.tenant(profile: "capacitor", apns: true)
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let pushToStart = try await t.iphone()
        let fcmToken = try await t.android()
        let instance = Fake.id("cap")
        _ = try await t.start(instance, state: ["title": "Order 42", "progress": 0.25, "status": "preparing"])
        let settled = try await t.settled(instance, count: 2)
        #expect(settled.allSatisfy { $0.string("status") == "sent" }, "\(settled)")
        let push = try #require(t.fixture.apns.pushes(token: pushToStart).first)
        let aps = try #require(push["payload"]?["aps"])
        let attributes = try decodeLikeActivityKit(
            Capacitor.LiveActivityAttributes.self, from: try #require(aps["attributes"]).bytes)
        #expect(attributes.activityType == instance)
        #expect(attributes.staticData["order"]?.string == "42")
        let state = try decodeLikeActivityKit(
            Capacitor.LiveActivityAttributes.ContentState.self, from: try #require(aps["content-state"]).bytes)
        #expect(state.title == "Order 42")
        #expect(state.progress == 0.25)
        #expect(state.extras["status"]?.string == "preparing")
        let apnsDelivery = try #require(settled.first { $0.string("provider") == "apns" })
        #expect(state.extras["marqueeDeliveryId"]?.string == apnsDelivery.string("id"))
        // Android: the data message the app's onMessageReceived maps to the plugin's activity.
        let data = Self.data(try #require(t.fcm.messages(token: fcmToken).first))
        #expect(data["liveActivityId"]?.stringValue == instance)
        #expect(data["title"]?.stringValue == "Order 42")
        #expect(data["progress"]?.stringValue == "0.25")
        // A start whose content state lacks the plugin's required title is refused: the device could not decode it.
        let refused = try await t.api.call(
            "POST", "/v1/live_notifications/start", key: t.tenant.app,
            json: [
                "identifiers": ["id": t.person], "notification_type": t.type, "instance_id": Fake.id("cap"),
                "attributes": ["order": "1"], "content_state": ["status": "x"],
                "push_payload": ["alert": ["title": "T", "body": "B"]],
            ])
        expectProblem(refused, 422, "missing-field", field: "content_state/title")
        // A field FCM reserves as a data key: refused at start and at update, never sent to be refused by FCM.
        let reserved = try await t.api.call(
            "POST", "/v1/live_notifications/start", key: t.tenant.app,
            json: [
                "identifiers": ["id": t.person], "notification_type": t.type, "instance_id": Fake.id("cap"),
                "attributes": ["order": "1"], "content_state": ["title": "x", "from": "y"],
                "push_payload": ["alert": ["title": "T", "body": "B"]],
            ])
        expectProblem(reserved, 422, "invalid-field", field: "content_state/from")
        let mistyped = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["timerCountsDown": "no"]])
        expectProblem(mistyped, 422, "invalid-field", field: "content_state/timerCountsDown")
        let patched = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["google.x": "y"]])
        expectProblem(patched, 422, "invalid-field", field: "content_state/google.x")
    }

    @Test("UNREGISTERED: undeliverable, the Android device is removed, and a later start no longer targets it")
    func unregistered() async throws {
        let t = try await Self.tenant()
        t.fcm.setFaults([.init(tokenPrefix: "gone", action: .unregistered)])
        defer { t.fcm.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let dead = try await t.android(tokenPrefix: "gone")
        let alive = try await t.android()
        let instance = Fake.id("dead")
        #expect(try await t.start(instance)["targets"] as? Int == 2)
        let settled = try await t.settled(instance, count: 2)
        let byStatus = Dictionary(grouping: settled) { $0.string("status") ?? "" }
        #expect(byStatus["undeliverable"]?.count == 1, "\(settled)")
        #expect(byStatus["sent"]?.count == 1, "\(settled)")
        #expect(byStatus["undeliverable"]?.first?.string("reason") == "UNREGISTERED")
        #expect(byStatus["undeliverable"]?.first?["attempts"] as? Int == 1, "a dead token is not retried")
        #expect(t.fcm.messages(token: dead).isEmpty)
        // Removed in the worker's settle step, the transaction after the one that records the outcome.
        try await eventually("the dead token's device is gone") { try await t.deviceCount(dead) == 0 }
        #expect(try await t.deviceCount(alive) == 1, "the live one stays")

        let again = Fake.id("again")
        #expect(try await t.start(again)["targets"] as? Int == 1, "only the live device is targeted")
        let later = try await t.settled(again, count: 1)
        #expect(later[0].string("status") == "sent")
        #expect(t.fcm.messages(token: alive).count == 2)
        #expect(t.fcm.messages(token: dead).isEmpty)
    }

    @Test("UNAVAILABLE with Retry-After: retried only after the delay, then sent once")
    func unavailableRetryAfter() async throws {
        let t = try await Self.tenant()
        t.fcm.setFaults([.init(tokenPrefix: "u503", action: .serviceUnavailable, times: 1, retryAfterSeconds: 3)])
        defer { t.fcm.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let token = try await t.android(tokenPrefix: "u503")
        let instance = Fake.id("unavailable")
        let clock = ContinuousClock()
        let began = clock.now
        _ = try await t.start(instance)
        // Backoff alone would retry within ~200 ms (MARQUEE_RETRY_INITIAL_MS): the first attempt fails, then waits.
        // Its row says when the retry is due, so the check holds however late a loaded machine runs the attempt.
        var firstFailure: [String: Any]?
        while clock.now - began < .seconds(30) {
            if let d = try await t.deliveries(instance).first, d["attempts"] as? Int == 1,
                d.string("reason") == "UNAVAILABLE"
            {
                firstFailure = d
                break
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let failed = try #require(firstFailure, "the first attempt is answered UNAVAILABLE")
        #expect(failed.string("status") == "queued")
        let failedAt = try #require(failed.string("updated_at").flatMap(Self.timestamp))
        let retryAt = try #require(failed.string("next_attempt_at").flatMap(Self.timestamp))
        #expect(retryAt.timeIntervalSince(failedAt) >= 2.0, "retry due \(retryAt.timeIntervalSince(failedAt)) s later")
        #expect(t.fcm.messages(token: token).isEmpty || Date() >= retryAt)

        let settled = try await t.settled(instance, count: 1)
        #expect(settled[0].string("status") == "sent")
        #expect(settled[0]["attempts"] as? Int == 2)
        #expect(clock.now - began >= .seconds(3), "Retry-After honoured")
        #expect(t.fcm.messages(token: token).count == 1)
    }

    static func timestamp(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text) ?? ISO8601DateFormatter().date(from: text)
    }

    @Test("an expired access token is refreshed exactly once, even with 100 concurrent sends")
    func sharedRefresh() async throws {
        let t = try await Self.tenant()
        let worker = try t.fixture.worker(["MARQUEE_WORKER_BATCH": "128"])
        defer { worker.signal(SIGKILL) }
        // Warm up: the worker obtains and caches an access token.
        let warmPerson = Fake.id("warm")
        let warm = try await t.android(person: warmPerson)
        let warmInstance = Fake.id("warm")
        _ = try await t.start(warmInstance, person: warmPerson)
        #expect(try await t.settled(warmInstance, count: 1)[0].string("status") == "sent")
        #expect(t.fcm.messages(token: warm).count == 1)

        // 100 Android phones of one person: above the default cap on devices per person.
        let cap = try await t.api.call(
            "PATCH", "/v1/settings", key: t.tenant.app, json: ["max_devices_per_person": 100])
        #expect(cap.status == 200, "\(cap.text)")
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<100 { group.addTask { try await t.android() } }
            var all: [String] = []
            for try await token in group { all.append(token) }
            return all
        }
        let issuedBefore = t.fcm.tokensIssued
        let rejectedBefore = Self.unauthenticated(t.fcm)
        // The refresh is answered only once 10 sends were rejected: how many sends meet the expired token before
        // the new one lands is then not left to the scheduler of a loaded machine.
        t.fcm.holdTokenIssuance(untilRejected: 10, timeout: .seconds(10))
        defer { t.fcm.releaseTokenIssuance() }
        #expect(t.fcm.expireAccessTokens() >= 1, "the worker's cached token is now expired at the simulator")

        let instance = Fake.id("herd")
        #expect(try await t.start(instance)["targets"] as? Int == 100)
        let settled = try await t.settled(instance, count: 100, timeout: .seconds(60))
        #expect(
            settled.allSatisfy { $0.string("status") == "sent" }, "\(settled.filter { $0.string("status") != "sent" })")
        #expect(settled.allSatisfy { $0["attempts"] as? Int == 1 }, "the refresh-and-retry is within one attempt")
        for token in tokens { #expect(t.fcm.messages(token: token).count == 1) }

        let rejected = Self.unauthenticated(t.fcm) - rejectedBefore
        #expect(rejected >= 10, "many sends met the expired token at once (\(rejected))")
        #expect(t.fcm.tokensIssued - issuedBefore == 1, "one shared refresh, not one per send")
    }

    /// 401s the simulator answered so far.
    static func unauthenticated(_ simulator: FCMSimulator) -> Int {
        Int(simulator.statistics["rejected"]?["UNAUTHENTICATED"]?.intValue ?? 0)
    }

    @Test("401 twice: the credential is broken, the tenant's FCM deliveries pause until it is uploaded again")
    func brokenCredential() async throws {
        let t = try await Self.tenant()
        let other = try await Self.tenant()
        // Two hits per token: the first answer, and the answer to the retry with a refreshed access token.
        t.fcm.setFaults([.init(tokenPrefix: "b401", action: .expireToken, times: 2)])
        defer { t.fcm.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let rejectedToken = try await t.android(tokenPrefix: "b401")
        let instance = Fake.id("broken")
        _ = try await t.start(instance)

        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(20)
        var credential = try await t.fcmCredential()
        while credential.string("status") != "broken" && clock.now < deadline {
            try await Task.sleep(for: .milliseconds(100))
            credential = try await t.fcmCredential()
        }
        #expect(credential.string("status") == "broken", "\(credential)")
        #expect(credential.string("status_reason")?.contains("UNAUTHENTICATED") == true, "\(credential)")

        // Another instance of the same tenant, to a healthy token, while the credential is broken.
        let secondPerson = Fake.id("bob")
        let healthy = try await t.android(person: secondPerson)
        let second = Fake.id("paused")
        _ = try await t.start(second, person: secondPerson)
        // Another tenant's FCM deliveries go on.
        let otherToken = try await other.android()
        let otherInstance = Fake.id("unaffected")
        _ = try await other.start(otherInstance)
        #expect(try await other.settled(otherInstance, count: 1)[0].string("status") == "sent")

        // The fault budget is spent: any attempt now would succeed. Wait past the 5 s pause: nothing goes out.
        try await Task.sleep(for: .seconds(7))
        let paused = try await t.deliveries(instance) + t.deliveries(second)
        #expect(paused.count == 2)
        #expect(paused.allSatisfy { $0.string("status") == "parked" }, "\(paused)")
        #expect(try await t.deliveries(second).first?["attempts"] as? Int == 0, "not even claimed")
        #expect(t.fcm.messages(token: rejectedToken).isEmpty)
        #expect(t.fcm.messages(token: healthy).isEmpty)
        #expect(t.fcm.messages(token: otherToken).count == 1)

        try await t.uploadFCMCredentials()
        #expect(try await t.fcmCredential().string("status") == "ok")
        let first = try await t.settled(instance, count: 1)
        let later = try await t.settled(second, count: 1)
        #expect(first[0].string("status") == "sent", "\(first)")
        #expect(later[0].string("status") == "sent", "\(later)")
        #expect(t.fcm.messages(token: rejectedToken).count == 1)
        #expect(t.fcm.messages(token: healthy).count == 1)
    }
}
