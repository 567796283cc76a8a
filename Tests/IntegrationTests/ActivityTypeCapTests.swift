import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// A push-to-start registration naming an unknown activity type creates it, and the sdk key that registers is public:
/// a tenant caps the types registrations create (`max_auto_created_activity_types`, 100 unless set; migration 0088).
@Suite("Activity types created by registrations are capped")
struct ActivityTypeCapTests {
    struct World {
        let fixture: RegistryFixture.Running
        let tenant: TestTenant
        let person: String
        let device: String

        var api: API { fixture.api }

        /// A tenant whose cap is `cap`, with one iPhone registered.
        static func make(cap: Int) async throws -> World {
            let fixture = try await RegistryFixture.get()
            let tenant = try await fixture.api.createTenant()
            let settings = try await fixture.api.call(
                "PATCH", "/v1/settings", key: tenant.app, json: ["max_auto_created_activity_types": cap])
            guard settings.status == 200, try settings.json()["max_auto_created_activity_types"] as? Int == cap else {
                throw TestFailure("settings: \(settings.status) \(settings.text)")
            }
            let person = Fake.id("p")
            let device = Fake.hex()
            let put = try await fixture.api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"])
            guard put.status == 200 else { throw TestFailure("device: \(put.status) \(put.text)") }
            return World(fixture: fixture, tenant: tenant, person: person, device: device)
        }

        func register(_ type: String, key: String? = nil) async throws -> HTTP.Response {
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: key ?? tenant.sdk,
                json: ["token": Fake.hex()])
        }

        /// The tenant's activity types: identifier → auto_created.
        func types() async throws -> [String: Bool] {
            var out: [String: Bool] = [:]
            for row in try await fixture.pool.query(
                "SELECT identifier, auto_created FROM activity_types WHERE tenant_id = \(tenant.uuid)")
            {
                out[try row.decode(String.self, "identifier")] = try row.decode(Bool.self, "auto_created")
            }
            return out
        }
    }

    @Test("the default is 100, shown by GET /v1/settings; null restores it, and the range is 0 to 10000")
    func setting() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        #expect(
            try await api.call("GET", "/v1/settings", key: tenant.app).json()["max_auto_created_activity_types"]
                as? Int == 100)
        for bad in [-1, 10_001] {
            expectProblem(
                try await api.call(
                    "PATCH", "/v1/settings", key: tenant.app, json: ["max_auto_created_activity_types": bad]),
                422, "invalid-field", field: "max_auto_created_activity_types")
        }
        let zero = try await api.call(
            "PATCH", "/v1/settings", key: tenant.app, json: ["max_auto_created_activity_types": 0])
        #expect(try zero.json()["max_auto_created_activity_types"] as? Int == 0, "\(zero.text)")
        let restored = try await api.call(
            "PATCH", "/v1/settings", key: tenant.app, body: Data(#"{"max_auto_created_activity_types": null}"#.utf8),
            contentType: "application/json")
        #expect(try restored.json()["max_auto_created_activity_types"] as? Int == 100, "\(restored.text)")
    }

    @Test(
        "past the cap a new type is refused (422 activity-type-limit, field activity_type); known types still register")
    func capRefusesNewTypes() async throws {
        let w = try await World.make(cap: 2)
        let first = Fake.activityType()
        let second = Fake.activityType()
        #expect(try await w.register(first).status == 200)
        #expect(try await w.register(second, key: w.tenant.app).status == 200, "an app-key registration creates too")
        let third = Fake.activityType()
        for key in [w.tenant.sdk, w.tenant.app] {
            expectProblem(
                try await w.register(third, key: key), 422, "activity-type-limit", field: "activity_type",
                "a third new type")
        }
        // Types already there take registrations (a new token rotates the old one).
        let again = try await w.register(first)
        #expect(again.status == 200, "\(again.text)")
        #expect(try again.json()["rotated"] as? Bool == true)
        #expect(try await w.types() == [first: true, second: true], "nothing was created past the cap")
        let tokens = try await w.fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM push_to_start_tokens
            WHERE tenant_id = \(w.tenant.uuid) AND activity_type = \(third)
            """)
        #expect(tokens == 0, "the refused registration stored no token")
    }

    @Test("types created with the app key are never refused and do not count; adopting one frees its place")
    func appKeyTypesUnaffected() async throws {
        let w = try await World.make(cap: 1)
        let auto = Fake.activityType()
        #expect(try await w.register(auto).status == 200)
        // Explicit types: created past the cap, registered to, and not counted.
        for _ in 0..<3 {
            let explicit = Fake.activityType()
            #expect(
                try await w.api.call(
                    "PUT", "/v1/activity_types/\(explicit)", key: w.tenant.app, json: ["attributes_type": "A"]
                ).status == 201)
            #expect(try await w.register(explicit).status == 200)
        }
        let refused = Fake.activityType()
        expectProblem(try await w.register(refused), 422, "activity-type-limit", field: "activity_type")
        // Replacing the auto-created type with the app key makes it the tenant's own: a place is free again.
        #expect(
            try await w.api.call("PUT", "/v1/activity_types/\(auto)", key: w.tenant.app, json: ["attributes_type": "A"])
                .status == 200)
        #expect(try await w.register(refused).status == 200)
        #expect(try await w.types().values.filter { $0 }.count == 1)
    }

    @Test("a cap of 0 lets registrations create no type")
    func zeroCap() async throws {
        let w = try await World.make(cap: 0)
        expectProblem(try await w.register(Fake.activityType()), 422, "activity-type-limit", field: "activity_type")
        #expect(try await w.types().isEmpty)
    }

    @Test("the Customer.io ingest is refused the same way, naming properties.notificationType, and keeps nothing")
    func compatRefused() async throws {
        let w = try await World.make(cap: 1)
        #expect(try await w.register(Fake.activityType()).status == 200)
        let newDevice = Fake.hex()
        let type = Fake.activityType()
        let event = CompatIngestTests.event(
            "track", "Live Notification Token", userId: w.person,
            properties: [
                "registrationType": "push_to_start", "pushToStartToken": Fake.hex(), "notificationType": type,
                "deviceId": newDevice, "platform": "ios",
            ])
        expectProblem(
            try await w.api.call("POST", "/v1/track", key: w.tenant.sdk, json: event), 422, "activity-type-limit",
            field: "properties.notificationType")
        let batch = try await w.api.call(
            "POST", "/v1/batch", key: w.tenant.sdk,
            json: CompatIngestTests.envelope([event], writeKey: w.tenant.sdk))
        expectProblem(batch, 422, "activity-type-limit", field: "batch[0].properties.notificationType")
        #expect(try await w.types()[type] == nil)
        let devices = try await w.fixture.pool.count(
            "SELECT count(*)::int AS n FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(newDevice)")
        #expect(devices == 0, "the device the event would have registered was not kept")
    }

    @Test("an import rejects each line naming a type past the cap (the whole line) and imports the others")
    func importLinesRejected() async throws {
        let w = try await World.make(cap: 2)
        let known = Fake.activityType()
        #expect(try await w.register(known).status == 200)
        let fresh = Fake.activityType()
        let (a, b, c, d) = (Fake.id("a"), Fake.id("b"), Fake.id("c"), Fake.id("d"))
        let overflow = Fake.activityType()
        let lines = [
            try PeopleImportTests.json([
                "id": a, "devices": [["token": Fake.hex(), "platform": "ios", "push_to_start": [known: Fake.hex()]]],
            ]),
            try PeopleImportTests.json([
                "id": b, "devices": [["token": Fake.hex(), "platform": "ios", "push_to_start": [fresh: Fake.hex()]]],
            ]),
            try PeopleImportTests.json([
                "id": c,
                "devices": [
                    ["token": Fake.hex(), "platform": "android"],
                    [
                        "token": Fake.hex(), "platform": "ios",
                        "push_to_start": [overflow: Fake.hex(), known: Fake.hex()],
                    ],
                ],
            ]),
            try PeopleImportTests.json([
                "id": d, "devices": [["token": Fake.hex(), "platform": "ios", "push_to_start": [fresh: Fake.hex()]]],
            ]),
        ]
        let response = try await PeopleImportTests.post(w.api, w.tenant.app, PeopleImportTests.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 3, "\(response.text)")
        let rejected = body.array("rejected")
        #expect(rejected.count == 1, "\(rejected)")
        #expect(rejected.first?["line"] as? Int == 3)
        #expect(rejected.first?.string("field") == "devices[1].push_to_start.\(overflow)")
        #expect(rejected.first?.string("reason")?.contains("max_auto_created_activity_types") == true)
        #expect(try await w.types() == [known: true, fresh: true])
        let people = try await w.fixture.pool.query(
            "SELECT id FROM people WHERE tenant_id = \(w.tenant.uuid) AND id = ANY(\([a, b, c, d])::text[]) ORDER BY id"
        ).map { try $0.decode(String.self, "id") }
        #expect(people == [a, b, d].sorted(), "the rejected line imported nothing")
        let tokens = try await w.fixture.pool.count(
            "SELECT count(*)::int AS n FROM push_to_start_tokens WHERE tenant_id = \(w.tenant.uuid) AND status = 'active'"
        )
        #expect(tokens == 4, "the first registration and lines 1, 2 and 4")
    }

    @Test("an import line naming more new types than the cap has room for creates none of them; later lines can")
    func importLineLeavesNothing() async throws {
        let w = try await World.make(cap: 2)
        let known = Fake.activityType()
        #expect(try await w.register(known).status == 200)  // one place left
        let (x1, x2, x3, x4) = (Fake.activityType(), Fake.activityType(), Fake.activityType(), Fake.activityType())
        let ids = (1...5).map { Fake.id("l\($0)") }
        func line(_ id: String, _ devices: [[String]]) throws -> String {
            try PeopleImportTests.json([
                "id": id,
                "devices": devices.map { types in
                    [
                        "token": Fake.hex(), "platform": "ios",
                        "push_to_start": Dictionary(uniqueKeysWithValues: types.map { ($0, Fake.hex()) }),
                    ] as [String: Any]
                },
            ])
        }
        let lines = [
            try line(ids[0], [[x1, x2]]),  // two new types, room for one: neither is created
            try line(ids[1], [[x3]]),  // the place line 1 did not take
            try line(ids[2], [[x1]]),  // no place left
            try line(ids[3], [[x3], [known]]),  // created by line 2
            try line(ids[4], [[known], [x4]]),  // no place left
        ]
        let response = try await PeopleImportTests.post(w.api, w.tenant.app, PeopleImportTests.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 2, "\(response.text)")
        let rejected = body.array("rejected")
        #expect(rejected.compactMap { $0["line"] as? Int } == [1, 3, 5], "\(rejected)")
        #expect(rejected.first?.string("field") == "devices[0].push_to_start.\([x1, x2].min()!)", "\(rejected)")
        #expect(rejected.last?.string("field") == "devices[1].push_to_start.\(x4)", "\(rejected)")
        #expect(try await w.types() == [known: true, x3: true], "a rejected line left no type behind")
        let people = try await w.fixture.pool.query(
            "SELECT id FROM people WHERE tenant_id = \(w.tenant.uuid) AND id = ANY(\(ids)::text[]) ORDER BY id"
        ).map { try $0.decode(String.self, "id") }
        #expect(people == [ids[1], ids[3]].sorted())
    }

    @Test("a registration waits for another creating a type, then counts it: concurrent ones never overshoot")
    func concurrentCreationsCounted() async throws {
        let fixture = try await RegistryFixture.holding.running()
        let api = fixture.api
        let tenant = try await api.createTenant()
        #expect(
            try await api.call(
                "PATCH", "/v1/settings", key: tenant.app, json: ["max_auto_created_activity_types": 1]
            ).status == 200)
        let person = Fake.id("p")
        let device = Fake.hex()
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]
            ).status == 200)
        // Another registration's transaction creates the tenant's one type and has not committed yet.
        let held = Fake.activityType()
        let tenantID = tenant.uuid
        let open = try await HeldTransaction.open(fixture.databaseURL) { c in
            _ = try c.query(
                """
                SELECT marquee_create_activity_types(\(tenantID), 'marquee', ARRAY[\(held)]::text[], ARRAY['A']::text[])
                """)
        }
        let other = Fake.activityType()
        let racing = Task {
            try await api.call(
                "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(other)", key: tenant.sdk,
                json: ["token": Fake.hex()], timeout: 60)
        }
        try await open.waitedOn(via: fixture.pool, "the registration waits for the type being created")
        try await open.commit()
        expectProblem(try await racing.value, 422, "activity-type-limit", field: "activity_type")
        let auto = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM activity_types WHERE tenant_id = \(tenantID) AND auto_created")
        #expect(auto == 1)
    }
}
