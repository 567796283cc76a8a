import Foundation
import MarqueeCore
import PostgresClient
import Testing

/// `POST /v1/people/import`: NDJSON in, people, devices and push-to-start tokens out, bad lines reported.
@Suite("People import")
struct PeopleImportTests {
    static func ndjson(_ lines: [String]) -> Data { Data(lines.joined(separator: "\n").utf8) }

    static func post(_ api: API, _ key: String, _ body: Data, headers: [String: String] = [:]) async throws
        -> HTTP.Response
    {
        try await api.call(
            "POST", "/v1/people/import", key: key, body: body, contentType: "application/x-ndjson", headers: headers,
            // 13–73 s on a 2-core machine (the upper end beside the campaign suite's 10k import and runs). It took
            // 316–881 s while the registration function could keep a sequential-scan plan (fixed by migration 0048),
            // and once more than 300 s in a CI run of 2026-12-04 whose cause was not found. The bound is the client's
            // patience, not the assertion: performance is measured in bench/.
            timeout: 900)
    }

    static func json(_ object: [String: Any]) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }

    @Test("good lines import, bad ones are reported by line and field, and existing people keep what a line omits")
    func goodAndBad() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let type = Fake.activityType()
        let existing = Fake.id("old")
        let taken = Fake.id("taken")
        #expect(
            try await api.call(
                "PUT", "/v1/people/\(existing)", key: tenant.app,
                json: ["email": "\(existing)@example.com", "attributes": ["plan": "pro"]]
            ).status == 200)
        #expect(
            try await api.call("PUT", "/v1/people/\(taken)", key: tenant.app, json: ["email": "taken@example.com"])
                .status == 200)
        let fresh = Fake.id("new")
        let iphone = Fake.hex()
        let pts = Fake.hex()
        let pixel = Fake.fcm()
        // Line numbers (from 1) are what the expectations below name.
        let lines: [String] = [
            try Self.json([
                "id": fresh, "email": "\(fresh)@example.com", "attributes": ["team": "lions"],
                "devices": [
                    ["token": iphone, "platform": "ios", "push_to_start": [type: pts]],
                    ["token": pixel, "platform": "android"],
                ],
            ]),
            try Self.json(["id": existing, "email": "\(existing)-2@example.com"]),
            "{not json",
            try Self.json(["email": "x@example.com"]),
            try Self.json(["id": Fake.id("p"), "devices": [["token": Fake.hex(), "platform": "windows"]]]),
            try Self.json([
                "id": Fake.id("p"),
                "devices": [["token": Fake.fcm(), "platform": "android", "push_to_start": [type: pts]]],
            ]),
            try Self.json(["id": fresh]),
            try Self.json(["id": Fake.id("p"), "email": "\(fresh.uppercased())@EXAMPLE.com"]),
            try Self.json(["id": Fake.id("p"), "devices": [["token": iphone, "platform": "ios"]]]),
            try Self.json(["id": Fake.id("p"), "email": "TAKEN@example.com"]),
            "",
            try Self.json(["id": Fake.id("p"), "attributes": [1, 2]]),
            try Self.json(["id": Fake.id("p"), "nickname": "x"]) + "\r",
            "[1]",
        ]
        let response = try await Self.post(api, tenant.app, Self.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 1)
        #expect(body["updated"] as? Int == 1)
        let rejected = (body["rejected"] as? [[String: Any]]) ?? []
        let byLine = Dictionary(
            rejected.map { ($0["line"] as? Int ?? 0, $0["field"] as? String ?? "") }, uniquingKeysWith: { a, _ in a })
        #expect(
            byLine == [
                3: "line", 4: "id", 5: "devices[0].platform", 6: "devices[0].push_to_start", 7: "id", 8: "email",
                9: "devices[0].token", 10: "email", 12: "attributes", 13: "nickname", 14: "line",
            ], "\(response.text)")
        #expect(rejected.allSatisfy { ($0["reason"] as? String)?.isEmpty == false })
        #expect(!response.text.contains(pts), "tokens are never echoed")

        // The new person, with both devices and the push-to-start token, as the API reads them.
        let person = try await api.call("GET", "/v1/people/\(fresh)", key: tenant.app)
        #expect(person.status == 200, "\(person.text)")
        let devices = (try person.json()["devices"] as? [[String: Any]]) ?? []
        #expect(devices.compactMap { $0["platform"] as? String }.sorted() == ["android", "ios"], "\(person.text)")
        let iosTokens = devices.first { $0["platform"] as? String == "ios" }?["tokens"] as? [[String: Any]]
        #expect(iosTokens?.map { "\($0["kind"] ?? "")/\($0["activity_type"] ?? "")" } == ["push_to_start/\(type)"])
        #expect(try person.json()["email"] as? String == "\(fresh)@example.com")
        // The existing person: new email, attributes kept (the line had none).
        let old = try await api.call("GET", "/v1/people/\(existing)", key: tenant.app).json()
        #expect(old["email"] as? String == "\(existing)-2@example.com")
        #expect((old["attributes"] as? [String: Any])?["plan"] as? String == "pro")
        // The taken email still belongs to its owner.
        #expect(
            try await api.call("GET", "/v1/people/\(taken)", key: tenant.app).json()["email"] as? String
                == "taken@example.com")
        // A segment sees the imported push-to-start token.
        #expect(
            try await api.call(
                "PUT", "/v1/segments/pts", key: tenant.app,
                json: ["name": "pts", "filter": ["has_push_to_start": type]]
            ).status == 201)
        let preview = try await api.call("POST", "/v1/segments/pts/preview", key: tenant.app).json()
        #expect(preview["sample"] as? [String] == [fresh])

        // Importing again rotates the push-to-start token like a registration does.
        let rotated = Fake.hex()
        let again = try await Self.post(
            api, tenant.app,
            Self.ndjson([
                try Self.json([
                    "id": fresh, "devices": [["token": iphone, "platform": "ios", "push_to_start": [type: rotated]]],
                ])
            ]))
        #expect(try again.json()["updated"] as? Int == 1, "\(again.text)")
        let tokens = try await fixture.pool.query(
            """
            SELECT token, status FROM push_to_start_tokens
            WHERE tenant_id = \(tenant.uuid) AND device_token = \(iphone) ORDER BY status
            """)
        #expect(
            try tokens.map { try "\($0.decode(String.self, "token"))=\($0.decode(String.self, "status"))" } == [
                "\(rotated)=active", "\(pts)=retired",
            ])
    }

    @Test("emails the database folds alike are one email: a later line repeating one is refused, not a 500")
    func emailsFoldedAsTheDatabaseDoes() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let local = Fake.hex(6)
        // Swift lowercases U+0130 to "i" and a combining dot; PostgreSQL's lower() (C.UTF-8) to a plain "i".
        let lines = [
            try Self.json(["id": Fake.id("p"), "email": "\u{130}\(local)@example.com"]),
            try Self.json(["id": Fake.id("p"), "email": "i\(local)@example.com"]),
        ]
        let response = try await Self.post(api, tenant.app, Self.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 1)
        let rejected = (body["rejected"] as? [[String: Any]]) ?? []
        #expect(rejected.count == 1, "\(rejected)")
        #expect(rejected.first?["line"] as? Int == 2)
        #expect(rejected.first?["field"] as? String == "email")
        #expect(rejected.first?["reason"] as? String == "repeats line 1")
    }

    @Test("emails the database tells apart are two emails: NFC and NFD spellings of one address both import")
    func emailsToldApartAsTheDatabaseDoes() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let local = Fake.hex(6)
        // Equal to Swift's == (canonically equivalent), different to lower() and the people_email index, as to
        // `PUT /v1/people/{id}`.
        let (composed, decomposed) = ("jos\u{e9}\(local)@example.com", "jose\u{301}\(local)@example.com")
        let (first, second) = (Fake.id("p"), Fake.id("p"))
        let response = try await Self.post(
            api, tenant.app,
            Self.ndjson([
                try Self.json(["id": first, "email": composed]), try Self.json(["id": second, "email": decomposed]),
            ]))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 2, "\(response.text)")
        #expect((body["rejected"] as? [Any])?.isEmpty == true, "\(response.text)")
        let stored = try await fixture.pool.query(
            "SELECT email FROM people WHERE tenant_id = \(tenant.uuid) ORDER BY convert_to(email, 'UTF8')")
        #expect(
            try stored.map { Array(try $0.decode(String.self, "email").utf8) } == [
                Array(decomposed.utf8), Array(composed.utf8),
            ])
    }

    @Test("a line naming one device token twice (in another case) is refused; the other lines import")
    func tokenTwiceInALine() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let token = Fake.hex()
        let lines = [
            try Self.json([
                "id": Fake.id("p"),
                "devices": [["token": token, "platform": "ios"], ["token": token.uppercased(), "platform": "ios"]],
            ]),
            try Self.json(["id": Fake.id("p"), "devices": [["token": Fake.hex(), "platform": "ios"]]]),
        ]
        let response = try await Self.post(api, tenant.app, Self.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 1, "\(response.text)")
        let rejected = (body["rejected"] as? [[String: Any]]) ?? []
        #expect(rejected.first?["line"] as? Int == 1, "\(rejected)")
        #expect(rejected.first?["field"] as? String == "devices[1].token", "\(rejected)")
        #expect(rejected.first?["reason"] as? String == "repeats devices[0]", "\(rejected)")
    }

    /// A person being created by a transaction held open (not committed): an import whose insert of people reaches
    /// them waits there, after the lines whose IDs sort before, until the test commits it. On the `holding` fixture:
    /// the waiting import holds its locks on the queue's tables, and in the shared fixture a test's trigger created on
    /// `delivery_queue` (`LifecycleTests.startIsAtomic`) queued behind them, and every lifecycle write behind it (15 s of
    /// timeouts across the registry suites, seen on a loaded machine).
    static func creating(_ fixture: RegistryFixture.Running, tenant: UUID, _ id: String) async throws -> HeldTransaction
    {
        try await HeldTransaction.open(fixture.databaseURL) { c in
            try c.execute("INSERT INTO people (tenant_id, id) VALUES (\(tenant), \(id))")
        }
    }

    @Test("a person erased while an import writes them: the import answers 200, and the erasure comes after it")
    func erasureDuringImport() async throws {
        let fixture = try await RegistryFixture.holding.running()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let (person, later, phone) = ("a-" + Fake.hex(8), "z-" + Fake.hex(8), Fake.hex())
        #expect(
            try await api.call("PUT", "/v1/people/\(person)", key: tenant.app, json: ["attributes": ["a": 1]]).status
                == 200)
        // The import's insert of people passes `person`, who exists (and is left as they are, unlocked), and waits at
        // `later`: before it updates `person` and gives them the phone.
        let held = try await Self.creating(fixture, tenant: tenant.uuid, later)
        let lines = [
            try Self.json(["id": person, "attributes": ["a": 2], "devices": [["token": phone, "platform": "ios"]]]),
            try Self.json(["id": later]),
        ]
        let importing = Task { try await Self.post(api, tenant.app, Self.ndjson(lines)) }
        try await held.waitedOn(via: fixture.pool, "the import waits at its insert of \(later)")
        let erasing = Task { try await api.call("DELETE", "/v1/people/\(person)", key: tenant.app) }
        // The erasure waits for the import (so for the held transaction, one removed), or it is done.
        try await eventually("the erasure waits for the import, or is done") {
            let left = try await fixture.pool.count(
                "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(tenant.uuid) AND id = \(person)")
            return try await held.waiting(via: fixture.pool) >= 2 || left == 0
        }
        try await held.commit()
        let response = try await importing.value
        #expect(response.status == 200, "\(response.text)")
        #expect(try response.json()["updated"] as? Int == 2, "\(response.text)")
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        // The erasure came second: nothing of the person is left, the imported phone neither.
        let left = try await fixture.pool.count(
            """
            SELECT (SELECT count(*) FROM people WHERE tenant_id = \(tenant.uuid) AND id = \(person))
                 + (SELECT count(*) FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(phone)) AS n
            """)
        #expect(left == 0)
    }

    @Test("an email given to someone else while an import runs: its lines are refused, the others import, not a 500")
    func emailTakenDuringImport() async throws {
        let fixture = try await RegistryFixture.holding.running()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let (first, fresh, existing) = ("a-" + Fake.hex(8), "b-" + Fake.hex(8), "c-" + Fake.hex(8))
        let (created, updated) = ("b-\(Fake.hex(6))@example.com", "c-\(Fake.hex(6))@example.com")
        #expect(try await api.call("PUT", "/v1/people/\(existing)", key: tenant.app, json: [:]).status == 200)
        // The import found both emails free, and waits at its insert of `first`: before it creates `fresh` with one
        // and updates `existing` with the other.
        let held = try await Self.creating(fixture, tenant: tenant.uuid, first)
        let lines = [
            try Self.json(["id": first]), try Self.json(["id": fresh, "email": created]),
            try Self.json(["id": existing, "email": updated]),
        ]
        let importing = Task { try await Self.post(api, tenant.app, Self.ndjson(lines)) }
        try await held.waitedOn(via: fixture.pool, "the import waits at its insert of \(first)")
        let takers = [(Fake.id("t"), created), (Fake.id("t"), updated)]
        for (taker, email) in takers {
            let put = try await api.call("PUT", "/v1/people/\(taker)", key: tenant.app, json: ["email": email])
            #expect(put.status == 200, "\(put.text)")
        }
        try await held.commit()
        let response = try await importing.value
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        // `first` was created meanwhile: the import updates them.
        #expect(body["imported"] as? Int == 0, "\(response.text)")
        #expect(body["updated"] as? Int == 1, "\(response.text)")
        let rejected = ((body["rejected"] as? [[String: Any]]) ?? []).map {
            "\($0["line"] ?? "")/\($0["field"] ?? "")/\($0["reason"] ?? "")"
        }
        #expect(rejected == ["2/email/belongs to another person", "3/email/belongs to another person"])
        let emails = try await fixture.pool.query(
            "SELECT id, COALESCE(email, '') AS email FROM people WHERE tenant_id = \(tenant.uuid)"
        ).map { "\(try $0.decode(String.self, "id"))=\(try $0.decode(String.self, "email"))" }
        #expect(
            Set(emails)
                == Set(["\(first)=", "\(existing)=", "\(takers[0].0)=\(created)", "\(takers[1].0)=\(updated)"]))
    }

    @Test("a line's devices are capped by the tenant's max_devices_per_person, as a registration's, not by 20")
    func devicesUpToTheTenantsCap() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        #expect(
            try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["max_devices_per_person": 50]).status
                == 200)
        let (thirty, sixty) = (Fake.id("p"), Fake.id("p"))
        let lines = [
            try Self.json([
                "id": thirty, "devices": (0..<30).map { _ in ["token": Fake.hex(), "platform": "ios"] },
            ]),
            try Self.json([
                "id": sixty, "devices": (0..<60).map { _ in ["token": Fake.hex(), "platform": "ios"] },
            ]),
        ]
        let response = try await Self.post(api, tenant.app, Self.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        #expect(try response.json()["imported"] as? Int == 2, "\(response.text)")
        let counts = try await fixture.pool.query(
            """
            SELECT person_id, count(*)::int AS n FROM devices WHERE tenant_id = \(tenant.uuid) GROUP BY person_id
            """)
        let byPerson = Dictionary(
            uniqueKeysWithValues: try counts.map {
                (try $0.decode(String.self, "person_id"), try $0.decode(Int.self, "n"))
            })
        #expect(byPerson == [thirty: 30, sixty: 50], "a person over the cap keeps 50, as a registration would")
    }

    @Test("IDs are compared byte by byte, as the database does: two spellings of one accented letter are two people")
    func idsComparedAsBytes() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let stem = Fake.id("p")
        // U+00E9 and "e" + U+0301: equal to Swift's ==, different to PostgreSQL (and to every other route).
        let (composed, decomposed) = (stem + "\u{e9}", stem + "e\u{301}")
        let lines = [
            try Self.json(["id": composed]), try Self.json(["id": decomposed]), try Self.json(["id": composed]),
        ]
        let response = try await Self.post(api, tenant.app, Self.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 2, "\(response.text)")
        let rejected = (body["rejected"] as? [[String: Any]]) ?? []
        #expect(rejected.count == 1, "\(rejected)")
        #expect(rejected.first?["line"] as? Int == 3)
        #expect(rejected.first?["reason"] as? String == "repeats line 1")
        let stored = try await fixture.pool.query(
            "SELECT id FROM people WHERE tenant_id = \(tenant.uuid) ORDER BY convert_to(id, 'UTF8')")
        #expect(
            try stored.map { Array(try $0.decode(String.self, "id").utf8) } == [
                Array(decomposed.utf8), Array(composed.utf8),
            ])
    }

    @Test("registrations as a set give each row the outcome, rotation and stored rows single registrations give")
    func registrationsAsSet() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (type, other, third) = (Fake.activityType(), Fake.activityType(), Fake.activityType())
        let (alice, bob, carol) = (Fake.id("a"), Fake.id("b"), Fake.id("c"))
        let (phoneA, pixelB, phoneC, unknown) = (Fake.hex(), Fake.fcm(), Fake.hex(), Fake.hex())
        let (first, second, carols, carolsToo) = (Fake.hex(), Fake.hex(), Fake.hex(), Fake.hex())
        // The same people in two tenants: one registers through the set function, the other one row at a time
        // through the single registration's (migration 0003).
        var results: [[String]] = []
        for asSet in [true, false] {
            let tenant = try await api.createTenant("import-set-" + Fake.hex(6))
            let imported = try await Self.post(
                api, tenant.app,
                Self.ndjson([
                    try Self.json([
                        "id": alice, "devices": [["token": phoneA, "platform": "ios", "push_to_start": [type: first]]],
                    ]),
                    try Self.json(["id": bob, "devices": [["token": pixelB, "platform": "android"]]]),
                    try Self.json(["id": carol, "devices": [["token": phoneC, "platform": "ios"]]]),
                ]))
            #expect(imported.status == 200, "\(imported.text)")
            func register(_ rows: [(person: String, device: String, type: String, token: String)]) async throws
                -> [String]
            {
                func line(_ row: PostgresRow) throws -> String {
                    "\(try row.decode(String.self, "outcome"))"
                        + "\(try row.decode(Bool.self, "rotated") ? ",rotated" : "")"
                        + "\(try row.decode(Bool.self, "inserted") ? ",inserted" : "")"
                }
                if asSet {
                    return try await fixture.pool.query(
                        """
                        SELECT outcome, rotated, inserted FROM marquee_register_push_to_start_rows(
                            \(tenant.uuid), 'marquee', \(rows.map(\.person))::text[], \(rows.map(\.device))::text[],
                            \(rows.map(\.type))::text[], \(rows.map(\.token))::text[],
                            \(rows.map { _ in String?.none })::text[], \(rows.map { _ in "Attributes" })::text[])
                        ORDER BY ord
                        """
                    ).map(line)
                }
                var lines: [String] = []
                for row in rows {
                    lines += try await fixture.pool.query(
                        """
                        SELECT outcome, rotated, inserted FROM marquee_register_push_to_start(
                            \(tenant.uuid), \(row.person), \(row.device), \(row.type), \(row.token), NULL, 'marquee',
                            'Attributes')
                        """
                    ).map(line)
                }
                return lines
            }
            var outcomes = try await register([
                (alice, phoneA, type, second),  // rotates the imported token
                (alice, unknown, type, Fake.hex()),  // no such device
                (bob, pixelB, type, Fake.hex()),  // an Android device
                (carol, phoneC, other, carols),  // new, and a new activity type
                (carol, phoneA, other, Fake.hex()),  // Alice's device, not Carol's
            ])
            // Registered again: neither new nor rotating.
            outcomes += try await register([(alice, phoneA, type, second)])
            // Past the tenant's cap on types registrations create (2: `type` and `other`), a new type is refused and
            // the known one in the same call registers (migration 0088).
            #expect(
                try await api.call(
                    "PATCH", "/v1/settings", key: tenant.app, json: ["max_auto_created_activity_types": 2]
                ).status == 200)
            outcomes += try await register([(carol, phoneC, third, Fake.hex()), (carol, phoneC, type, carolsToo)])
            let tokens = try await fixture.pool.query(
                """
                SELECT device_token || '/' || activity_type || '/' || token || '=' || status
                       || COALESCE('/' || retired_reason, '') AS row
                FROM push_to_start_tokens WHERE tenant_id = \(tenant.uuid) ORDER BY 1
                """
            ).map { try $0.decode(String.self, "row") }
            let types = try await fixture.pool.query(
                """
                SELECT identifier || '=' || attributes_type || '/' || auto_created AS row FROM activity_types
                WHERE tenant_id = \(tenant.uuid) AND identifier IN (\(type), \(other)) ORDER BY 1
                """
            ).map { try $0.decode(String.self, "row") }
            results.append(outcomes + tokens + types)
            if asSet {
                #expect(
                    outcomes == [
                        "ok,rotated,inserted", "no_device", "not_ios", "ok,inserted", "no_device", "ok", "type_limit",
                        "ok,inserted",
                    ])
                #expect(
                    tokens
                        == [
                            "\(phoneA)/\(type)/\(first)=retired/rotated", "\(phoneA)/\(type)/\(second)=active",
                            "\(phoneC)/\(other)/\(carols)=active", "\(phoneC)/\(type)/\(carolsToo)=active",
                        ].sorted())
                // A batch naming a (device, type) twice cannot say which token is the newer: refused.
                await #expect(throws: PostgresError.self) {
                    _ = try await register([(alice, phoneA, type, Fake.hex()), (alice, phoneA, type, Fake.hex())])
                }
            }
        }
        #expect(results[0] == results[1], "the set function and the single registration differ")
    }

    @Test("an Idempotency-Key replays the first answer; a JSON body is 415; more than 100,000 people is 422")
    func requestRules() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-rules-" + Fake.hex(6))
        let body = Self.ndjson([try Self.json(["id": Fake.id("a")]), try Self.json(["id": Fake.id("b")])])
        let key = ["Idempotency-Key": Fake.hex(12)]
        let first = try await Self.post(api, tenant.app, body, headers: key)
        #expect(first.status == 200)
        #expect(try first.json()["imported"] as? Int == 2)
        let repeated = try await Self.post(api, tenant.app, body, headers: key)
        #expect(repeated.status == 200)
        #expect(repeated.header("Idempotent-Replayed") == "true")
        #expect(try repeated.json()["imported"] as? Int == 2, "the first answer, not a second import (0 new)")
        expectProblem(
            try await Self.post(api, tenant.app, Self.ndjson([try Self.json(["id": "c"])]), headers: key), 422,
            "invalid-field", field: "Idempotency-Key")

        let json = try await api.call(
            "POST", "/v1/people/import", key: tenant.app, body: body, contentType: "application/json")
        expectProblem(json, 415, "unsupported-media-type")
        expectProblem(
            try await api.call(
                "POST", "/v1/people/import", key: tenant.sdk, body: body, contentType: "application/x-ndjson"),
            403, "forbidden")
        let tooMany = Data(String(repeating: "{\"id\":\"x\"}\n", count: 100_001).utf8)
        expectProblem(try await Self.post(api, tenant.app, tooMany), 422, "invalid-field", field: "body")
    }

    @Test("a start that records an Idempotency-Key while an import with it runs keeps it: the import is undone, 422")
    func keyTakenDuringImport() async throws {
        let fixture = try await RegistryFixture.holding.running()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let type = Fake.activityType()
        #expect(
            try await api.call(
                "PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "DeliveryAttributes"]
            ).status == 201)
        let key = ["Idempotency-Key": "shared-" + Fake.hex(8)]
        let (first, later) = ("a-" + Fake.hex(8), "z-" + Fake.hex(8))
        // The import found the key free, and waits at its insert of `later`.
        let held = try await Self.creating(fixture, tenant: tenant.uuid, later)
        let lines = [try Self.json(["id": first]), try Self.json(["id": later])]
        let importing = Task { try await Self.post(api, tenant.app, Self.ndjson(lines), headers: key) }
        try await held.waitedOn(via: fixture.pool, "the import waits at its insert of \(later)")
        // Meanwhile a start with the same key commits (a person with no device: accepted as failed).
        let start: [String: Any] = [
            "identifiers": ["id": Fake.id("nobody")], "notification_type": type, "attributes": ["order": "42"],
            "content_state": ["eta": 1],
        ]
        func postStart() async throws -> HTTP.Response {
            try await api.call("POST", "/v1/live_notifications/start", key: tenant.app, json: start, headers: key)
        }
        let started = try await postStart()
        #expect(started.status == 200, "\(started.text)")
        try await held.commit()
        // The import lost the key: nothing of it is written, and it is answered as a request the key was used for.
        expectProblem(try await importing.value, 422, "invalid-field", field: "Idempotency-Key")
        #expect(
            try await fixture.pool.count(
                "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(tenant.uuid) AND id = \(first)") == 0)
        // The start's retry still gets its own answer.
        let retried = try await postStart()
        #expect(retried.status == 200, "\(retried.text)")
        #expect(retried.header("Idempotent-Replayed") == "true")
        #expect(try retried.json()["instance_id"] as? String == started.json()["instance_id"] as? String)
    }

    @Test("a body over the server's 1 MiB limit is read only after the app key is checked: no key, no 64 MiB buffer")
    func largeBodyNeedsTheKeyFirst() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-" + Fake.hex(6))
        let url = try #require(URLComponents(string: api.baseURL))
        let (host, port) = (try #require(url.host), try #require(url.port))
        // Only the headers are sent: the answer must come without the 64 MiB body announced.
        for (authorization, status, slug) in [
            (nil, 401, "unauthorized"), ("Bearer mq_app_not_a_key", 401, "unauthorized"),
            ("Bearer \(tenant.sdk)", 403, "forbidden"),
        ] {
            var head =
                "POST /v1/people/import HTTP/1.1\r\nHost: \(host)\r\nContent-Type: application/x-ndjson\r\n"
                + "Content-Length: \(64 << 20)\r\n"
            if let authorization { head += "Authorization: \(authorization)\r\n" }
            let request = Array((head + "\r\n").utf8)
            let raw = try await withCheckedThrowingContinuation {
                (continuation: CheckedContinuation<[UInt8], any Error>) in
                Thread {
                    continuation.resume(with: Result { try HTTP.exchange(host: host, port: port, request: request) })
                }
                .start()
            }
            expectProblem(try HTTP.parse(raw), status, slug, "\(authorization ?? "no key")")
        }
        // With the app key the body is read (the 100,000-people test imports a body of many MiB).
        let small = try await Self.post(api, tenant.app, Self.ndjson([try Self.json(["id": Fake.id("k")])]))
        #expect(small.status == 200, "\(small.text)")
    }

    @Test("the registration functions never plan a sequential scan (migrations 0048, 0065)")
    func registrationFunctionsUseIndexes() async throws {
        let fixture = try await RegistryFixture.get()
        // Planned on nearly empty tables and kept, a sequential scan made the 100k import quadratic (316–881 s).
        let rows = try await fixture.pool.query(
            """
            SELECT proname, COALESCE(array_to_string(proconfig, ','), '') AS config FROM pg_proc
            WHERE proname IN ('marquee_register_push_to_start', 'marquee_register_push_to_start_rows',
                              'marquee_register_activity_token')
            ORDER BY proname
            """)
        #expect(rows.count == 3)
        for row in rows {
            let name = try row.decode(String.self, "proname")
            #expect(try row.decode(String.self, "config").contains("enable_seqscan=off"), "\(name)")
        }
    }

    @Test("100,000 people with an iPhone and a push-to-start token each, in one request")
    func hundredThousand() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("import-100k-" + Fake.hex(6))
        let type = Fake.activityType()
        let prefix = Fake.hex(6)
        var text = ""
        text.reserveCapacity(100_000 * 220)
        for i in 0..<100_000 {
            let device = String(format: "%064x", i)
            text += """
                {"id":"p\(prefix)-\(i)","email":"p\(i)@\(prefix).example.com","attributes":{"n":\(i)},\
                "devices":[{"token":"\(device)","platform":"ios","push_to_start":{"\(type)":"\(device)aa"}}]}

                """
        }
        let started = ContinuousClock.now
        let response = try await Self.post(api, tenant.app, Data(text.utf8))
        let elapsed = ContinuousClock.now - started
        #expect(response.status == 200, "\(response.text.prefix(500))")
        let body = try response.json()
        #expect(body["imported"] as? Int == 100_000)
        #expect((body["rejected"] as? [Any])?.isEmpty == true)
        let counts = try await fixture.pool.query(
            """
            SELECT (SELECT count(*)::int FROM people WHERE tenant_id = \(tenant.uuid)) AS people,
                   (SELECT count(*)::int FROM devices WHERE tenant_id = \(tenant.uuid)) AS devices,
                   (SELECT count(*)::int FROM push_to_start_tokens WHERE tenant_id = \(tenant.uuid)
                        AND status = 'active') AS tokens
            """)
        #expect(try counts[0].decode(Int.self, "people") == 100_000)
        #expect(try counts[0].decode(Int.self, "devices") == 100_000)
        #expect(try counts[0].decode(Int.self, "tokens") == 100_000)
        print("import of 100,000 people with devices and push-to-start tokens: \(elapsed)")
    }
}
