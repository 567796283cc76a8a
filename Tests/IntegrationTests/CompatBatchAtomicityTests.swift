import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// A Customer.io batch is written in one transaction: every event of it is applied, or none is.
@Suite("Compat batch atomicity")
struct CompatBatchAtomicityTests {
    /// How many rows of each table the batch could have written are there for `tenant`.
    static func footprint(_ pool: PostgresPool, tenant: UUID) async throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for table in [
            "people", "devices", "push_to_start_tokens", "activity_tokens", "activity_events", "instance_devices",
            "delivery_metrics",
        ] {
            counts[table] = try await pool.count(
                PostgresQuery(unsafeSQL: "SELECT count(*)::int AS n FROM \(table) WHERE tenant_id = '\(tenant)'"))
        }
        return counts
    }

    static func post(_ api: API, _ tenant: TestTenant, _ events: [Any], headers: [String: String] = [:]) async throws
        -> HTTP.Response
    {
        var all = headers
        all["Authorization"] = tenant.basicSDK
        return try await api.call("POST", "/v1/batch", json: ["batch": events], headers: all)
    }

    @Test("a batch whose last event is invalid applies none of the others (422 naming it); without it, all apply")
    func lastEventInvalid() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("atomic")
        let device = Fake.hex()
        let instance = Fake.id("atomic-inst")
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: user)
        let seeded = try await Self.footprint(fixture.pool, tenant: tenant.uuid)
        let secret = try await fixture.tenants.deliverySecret(tenant: tenant.uuid)
        let good: [[String: Any]] = [
            CompatIngestTests.event("identify", userId: user, properties: ["email": user + "@example.com"]),
            CompatIngestTests.event(
                "track", "Device Created or Updated", userId: user, properties: ["device_os": "17.4"],
                deviceToken: device),
            CompatIngestTests.event(
                "track", "Live Notification Token", userId: user,
                properties: [
                    "registrationType": "push_to_start", "pushToStartToken": Fake.hex(160),
                    "notificationType": Fake.activityType(), "deviceId": device,
                ]),
            CompatIngestTests.event(
                "track", "Live Notification Token", userId: user,
                properties: [
                    "registrationType": "instance", "cioInstanceId": instance, "instanceToken": Fake.hex(160),
                    "deviceId": device,
                ]),
            CompatIngestTests.event(
                "track", "Live Notification Event", userId: user,
                properties: ["eventType": "start", "cioInstanceId": instance, "deviceId": device]),
            CompatIngestTests.event(
                "track", "Report Delivery Event", userId: nil,
                properties: [
                    "metric": "delivered", "deliveryId": delivery, "recipient": device,
                    "deliveryToken": DeliveryTokens.make(deliveryID: delivery, secret: secret),
                ]),
            CompatIngestTests.event("track", "Application Opened", userId: user),
        ]
        let invalid = CompatIngestTests.event(
            "track", "Device Created or Updated", userId: user, deviceToken: "not-a-token")

        let refused = try await Self.post(api, tenant, good + [invalid])
        expectProblem(refused, 422, "invalid-token", field: "batch[7].context.device.token")
        let problem = try refused.json()
        #expect(problem.string("index") == "7")
        #expect(problem.string("messageId") == invalid["messageId"] as? String)
        #expect(!refused.text.contains("not-a-token"), "the bad token is not echoed")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid) == seeded, "nothing of the batch is kept")

        let applied = try await Self.post(api, tenant, good)
        #expect(applied.status == 200, "\(applied.text)")
        let result = try applied.json()
        #expect(result["success"] as? Bool == true)
        #expect(result["applied"] as? Int == 6)
        #expect(result["ignored"] as? Int == 1)
        #expect(result.array("rejected").isEmpty)
        let after = try await Self.footprint(fixture.pool, tenant: tenant.uuid)
        for table in [
            "devices", "push_to_start_tokens", "activity_tokens", "activity_events", "instance_devices",
            "delivery_metrics",
        ] {
            #expect(after[table] == 1, "\(table): \(after)")
        }
        #expect(after["people"] == 1)
    }

    @Test("an ownership failure in the last event (another person's instance) leaves no trace of the earlier ones")
    func lastEventNotOwner() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let victim = Fake.id("victim")
        let attacker = Fake.id("mallory")
        let phone = Fake.hex()
        let victimInstance = Fake.id("order")
        let ownInstance = Fake.id("own")
        try await fixture.seedInstance(tenant: tenant.uuid, id: victimInstance, person: victim)
        try await fixture.seedInstance(tenant: tenant.uuid, id: ownInstance, person: attacker)
        let seeded = try await Self.footprint(fixture.pool, tenant: tenant.uuid)
        let events: [[String: Any]] = [
            CompatIngestTests.event("identify", userId: attacker, properties: ["plan": "free"]),
            CompatIngestTests.event("track", "Device Created or Updated", userId: attacker, deviceToken: phone),
            CompatIngestTests.event(
                "track", "Live Notification Event", userId: attacker,
                properties: ["eventType": "start", "cioInstanceId": ownInstance, "deviceId": phone]),
            CompatIngestTests.event(
                "track", "Live Notification Token", userId: attacker,
                properties: [
                    "registrationType": "instance", "cioInstanceId": victimInstance, "instanceToken": Fake.hex(),
                    "deviceId": phone,
                ]),
        ]
        let refused = try await Self.post(api, tenant, events)
        expectProblem(refused, 404, "not-found", field: "batch[3]")
        #expect(try refused.json().string("index") == "3")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid) == seeded, "nothing of the batch is kept")
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: victimInstance).isEmpty)

        // A single call is one transaction too: the device it would have registered on the way is not kept.
        let single = try await api.call(
            "POST", "/v1/track", key: tenant.sdk, json: events[3])
        expectProblem(single, 404, "not-found")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid) == seeded)
    }

    @Test("identity verification refusing the last event (another person) rolls back the earlier ones: 403")
    func lastEventWrongPerson() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (tenant, secret) = try await IdentityVerificationTests.requiredTenant(api)
        let user = Fake.id("user")
        let events: [[String: Any]] = [
            CompatIngestTests.event("identify", userId: user, properties: ["email": user + "@example.com"]),
            CompatIngestTests.event("track", "Device Created or Updated", userId: user, deviceToken: Fake.hex()),
            CompatIngestTests.event("identify", userId: Fake.id("victim"), properties: ["email": "evil@example.com"]),
        ]
        let token = [
            IdentityVerificationTests.header: IdentityVerificationTests.token(
                user, secret, email: user + "@example.com")
        ]
        let refused = try await Self.post(api, tenant, events, headers: token)
        expectProblem(refused, 403, "user-token-wrong-person", field: IdentityVerificationTests.header)
        #expect(try refused.json().string("index") == "2")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid).values.allSatisfy { $0 == 0 })

        let applied = try await Self.post(api, tenant, Array(events.prefix(2)), headers: token)
        #expect(applied.status == 200, "\(applied.text)")
        #expect(try applied.json()["applied"] as? Int == 2)
    }

    /// Under identity verification (without it an `identify` never tells an email is taken: `TakenEmails`).
    @Test("a conflict the database finds in the last event (a vouched email taken) rolls back the earlier ones: 409")
    func lastEventConflict() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (tenant, secret) = try await IdentityVerificationTests.requiredTenant(api)
        let taken = Fake.id("owner") + "@example.com"
        #expect(
            try await api.call("PUT", "/v1/people/\(Fake.id("owner"))", key: tenant.app, json: ["email": taken])
                .status == 200)
        let seeded = try await Self.footprint(fixture.pool, tenant: tenant.uuid)
        let user = Fake.id("user")
        let events: [[String: Any]] = [
            CompatIngestTests.event("identify", userId: user, properties: ["plan": "pro"]),
            CompatIngestTests.event("track", "Device Created or Updated", userId: user, deviceToken: Fake.hex()),
            CompatIngestTests.event("identify", userId: user, properties: ["email": taken]),
        ]
        let refused = try await Self.post(
            api, tenant, events,
            headers: [IdentityVerificationTests.header: IdentityVerificationTests.token(user, secret, email: taken)])
        expectProblem(refused, 409, "conflict", field: "batch[2].email")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid) == seeded, "nothing of the batch is kept")
    }

    @Test("an activity token checked for another platform than its registered device's is refused, naming platform")
    func tokenPlatformIsTheDevices() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let user = Fake.id("plat")
        let iphone = Fake.hex()
        let instance = Fake.id("plat-inst")
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: user)
        let device = CompatIngestTests.event(
            "track", "Device Created or Updated", userId: user, properties: ["device_os": "17.4"], deviceToken: iphone)
        #expect(try await Self.post(api, tenant, [device]).status == 200)
        // The iPhone named with platform android: its token would pass as an FCM token, and replace the real one.
        let wrong = CompatIngestTests.event(
            "track", "Live Notification Token", userId: user,
            properties: [
                "registrationType": "instance", "cioInstanceId": instance, "instanceToken": "not:hex",
                "deviceId": iphone, "platform": "android",
            ])
        expectProblem(
            try await Self.post(api, tenant, [wrong]), 422, "invalid-field", field: "batch[0].properties.platform")
        let tokens = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM activity_tokens WHERE tenant_id = \(tenant.uuid) AND instance_id = \(instance)"
        )
        #expect(tokens == 0)
    }

    @Test("a batch whose database connection dies mid-way (a crash) leaves nothing half-applied")
    func connectionLostMidBatch() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let owner = Fake.id("owner")
        let locked = Fake.hex()
        _ = try await fixture.registry.upsertDevice(
            tenant: tenant.uuid, DeviceRegistration(personID: owner, token: locked, platform: .ios))
        let seeded = try await Self.footprint(fixture.pool, tenant: tenant.uuid)

        // The test holds the last event's device row, so the batch stops there with its earlier events written.
        let holder = try PostgresConnection(connecting: try PostgresConfiguration(url: fixture.databaseURL))
        try holder.execute("BEGIN")
        try holder.query("SELECT 1 FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(locked) FOR UPDATE")
        let holderPID = try holder.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")

        let user = Fake.id("user")
        let events: [[String: Any]] = [
            CompatIngestTests.event("identify", userId: user, properties: ["plan": "pro"]),
            CompatIngestTests.event("track", "Device Created or Updated", userId: user, deviceToken: Fake.hex()),
            CompatIngestTests.event("track", "Device Created or Updated", userId: owner, deviceToken: locked),
        ]
        let sent = Task { try await Self.post(api, tenant, events) }
        let waiting = try #require(
            try await fixture.backend(blockedBy: holderPID), "the batch reached the locked device")
        // Its connection dies as if the server process or the network had: the transaction never commits.
        _ = try await fixture.pool.query("SELECT pg_terminate_backend(\(waiting)::int)")
        let response = try await sent.value
        try holder.execute("ROLLBACK")
        #expect(response.status == 503, "\(response.text)")
        #expect(try await Self.footprint(fixture.pool, tenant: tenant.uuid) == seeded, "nothing of the batch is kept")
    }
}

extension RegistryFixture.Running {
    /// The backend that waits for a lock the backend `holder` holds, once there is one (nil after `timeout`).
    func backend(blockedBy holder: Int, timeout: Duration = .seconds(30)) async throws -> Int? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let pid = try await pool.query(
                "SELECT pid FROM pg_stat_activity WHERE \(holder)::int = ANY(pg_blocking_pids(pid))"
            ).first?.decode(Int.self, "pid") {
                return pid
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }
}
