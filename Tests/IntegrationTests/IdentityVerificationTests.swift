import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// Identity verification: with `identity_verification: required`, sdk-key writes about a person need a user token
/// (HS256 JWT from the tenant's server) whose `sub` is that person.
@Suite("identity verification")
struct IdentityVerificationTests {
    static let header = "X-Marquee-User-Token"

    /// A user token for `subject`, signed with the base64url `secret` the API returned.
    static func token(_ subject: String, _ secret: String, expiresIn: Int64 = 600, email: String? = nil) -> String {
        HS256.sign(
            subject: subject, expiresAt: Int64(Date().timeIntervalSince1970) + expiresIn,
            secret: Base64URL.decode(Substring(secret)) ?? [], email: email)
    }

    /// An unsigned token (`alg: none`) claiming to be `subject`.
    static func unsigned(_ subject: String) -> String {
        let header = Base64URL.encode(Array(#"{"alg":"none","typ":"JWT"}"#.utf8))
        let exp = Int64(Date().timeIntervalSince1970) + 600
        let payload = Base64URL.encode(Array(#"{"sub":"\#(subject)","exp":\#(exp)}"#.utf8))
        return header + "." + payload + "."
    }

    /// A tenant with an identity secret and verification required; returns the tenant and the secret.
    static func requiredTenant(_ api: API) async throws -> (TestTenant, String) {
        let tenant = try await api.createTenant()
        let created = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        try #require(created.status == 201, "\(created.text)")
        let secret = try #require(try created.json().string("secret"))
        let patched = try await api.call(
            "PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "required"])
        try #require(patched.status == 200, "\(patched.text)")
        return (tenant, secret)
    }

    @Test("settings routes: app key only, 422 naming the field, required refused before a secret, secret shown once")
    func settingsRoutes() async throws {
        let api = try await RegistryFixture.get().api
        let tenant = try await api.createTenant()
        let initial = try await api.call("GET", "/v1/settings", key: tenant.app)
        #expect(initial.status == 200, "\(initial.text)")
        let defaults = try initial.json()
        #expect(defaults.string("identity_verification") == "off")
        #expect(defaults["identity_secret_set"] as? Bool == false)
        #expect(defaults["previous_secret_valid_until"] is NSNull)

        for (method, path) in [
            ("GET", "/v1/settings"), ("PATCH", "/v1/settings"), ("POST", "/v1/settings/identity_secret"),
        ] {
            expectProblem(
                try await api.call(method, path, key: tenant.sdk, json: ["identity_verification": "off"]), 403,
                "forbidden", "\(method) \(path) with the sdk key")
        }
        expectProblem(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "maybe"]),
            422, "invalid-field", field: "identity_verification")
        expectProblem(
            try await api.call(
                "PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "off", "colour": "red"]),
            422, "invalid-field", field: "colour")
        let early = try await api.call(
            "PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "required"])
        expectProblem(early, 422, "invalid-field", field: "identity_verification")
        #expect(early.text.contains("POST /v1/settings/identity_secret"), "\(early.text)")

        let first = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        #expect(first.status == 201, "\(first.text)")
        let secret = try #require(try first.json().string("secret"))
        #expect(Base64URL.decode(Substring(secret))?.count == 32)
        let second = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        #expect(second.status == 200, "\(second.text)")
        let rotated = try #require(try second.json().string("secret"))
        #expect(rotated != secret)

        let required = try await api.call(
            "PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "required"])
        #expect(required.status == 200, "\(required.text)")
        let shown = try await api.call("GET", "/v1/settings", key: tenant.app)
        let body = try shown.json()
        #expect(body.string("identity_verification") == "required")
        #expect(body["identity_secret_set"] as? Bool == true)
        let until = try #require(body.string("previous_secret_valid_until"))
        let date = try #require(
            ISO8601DateFormatter.withFractions.date(from: until) ?? ISO8601DateFormatter().date(from: until))
        #expect(abs(date.timeIntervalSinceNow - 24 * 3600) < 600, "grace of 24 hours: \(until)")
        #expect(!shown.text.contains(secret) && !shown.text.contains(rotated), "secrets are shown only by the POST")
    }

    @Test("required: an attacker with the sdk key cannot write about the victim, with no, forged or another's token")
    func attackerRefused() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (tenant, secret) = try await Self.requiredTenant(api)
        let victim = Fake.id("victim")
        let attacker = Fake.id("mallory")
        let device = Fake.hex()
        let attempts: [(String, [String: String], Int, String)] = [
            ("no token", [:], 401, "user-token-required"),
            ("another's token", [Self.header: Self.token(attacker, secret)], 403, "user-token-wrong-person"),
            ("expired token", [Self.header: Self.token(victim, secret, expiresIn: -3600)], 401, "user-token-invalid"),
            ("alg none", [Self.header: Self.unsigned(victim)], 401, "user-token-invalid"),
            (
                "wrong secret", [Self.header: Self.token(victim, Base64URL.encode(SecureRandom.bytes(32)))], 401,
                "user-token-invalid"
            ),
            (
                "too long-lived", [Self.header: Self.token(victim, secret, expiresIn: 3 * 86_400)], 401,
                "user-token-invalid"
            ),
        ]
        for (label, headers, status, slug) in attempts {
            expectProblem(
                try await api.call(
                    "PUT", "/v1/people/\(victim)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"],
                    headers: headers), status, slug, field: Self.header, "device, \(label)")
            expectProblem(
                try await api.call(
                    "PUT", "/v1/people/\(victim)", key: tenant.sdk, json: ["email": "evil@example.com"],
                    headers: headers), status, slug, field: Self.header, "person, \(label)")
            var identify = CompatIngestTests.event(
                "identify", userId: victim, properties: ["email": "evil@example.com"])
            identify["type"] = nil
            var basic = headers
            basic["Authorization"] = tenant.basicSDK
            let single = try await HTTP.send(
                "POST", api.baseURL + "/v1/identify",
                headers: basic.merging(["Content-Type": "application/json"]) { $1 },
                body: try JSONSerialization.data(withJSONObject: identify))
            expectProblem(single, status, slug, field: Self.header, "identify, \(label)")
            let batch = try await HTTP.send(
                "POST", api.baseURL + "/v1/batch", headers: basic.merging(["Content-Type": "application/json"]) { $1 },
                body: try JSONSerialization.data(
                    withJSONObject: [
                        "batch": [
                            CompatIngestTests.event(
                                "identify", userId: victim, properties: ["email": "evil@example.com"]),
                            CompatIngestTests.event(
                                "track", "Device Created or Updated", userId: victim, deviceToken: device),
                        ]
                    ]))
            expectProblem(batch, status, slug, field: Self.header, "batch, \(label)")
            #expect(try batch.json().string("index") == "0", "batch, \(label): \(batch.text)")
        }
        #expect(
            try await fixture.pool.count(
                "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(tenant.uuid) AND id = \(victim)") == 0,
            "nothing was written about the victim")

        // The victim's own token works, on every route.
        let own = [Self.header: Self.token(victim, secret, email: "victim@example.com")]
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(victim)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"],
                headers: own
            ).status == 200)
        let identify = try await api.call(
            "POST", "/v1/identify", key: tenant.sdk,
            json: CompatIngestTests.event("identify", userId: victim, properties: ["email": "victim@example.com"]),
            headers: own)
        #expect(identify.status == 200, "\(identify.text)")

        // Events and activity tokens are about the device's owner.
        let instance = Fake.id("order")
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: victim)
        let event: [String: Any] = ["event": "started", "device_token": device, "at": Date().timeIntervalSince1970]
        expectProblem(
            try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk, json: event,
                headers: [Self.header: Self.token(attacker, secret)]), 403, "user-token-wrong-person")
        expectProblem(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: tenant.sdk,
                json: ["token": Fake.hex()], headers: [Self.header: Self.token(attacker, secret)]), 403,
            "user-token-wrong-person")
        #expect(
            try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk, json: event, headers: own
            ).status == 202)
        #expect(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: tenant.sdk,
                json: ["token": Fake.hex()], headers: own
            ).status == 200)
        // Registering the victim's device under the attacker would move it (and its tokens' pushes): a write about
        // the device's owner too, refused like the token events above, on the REST route and the compat event.
        let mine = [Self.header: Self.token(attacker, secret)]
        expectProblem(
            try await api.call(
                "PUT", "/v1/people/\(attacker)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"],
                headers: mine), 403, "user-token-wrong-person", "device takeover")
        var takeover = mine
        takeover["Authorization"] = tenant.basicSDK
        takeover["Content-Type"] = "application/json"
        let compat = try await HTTP.send(
            "POST", api.baseURL + "/v1/batch", headers: takeover,
            body: try JSONSerialization.data(
                withJSONObject: [
                    "batch": [
                        CompatIngestTests.event(
                            "track", "Device Created or Updated", userId: attacker, deviceToken: device)
                    ]
                ]))
        expectProblem(compat, 403, "user-token-wrong-person", "compat device takeover")
        #expect(
            try await fixture.pool.count(
                """
                SELECT count(*)::int AS n FROM devices
                WHERE tenant_id = \(tenant.uuid) AND token = \(device) AND person_id = \(victim)
                """) == 1, "the device is still the victim's")
        // The attacker's own new device is still theirs to register.
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(attacker)/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"],
                headers: mine
            ).status == 200)

        let person = try await api.call("GET", "/v1/people/\(victim)", key: tenant.app).json()
        #expect(person.string("email") == "victim@example.com")

        // The app key is never asked for a user token.
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(Fake.id("server"))", key: tenant.app, json: ["email": "s@example.com"]
            ).status == 200)
    }

    @Test("required: an email set from an app must be the token's email claim (identify too); IDs compared as bytes")
    func emailVouchedFor() async throws {
        let api = try await RegistryFixture.get().api
        let (tenant, secret) = try await Self.requiredTenant(api)
        let person = Fake.id("claimer")
        let victim = "victim-\(person)@example.com"
        let key = Base64URL.decode(Substring(secret)) ?? []
        let expires = Int64(Date().timeIntervalSince1970) + 600
        let plain = HS256.sign(subject: person, expiresAt: expires, secret: key)
        let vouched = HS256.sign(subject: person, expiresAt: expires, secret: key, email: "\(person)@example.com")
        // A signed-in person takes on an address no one holds yet: refused, with or without another email vouched.
        for token in [plain, vouched] {
            expectProblem(
                try await api.call(
                    "PUT", "/v1/people/\(person)", key: tenant.sdk, json: ["email": victim],
                    headers: [Self.header: token]), 403, "user-token-wrong-email", field: "email", "PUT person")
            var basic = [Self.header: token, "Content-Type": "application/json"]
            basic["Authorization"] = tenant.basicSDK
            var event = CompatIngestTests.event("identify", userId: person)
            event["type"] = nil
            event["traits"] = ["email": victim]
            let identify = try await HTTP.send(
                "POST", api.baseURL + "/v1/identify", headers: basic,
                body: try JSONSerialization.data(withJSONObject: event))
            expectProblem(identify, 403, "user-token-wrong-email", field: "traits.email", "identify")
        }
        let app = try await api.call("GET", "/v1/people/\(person)", key: tenant.app)
        #expect(!app.text.contains(victim), "\(app.text)")
        // The email the token vouches for, and writes without an email, pass.
        let own = try await api.call(
            "PUT", "/v1/people/\(person)", key: tenant.sdk, json: ["email": "\(person)@example.com"],
            headers: [Self.header: vouched])
        #expect(own.status == 200, "\(own.text)")
        let attributes = try await api.call(
            "PUT", "/v1/people/\(person)", key: tenant.sdk, json: ["attributes": ["plan": "gold"]],
            headers: [Self.header: plain])
        #expect(attributes.status == 200, "\(attributes.text)")
        // A token for "jos\u{E9}" does not write about "jose\u{301}": the same to Swift's `==`, two IDs to PostgreSQL.
        let composed = "jos\u{E9}-\(person)"
        let decomposed = "jose\u{301}-\(person)"
        let token = HS256.sign(subject: composed, expiresAt: expires, secret: key)
        let path = decomposed.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? decomposed
        expectProblem(
            try await api.call(
                "PUT", "/v1/people/\(path)/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"],
                headers: [Self.header: token]), 403, "user-token-wrong-person", field: Self.header, "equivalent ID")
    }

    @Test("rotation: the previous secret's tokens work during the grace period and are refused after it")
    func rotationGrace() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (tenant, oldSecret) = try await Self.requiredTenant(api)
        let rotated = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        #expect(rotated.status == 200, "\(rotated.text)")
        let newSecret = try #require(try rotated.json().string("secret"))
        let victim = Fake.id("victim")
        let put: @Sendable (String) async throws -> HTTP.Response = { token in
            try await api.call(
                "PUT", "/v1/people/\(victim)", key: tenant.sdk, json: [String: Any](), headers: [Self.header: token])
        }
        #expect(try await put(Self.token(victim, oldSecret)).status == 200, "previous secret during the grace")
        #expect(try await put(Self.token(victim, newSecret)).status == 200, "current secret")

        // The grace ends (as if 24 hours had passed).
        try await fixture.pool.transaction { connection in
            try connection.execute("SET LOCAL ROLE marquee_system")
            try connection.execute(
                """
                UPDATE tenant_settings SET previous_secret_valid_until = now() - interval '1 second'
                WHERE tenant_id = \(tenant.uuid)
                """)
        }
        // Other processes' caches (the key cache's TTL, 5 s by default) may hold the old window for a moment.
        let deadline = ContinuousClock.now + .seconds(30)
        var last = try await put(Self.token(victim, oldSecret))
        while last.status != 401, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
            last = try await put(Self.token(victim, oldSecret))
        }
        expectProblem(last, 401, "user-token-invalid", field: Self.header, "rotated-out secret after the grace")
        #expect(try await put(Self.token(victim, newSecret)).status == 200, "current secret still works")
    }

    @Test("rotation: a second rotation within the grace is refused (409) and keeps the first secret; force drops it")
    func secondRotationWithinGrace() async throws {
        let api = try await RegistryFixture.get().api
        let (tenant, first) = try await Self.requiredTenant(api)
        let rotated = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        #expect(rotated.status == 200, "\(rotated.text)")
        let second = try #require(try rotated.json().string("secret"))
        let until = try #require(
            try await api.call("GET", "/v1/settings", key: tenant.app).json().string("previous_secret_valid_until"))
        let person = Fake.id("user")
        let put: @Sendable (String) async throws -> HTTP.Response = { token in
            try await api.call(
                "PUT", "/v1/people/\(person)", key: tenant.sdk, json: [String: Any](), headers: [Self.header: token])
        }

        // A retry of the rotation whose answer was lost, say: the tenant's servers still mint with the first secret.
        let again = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        expectProblem(again, 409, "identity-secret-in-grace", field: "force")
        let problem = try again.json()
        #expect(problem.string("previous_secret_valid_until") == until, "\(again.text)")
        #expect(problem.string("detail")?.contains(until) == true, "\(again.text)")
        #expect(problem["secret"] == nil && !again.text.contains(first) && !again.text.contains(second))
        #expect(try await put(Self.token(person, first)).status == 200, "the first secret is still in its grace")
        #expect(try await put(Self.token(person, second)).status == 200, "the current secret")
        expectProblem(
            try await api.call("POST", "/v1/settings/identity_secret?force=yes", key: tenant.app), 422,
            "invalid-field", field: "force")

        // Deliberately: the first secret goes at once, the second becomes the previous one.
        let forced = try await api.call("POST", "/v1/settings/identity_secret?force=true", key: tenant.app)
        #expect(forced.status == 200, "\(forced.text)")
        let third = try #require(try forced.json().string("secret"))
        expectProblem(try await put(Self.token(person, first)), 401, "user-token-invalid", field: Self.header)
        #expect(try await put(Self.token(person, second)).status == 200, "the previous secret, in its own grace")
        #expect(try await put(Self.token(person, third)).status == 200, "the current secret")
    }

    @Test("off: identity secrets sealed under a master key this process lacks (a rollout) do not fail sdk writes")
    func offNeedsNoSecrets() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        #expect(try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app).status == 201)
        #expect(try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app).status == 200)
        // As if another process, already on a new master key, had sealed them: this one's ring has no such key ID.
        let newer = try SealingKeyRing(current: (id: "k-newer", key: SecureRandom.bytes(32)))
        let context = TenantSettingsStore.identitySecretContext(tenant.uuid)
        let (current, previous) = (
            try newer.seal(SecureRandom.bytes(32), associatedData: context),
            try newer.seal(SecureRandom.bytes(32), associatedData: context)
        )
        try await fixture.pool.transaction { connection in
            try connection.execute("SET LOCAL ROLE marquee_system")
            try connection.execute(
                """
                UPDATE tenant_settings SET sealed_identity_secret = \(current),
                    sealed_previous_identity_secret = \(previous)
                WHERE tenant_id = \(tenant.uuid)
                """)
        }
        let person = Fake.id("user")
        let put = try await api.call("PUT", "/v1/people/\(person)", key: tenant.sdk, json: ["email": "u@example.com"])
        #expect(put.status == 200, "verification is off: \(put.text)")
        let device = try await api.call(
            "PUT", "/v1/people/\(person)/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"])
        #expect(device.status == 200, "\(device.text)")
    }

    @Test("off: the Customer.io SDK flow works without tokens; a PATCH takes effect on the next request")
    func offUnchangedAndPatchImmediate() async throws {
        let api = try await RegistryFixture.get().api
        let tenant = try await api.createTenant()
        let person = Fake.id("user")
        let device = Fake.hex()
        let flow: @Sendable () async throws -> HTTP.Response = {
            try await HTTP.send(
                "POST", api.baseURL + "/v1/b",
                headers: ["Authorization": tenant.basicSDK, "Content-Type": "application/json"],
                body: try JSONSerialization.data(
                    withJSONObject: [
                        "batch": [
                            CompatIngestTests.event("identify", userId: person, properties: ["email": "u@example.com"]),
                            CompatIngestTests.event(
                                "track", "Device Created or Updated", userId: person, deviceToken: device),
                        ]
                    ]))
        }
        let off = try await flow()
        #expect(off.status == 200, "\(off.text)")
        #expect(try off.json()["applied"] as? Int == 2, "\(off.text)")

        #expect(try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app).status == 201)
        #expect(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "required"])
                .status == 200)
        let required = try await flow()
        expectProblem(required, 401, "user-token-required", field: Self.header, "required at once")
        #expect(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "off"])
                .status == 200)
        let again = try await flow()
        #expect(try again.json()["applied"] as? Int == 2, "off again at once: \(again.text)")
    }
}

extension IdentityVerificationTests {
    @Test("required: every other sdk route about a person (device delete, push-to-start, Customer.io events) checks")
    func everyPersonRoute() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (tenant, secret) = try await Self.requiredTenant(api)
        let victim = Fake.id("victim")
        let device = Fake.hex()
        let own = [Self.header: Self.token(victim, secret)]
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(victim)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"],
                headers: own
            ).status == 200)
        let instance = Fake.id("order")
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: victim)
        let activityType = Fake.activityType()
        let native: [(String, String, [String: Any]?)] = [
            ("DELETE", "/v1/people/\(victim)/devices/\(device)", nil),
            ("PUT", "/v1/people/\(victim)/devices/\(device)/push_to_start/\(activityType)", ["token": Fake.hex()]),
        ]
        let compat: [[String: Any]] = [
            CompatIngestTests.event("track", "Device Deleted", userId: victim, deviceToken: device),
            CompatIngestTests.event(
                "track", "Live Notification Token", userId: victim,
                properties: [
                    "registrationType": "push_to_start", "notificationType": activityType,
                    "pushToStartToken": Fake.hex(), "deviceId": device,
                ]),
            // No userId: the device's owner is the person.
            CompatIngestTests.event(
                "track", "Live Notification Event", userId: nil,
                properties: ["eventType": "start", "cioInstanceId": instance, "deviceId": device]),
        ]
        for (label, headers, status, slug) in [
            ("no token", [:], 401, "user-token-required"),
            ("another's token", [Self.header: Self.token(Fake.id("mallory"), secret)], 403, "user-token-wrong-person"),
        ] as [(String, [String: String], Int, String)] {
            for (method, path, body) in native {
                expectProblem(
                    try await api.call(method, path, key: tenant.sdk, json: body, headers: headers), status, slug,
                    field: Self.header, "\(method) \(path), \(label)")
            }
            for event in compat {
                expectProblem(
                    try await api.call("POST", "/v1/track", key: tenant.sdk, json: event, headers: headers), status,
                    slug, field: Self.header, "\(event["event"] ?? ""), \(label)")
            }
        }
        for event in compat.reversed() {
            let response = try await api.call("POST", "/v1/track", key: tenant.sdk, json: event, headers: own)
            #expect(response.status == 200, "\(event["event"] ?? ""), own token: \(response.text)")
        }
        // Metrics name no person: they need the delivery's token, not a user token.
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        let deliveryToken = DeliveryTokens.make(
            deliveryID: delivery, secret: try await fixture.tenants.deliverySecret(tenant: tenant.uuid))
        let metric = try await api.call(
            "POST", "/v1/deliveries/\(delivery)/metrics", key: tenant.sdk,
            json: ["metric": "opened", "delivery_token": deliveryToken])
        #expect(metric.status == 202, "\(metric.text)")
    }

    @Test("with the settings cache on, a PATCH takes effect for the next request on the same process")
    func cachedSettingsInvalidated() async throws {
        let fixture = try await RegistryFixture.get()
        let serve = try await fixture.serveCachingKeys()
        defer { serve.signal(SIGKILL) }
        let api = API(baseURL: serve.baseURL)
        let tenant = try await api.createTenant()
        let person = Fake.id("user")
        let write: @Sendable () async throws -> HTTP.Response = {
            try await api.call("PUT", "/v1/people/\(person)", key: tenant.sdk, json: [String: Any]())
        }
        #expect(try await write().status == 200, "off, and now cached")
        let created = try await api.call("POST", "/v1/settings/identity_secret", key: tenant.app)
        #expect(created.status == 201)
        let secret = try #require(try created.json().string("secret"))
        #expect(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "required"])
                .status == 200)
        expectProblem(try await write(), 401, "user-token-required", field: Self.header)
        let token = Self.token(person, secret)
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)", key: tenant.sdk, json: [String: Any](), headers: [Self.header: token]
            ).status == 200)
        #expect(!serve.log.contains(secret) && !serve.log.contains(token), "neither secret nor token is logged")
        #expect(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["identity_verification": "off"])
                .status == 200)
        #expect(try await write().status == 200, "off again at once")
    }
}

extension ISO8601DateFormatter {
    static var withFractions: ISO8601DateFormatter {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter
    }
}
