import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// The sdk key ships inside every app: these are the attacks anyone holding it could try, whatever the tenant's
/// settings, and each must be refused.
@Suite("sdk key abuse")
struct SDKKeyAbuseTests {
    @Test("metrics without the delivery's token are refused, on the native and the Customer.io route")
    func forgedMetrics() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        expectProblem(
            try await api.call(
                "POST", "/v1/deliveries/\(delivery)/metrics", key: tenant.sdk, json: ["metric": "opened"]),
            422, "missing-field", field: "delivery_token")
        for extra in [[:], ["deliveryToken": "forged"]] as [[String: Any]] {
            var properties: [String: Any] = ["metric": "opened", "deliveryId": delivery]
            properties.merge(extra) { $1 }
            let response = try await api.call(
                "POST", "/v1/track", key: tenant.sdk,
                json: CompatIngestTests.event("track", "Report Delivery Event", userId: nil, properties: properties))
            #expect(response.status == 422, "\(response.text)")
            #expect(try response.json().string("field") == "properties.deliveryToken")
        }
        let forged = try await fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM delivery_metrics
            WHERE tenant_id = \(tenant.uuid) AND delivery_id = \(delivery)
            """)
        #expect(forged == 0, "no forged metric was recorded")

        let token = DeliveryTokens.make(
            deliveryID: delivery, secret: try await fixture.tenants.deliverySecret(tenant: tenant.uuid))
        let genuine = try await api.call(
            "POST", "/v1/track", key: tenant.sdk,
            json: CompatIngestTests.event(
                "track", "Report Delivery Event", userId: nil,
                properties: ["metric": "opened", "deliveryId": delivery, "deliveryToken": token]))
        #expect(genuine.status == 200, "\(genuine.text)")
    }

    @Test("Device Deleted needs the device's owner: no userId is refused, another's userId deletes nothing")
    func deviceDeletedNeedsOwner() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let victim = Fake.id("victim")
        let device = Fake.hex()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(victim)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)

        let anonymous = try await api.call(
            "POST", "/v1/track", key: tenant.sdk,
            json: CompatIngestTests.event("track", "Device Deleted", userId: nil, deviceToken: device))
        #expect(anonymous.status == 422, "\(anonymous.text)")
        #expect(try anonymous.json().string("field") == "userId")
        let other = try await api.call(
            "POST", "/v1/track", key: tenant.sdk,
            json: CompatIngestTests.event("track", "Device Deleted", userId: Fake.id("mallory"), deviceToken: device))
        #expect(other.status == 200, "\(other.text)")
        #expect(try other.json()["applied"] as? Int == 0)

        let devices = try await api.call("GET", "/v1/people/\(victim)", key: tenant.app).json().array("devices")
        #expect(devices.map { $0.string("token") } == [maskToken(device)], "the victim keeps the device")
    }

    @Test("a device of another person cannot attach a token or report events for an instance: 404, nothing stored")
    func instanceHijack() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let victim = Fake.id("victim")
        let attacker = Fake.id("mallory")
        let victimPhone = Fake.hex()
        let attackerPhone = Fake.hex()
        let instance = Fake.id("order")
        for (person, device) in [(victim, victimPhone), (attacker, attackerPhone)] {
            #expect(
                try await api.call(
                    "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
                ).status == 200)
        }
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: victim)

        expectProblem(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(attackerPhone)", key: tenant.sdk,
                json: ["token": Fake.hex()]), 404, "not-found")
        expectProblem(
            try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                json: ["event": "started", "device_token": attackerPhone, "at": Date().timeIntervalSince1970]),
            404, "not-found")
        for properties in [
            [
                "registrationType": "instance", "cioInstanceId": instance, "instanceToken": Fake.hex(),
                "deviceId": attackerPhone,
            ],
            ["eventType": "start", "cioInstanceId": instance, "deviceId": attackerPhone],
        ] {
            let name = properties["registrationType"] == nil ? "Live Notification Event" : "Live Notification Token"
            let response = try await api.call(
                "POST", "/v1/track", key: tenant.sdk,
                json: CompatIngestTests.event("track", name, userId: attacker, properties: properties))
            #expect(response.status == 404, "\(name): \(response.text)")
        }
        // An instance that does not exist is refused the same way (no probing for IDs).
        expectProblem(
            try await api.call(
                "PUT", "/v1/live_notifications/\(Fake.id("order"))/tokens/\(attackerPhone)", key: tenant.sdk,
                json: ["token": Fake.hex()]), 404, "not-found")
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).isEmpty)

        // The victim's own device still can.
        #expect(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(victimPhone)", key: tenant.sdk,
                json: ["token": Fake.hex()]
            ).status == 200)
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).count == 1)
    }

    @Test("a compat batch with a wrong key is refused before its body is parsed: 401, not 400")
    func batchAuthenticatedFirst() async throws {
        let api = try await RegistryFixture.get().api
        for path in ["/v1/b", "/v1/batch"] {
            let response = try await api.call(
                "POST", path, body: Data("{not json".utf8), contentType: "application/json",
                headers: ["Authorization": "Bearer not-a-key"])
            #expect(response.status == 401, "\(path): \(response.text)")
        }
    }

    @Test("an event's content_state is capped at 4 KiB: 422 naming the field")
    func eventContentStateCap() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        let device = Fake.hex()
        let instance = Fake.id("inst")
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: person)
        let big = ["blob": String(repeating: "x", count: 5000)]
        expectProblem(
            try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                json: [
                    "event": "started", "device_token": device, "at": Date().timeIntervalSince1970,
                    "content_state": big,
                ]), 422, "invalid-field", field: "content_state")
        let compat = try await api.call(
            "POST", "/v1/track", key: tenant.sdk,
            json: CompatIngestTests.event(
                "track", "Live Notification Event", userId: person,
                properties: [
                    "eventType": "start", "cioInstanceId": instance, "deviceId": device, "contentState": big,
                ]))
        #expect(compat.status == 422, "\(compat.text)")
        #expect(try compat.json().string("field") == "properties.contentState")
        let stored = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM activity_events WHERE tenant_id = \(tenant.uuid)")
        #expect(stored == 0)
    }
}

extension RegistryFixture.Running {
    /// An active instance started for `person`, as a start leaves it, written directly (no credentials or deliveries
    /// needed): devices may report tokens and events only for instances of their own person.
    func seedInstance(tenant: UUID, id: String, person: String) async throws {
        try await pool.execute(
            """
            INSERT INTO instances (tenant_id, id, activity_type, person_id, state, attributes, content_state,
                                   content_timestamp, expires_at)
            VALUES (\(tenant), \(id), 'com.example.seeded', \(person), 'active', '{}', '{}', 1,
                    now() + interval '8 hours')
            """)
    }

    /// A delivery of `tenant` as a worker records one (a history row, written directly: no instance or credentials
    /// needed), and its ID as its push carries it (a ULID): a delivery metric is kept only for a delivery that is
    /// there (migration 0101).
    func recordedDelivery(tenant: UUID) async throws -> String {
        let id = ULIDGenerator.shared.next()
        try await pool.execute(
            """
            INSERT INTO delivery_history (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                          operation, instance_version, status, attempts, created_at)
            VALUES (\(tenant), \(id.uuid), 'seeded', 'seeded', 'apns', 'activity', 'seeded', 'update', 1, 'sent', 1,
                    now())
            """)
        return id.description
    }
}
