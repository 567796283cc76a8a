import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// The registry API's happy paths, against `marquee serve` and a real database.
@Suite("Registry API")
struct RegistryTests {
    // MARK: Admin

    @Test("admin: create, list and get tenants; list, create, rotate and revoke keys")
    func adminAPI() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let admin = MarqueeProcess.adminToken
        let name = "Admin " + Fake.hex(6)
        let created = try await api.call("POST", "/admin/v1/tenants", key: admin, json: ["name": name])
        #expect(created.status == 201, "\(created.text)")
        #expect(created.header("Content-Type") == "application/json")
        let body = try created.json()
        let id = try #require(body.string("id"))
        #expect(UUID(uuidString: id) != nil)
        #expect(body.string("name") == name)
        #expect(body.string("created_at") != nil)
        let app = try #require(body.object("keys")?.string("app"))
        let sdk = try #require(body.object("keys")?.string("sdk"))
        #expect(app.hasPrefix("mq_app_") && sdk.hasPrefix("mq_sdk_"))

        let list = try await api.call("GET", "/admin/v1/tenants", key: admin)
        #expect(list.status == 200)
        #expect(try list.json().array("tenants").contains { $0.string("id") == id && $0.string("name") == name })

        let one = try await api.call("GET", "/admin/v1/tenants/\(id)", key: admin)
        #expect(one.status == 200)
        #expect(try one.json().string("name") == name)
        #expect(try one.json()["keys"] == nil, "a tenant read never shows keys")
        expectProblem(try await api.call("GET", "/admin/v1/tenants/\(UUID())", key: admin), 404, "not-found")

        let keys = try await api.call("GET", "/admin/v1/tenants/\(id)/keys", key: admin)
        #expect(keys.status == 200)
        let listed = try keys.json().array("keys")
        #expect(Set(listed.compactMap { $0.string("kind") }) == ["app", "sdk"])
        #expect(listed.allSatisfy { $0["key"] == nil && $0.string("hint")?.isEmpty == false })
        #expect(!keys.text.contains(app) && !keys.text.contains(sdk), "key texts are shown once only")

        let newKey = try await api.call("POST", "/admin/v1/tenants/\(id)/keys", key: admin, json: ["kind": "app"])
        #expect(newKey.status == 201, "\(newKey.text)")
        let issued = try newKey.json()
        let issuedText = try #require(issued.string("key"))
        let issuedID = try #require(issued.string("id"))
        #expect(issued.string("kind") == "app")
        #expect(try await api.call("GET", "/v1/activity_types", key: issuedText).status == 200)

        let rotated = try await api.call(
            "POST", "/admin/v1/tenants/\(id)/keys/\(issuedID)/rotate", key: admin, json: ["grace_seconds": 0])
        #expect(rotated.status == 201, "\(rotated.text)")
        let rotatedText = try #require(try rotated.json().string("key"))
        #expect(rotatedText != issuedText)
        #expect(try await api.call("GET", "/v1/activity_types", key: rotatedText).status == 200)
        expectProblem(try await api.call("GET", "/v1/activity_types", key: issuedText), 401, "unauthorized")

        let rotatedID = try #require(try rotated.json().string("id"))
        let revoked = try await api.call("DELETE", "/admin/v1/tenants/\(id)/keys/\(rotatedID)", key: admin)
        #expect(revoked.status == 200, "\(revoked.text)")
        #expect(try revoked.json().string("revoked_at") != nil)
        expectProblem(try await api.call("GET", "/v1/activity_types", key: rotatedText), 401, "unauthorized")
        expectProblem(
            try await api.call("DELETE", "/admin/v1/tenants/\(id)/keys/\(UUID())", key: admin), 404, "not-found")
        #expect(try await api.call("GET", "/admin/v1/tenants/\(id)/keys", key: admin).json().array("keys").count == 4)
    }

    @Test("`marquee tenant create --name N --json` prints what the admin API answers, with working keys")
    func tenantCreateCommand() async throws {
        let fixture = try await RegistryFixture.get()
        let name = "CLI " + Fake.hex(6)
        let result = try await runCommand(
            TestEnvironment.marqueeBinary, ["tenant", "create", "--name", name, "--json"],
            environment: fixture.environment)
        #expect(result.status == 0, "\(result.output)")
        let line = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") })
        let printed = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        let viaAPI = try await fixture.api.call(
            "POST", "/admin/v1/tenants", key: MarqueeProcess.adminToken, json: ["name": name + " api"]
        ).json()
        #expect(Set(printed.keys) == Set(viaAPI.keys))
        #expect(Set(printed.object("keys")?.keys ?? [:].keys) == Set(viaAPI.object("keys")?.keys ?? [:].keys))
        #expect(printed.string("name") == name)
        let id = try #require(printed.string("id"))
        let app = try #require(printed.object("keys")?.string("app"))
        #expect(app.contains(id.replacingOccurrences(of: "-", with: "")))
        // The printed keys work against the server: same database, same master key.
        #expect(try await fixture.api.call("GET", "/v1/activity_types", key: app).status == 200)
        let fetched = try await fixture.api.call("GET", "/admin/v1/tenants/\(id)", key: MarqueeProcess.adminToken)
        #expect(try fetched.json().string("name") == name)
    }

    // MARK: Credentials

    @Test("APNs credentials: PUT, GET and DELETE; only metadata comes back")
    func apnsCredentials() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let pem = ES256PrivateKey.generate().pkcs8PEM
        expectProblem(try await api.call("GET", "/v1/credentials/apns", key: tenant.app), 404, "not-found")
        let put = try await api.call(
            "PUT", "/v1/credentials/apns", key: tenant.app,
            json: [
                "team_id": "ABCDE12345", "key_id": "KEY1234567", "private_key": pem, "bundle_id": "com.example.app",
                "environment": "sandbox",
            ])
        #expect(put.status == 200, "\(put.text)")
        let get = try await api.call("GET", "/v1/credentials/apns", key: tenant.app)
        #expect(get.status == 200)
        let info = try get.json()
        #expect(info.string("team_id") == "ABCDE12345")
        #expect(info.string("key_id") == "KEY1234567")
        #expect(info.string("bundle_id") == "com.example.app")
        #expect(info.string("environment") == "sandbox")
        #expect(info.string("status") == "ok")
        #expect(info["private_key"] == nil && !get.text.contains("PRIVATE KEY"))

        let replaced = try await api.call(
            "PUT", "/v1/credentials/apns", key: tenant.app,
            json: [
                "team_id": "ABCDE12345", "key_id": "KEY7654321", "private_key": ES256PrivateKey.generate().pkcs8PEM,
                "bundle_id": "com.example.app", "environment": "production",
            ])
        #expect(replaced.status == 200)
        let after = try await api.call("GET", "/v1/credentials/apns", key: tenant.app).json()
        #expect(after.string("key_id") == "KEY7654321" && after.string("environment") == "production")

        #expect(try await api.call("DELETE", "/v1/credentials/apns", key: tenant.app).status == 204)
        expectProblem(try await api.call("GET", "/v1/credentials/apns", key: tenant.app), 404, "not-found")
        expectProblem(try await api.call("DELETE", "/v1/credentials/apns", key: tenant.app), 404, "not-found")
    }

    @Test("FCM credentials: PUT, GET and DELETE of a service account")
    func fcmCredentials() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let key = try RS256PrivateKey.generate()
        let put = try await api.call(
            "PUT", "/v1/credentials/fcm", key: tenant.app,
            json: ["service_account": Self.serviceAccount(pem: key.pkcs8PEM)])
        #expect(put.status == 200, "\(put.text)")
        let info = try await api.call("GET", "/v1/credentials/fcm", key: tenant.app).json()
        #expect(info.string("project_id") == "marquee-test")
        #expect(info.string("client_email") == "push@marquee-test.iam.gserviceaccount.com")
        #expect(info.string("private_key_id") == "abc123")
        #expect(info.string("token_uri") == "https://oauth2.googleapis.com/token")
        #expect(info.string("status") == "ok")
        #expect(info["private_key"] == nil && info["service_account"] == nil)
        #expect(try await api.call("DELETE", "/v1/credentials/fcm", key: tenant.app).status == 204)
        expectProblem(try await api.call("GET", "/v1/credentials/fcm", key: tenant.app), 404, "not-found")
    }

    static func serviceAccount(pem: String) -> [String: Any] {
        [
            "type": "service_account", "project_id": "marquee-test", "private_key_id": "abc123", "private_key": pem,
            "client_email": "push@marquee-test.iam.gserviceaccount.com", "client_id": "1234567890",
            "token_uri": "https://oauth2.googleapis.com/token",
        ]
    }

    // MARK: Activity types

    @Test("activity types: PUT creates (201) then replaces (200); GET one and list")
    func activityTypes() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let identifier = Fake.activityType()
        let schema: [String: Any] = [
            "type": "object", "required": ["status"],
            "properties": [
                "status": ["type": "string", "enum": ["preparing", "on_the_way"]], "eta": ["type": "number"],
            ],
        ]
        let created = try await api.call(
            "PUT", "/v1/activity_types/\(identifier)", key: tenant.app,
            json: [
                "attributes_type": "DeliveryAttributes", "content_state_schema": schema,
                "date_fields": ["/eta": "apple_reference"], "payload_profile": "marquee",
            ])
        #expect(created.status == 201, "\(created.text)")
        let first = try created.json()
        #expect(first.string("identifier") == identifier)
        #expect(first.string("attributes_type") == "DeliveryAttributes")
        #expect(first.object("date_fields")?.string("/eta") == "apple_reference")
        #expect(first["auto_created"] as? Bool == false)
        #expect(first.object("content_state_schema")?.string("type") == "object")

        let replaced = try await api.call(
            "PUT", "/v1/activity_types/\(identifier)", key: tenant.app,
            json: ["attributes_type": "OrderAttributes", "payload_profile": "customerio"])
        #expect(replaced.status == 200, "\(replaced.text)")
        let one = try await api.call("GET", "/v1/activity_types/\(identifier)", key: tenant.app)
        #expect(one.status == 200)
        let current = try one.json()
        #expect(current.string("attributes_type") == "OrderAttributes")
        #expect(current.string("payload_profile") == "customerio")
        #expect(current["content_state_schema"] is NSNull, "a replace replaces the whole type")
        #expect(current.object("date_fields")?.isEmpty == true)

        let second = Fake.activityType()
        #expect(
            try await api.call(
                "PUT", "/v1/activity_types/\(second)", key: tenant.app, json: ["attributes_type": "Other"]
            ).status == 201)
        let list = try await api.call("GET", "/v1/activity_types", key: tenant.app).json().array("activity_types")
        #expect(Set(list.compactMap { $0.string("identifier") }) == [identifier, second])
        expectProblem(
            try await api.call("GET", "/v1/activity_types/com.example.none", key: tenant.app), 404, "not-found")
    }

    @Test("activity types an sdk key creates by the hundred are listed a page at a time, by identifier")
    func activityTypePages() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        // The sdk key ships in the app: whoever holds it registers push-to-start tokens for 55 made-up types, each
        // of which is created.
        let person = Fake.id("typist")
        let device = Fake.hex()
        try ok(
            await api.call("PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]))
        let prefix = "com.hostile" + Fake.hex(4)
        let types = (0..<55).map { prefix + ".t" + String(100 + $0) }
        for type in types {
            try ok(
                await api.call(
                    "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: tenant.sdk,
                    json: ["token": Fake.hex(64)]))
        }
        let first = try await api.call("GET", "/v1/activity_types", key: tenant.app)
        #expect(first.status == 200, "\(first.text)")
        let page = try first.json()
        #expect(page.array("activity_types").compactMap { $0.string("identifier") } == Array(types.prefix(50)))
        let cursor = try #require(page.string("next_cursor"), "\(page["next_cursor"] ?? "none")")
        let rest = try await api.call("GET", "/v1/activity_types?cursor=\(cursor)", key: tenant.app).json()
        #expect(rest.array("activity_types").compactMap { $0.string("identifier") } == Array(types.suffix(5)))
        #expect(rest["next_cursor"] is NSNull)

        let two = try await api.call("GET", "/v1/activity_types?limit=2", key: tenant.app).json()
        #expect(two.array("activity_types").compactMap { $0.string("identifier") } == Array(types.prefix(2)))
        #expect(two.string("next_cursor") == types[1])
        for query in ["limit=0", "limit=201", "limit=x"] {
            expectProblem(
                try await api.call("GET", "/v1/activity_types?\(query)", key: tenant.app), 422, "invalid-field",
                field: "limit", query)
        }
        expectProblem(
            try await api.call("GET", "/v1/activity_types?cursor=not-a-type", key: tenant.app), 422, "invalid-field",
            field: "cursor")
    }

    @Test("a person read lists 50 tokens a device at most, the active first, and how many the device has")
    func personTokensBounded() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        // Whoever holds the sdk key rotates one device's push-to-start token 60 times: 59 retired tokens are kept.
        let person = Fake.id("rotator")
        let device = Fake.hex()
        let type = Fake.activityType()
        try ok(
            await api.call("PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]))
        var last = ""
        for _ in 0..<60 {
            last = Fake.hex(64)
            try ok(
                await api.call(
                    "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: tenant.sdk,
                    json: ["token": last]))
        }
        let read = try await api.call("GET", "/v1/people/\(person)", key: tenant.app)
        #expect(read.status == 200, "\(read.text)")
        let first = try #require(try read.json().array("devices").first)
        #expect(first["tokens_total"] as? Int == 60)
        let tokens = first.array("tokens")
        #expect(tokens.count == 50)
        #expect(tokens.first?.string("status") == "active")
        #expect(tokens.first?.string("token") == maskToken(last))
        #expect(tokens.dropFirst().allSatisfy { $0.string("status") == "retired" })
    }

    // MARK: People and devices

    @Test("people: PUT creates and updates, GET shows devices, DELETE erases with devices")
    func people() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("person")
        let put = try await api.call(
            "PUT", "/v1/people/\(person)", key: tenant.app,
            json: ["email": "\(person)@example.com", "attributes": ["plan": "gold"]])
        #expect(put.status == 200, "\(put.text)")
        #expect(try put.json().string("email") == "\(person)@example.com")
        // Absent fields keep their values; attributes replace the object.
        let update = try await api.call(
            "PUT", "/v1/people/\(person)", key: tenant.sdk, json: ["attributes": ["plan": "silver"]])
        #expect(update.status == 200, "\(update.text)")
        // The sdk key (public) writes a person but never reads one: not even an empty body shows what is stored.
        #expect(try update.json().keys.sorted() == ["id"], "\(update.text)")
        let probe = try await api.call("PUT", "/v1/people/\(person)", key: tenant.sdk, json: [String: Any]())
        #expect(probe.status == 200 && !probe.text.contains("@example.com") && !probe.text.contains("silver"))
        let got = try await api.call("GET", "/v1/people/\(person)", key: tenant.app)
        #expect(got.status == 200)
        let detail = try got.json()
        #expect(detail.string("id") == person)
        #expect(detail.string("email") == "\(person)@example.com")
        #expect(detail.object("attributes")?.string("plan") == "silver")
        #expect(detail.array("devices").isEmpty)
        #expect(detail["devices"] != nil)

        let device = Fake.hex()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)
        #expect(try await api.call("DELETE", "/v1/people/\(person)", key: tenant.app).status == 204)
        expectProblem(try await api.call("GET", "/v1/people/\(person)", key: tenant.app), 404, "not-found")
        expectProblem(try await api.call("DELETE", "/v1/people/\(person)", key: tenant.app), 404, "not-found")
        // The device went with the person.
        let count = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(device)")
        #expect(count == 0)
    }

    @Test("devices: PUT registers (masked in reads), a token moves to a new person, DELETE removes it")
    func devices() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let alice = Fake.id("alice")
        let bob = Fake.id("bob")
        let token = Fake.hex().uppercased()
        let put = try await api.call(
            "PUT", "/v1/people/\(alice)/devices/\(token)", key: tenant.sdk,
            json: ["platform": "ios", "app_id": "com.example.app", "os_version": "17.4", "app_version": "1.0"])
        #expect(put.status == 200, "\(put.text)")
        // The sdk key (public) writes a device but never reads one: it is told what it sent.
        #expect(try put.json().keys.sorted() == ["platform", "token"], "\(put.text)")
        #expect(try put.json().string("platform") == "ios")
        #expect(!put.text.lowercased().contains(token.lowercased()), "tokens are masked in responses")
        // The app key gets the device as stored.
        let stored = try await api.call(
            "PUT", "/v1/people/\(alice)/devices/\(token)", key: tenant.app, json: ["platform": "ios"])
        #expect(stored.status == 200, "\(stored.text)")
        #expect(try stored.json().string("os_version") == "17.4", "\(stored.text)")
        #expect(!stored.text.lowercased().contains(token.lowercased()), "tokens are masked in responses")

        let aliceDetail = try await api.call("GET", "/v1/people/\(alice)", key: tenant.app)
        let aliceDevices = try aliceDetail.json().array("devices")
        #expect(aliceDevices.count == 1)
        #expect(aliceDevices.first?.string("app_id") == "com.example.app")
        #expect(!aliceDetail.text.lowercased().contains(token.lowercased()))

        let android = Fake.fcm()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(alice)/devices/\(android)", key: tenant.sdk, json: ["platform": "android"]
            ).status == 200)

        // The same token registered for Bob moves to Bob.
        let moved = try await api.call(
            "PUT", "/v1/people/\(bob)/devices/\(token)", key: tenant.sdk, json: ["platform": "ios"])
        #expect(moved.status == 200, "\(moved.text)")
        // Not even a token that moves shows what its previous owner's registration stored.
        #expect(try moved.json().keys.sorted() == ["platform", "token"], "\(moved.text)")
        #expect(!moved.text.contains("com.example.app") && !moved.text.contains("17.4"), "\(moved.text)")
        #expect(try await api.call("GET", "/v1/people/\(alice)", key: tenant.app).json().array("devices").count == 1)
        let bobDevices = try await api.call("GET", "/v1/people/\(bob)", key: tenant.app).json().array("devices")
        #expect(bobDevices.count == 1)
        #expect(bobDevices.first?.string("app_id") == "com.example.app", "the move keeps the device's fields")

        // Deleting under the old owner does nothing; under the new one it removes the device.
        expectProblem(
            try await api.call("DELETE", "/v1/people/\(alice)/devices/\(token)", key: tenant.sdk), 404, "not-found")
        #expect(try await api.call("DELETE", "/v1/people/\(bob)/devices/\(token)", key: tenant.sdk).status == 204)
        #expect(try await api.call("GET", "/v1/people/\(bob)", key: tenant.app).json().array("devices").isEmpty)
        #expect(try await api.call("DELETE", "/v1/people/\(alice)/devices/\(android)", key: tenant.app).status == 204)
    }

    @Test("a person keeps at most 20 devices: the least recently registered goes, and a start reaches 20 at most")
    func devicesPerPerson() async throws {
        let w = try await LifecycleTests.world()
        let api = w.api
        let person = Fake.id("many")
        func register(_ token: String) async throws {
            let r = try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(token)", key: w.tenant.sdk, json: ["platform": "android"])
            guard r.status == 200 else { throw TestFailure("device: \(r.text)") }
        }
        func stored() async throws -> Set<String> {
            let rows = try await w.fixture.pool.query(
                "SELECT token FROM devices WHERE tenant_id = \(w.tenant.uuid) AND person_id = \(person)")
            return Set(try rows.map { try $0.decode(String.self, "token") })
        }
        let tokens = (0..<25).map { _ in Fake.fcm() }
        for token in tokens { try await register(token) }
        #expect(try await stored() == Set(tokens.suffix(20)), "the 20 registered last remain")
        // A registration again counts as recent: the oldest other device goes instead.
        try await register(tokens[5])
        try await register(Fake.fcm())
        let now = try await stored()
        #expect(now.count == 20 && now.contains(tokens[5]) && !now.contains(tokens[6]))
        // Every start goes to the person's devices: 20 pushes, not one per token ever registered.
        let instance = Fake.id("capped")
        let started = try await w.start(["instance_id": instance, "identifiers": ["id": person]])
        #expect(started.status == 200, "\(started.text)")
        #expect(try started.json()["targets"] as? Int == 20, "\(started.text)")
        #expect(try await w.deliveries(instance).count == 20)

        // The Customer.io batch (1,000 devices a request) is held to the same cap; the device registered last stays.
        let user = Fake.id("batch")
        let batch = (0..<25).map { _ in Fake.fcm() }
        let events = batch.map { token -> [String: Any] in
            var event = CompatIngestTests.event("track", "Device Created or Updated", userId: user, deviceToken: token)
            event["context"] = ["device": ["token": token, "type": "android"]]
            return event
        }
        let posted = try await CompatBatchAtomicityTests.post(api, w.tenant, events)
        #expect(posted.status == 200, "\(posted.text)")
        let kept = try await w.fixture.pool.query(
            "SELECT token FROM devices WHERE tenant_id = \(w.tenant.uuid) AND person_id = \(user)")
        let keptTokens = Set(try kept.map { try $0.decode(String.self, "token") })
        #expect(keptTokens.count == 20 && keptTokens.contains(batch[24]))

        // The tenant sets its own cap (null: the default again); a lower one applies at the next registration.
        let set = try await api.call(
            "PATCH", "/v1/settings", key: w.tenant.app, json: ["max_devices_per_person": 2])
        #expect(try set.json()["max_devices_per_person"] as? Int == 2, "\(set.text)")
        let last = Fake.fcm()
        try await register(last)
        let capped = try await stored()
        #expect(capped.count == 2 && capped.contains(last))
        expectProblem(
            try await api.call("PATCH", "/v1/settings", key: w.tenant.app, json: ["max_devices_per_person": 0]),
            422, "invalid-field", field: "max_devices_per_person")
        let reset = try await api.call(
            "PATCH", "/v1/settings", key: w.tenant.app, json: ["max_devices_per_person": NSNull()])
        #expect(try reset.json()["max_devices_per_person"] as? Int == 20, "\(reset.text)")
    }

    // MARK: Tokens

    @Test("push-to-start: a new token for the same device and type retires the old; the same token is unchanged")
    func pushToStartRotation() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        let device = Fake.hex()
        let type = Fake.activityType()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)
        let path = "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)"
        let first = Fake.hex(80)
        let r1 = try await api.call(
            "PUT", path, key: tenant.sdk, json: ["token": first, "attributes_type": "PizzaAttributes"])
        #expect(r1.status == 200, "\(r1.text)")
        let b1 = try r1.json()
        #expect(b1.string("kind") == "push_to_start" && b1.string("status") == "active")
        #expect(b1["rotated"] as? Bool == false && b1["unchanged"] as? Bool == false)
        #expect(!r1.text.contains(first))

        let again = try await api.call("PUT", path, key: tenant.sdk, json: ["token": first])
        #expect(try again.json()["unchanged"] as? Bool == true)
        #expect(try again.json()["rotated"] as? Bool == false)

        let second = Fake.hex(80)
        let r2 = try await api.call("PUT", path, key: tenant.sdk, json: ["token": second])
        #expect(try r2.json()["rotated"] as? Bool == true)
        #expect(try r2.json()["unchanged"] as? Bool == false)

        let tokens =
            try await api.call("GET", "/v1/people/\(person)", key: tenant.app).json().array("devices")
            .first?.array("tokens") ?? []
        let pts = tokens.filter { $0.string("kind") == "push_to_start" && $0.string("activity_type") == type }
        #expect(pts.count == 2)
        #expect(pts.filter { $0.string("status") == "active" }.count == 1)
        #expect(pts.filter { $0.string("status") == "retired" }.count == 1)
        #expect(pts.first { $0.string("status") == "active" }?.string("token") == maskToken(second))

        // The unknown type was created on first registration, permissive and marked as such.
        let created = try await api.call("GET", "/v1/activity_types/\(type)", key: tenant.app)
        #expect(created.status == 200, "\(created.text)")
        #expect(try created.json()["auto_created"] as? Bool == true)
        #expect(try created.json().string("attributes_type") == "PizzaAttributes")
        let listed = try await api.call("GET", "/v1/activity_types", key: tenant.app).json().array("activity_types")
        #expect(listed.contains { $0.string("identifier") == type && $0["auto_created"] as? Bool == true })

        // Defining the type for real clears the flag.
        #expect(
            try await api.call(
                "PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "PizzaAttributes"]
            ).status == 200)
        #expect(
            try await api.call("GET", "/v1/activity_types/\(type)", key: tenant.app).json()["auto_created"] as? Bool
                == false)
    }

    @Test("push-to-start is for iOS devices of that person only")
    func pushToStartRules() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        let android = Fake.hex()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(android)", key: tenant.sdk, json: ["platform": "android"]
            ).status == 200)
        let type = Fake.activityType()
        expectProblem(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(android)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": Fake.hex()]), 409, "conflict", field: "device_token")
        expectProblem(
            try await api.call(
                "PUT", "/v1/people/someone-else/devices/\(android)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": Fake.hex()]), 404, "not-found")
    }

    @Test("per-activity tokens: rotation retires the old token; the same token is unchanged")
    func activityTokenRotation() async throws {
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
        let path = "/v1/live_notifications/\(instance)/tokens/\(device)"
        let first = Fake.hex(100)
        let r1 = try await api.call("PUT", path, key: tenant.sdk, json: ["token": first])
        #expect(r1.status == 200, "\(r1.text)")
        #expect(try r1.json().string("kind") == "activity")
        #expect(try r1.json()["unchanged"] as? Bool == false)
        #expect(
            try await api.call("PUT", path, key: tenant.sdk, json: ["token": first]).json()["unchanged"] as? Bool
                == true)
        let second = Fake.hex(100)
        #expect(
            try await api.call("PUT", path, key: tenant.sdk, json: ["token": second]).json()["rotated"] as? Bool == true
        )

        let tokens =
            try await api.call("GET", "/v1/people/\(person)", key: tenant.app).json().array("devices")
            .first?.array("tokens") ?? []
        let activity = tokens.filter { $0.string("kind") == "activity" && $0.string("instance_id") == instance }
        #expect(activity.count == 2)
        #expect(activity.filter { $0.string("status") == "active" }.map { $0.string("token") } == [maskToken(second)])
        #expect(activity.filter { $0.string("status") == "retired" }.count == 1)

        let targets = try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance)
        #expect(targets.map(\.token) == [second])

        // An unregistered device is a 404, not a silent insert.
        expectProblem(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(Fake.hex())", key: tenant.sdk,
                json: ["token": Fake.hex()]), 404, "not-found")
    }

    // MARK: Lifecycle

    @Test("lifecycle: started is targeted; ended and dismissed are excluded; a later updated does not bring it back")
    func lifecycleExclusion() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        let iphone = Fake.hex()
        let pixel = Fake.fcm()
        let instance = Fake.id("order")
        for (token, platform) in [(iphone, "ios"), (pixel, "android")] {
            #expect(
                try await api.call(
                    "PUT", "/v1/people/\(person)/devices/\(token)", key: tenant.sdk, json: ["platform": platform]
                ).status == 200)
        }
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: person)
        let activityToken = Fake.hex(128)
        #expect(
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(iphone)", key: tenant.sdk,
                json: ["token": activityToken]
            ).status == 200)

        let t0 = Date().timeIntervalSince1970.rounded()
        func post(_ event: String, _ device: String, _ at: Double) async throws {
            let response = try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                json: [
                    "event": event, "device_token": device, "at": at, "content_state": ["status": event],
                ])
            #expect(response.status == 202, "\(response.text)")
            #expect(try response.json()["recorded"] as? Bool == true)
        }
        func targets() async throws -> Set<String> {
            Set(
                try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).map(\.deviceToken)
            )
        }

        // Before any event: the iPhone is targeted through its activity token; the Pixel is not yet in the instance.
        #expect(try await targets() == [iphone])
        try await post("started", iphone, t0)
        try await post("started", pixel, t0)
        #expect(try await targets() == [iphone, pixel])
        let all = try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance)
        #expect(all.first { $0.platform == .ios }?.token == activityToken)
        #expect(all.first { $0.platform == .android }?.token == pixel)

        try await post("ended", iphone, t0 + 1)
        #expect(try await targets() == [pixel])
        try await post("dismissed", pixel, t0 + 2)
        #expect(try await targets().isEmpty)
        try await post("updated", iphone, t0 + 3)
        try await post("started", pixel, t0 + 4)
        #expect(try await targets().isEmpty, "ended and dismissed are final")

        let events = try await fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM activity_events WHERE tenant_id = \(tenant.uuid) AND instance_id = \(instance)
            """)
        #expect(events == 6, "every event is kept as reported")

        // A device whose clock jumped ahead (an update dated in the year 2999) does not pin its state: its real
        // dismissal, dated now, still stops its sends.
        let later = Fake.id("order")
        try await fixture.seedInstance(tenant: tenant.uuid, id: later, person: person)
        func report(_ event: String, _ at: Double) async throws {
            let response = try await api.call(
                "POST", "/v1/live_notifications/\(later)/events", key: tenant.sdk,
                json: ["event": event, "device_token": pixel, "at": at])
            #expect(response.status == 202, "\(response.text)")
        }
        try await report("started", t0)
        try await report("updated", 32_472_144_000)
        let pixelTargeted = {
            try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: later).contains {
                $0.deviceToken == pixel
            }
        }
        #expect(try await pixelTargeted())
        try await report("dismissed", Date().timeIntervalSince1970)
        #expect(try await !pixelTargeted(), "the dismissal applies")
        expectProblem(
            try await api.call(
                "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                json: ["event": "started", "device_token": Fake.hex(), "at": t0]), 404, "not-found")
    }

    // MARK: Metrics

    @Test("delivery metrics: delivered is deduplicated, opened recorded each time, delivery_token checked")
    func deliveryMetrics() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        let path = "/v1/deliveries/\(delivery)/metrics"
        let secret = try await fixture.tenants.deliverySecret(tenant: tenant.uuid)
        let right = DeliveryTokens.make(deliveryID: delivery, secret: secret)
        // The sdk key is public: without the delivery's token a metric would be a forgery.
        for metric in ["delivered", "opened"] {
            expectProblem(
                try await api.call("POST", path, key: tenant.sdk, json: ["metric": metric, "recipient": "r1"]),
                422, "missing-field", field: "delivery_token")
        }
        let first = try await api.call(
            "POST", path, key: tenant.sdk, json: ["metric": "delivered", "recipient": "r1", "delivery_token": right])
        #expect(first.status == 202, "\(first.text)")
        #expect(try first.json()["recorded"] as? Bool == true && first.json()["duplicate"] as? Bool == false)
        let repeatDelivered = try await api.call(
            "POST", path, key: tenant.sdk, json: ["metric": "delivered", "recipient": "r1", "delivery_token": right])
        #expect(repeatDelivered.status == 202)
        #expect(try repeatDelivered.json()["duplicate"] as? Bool == true)
        #expect(try repeatDelivered.json()["recorded"] as? Bool == false)
        let otherRecipient = try await api.call(
            "POST", path, key: tenant.sdk, json: ["metric": "delivered", "recipient": "r2", "delivery_token": right])
        #expect(try otherRecipient.json()["recorded"] as? Bool == true)

        for _ in 0..<2 {
            let opened = try await api.call(
                "POST", path, key: tenant.sdk,
                json: [
                    "metric": "opened", "recipient": "r1", "at": "2025-01-02T03:04:05Z", "delivery_token": right,
                ])
            #expect(opened.status == 202)
            #expect(try opened.json()["recorded"] as? Bool == true)
        }

        expectProblem(
            try await api.call(
                "POST", path, key: tenant.sdk, json: ["metric": "opened", "delivery_token": "not-the-right-token"]),
            422, "invalid-field", field: "delivery_token")
        let verified = try await api.call(
            "POST", path, key: tenant.sdk, json: ["metric": "opened", "delivery_token": right])
        #expect(verified.status == 202, "\(verified.text)")
        // A token for another delivery does not fit this one.
        expectProblem(
            try await api.call(
                "POST", "/v1/deliveries/\(delivery)-x/metrics", key: tenant.sdk,
                json: ["metric": "opened", "delivery_token": right]), 422, "invalid-field", field: "delivery_token")

        let rows = try await fixture.pool.query(
            """
            SELECT metric, count(*)::int AS n FROM delivery_metrics
            WHERE tenant_id = \(tenant.uuid) AND delivery_id = \(delivery) GROUP BY metric ORDER BY metric
            """)
        let counts = Dictionary(
            uniqueKeysWithValues: try rows.map { (try $0.decode(String.self, "metric"), try $0.decode(Int.self, "n")) })
        #expect(counts == ["delivered": 2, "opened": 3])
        // A delivery that is not there (never was, erased, past retention) keeps no report, whatever its token.
        let unknown = ULIDGenerator.shared.next().description
        expectProblem(
            try await api.call(
                "POST", "/v1/deliveries/\(unknown)/metrics", key: tenant.sdk,
                json: ["metric": "opened", "delivery_token": DeliveryTokens.make(deliveryID: unknown, secret: secret)]),
            404, "not-found")
    }
}

/// Races a device SDK produces: retried requests and several app launches at once.
@Suite("Registry API under concurrency")
struct RegistryConcurrencyTests {
    /// Registrations racing for one (device, scope), per token kind.
    static let racers = 12

    @Test("concurrent push-to-start and activity-token registrations leave exactly one active token")
    func concurrentRotation() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("p")
        let device = Fake.hex()
        let type = Fake.activityType()
        let instance = Fake.id("inst")
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: person)
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<Self.racers {
                group.addTask {
                    try await api.call(
                        "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: tenant.sdk,
                        json: ["token": Fake.hex()]
                    ).status
                }
                group.addTask {
                    try await api.call(
                        "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: tenant.sdk,
                        json: ["token": Fake.hex()]
                    ).status
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses.allSatisfy { $0 == 200 }, "\(statuses)")
        let active = try await fixture.pool.query(
            """
            SELECT (SELECT count(*) FROM push_to_start_tokens WHERE tenant_id = \(tenant.uuid) AND status = 'active')::int AS p,
                   (SELECT count(*) FROM push_to_start_tokens WHERE tenant_id = \(tenant.uuid))::int AS pall,
                   (SELECT count(*) FROM activity_tokens WHERE tenant_id = \(tenant.uuid) AND status = 'active')::int AS a,
                   (SELECT count(*) FROM activity_tokens WHERE tenant_id = \(tenant.uuid))::int AS aall
            """)
        #expect(try active[0].decode(Int.self, "p") == 1)
        #expect(try active[0].decode(Int.self, "pall") == Self.racers)
        #expect(try active[0].decode(Int.self, "a") == 1)
        #expect(try active[0].decode(Int.self, "aall") == Self.racers)
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).count == 1)
    }

    @Test("the same delivered report sent many times at once is recorded once")
    func concurrentDelivered() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let delivery = try await fixture.recordedDelivery(tenant: tenant.uuid)
        let token = DeliveryTokens.make(
            deliveryID: delivery, secret: try await fixture.tenants.deliverySecret(tenant: tenant.uuid))
        let recorded = try await withThrowingTaskGroup(of: Bool?.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    let response = try await api.call(
                        "POST", "/v1/deliveries/\(delivery)/metrics", key: tenant.sdk,
                        json: ["metric": "delivered", "recipient": "r", "delivery_token": token])
                    return response.status == 202 ? try response.json()["recorded"] as? Bool : nil
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(recorded.filter { $0 == true }.count == 1, "\(recorded)")
        #expect(recorded.filter { $0 == false }.count == 7, "\(recorded)")
    }

    @Test("an email belongs to one person, case-insensitively: 409 conflict on email")
    func emailConflict() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let email = Fake.id("mail") + "@example.com"
        #expect(try await api.call("PUT", "/v1/people/one", key: tenant.app, json: ["email": email]).status == 200)
        expectProblem(
            try await api.call("PUT", "/v1/people/two", key: tenant.app, json: ["email": email.uppercased()]), 409,
            "conflict", field: "email")
        expectProblem(try await api.call("GET", "/v1/people/two", key: tenant.app), 404, "not-found")
        // The same email in another tenant is fine.
        let other = try await api.createTenant()
        #expect(try await api.call("PUT", "/v1/people/two", key: other.app, json: ["email": email]).status == 200)
    }
}
