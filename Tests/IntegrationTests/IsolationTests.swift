import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// Tenant isolation through every route: tenant B's keys never see or change tenant A's data.
@Suite("Tenant isolation")
struct IsolationTests {
    /// What a probe with B's credentials must get.
    enum Expectation {
        /// 404 not-found, the same answer as for something that does not exist at all (`control` path).
        case notFound(control: String?)
        /// 401: tenant keys are not admin tokens.
        case unauthorized
        /// A write into B's own namespace: this status; A's data is checked unchanged afterwards.
        case own(Int)
        /// A 422 for this field (e.g. A's delivery token presented by B).
        case invalid(field: String)
        /// Any non-5xx answer that mentions none of A's identifiers.
        case noLeak
    }

    struct Probe {
        var method: String
        var path: String
        var key: String?
        var body: [String: Any]?
        var headers: [String: String] = [:]
        /// A body that is not JSON (with its media type), instead of `body`.
        var raw: (body: Data, contentType: String)? = nil
        var expect: Expectation
    }

    /// Tenant A with data in every table.
    struct Seeded {
        var tenant: TestTenant
        var person: String
        var email: String
        var iphone: String
        var pixel: String
        var activityType: String
        var instance: String
        var delivery: String
        var recipient: String
        var teamID: String
        var projectID: String
        var keyIDs: [String]
        /// A's broadcast channel (ULID) and Apple's ID for it.
        var channel: String
        var apnsChannel: String
        /// A's segment (its ID and name both A's).
        var segment: String
        /// A's campaign (scheduled an hour ahead: this fixture runs no worker).
        var campaign: String

        /// Strings of A's that must never appear in an answer to B.
        var secrets: [String] {
            [
                tenant.id, tenant.name, person, email, iphone, pixel, activityType, instance, teamID, projectID,
                tenant.app,
                tenant.sdk, channel, apnsChannel, segment, campaign,
            ] + keyIDs
        }
    }

    static func seed(_ fixture: RegistryFixture.Running) async throws -> Seeded {
        let api = fixture.api
        let tenant = try await api.createTenant("isolation-A-" + Fake.hex(8))
        let person = Fake.id("alice")
        let email = person + "@a.example.com"
        let iphone = Fake.hex()
        let pixel = Fake.fcm()
        let type = Fake.activityType()
        let instance = Fake.id("inst")
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        let teamID = "T" + Fake.hex(9).uppercased()
        let projectID = "proj-" + Fake.hex(8)
        func ok(_ r: HTTP.Response, _ statuses: Set<Int> = [200, 201, 202, 204]) throws {
            guard statuses.contains(r.status) else { throw TestFailure("seeding A: \(r.status) \(r.text)") }
        }
        try ok(await api.call("PUT", "/v1/people/\(person)", key: tenant.app, json: ["email": email]))
        try ok(
            await api.call("PUT", "/v1/people/\(person)/devices/\(iphone)", key: tenant.sdk, json: ["platform": "ios"]))
        try ok(
            await api.call(
                "PUT", "/v1/people/\(person)/devices/\(pixel)", key: tenant.sdk, json: ["platform": "android"]))
        try ok(
            await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "AAttrs"]))
        try ok(
            await api.call(
                "PUT", "/v1/people/\(person)/devices/\(iphone)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": Fake.hex()]))
        // Devices report tokens and events only for instances of their own person: start first.
        try ok(
            await api.call(
                "POST", "/v1/live_notifications/start", key: tenant.app,
                json: [
                    "identifiers": ["id": person], "notification_type": type, "attributes": ["order": "a"],
                    "content_state": ["step": 1], "instance_id": instance,
                    "push_payload": ["alert": ["title": "A", "body": "started"]],
                ]))
        try ok(
            await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(iphone)", key: tenant.sdk,
                json: ["token": Fake.hex()]))
        for device in [iphone, pixel] {
            try ok(
                await api.call(
                    "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                    json: ["event": "started", "device_token": device, "at": Date().timeIntervalSince1970]))
        }
        try ok(
            await api.call(
                "POST", "/v1/deliveries/\(delivery)/metrics", key: tenant.sdk,
                json: [
                    "metric": "delivered", "recipient": iphone,
                    "delivery_token": DeliveryTokens.make(
                        deliveryID: delivery, secret: try await fixture.tenants.deliverySecret(tenant: tenant.uuid)),
                ]))
        try ok(
            await api.call(
                "PUT", "/v1/credentials/apns", key: tenant.app,
                json: [
                    "team_id": teamID, "key_id": "KEY1234567", "private_key": ES256PrivateKey.generate().pkcs8PEM,
                    "bundle_id": "com.example.a", "environment": "sandbox",
                ]))
        var account = RegistryTests.serviceAccount(pem: try RS256PrivateKey.generate().pkcs8PEM)
        account["project_id"] = projectID
        try ok(await api.call("PUT", "/v1/credentials/fcm", key: tenant.app, json: ["service_account": account]))
        let keys = try await api.call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: MarqueeProcess.adminToken)
        // A channel as the API records one after Apple created it (this fixture has no APNs to create it at).
        let channel = ULIDGenerator.shared.next()
        let apnsChannel = Data(SecureRandom.bytes(18)).base64EncodedString()
        _ = try await ChannelStore(database: TenantDatabase(pool: fixture.pool)).insert(
            tenant: tenant.uuid,
            ChannelRecord(
                id: channel.uuid, activityType: type, storagePolicy: .mostRecent, apnsChannelID: apnsChannel,
                bundleID: "com.example.a", environment: "sandbox", createdAt: Date(), updatedAt: Date()),
            idempotency: nil)
        let segment = Fake.id("seg")
        try ok(
            await api.call(
                "PUT", "/v1/segments/\(segment)", key: tenant.app,
                json: ["name": segment, "filter": ["email_domain": "a.example.com"]]))
        let campaign = Fake.id("camp")
        try ok(
            await api.call(
                "POST", "/v1/campaigns", key: tenant.app,
                json: [
                    "campaign_id": campaign, "name": campaign, "notification_type": type, "audience": ["all": true],
                    "attributes": ["order": ["$person": "/order", "default": "?"]], "content_state": ["step": 0],
                    "push_payload": ["alert": ["title": "A", "body": "campaign"]],
                    "start_at": Date().timeIntervalSince1970 + 3600,
                ]))
        return Seeded(
            tenant: tenant, person: person, email: email, iphone: iphone, pixel: pixel, activityType: type,
            instance: instance, delivery: delivery, recipient: iphone, teamID: teamID, projectID: projectID,
            keyIDs: try keys.json().array("keys").compactMap { $0.string("id") }, channel: channel.description,
            apnsChannel: apnsChannel, segment: segment, campaign: campaign)
    }

    /// A's data as A sees it (timestamps included, so any write would show).
    static func snapshot(_ fixture: RegistryFixture.Running, _ a: Seeded) async throws -> [String] {
        let api = fixture.api
        var views: [String] = []
        for path in [
            "/v1/people/\(a.person)", "/v1/credentials/apns", "/v1/credentials/fcm", "/v1/activity_types",
            "/v1/activity_types/\(a.activityType)", "/v1/live_notifications/\(a.instance)",
            "/v1/live_notifications/\(a.instance)/deliveries", "/v1/live_notifications", "/v1/channels",
            "/v1/channels/\(a.channel)", "/v1/segments", "/v1/segments/\(a.segment)", "/v1/campaigns",
            "/v1/campaigns/\(a.campaign)", "/v1/campaigns/\(a.campaign)/people",
        ] {
            let response = try await api.call("GET", path, key: a.tenant.app)
            views.append("\(path) \(response.status) \(response.text)")
        }
        let tenant = try await api.call("GET", "/admin/v1/tenants/\(a.tenant.id)", key: MarqueeProcess.adminToken)
        views.append(tenant.text)
        let keys = try await api.call("GET", "/admin/v1/tenants/\(a.tenant.id)/keys", key: MarqueeProcess.adminToken)
        views.append(
            try keys.json().array("keys").map { "\($0["id"] ?? "") \($0["revoked_at"] ?? "")" }.sorted()
                .joined(separator: ","))
        let targets = try await fixture.registry.activityTargets(tenant: a.tenant.uuid, instanceID: a.instance)
        views.append(targets.map { "\($0.deviceToken)=\($0.token)" }.sorted().joined(separator: ","))
        let metrics = try await fixture.pool.query(
            """
            SELECT metric || ':' || recipient || ':' || at::text AS m FROM delivery_metrics
            WHERE tenant_id = \(a.tenant.uuid) ORDER BY 1
            """)
        views.append(try metrics.map { try $0.decode(String.self, "m") }.joined(separator: ","))
        let events = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM activity_events WHERE tenant_id = \(a.tenant.uuid)")
        views.append("events=\(events)")
        return views
    }

    @Test("every registered route: B's keys get 404 for A's data, or write only into B")
    func everyRoute() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let routes = try RegisteredRoutes()
        try #require(routes.all.count >= 30, "read \(routes.all.count) routes from the router")

        let a = try await Self.seed(fixture)
        let b = try await api.createTenant("isolation-B-" + Fake.hex(8))
        let bDeliveryToken = DeliveryTokens.make(
            deliveryID: a.delivery, secret: try await fixture.tenants.deliverySecret(tenant: b.uuid))
        #expect(try await Self.snapshot(fixture, a).allSatisfy { !$0.contains(" 404 ") }, "A is fully seeded")
        let before = try await Self.snapshot(fixture, a)

        let secret = try await fixture.tenants.deliverySecret(tenant: a.tenant.uuid)
        let aDeliveryToken = DeliveryTokens.make(deliveryID: a.delivery, secret: secret)
        let now = Date().timeIntervalSince1970
        let forgedSDK = "mq_sdk_\(a.tenant.id.replacingOccurrences(of: "-", with: ""))_" + Fake.hex(43)
        let aKey = a.keyIDs[0]
        let compatBatch: [String: Any] = [
            "batch": [
                [
                    "type": "track", "event": "Device Deleted", "userId": a.person, "messageId": UUID().uuidString,
                    "context": ["device": ["token": a.iphone, "type": "ios"]], "properties": [:],
                ],
                [
                    "type": "track", "event": "Live Notification Event", "messageId": UUID().uuidString,
                    "properties": ["eventType": "end", "cioInstanceId": a.instance, "deviceId": a.iphone],
                ],
                [
                    "type": "track", "event": "Live Notification Token", "userId": a.person,
                    "messageId": UUID().uuidString,
                    "properties": [
                        "registrationType": "instance", "cioInstanceId": a.instance, "instanceToken": Fake.hex(),
                        "deviceId": a.pixel, "platform": "android",
                    ],
                ],
                [
                    "type": "identify", "userId": a.person, "messageId": UUID().uuidString,
                    "traits": ["email": "b-" + a.email],
                ],
            ],
            "sentAt": "2025-01-01T00:00:00.000Z",
        ]
        // Only the events that name nothing of A's that B must know (Device Deleted, identify).
        var compatOwnBatch = compatBatch
        let compatEvents = compatBatch["batch"] as? [Any] ?? []
        compatOwnBatch["batch"] = [compatEvents[0], compatEvents[3]]

        let newB = [
            "team_id": "BBBBB22222", "key_id": "KEYB234567", "private_key": ES256PrivateKey.generate().pkcs8PEM,
            "bundle_id": "com.example.b", "environment": "production",
        ]
        var bAccount = RegistryTests.serviceAccount(pem: try RS256PrivateKey.generate().pkcs8PEM)
        bAccount["project_id"] = "proj-b"

        // Reads and deletes first, then writes that land in B's namespace (which would make later reads find B's).
        let probes: [Probe] = [
            // System routes carry no tenant data.
            Probe(method: "GET", path: "/healthz", key: b.app, expect: .noLeak),
            Probe(method: "GET", path: "/readyz", key: b.app, expect: .noLeak),
            Probe(method: "GET", path: "/metrics", key: b.app, expect: .noLeak),
            // Admin routes: tenant keys are not admin tokens.
            Probe(method: "POST", path: "/admin/v1/tenants", key: b.app, body: ["name": "x"], expect: .unauthorized),
            Probe(method: "GET", path: "/admin/v1/tenants", key: b.app, expect: .unauthorized),
            Probe(method: "GET", path: "/admin/v1/tenants/\(a.tenant.id)", key: b.app, expect: .unauthorized),
            Probe(method: "GET", path: "/admin/v1/tenants/\(a.tenant.id)/keys", key: b.app, expect: .unauthorized),
            Probe(
                method: "POST", path: "/admin/v1/tenants/\(a.tenant.id)/keys", key: b.app, body: ["kind": "app"],
                expect: .unauthorized),
            Probe(
                method: "POST", path: "/admin/v1/tenants/\(a.tenant.id)/keys/\(aKey)/rotate", key: b.app, body: [:],
                expect: .unauthorized),
            Probe(
                method: "DELETE", path: "/admin/v1/tenants/\(a.tenant.id)/keys/\(aKey)", key: b.sdk,
                expect: .unauthorized),
            // Credentials: B has none, and cannot remove A's.
            Probe(method: "GET", path: "/v1/credentials/apns", key: b.app, expect: .notFound(control: nil)),
            Probe(method: "DELETE", path: "/v1/credentials/apns", key: b.app, expect: .notFound(control: nil)),
            Probe(method: "GET", path: "/v1/credentials/fcm", key: b.app, expect: .notFound(control: nil)),
            Probe(method: "DELETE", path: "/v1/credentials/fcm", key: b.app, expect: .notFound(control: nil)),
            // Activity types.
            Probe(method: "GET", path: "/v1/activity_types", key: b.app, expect: .noLeak),
            Probe(
                method: "GET", path: "/v1/activity_types/\(a.activityType)", key: b.app,
                expect: .notFound(control: "/v1/activity_types/\(Fake.activityType())")),
            // People, devices, tokens, events.
            Probe(
                method: "GET", path: "/v1/people/\(a.person)", key: b.app,
                expect: .notFound(control: "/v1/people/\(Fake.id("nobody"))")),
            Probe(
                method: "DELETE", path: "/v1/people/\(a.person)", key: b.app,
                expect: .notFound(control: "/v1/people/\(Fake.id("nobody"))")),
            Probe(
                method: "DELETE", path: "/v1/people/\(a.person)/devices/\(a.iphone)", key: b.sdk,
                expect: .notFound(control: "/v1/people/\(a.person)/devices/\(Fake.hex())")),
            Probe(
                method: "PUT", path: "/v1/people/\(a.person)/devices/\(a.iphone)/push_to_start/\(a.activityType)",
                key: b.sdk, body: ["token": Fake.hex()],
                expect: .notFound(
                    control: "/v1/people/\(a.person)/devices/\(Fake.hex())/push_to_start/\(a.activityType)")
            ),
            Probe(
                method: "PUT", path: "/v1/live_notifications/\(a.instance)/tokens/\(a.iphone)", key: b.sdk,
                body: ["token": Fake.hex()],
                expect: .notFound(control: "/v1/live_notifications/\(a.instance)/tokens/\(Fake.hex())")),
            Probe(
                method: "POST", path: "/v1/live_notifications/\(a.instance)/events", key: b.sdk,
                body: ["event": "ended", "device_token": a.iphone, "at": now + 10], expect: .notFound(control: nil)),
            // Live activities: A's instance is invisible to B and cannot be changed by B.
            Probe(
                method: "GET", path: "/v1/live_notifications/\(a.instance)", key: b.app,
                expect: .notFound(control: "/v1/live_notifications/\(Fake.id("none"))")),
            Probe(
                method: "GET", path: "/v1/live_notifications/\(a.instance)/deliveries", key: b.app,
                expect: .notFound(control: "/v1/live_notifications/\(Fake.id("none"))/deliveries")),
            Probe(method: "GET", path: "/v1/live_notifications?person=\(a.person)", key: b.app, expect: .noLeak),
            Probe(
                method: "POST", path: "/v1/live_notifications/update", key: b.app,
                body: ["instance_id": a.instance, "content_state": ["step": 99]], expect: .notFound(control: nil)),
            Probe(
                method: "POST", path: "/v1/live_notifications/end", key: b.app, body: ["instance_id": a.instance],
                expect: .notFound(control: nil)),
            Probe(
                method: "POST", path: "/v1/live_notifications/start", key: b.app,
                body: [
                    "identifiers": ["id": a.person], "notification_type": a.activityType, "attributes": ["o": "b"],
                    "content_state": ["step": 1], "instance_id": a.instance,
                    "push_payload": ["alert": ["title": "B", "body": "b"]],
                ], expect: .invalid(field: "notification_type")),
            // Broadcast channels: A's is invisible to B and cannot be deleted by B (at Apple or here). B's create
            // names A's activity type, which B does not have.
            Probe(method: "GET", path: "/v1/channels", key: b.app, expect: .noLeak),
            Probe(
                method: "GET", path: "/v1/channels/\(a.channel)", key: b.app,
                expect: .notFound(control: "/v1/channels/\(ULIDGenerator.shared.next())")),
            Probe(
                method: "DELETE", path: "/v1/channels/\(a.channel)", key: b.app,
                expect: .notFound(control: "/v1/channels/\(ULIDGenerator.shared.next())")),
            Probe(
                method: "POST", path: "/v1/channels", key: b.app,
                body: ["activity_type": a.activityType, "storage_policy": "none"],
                expect: .invalid(field: "activity_type")),
            // Segments: A's is invisible to B, cannot be previewed or deleted by B; B's PUT under its ID is B's own.
            Probe(method: "GET", path: "/v1/segments", key: b.app, expect: .noLeak),
            Probe(
                method: "GET", path: "/v1/segments/\(a.segment)", key: b.app,
                expect: .notFound(control: "/v1/segments/\(Fake.id("none"))")),
            Probe(
                method: "POST", path: "/v1/segments/\(a.segment)/preview", key: b.app,
                expect: .notFound(control: "/v1/segments/\(Fake.id("none"))/preview")),
            Probe(
                method: "DELETE", path: "/v1/segments/\(a.segment)", key: b.app,
                expect: .notFound(control: "/v1/segments/\(Fake.id("none"))")),
            // Campaigns: A's is invisible to B, and B can neither change, end nor cancel it; B's create under its ID
            // names A's activity type, which B does not have.
            Probe(method: "GET", path: "/v1/campaigns", key: b.app, expect: .noLeak),
            Probe(
                method: "GET", path: "/v1/campaigns/\(a.campaign)", key: b.app,
                expect: .notFound(control: "/v1/campaigns/\(Fake.id("none"))")),
            Probe(
                method: "GET", path: "/v1/campaigns/\(a.campaign)/people", key: b.app,
                expect: .notFound(control: "/v1/campaigns/\(Fake.id("none"))/people")),
            Probe(
                method: "POST", path: "/v1/campaigns/\(a.campaign)/update", key: b.app,
                body: ["content_state_patch": ["step": 9]],
                expect: .notFound(control: "/v1/campaigns/\(Fake.id("none"))/update")),
            Probe(
                method: "POST", path: "/v1/campaigns/\(a.campaign)/end", key: b.app, body: [:],
                expect: .notFound(control: "/v1/campaigns/\(Fake.id("none"))/end")),
            Probe(
                method: "POST", path: "/v1/campaigns/\(a.campaign)/cancel", key: b.app,
                expect: .notFound(control: "/v1/campaigns/\(Fake.id("none"))/cancel")),
            Probe(
                method: "POST", path: "/v1/campaigns", key: b.app,
                body: [
                    "campaign_id": a.campaign, "name": "b", "notification_type": a.activityType,
                    "audience": ["all": true], "attributes": ["o": "b"], "content_state": ["step": 1],
                    "push_payload": ["alert": ["title": "B", "body": "b"]],
                ], expect: .invalid(field: "notification_type")),
            // The console's aggregates count B's own only (B has nothing: no A identifier may appear), and its files
            // hold no tenant data at all.
            Probe(method: "GET", path: "/v1/overview", key: b.app, expect: .noLeak),
            Probe(method: "GET", path: "/v1/delivery_failures?hours=168", key: b.app, expect: .noLeak),
            Probe(method: "GET", path: "/console", key: nil, expect: .noLeak),
            Probe(method: "GET", path: "/console/app.js", key: b.app, expect: .noLeak),
            // Metrics: A's delivery token is not B's, and with B's own token for its ID, A's delivery is no delivery
            // of B's (404, as for none at all).
            Probe(
                method: "POST", path: "/v1/deliveries/\(a.delivery)/metrics", key: b.sdk,
                body: ["metric": "opened", "delivery_token": aDeliveryToken], expect: .invalid(field: "delivery_token")),
            Probe(
                method: "POST", path: "/v1/deliveries/\(a.delivery)/metrics", key: b.sdk,
                body: ["metric": "delivered", "recipient": a.recipient, "delivery_token": bDeliveryToken],
                expect: .notFound(control: nil)),
            // Compat ingest with B's sdk key naming A's person, devices and instance.
            // A batch is all or nothing: A's device and instance are unknown in B, so the whole batch is refused;
            // without those events it is B's own.
            Probe(
                method: "POST", path: "/v1/b", key: nil, body: compatBatch, headers: ["Authorization": b.basicSDK],
                expect: .notFound(control: nil)),
            Probe(method: "POST", path: "/v1/batch", key: b.sdk, body: compatOwnBatch, expect: .own(200)),
            Probe(
                method: "POST", path: "/v1/track", key: nil,
                body: [
                    "event": "Device Deleted", "userId": a.person,
                    "context": ["device": ["token": a.pixel, "type": "android"]],
                ], headers: ["Authorization": b.basicSDK], expect: .own(200)),
            Probe(
                method: "POST", path: "/v1/identify", key: nil,
                body: ["userId": a.person, "traits": ["email": "c-" + a.email], "writeKey": b.sdk], expect: .own(200)),
            Probe(method: "GET", path: "/v1/projects/\(b.sdk)/settings", key: nil, expect: .noLeak),
            Probe(
                method: "GET", path: "/v1/projects/\(forgedSDK)/settings", key: nil,
                expect: .notFound(control: "/v1/projects/\(Fake.hex(20))/settings")),
            // Writes into B's namespace under A's names.
            Probe(method: "PUT", path: "/v1/credentials/apns", key: b.app, body: newB, expect: .own(200)),
            Probe(
                method: "PUT", path: "/v1/credentials/fcm", key: b.app, body: ["service_account": bAccount],
                expect: .own(200)),
            Probe(
                method: "PUT", path: "/v1/activity_types/\(a.activityType)", key: b.app,
                body: ["attributes_type": "BAttrs"], expect: .own(201)),
            Probe(
                method: "PUT", path: "/v1/people/\(a.person)", key: b.sdk, body: ["email": "b-" + a.email],
                expect: .own(200)),
            Probe(
                method: "PUT", path: "/v1/people/\(a.person)/devices/\(a.iphone)", key: b.sdk,
                body: ["platform": "ios"], expect: .own(200)),
            // A bulk import naming A's person and device creates B's own.
            Probe(
                method: "POST", path: "/v1/people/import", key: b.app,
                raw: (
                    Data(
                        #"{"id":"\#(a.person)","devices":[{"token":"\#(a.iphone)","platform":"ios"}]}"#
                            .utf8),
                    "application/x-ndjson"
                ), expect: .own(200)),
            Probe(
                method: "PUT", path: "/v1/segments/\(a.segment)", key: b.app,
                body: ["name": "b", "filter": ["has_device": [:] as [String: Any]]], expect: .own(201)),
            // Settings: B reads and changes only its own.
            Probe(method: "GET", path: "/v1/settings", key: b.app, expect: .noLeak),
            Probe(method: "POST", path: "/v1/settings/identity_secret", key: b.app, expect: .own(201)),
            Probe(
                method: "PATCH", path: "/v1/settings", key: b.app, body: ["identity_verification": "off"],
                expect: .own(200)),
        ]

        var covered: Set<String> = []
        for probe in probes {
            let label = "\(probe.method) \(probe.path)"
            let route = try #require(routes.resolve(probe.method, probe.path), "\(label) matches no route")
            covered.insert(route)
            let response = try await api.call(
                probe.method, probe.path, key: probe.key, json: probe.body, body: probe.raw?.body,
                contentType: probe.raw?.contentType, headers: probe.headers)
            #expect(response.status != 403, "\(label): never 403 across tenants")
            #expect(response.status < 500, "\(label): \(response.text)")
            // B may see back what B itself sent (its own person with the same ID), nothing else of A's.
            let sent =
                probe.path
                + (try probe.body.map {
                    String(decoding: try JSONSerialization.data(withJSONObject: $0), as: UTF8.self)
                } ?? "") + (probe.raw.map { String(decoding: $0.body, as: UTF8.self) } ?? "")
            for secret in a.secrets where !sent.contains(secret) {
                #expect(!response.text.contains(secret), "\(label) mentions A's \(secret): \(response.text)")
            }
            switch probe.expect {
            case .notFound(let control):
                expectProblem(response, 404, "not-found", label)
                if let control {
                    let other = try await api.call(
                        probe.method, control, key: probe.key, json: probe.body, headers: probe.headers)
                    let mine = try response.json()
                    let theirs = try other.json()
                    #expect(other.status == 404, "\(label): control \(other.text)")
                    for field in ["type", "title", "detail", "field"] {
                        #expect(
                            mine[field] as? String == theirs[field] as? String,
                            "\(label): A's resource and a missing one must answer alike (\(field))")
                    }
                }
            case .unauthorized:
                expectProblem(response, 401, "unauthorized", label)
            case .own(let status):
                #expect(response.status == status, "\(label): \(response.text)")
            case .invalid(let field):
                expectProblem(response, 422, "invalid-field", field: field, label)
            case .noLeak:
                #expect(response.status < 400, "\(label): \(response.status)")
            }
        }

        let missing = routes.all.subtracting(covered)
        #expect(missing.isEmpty, "routes without an isolation probe: \(missing.sorted())")
        #expect(covered.isSubset(of: routes.all))

        let after = try await Self.snapshot(fixture, a)
        #expect(before == after, "A's data changed:\n\(zip(before, after).filter { $0 != $1 })")
        // A's keys still work, and B's writes are visible to B only.
        #expect(try await api.call("GET", "/v1/people/\(a.person)", key: a.tenant.app).status == 200)
        let bPerson = try await api.call("GET", "/v1/people/\(a.person)", key: b.app).json()
        #expect(bPerson.string("email") == "b-" + a.email)
        #expect(
            try await api.call("GET", "/v1/activity_types/\(a.activityType)", key: b.app).json()
                .string("attributes_type") == "BAttrs")
    }
}
