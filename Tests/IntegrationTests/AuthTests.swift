import Foundation
import Testing

/// API keys and the admin token, as a caller sees them.
@Suite("Registry API authentication")
struct AuthTests {
    @Test("missing, unknown, malformed and revoked keys are 401 with WWW-Authenticate")
    func unauthorized() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let path = "/v1/people/\(Fake.id("p"))"
        let missing = try await api.call("PUT", path, json: [:])
        expectProblem(missing, 401, "unauthorized")
        #expect(missing.header("WWW-Authenticate")?.hasPrefix("Bearer") == true)
        let tenantHex = tenant.id.replacingOccurrences(of: "-", with: "")
        let unknown = "mq_sdk_\(tenantHex)_" + String(repeating: "A", count: 43)
        expectProblem(try await api.call("PUT", path, key: unknown, json: [:]), 401, "unauthorized", "unknown key")
        expectProblem(try await api.call("PUT", path, key: "garbage", json: [:]), 401, "unauthorized", "garbage")
        // The right secret with the kind changed is not a key.
        let swapped = tenant.sdk.replacingOccurrences(of: "mq_sdk_", with: "mq_app_")
        expectProblem(try await api.call("GET", path, key: swapped), 401, "unauthorized", "kind swapped")
        let basic = try await api.call(
            "PUT", path, json: [:],
            headers: ["Authorization": "Basic " + Data("\(tenant.sdk):".utf8).base64EncodedString()])
        expectProblem(basic, 401, "unauthorized", "Basic is only for the compat ingest")

        // Revoked keys stop at once.
        let sdkID = try await api.keyIDs(tenant).sdk
        #expect(try await api.call("PUT", path, key: tenant.sdk, json: [:]).status == 200)
        let revoke = try await api.call(
            "DELETE", "/admin/v1/tenants/\(tenant.id)/keys/\(sdkID)", key: MarqueeProcess.adminToken)
        #expect(revoke.status == 200)
        expectProblem(try await api.call("PUT", path, key: tenant.sdk, json: [:]), 401, "unauthorized", "revoked")
        #expect(try await api.call("PUT", path, key: tenant.app, json: [:]).status == 200, "other keys still work")
    }

    @Test("an sdk key on app-only endpoints is 403")
    func sdkKeyForbidden() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        #expect(try await api.call("PUT", "/v1/people/\(person)", key: tenant.sdk, json: [:]).status == 200)
        let type = Fake.activityType()
        let appOnly: [(String, String, [String: Any]?)] = [
            ("GET", "/v1/people/\(person)", nil),
            ("DELETE", "/v1/people/\(person)", nil),
            ("GET", "/v1/credentials/apns", nil),
            ("PUT", "/v1/credentials/apns", [:]),
            ("DELETE", "/v1/credentials/apns", nil),
            ("GET", "/v1/credentials/fcm", nil),
            ("PUT", "/v1/credentials/fcm", [:]),
            ("DELETE", "/v1/credentials/fcm", nil),
            ("GET", "/v1/activity_types", nil),
            ("GET", "/v1/activity_types/\(type)", nil),
            ("PUT", "/v1/activity_types/\(type)", ["attributes_type": "A"]),
        ]
        for (method, path, body) in appOnly {
            let response = try await api.call(method, path, key: tenant.sdk, json: body)
            expectProblem(response, 403, "forbidden", "\(method) \(path)")
        }
        // The person is still there: the forbidden DELETE did nothing.
        #expect(try await api.call("GET", "/v1/people/\(person)", key: tenant.app).status == 200)
        // App keys may do what devices do.
        #expect(try await api.call("PUT", "/v1/people/\(person)", key: tenant.app, json: [:]).status == 200)
    }

    @Test("admin endpoints without or with a wrong admin token (or a tenant key) are 401")
    func adminToken() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let keyID = UUID().uuidString.lowercased()
        let routes: [(String, String, [String: Any]?)] = [
            ("POST", "/admin/v1/tenants", ["name": "intruder"]),
            ("GET", "/admin/v1/tenants", nil),
            ("GET", "/admin/v1/tenants/\(tenant.id)", nil),
            ("GET", "/admin/v1/tenants/\(tenant.id)/keys", nil),
            ("POST", "/admin/v1/tenants/\(tenant.id)/keys", ["kind": "app"]),
            ("POST", "/admin/v1/tenants/\(tenant.id)/keys/\(keyID)/rotate", [:]),
            ("DELETE", "/admin/v1/tenants/\(tenant.id)/keys/\(keyID)", nil),
        ]
        for (method, path, body) in routes {
            for key in [nil, "wrong-admin-token", MarqueeProcess.adminToken + "x", tenant.app] {
                let response = try await api.call(method, path, key: key, json: body)
                expectProblem(
                    response, 401, "unauthorized", "\(method) \(path) with \(key == nil ? "no" : "a bad") token")
                #expect(!response.text.contains(tenant.name))
            }
        }
        let list = try await api.call("GET", "/admin/v1/tenants", key: MarqueeProcess.adminToken).json()
        #expect(!list.array("tenants").contains { $0.string("name") == "intruder" })
        #expect(
            try await api.call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: MarqueeProcess.adminToken).json()
                .array("keys").count == 2, "no key was created")
    }

    @Test("rotation with grace_seconds keeps the old key working until then; without grace it stops at once")
    func rotationGrace() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let admin = MarqueeProcess.adminToken
        let tenant = try await api.createTenant()
        let (appID, sdkID) = try await api.keyIDs(tenant)

        // The grace starts when the rotation commits, after `rotating`: a request answered within the grace of
        // `rotating` was in it. (With 2 s, a loaded CI machine took longer than the grace to answer the next request.)
        let clock = ContinuousClock()
        let rotating = clock.now
        let graced = try await api.call(
            "POST", "/admin/v1/tenants/\(tenant.id)/keys/\(appID)/rotate", key: admin, json: ["grace_seconds": 8])
        #expect(graced.status == 201, "\(graced.text)")
        let newApp = try #require(try graced.json().string("key"))
        #expect(try graced.json().string("kind") == "app")
        let inGrace = try await api.call("GET", "/v1/activity_types", key: tenant.app)
        if clock.now - rotating < .seconds(8) { #expect(inGrace.status == 200, "old key in grace") }
        #expect(try await api.call("GET", "/v1/activity_types", key: newApp).status == 200)
        let listed = try await api.call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: admin).json().array("keys")
        #expect(listed.first { $0.string("id") == appID }?.string("revoked_at") != nil, "the old key has an end")
        // The grace ends 8 s after the rotation: wait for it with a deadline rather than a guessed sleep.
        var afterGrace = try await api.call("GET", "/v1/activity_types", key: tenant.app)
        while afterGrace.status != 401 && clock.now - rotating < .seconds(60) {
            try await Task.sleep(for: .milliseconds(100))
            afterGrace = try await api.call("GET", "/v1/activity_types", key: tenant.app)
        }
        expectProblem(afterGrace, 401, "unauthorized")
        #expect(try await api.call("GET", "/v1/activity_types", key: newApp).status == 200)

        // Without grace: at once (an empty body is allowed).
        let immediate = try await api.call("POST", "/admin/v1/tenants/\(tenant.id)/keys/\(sdkID)/rotate", key: admin)
        #expect(immediate.status == 201, "\(immediate.text)")
        let newSDK = try #require(try immediate.json().string("key"))
        #expect(newSDK.hasPrefix("mq_sdk_"))
        expectProblem(
            try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: tenant.sdk, json: [:]), 401, "unauthorized")
        #expect(try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: newSDK, json: [:]).status == 200)

        expectProblem(
            try await api.call(
                "POST", "/admin/v1/tenants/\(tenant.id)/keys/\(sdkID)/rotate", key: admin,
                json: ["grace_seconds": -1]), 422, "invalid-field", field: "grace_seconds")
        expectProblem(
            try await api.call(
                "POST", "/admin/v1/tenants/\(tenant.id)/keys/\(UUID())/rotate", key: admin, json: [:]), 404,
            "not-found")
    }

    @Test("revoking a key a rotation left working for a grace period stops it at once; revoking again keeps the time")
    func revokeDuringGrace() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let admin = MarqueeProcess.adminToken
        let tenant = try await api.createTenant()
        let appID = try await api.keyIDs(tenant).app
        let rotated = try await api.call(
            "POST", "/admin/v1/tenants/\(tenant.id)/keys/\(appID)/rotate", key: admin, json: ["grace_seconds": 3600])
        #expect(rotated.status == 201, "\(rotated.text)")
        #expect(try await api.call("GET", "/v1/activity_types", key: tenant.app).status == 200, "old key in grace")

        // The key leaked: the operator revokes it at once. It was answered 200 with the grace's end kept, and the
        // key went on working for the hour.
        let revoke = try await api.call("DELETE", "/admin/v1/tenants/\(tenant.id)/keys/\(appID)", key: admin)
        #expect(revoke.status == 200, "\(revoke.text)")
        let revokedAt = try #require(try revoke.json().string("revoked_at"))
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let date = try #require(formatter.date(from: revokedAt))
        #expect(date.timeIntervalSinceNow < 60, "revoked now, not at the grace's end (\(revokedAt))")
        expectProblem(try await api.call("GET", "/v1/activity_types", key: tenant.app), 401, "unauthorized")

        // Revoking again keeps the first time.
        let again = try await api.call("DELETE", "/admin/v1/tenants/\(tenant.id)/keys/\(appID)", key: admin)
        #expect(again.status == 200)
        #expect(try again.json().string("revoked_at") == revokedAt)
    }

    @Test("with the key cache on, a revocation or rotation applies at once on the process that made it")
    func revokeForgetsCachedKey() async throws {
        let fixture = try await RegistryFixture.get()
        let serve = try await fixture.serveCachingKeys()
        defer { serve.signal(SIGKILL) }
        let api = API(baseURL: serve.baseURL)
        let admin = MarqueeProcess.adminToken
        let tenant = try await api.createTenant()
        let (appID, sdkID) = try await api.keyIDs(tenant)
        #expect(try await api.call("GET", "/v1/activity_types", key: tenant.app).status == 200, "now cached")
        #expect(
            try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: tenant.sdk, json: [String: Any]()).status
                == 200, "now cached")
        #expect(try await api.call("DELETE", "/admin/v1/tenants/\(tenant.id)/keys/\(sdkID)", key: admin).status == 200)
        expectProblem(
            try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: tenant.sdk, json: [String: Any]()), 401,
            "unauthorized")
        let rotated = try await api.call("POST", "/admin/v1/tenants/\(tenant.id)/keys/\(appID)/rotate", key: admin)
        #expect(rotated.status == 201, "\(rotated.text)")
        expectProblem(try await api.call("GET", "/v1/activity_types", key: tenant.app), 401, "unauthorized")
        let fresh = try #require(try rotated.json().string("key"))
        #expect(try await api.call("GET", "/v1/activity_types", key: fresh).status == 200)
    }

    @Test("last_used_at is set when a key is used")
    func lastUsed() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let admin = MarqueeProcess.adminToken
        let tenant = try await api.createTenant()
        let before = try await api.call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: admin).json().array("keys")
        #expect(before.allSatisfy { $0["last_used_at"] is NSNull })
        #expect(try await api.call("GET", "/v1/activity_types", key: tenant.app).status == 200)
        let after = try await api.call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: admin).json().array("keys")
        let app = try #require(after.first { $0.string("kind") == "app" })
        let sdk = try #require(after.first { $0.string("kind") == "sdk" })
        let used = try #require(app.string("last_used_at"))
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let date = try #require(formatter.date(from: used))
        #expect(abs(date.timeIntervalSinceNow) < 60)
        #expect(sdk["last_used_at"] is NSNull, "only the key used is touched")
    }
}
