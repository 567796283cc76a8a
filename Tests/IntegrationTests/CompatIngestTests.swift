import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// The Customer.io-compatible ingest, fed batches shaped as the Customer.io iOS SDK sends them.
@Suite("Compat ingest")
struct CompatIngestTests {
    /// The envelope every event of the SDK carries (Segment's common fields).
    static func event(
        _ type: String, _ name: String? = nil, userId: String?, anonymousId: String = UUID().uuidString,
        properties: [String: Any] = [:], deviceToken: String? = nil, timestamp: Date = Date()
    ) -> [String: Any] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        var device: [String: Any] = [
            "id": "6C3A9E0B-1F2D-4C5E-8A7B-9D0E1F2A3B4C", "manufacturer": "Apple", "model": "iPhone15,2",
            "name": "iPhone", "type": "ios",
        ]
        if let deviceToken { device["token"] = deviceToken }
        var event: [String: Any] = [
            "type": type, "anonymousId": anonymousId, "messageId": UUID().uuidString,
            "timestamp": formatter.string(from: timestamp), "integrations": [:],
            "context": [
                "app": ["name": "Pizza", "version": "1.2.3", "build": "45", "namespace": "com.example.pizza"],
                "device": device,
                "library": ["name": "analytics-ios", "version": "1.5.0"],
                "os": ["name": "iOS", "version": "17.4"],
                "network": ["wifi": true, "cellular": false],
                "locale": "en-US", "timezone": "Europe/Berlin",
                "screen": ["width": 393, "height": 852],
            ],
        ]
        if let name { event["event"] = name }
        if let userId { event["userId"] = userId }
        if type == "identify" { event["traits"] = properties } else { event["properties"] = properties }
        return event
    }

    static func envelope(_ events: [[String: Any]], writeKey: String) -> [String: Any] {
        ["batch": events, "sentAt": "2025-03-01T12:00:00.000Z", "writeKey": writeKey]
    }

    /// The value of a counter sample in a Prometheus exposition (0 when absent).
    static func sample(_ exposition: String, _ series: String) -> Double {
        for line in exposition.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1)) ?? 0
        }
        return 0
    }

    @Test("attributes are at most 16 KiB of JSON (422 naming the field); compat versions at most 64 UTF-8 bytes")
    func attributeLimits() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("big")
        let device = Fake.hex()
        let big: [String: Any] = ["notes": String(repeating: "x", count: 16 * 1024)]
        let fits: [String: Any] = ["notes": String(repeating: "x", count: 16 * 1024 - 32)]
        expectProblem(
            try await api.call("PUT", "/v1/people/\(user)", key: tenant.sdk, json: ["attributes": big]),
            422, "invalid-field", field: "attributes", "person")
        #expect(
            try await api.call("PUT", "/v1/people/\(user)", key: tenant.sdk, json: ["attributes": fits]).status
                == 200)
        expectProblem(
            try await api.call(
                "PUT", "/v1/people/\(user)/devices/\(device)", key: tenant.sdk,
                json: ["platform": "ios", "attributes": big]), 422, "invalid-field", field: "attributes", "device")
        func post(_ event: [String: Any]) async throws -> HTTP.Response {
            try await api.call(
                "POST", "/v1/b", json: Self.envelope([event], writeKey: tenant.sdk),
                headers: ["Authorization": tenant.basicSDK])
        }
        expectProblem(
            try await post(Self.event("identify", userId: user, properties: big)), 422, "invalid-field",
            field: "batch[0].traits", "identify traits")
        expectProblem(
            try await post(
                Self.event("track", "Device Created or Updated", userId: user, properties: big, deviceToken: device)),
            422, "invalid-field", field: "batch[0].properties", "device properties")
        // 64 characters of which each is 1 + 40 combining accents: 64 graphemes, 5,248 bytes.
        let accented = String(repeating: "e" + String(repeating: "\u{301}", count: 40), count: 64)
        let registered = try await post(
            Self.event(
                "track", "Device Created or Updated", userId: user,
                properties: ["device_os": accented, "app_version": "é" + String(repeating: "1", count: 100)],
                deviceToken: device))
        #expect(registered.status == 200, "\(registered.text)")
        let stored = try await fixture.pool.query(
            "SELECT os_version, app_version FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(device)")
        let os = try stored[0].decode(String?.self, "os_version")
        let app = try #require(try stored[0].decode(String?.self, "app_version"))
        #expect(os == nil, "not even one of those characters fits in 64 bytes")
        #expect(app.utf8.count == 64 && app.hasPrefix("é1"), "\(app)")
    }

    @Test("a Customer.io SDK batch: all good events applied; with a malformed one, nothing, and a 422 naming it")
    func sdkBatch() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("cio-user")
        let email = user + "@example.com"
        let device = Fake.hex()
        let secondDevice = Fake.hex()
        let pushToStart = Fake.hex(160)
        let instanceToken = Fake.hex(160)
        let type = Fake.activityType()
        let instance = Fake.id("cio-inst")
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        let started = Date().addingTimeInterval(-60)

        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: user)
        let before = try await api.call("GET", "/metrics").text
        let malformed = Self.event(
            "track", "Live Notification Token", userId: user,
            properties: [
                "registrationType": "push_to_start", "pushToStartToken": "not-hex-" + Fake.hex(60),
                "notificationType": type, "attributesType": "PizzaDeliveryAttributes", "deviceId": device,
                "platform": "ios",
            ])
        let events: [[String: Any]] = [
            Self.event("identify", userId: user, properties: ["email": email, "first_name": "Ada", "plan": "pro"]),
            Self.event(
                "track", "Device Created or Updated", userId: user,
                properties: [
                    "device_os": "17.4", "app_version": "1.2.3", "cio_sdk_version": "3.5.0", "push_enabled": true,
                    "device_locale": "en-US", "device_manufacturer": "Apple",
                ], deviceToken: device),
            Self.event(
                "track", "Device Created or Updated", userId: user, properties: ["device_os": "17.4"],
                deviceToken: secondDevice),
            Self.event(
                "track", "Live Notification Token", userId: user,
                properties: [
                    "registrationType": "push_to_start", "pushToStartToken": pushToStart, "notificationType": type,
                    "attributesType": "PizzaDeliveryAttributes", "deviceId": device, "platform": "ios",
                ]),
            Self.event(
                "track", "Live Notification Token", userId: user,
                properties: [
                    "registrationType": "instance", "cioInstanceId": instance, "instanceToken": instanceToken,
                    "deviceId": device,
                ]),
            Self.event("track", "Application Opened", userId: user, properties: ["from_background": false]),
            malformed,
            Self.event(
                "track", "Live Notification Event", userId: user,
                properties: [
                    "eventType": "start", "cioInstanceId": instance, "deviceId": device,
                    "contentState": ["status": "baking", "eta": 1_700_000_000],
                ], timestamp: started),
            Self.event(
                "track", "Report Delivery Event", userId: nil, anonymousId: delivery,
                properties: [
                    "metric": "delivered", "deliveryId": delivery, "recipient": device,
                    "deliveryToken": DeliveryTokens.make(
                        deliveryID: delivery, secret: try await fixture.tenants.deliverySecret(tenant: tenant.uuid)),
                ]),
        ]
        // All or nothing: the malformed event fails the whole batch, naming its index, and nothing is kept.
        let refused = try await api.call(
            "POST", "/v1/b", json: Self.envelope(events, writeKey: tenant.sdk),
            headers: ["Authorization": tenant.basicSDK])
        expectProblem(refused, 422, "invalid-token", field: "batch[6].properties.pushToStartToken")
        #expect(try refused.json().string("index") == "6")
        #expect(try refused.json().string("messageId") == malformed["messageId"] as? String)
        #expect(!refused.text.contains("not-hex-"), "the bad token is not echoed")
        expectProblem(try await api.call("GET", "/v1/people/\(user)", key: tenant.app), 404, "not-found")

        // Without it, every event applies.
        let response = try await api.call(
            "POST", "/v1/b",
            json: Self.envelope(
                events.filter { $0["messageId"] as? String != malformed["messageId"] as? String }, writeKey: tenant.sdk),
            headers: ["Authorization": tenant.basicSDK])
        #expect(response.status == 200, "\(response.text)")
        let result = try response.json()
        #expect(result["success"] as? Bool == true)
        #expect(result["applied"] as? Int == 7)
        #expect(result["ignored"] as? Int == 1, "Application Opened is counted, not rejected")
        #expect(result.array("rejected").isEmpty)

        // The registry, as the app API shows it.
        let person = try await api.call("GET", "/v1/people/\(user)", key: tenant.app)
        #expect(person.status == 200, "\(person.text)")
        let detail = try person.json()
        #expect(detail.string("email") == email)
        #expect(detail.object("attributes")?.string("first_name") == "Ada")
        let devices = detail.array("devices")
        #expect(devices.count == 2)
        let first = try #require(devices.first { $0.string("token") == maskToken(device) })
        #expect(first.string("platform") == "ios")
        #expect(first.string("os_version") == "17.4")
        #expect(first.string("app_version") == "1.2.3")
        #expect(first.string("app_id") == "com.example.pizza")
        let tokens = first.array("tokens").map { token -> String in
            let scope = token.string("activity_type") ?? token.string("instance_id") ?? ""
            return [token.string("kind") ?? "", scope, token.string("status") ?? "", token.string("token") ?? ""]
                .joined(separator: " ")
        }
        #expect(tokens.contains("push_to_start \(type) active \(maskToken(pushToStart))"), "\(tokens)")
        #expect(tokens.contains("activity \(instance) active \(maskToken(instanceToken))"), "\(tokens)")
        let activityType = try await api.call("GET", "/v1/activity_types/\(type)", key: tenant.app).json()
        #expect(activityType["auto_created"] as? Bool == true)
        #expect(activityType.string("attributes_type") == "PizzaDeliveryAttributes")
        #expect(activityType.string("payload_profile") == "customerio")

        let targets = try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance)
        #expect(targets.map(\.token) == [instanceToken], "the started instance is targeted")
        let state = try await fixture.pool.query(
            """
            SELECT state, content_state->>'status' AS status FROM instance_devices
            WHERE tenant_id = \(tenant.uuid) AND instance_id = \(instance)
            """)
        #expect(try state.first?.decode(String.self, "state") == "started")
        #expect(try state.first?.decode(String.self, "status") == "baking")
        let delivered = try await fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM delivery_metrics
            WHERE tenant_id = \(tenant.uuid) AND delivery_id = \(delivery) AND metric = 'delivered' AND recipient = \(device)
            """)
        #expect(delivered == 1)

        // Second batch: the activity ends and the second device is deleted.
        let second = try await api.call(
            "POST", "/v1/b",
            json: Self.envelope(
                [
                    Self.event(
                        "track", "Live Notification Event", userId: user,
                        properties: ["eventType": "end", "cioInstanceId": instance, "deviceId": device],
                        timestamp: started.addingTimeInterval(30)),
                    Self.event("track", "Device Deleted", userId: user, properties: [:], deviceToken: secondDevice),
                ], writeKey: tenant.sdk), headers: ["Authorization": tenant.basicSDK])
        #expect(second.status == 200, "\(second.text)")
        #expect(try second.json()["success"] as? Bool == true)
        #expect(try second.json()["applied"] as? Int == 2)
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).isEmpty)
        let remaining = try await api.call("GET", "/v1/people/\(user)", key: tenant.app).json().array("devices")
        #expect(remaining.map { $0.string("token") } == [maskToken(device)])

        let after = try await api.call("GET", "/metrics").text
        #expect(after.contains("# TYPE marquee_ingest_events_total counter"))
        for (series, count) in [
            (#"marquee_ingest_events_total{type="identify",outcome="applied"}"#, 1.0),
            (#"marquee_ingest_events_total{type="track",outcome="applied"}"#, 8.0),
            (#"marquee_ingest_events_total{type="track",outcome="ignored"}"#, 1.0),
            (#"marquee_ingest_events_total{type="track",outcome="rejected"}"#, 1.0),
            (#"marquee_ingest_events_total{type="track",outcome="discarded"}"#, 7.0),
            (#"marquee_ingest_events_total{type="identify",outcome="discarded"}"#, 1.0),
        ] {
            #expect(Self.sample(after, series) - Self.sample(before, series) >= count, "\(series)")
        }
    }

    @Test("events that are not objects, hold U+0000 or lack their type fail the batch by index; nothing applies")
    func oddEvents() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("odd")
        let good = Self.event("identify", userId: user, properties: ["email": user + "@example.com"])
        for (odd, field) in [
            (["not", "an", "event"] as Any, "batch[1]"),
            (Self.event("identify", userId: user + "\u{0}", properties: [:]), "batch[1].userId"),
            (["event": "Device Created or Updated"], "batch[1].type"),
        ] {
            let response = try await api.call(
                "POST", "/v1/b", key: tenant.sdk, json: ["batch": [good, odd], "sentAt": "2025-03-01T12:00:00.000Z"])
            expectProblem(response, 422, field == "batch[1].type" ? "missing-field" : "invalid-field", field: field)
            #expect(try response.json().string("detail")?.first?.isWhitespace == false)
            expectProblem(try await api.call("GET", "/v1/people/\(user)", key: tenant.app), 404, "not-found")
        }
        let response = try await api.call(
            "POST", "/v1/b", key: tenant.sdk, json: ["batch": [good], "sentAt": "2025-03-01T12:00:00.000Z"])
        #expect(try response.json()["applied"] as? Int == 1, "\(response.text)")
        #expect(try await api.call("GET", "/v1/people/\(user)", key: tenant.app).status == 200)
    }

    @Test("single /v1/track and /v1/identify calls; writeKey in the body is accepted; no key is 401")
    func singles() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("single")
        let identify = try await api.call(
            "POST", "/v1/identify",
            json: Self.event("identify", userId: user, properties: ["email": user + "@example.com"]),
            headers: ["Authorization": tenant.basicSDK])
        #expect(identify.status == 200, "\(identify.text)")
        #expect(try identify.json()["applied"] as? Int == 1)
        let device = Fake.hex()
        var track = Self.event(
            "track", "Device Created or Updated", userId: user, properties: ["app_version": 7], deviceToken: device)
        track["writeKey"] = tenant.sdk
        let tracked = try await api.call("POST", "/v1/track", json: track)
        #expect(tracked.status == 200, "\(tracked.text)")
        #expect(try tracked.json()["success"] as? Bool == true)
        let person = try await api.call("GET", "/v1/people/\(user)", key: tenant.app).json()
        #expect(person.string("email") == user + "@example.com")
        #expect(person.array("devices").first?.string("app_version") == "7")

        // A single call that breaks a rule is a problem of its own (the batch form would list it).
        let bad = try await api.call(
            "POST", "/v1/track",
            json: Self.event("track", "Device Created or Updated", userId: user, deviceToken: "zz"),
            headers: ["Authorization": tenant.basicSDK])
        expectProblem(bad, 422, "invalid-token", field: "context.device.token")

        expectProblem(
            try await api.call("POST", "/v1/b", json: Self.envelope([], writeKey: "nope")), 401, "unauthorized")
        expectProblem(
            try await api.call("POST", "/v1/track", key: tenant.app, json: Self.event("track", "X", userId: user)),
            403, "forbidden", "an app key is not an sdk key")
        expectProblem(
            try await api.call("POST", "/v1/b", key: tenant.sdk, json: ["sentAt": "x"]), 422, "missing-field",
            field: "batch")
    }

    @Test("a key in the Authorization header is checked before the body is read, on every ingest route")
    func headerKeyBeforeBody() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let wrong = "Basic " + Data((Fake.id("not-a-key") + ":").utf8).base64EncodedString()
        for path in ["/v1/b", "/v1/batch", "/v1/track", "/v1/identify"] {
            let malformed = Data("{\"type\": \"track\", ".utf8)
            expectProblem(
                try await api.call(
                    "POST", path, body: malformed, contentType: "application/json", headers: ["Authorization": wrong]),
                401, "unauthorized", "\(path), a wrong key")
            // The tenant's key: now the body is read, and refused.
            let refused = try await api.call(
                "POST", path, body: malformed, contentType: "application/json",
                headers: ["Authorization": tenant.basicSDK])
            #expect(refused.status == 400, "\(path), the right key: \(refused.text)")
        }
    }

    @Test("GET /v1/projects/{writeKey}/settings answers for sdk keys only")
    func settings() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let settings = try await api.call("GET", "/v1/projects/\(tenant.sdk)/settings")
        #expect(settings.status == 200, "\(settings.text)")
        let integration = try settings.json().object("integrations")?.object("Customer.io Data Pipelines")
        #expect(integration?.string("apiKey") == tenant.sdk)
        expectProblem(try await api.call("GET", "/v1/projects/\(tenant.app)/settings"), 404, "not-found")
        expectProblem(try await api.call("GET", "/v1/projects/unknown-key/settings"), 404, "not-found")
    }
}
