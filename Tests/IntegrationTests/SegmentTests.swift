import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// Segments and their filter language, through the API against a real database.
@Suite("Segments")
struct SegmentTests {
    /// A tenant with four people whose attributes, emails, devices and push-to-start tokens differ.
    struct People {
        var tenant: TestTenant
        var activityType: String
        /// lions, 30, tags [vip, beta], joined 2024-01-05, nested.x 1, example.com, iPhone with push-to-start.
        var p1: String
        /// tigers, 17, tags [beta], bio "loves lions", Other.org, an Android phone.
        var p2: String
        /// team null, age "thirty", no email, no device.
        var p3: String
        /// no attributes, EXAMPLE.COM, an iPhone without push-to-start.
        var p4: String
    }

    static func seed(_ api: API) async throws -> People {
        let tenant = try await api.createTenant("segments-" + Fake.hex(6))
        let type = Fake.activityType()
        let ids = (1...4).map { Fake.id("p\($0)") }
        func ok(_ r: HTTP.Response) throws {
            guard (200...204).contains(r.status) else { throw TestFailure("seeding: \(r.status) \(r.text)") }
        }
        try ok(await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "A"]))
        let people: [(String, String?, [String: Any])] = [
            (
                ids[0], "\(ids[0])@example.com",
                [
                    "team": "lions", "age": 30, "tags": ["vip", "beta"], "joined": "2024-01-05T00:00:00Z",
                    "nested": ["x": 1],
                ]
            ),
            (ids[1], "\(ids[1])@Other.org", ["team": "tigers", "age": 17, "tags": ["beta"], "bio": "loves lions"]),
            (ids[2], nil, ["team": NSNull(), "age": "thirty"]),
            (ids[3], "\(ids[3])@EXAMPLE.COM", [:]),
        ]
        for (id, email, attributes) in people {
            var body: [String: Any] = ["attributes": attributes]
            if let email { body["email"] = email }
            try ok(await api.call("PUT", "/v1/people/\(id)", key: tenant.app, json: body))
        }
        let iphone1 = Fake.hex()
        try ok(
            await api.call("PUT", "/v1/people/\(ids[0])/devices/\(iphone1)", key: tenant.sdk, json: ["platform": "ios"])
        )
        try ok(
            await api.call(
                "PUT", "/v1/people/\(ids[0])/devices/\(iphone1)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": Fake.hex()]))
        try ok(
            await api.call(
                "PUT", "/v1/people/\(ids[1])/devices/\(Fake.fcm())", key: tenant.sdk, json: ["platform": "android"]))
        try ok(
            await api.call(
                "PUT", "/v1/people/\(ids[3])/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"]))
        return People(tenant: tenant, activityType: type, p1: ids[0], p2: ids[1], p3: ids[2], p4: ids[3])
    }

    /// Saves `filter` as a segment and previews it: the people it matches (sorted) and the count.
    static func matches(_ api: API, _ tenant: TestTenant, _ filter: [String: Any]) async throws -> (Int, [String]) {
        let id = Fake.id("seg")
        let put = try await api.call(
            "PUT", "/v1/segments/\(id)", key: tenant.app, json: ["name": "s", "filter": filter])
        guard put.status == 201 else { throw TestFailure("PUT segment: \(put.status) \(put.text)") }
        let preview = try await api.call("POST", "/v1/segments/\(id)/preview", key: tenant.app)
        guard preview.status == 200 else { throw TestFailure("preview: \(preview.status) \(preview.text)") }
        let body = try preview.json()
        let sample = (body["sample"] as? [String]) ?? []
        return (body["count"] as? Int ?? -1, sample)
    }

    @Test("every operator, email domain, devices, push-to-start, and nesting with and/or/not")
    func operators() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let s = try await Self.seed(api)
        func attr(_ pointer: String, _ op: String, _ value: Any? = nil) -> [String: Any] {
            var f: [String: Any] = ["attribute": pointer, "op": op]
            if let value { f["value"] = value }
            return f
        }
        let cases: [(String, [String: Any], [String])] = [
            ("eq string", attr("/team", "eq", "lions"), [s.p1]),
            ("eq number as a double", attr("/age", "eq", 30.0), [s.p1]),
            ("eq never matches another type", attr("/age", "eq", "30"), []),
            ("ne includes people without the attribute", attr("/team", "ne", "lions"), [s.p2, s.p3, s.p4]),
            ("eq null", attr("/team", "eq", NSNull()), [s.p3]),
            ("in", attr("/team", "in", ["lions", "tigers", "bears"]), [s.p1, s.p2]),
            ("lt number skips strings", attr("/age", "lt", 18), [s.p2]),
            ("lte", attr("/age", "lte", 30), [s.p1, s.p2]),
            ("gt", attr("/age", "gt", 17), [s.p1]),
            ("gte", attr("/age", "gte", 17), [s.p1, s.p2]),
            ("gt string compares timestamps", attr("/joined", "gt", "2024-01-01T00:00:00Z"), [s.p1]),
            ("lt string", attr("/team", "lt", "m"), [s.p1]),
            ("exists includes null", attr("/team", "exists"), [s.p1, s.p2, s.p3]),
            ("exists false", attr("/team", "exists", false), [s.p4]),
            ("contains an array element", attr("/tags", "contains", "vip"), [s.p1]),
            ("contains in a string", attr("/bio", "contains", "lions"), [s.p2]),
            ("contains matches no number", attr("/age", "contains", 3), []),
            ("a nested pointer", attr("/nested/x", "eq", 1), [s.p1]),
            ("email domain, any case", ["email_domain": "Example.com"], [s.p1, s.p4]),
            ("any device", ["has_device": [:] as [String: Any]], [s.p1, s.p2, s.p4]),
            ("iOS device", ["has_device": ["platform": "ios"]], [s.p1, s.p4]),
            ("Android device", ["has_device": ["platform": "android"]], [s.p2]),
            ("push-to-start", ["has_push_to_start": s.activityType], [s.p1]),
            ("push-to-start for another type", ["has_push_to_start": "com.example.other"], []),
            ("not eq is ne", ["not": attr("/team", "eq", "lions")], [s.p2, s.p3, s.p4]),
            (
                "and with not",
                ["and": [["has_device": ["platform": "ios"]], ["not": ["has_push_to_start": s.activityType]]]],
                [s.p4]
            ),
            (
                "or of and",
                [
                    "or": [
                        ["and": [attr("/tags", "contains", "beta"), attr("/age", "lt", 18)]],
                        ["email_domain": "example.com"],
                    ]
                ],
                [s.p1, s.p2, s.p4]
            ),
        ]
        for (name, filter, expected) in cases {
            let (count, sample) = try await Self.matches(api, s.tenant, filter)
            #expect(count == expected.count, "\(name): count")
            #expect(sample == expected.sorted(), "\(name)")
        }
    }

    @Test("contains: an element equal to the value (numbers by value, objects and arrays whole, nothing nested)")
    func containsElements() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("segments-contains-" + Fake.hex(6))
        let mixed = Fake.id("mixed")
        let other = Fake.id("other")
        for (id, tags) in [
            (mixed, [1.5, "a", ["k": 1, "j": 2], [1, 2], NSNull(), true] as [Any]),
            (other, [[3], ["k": 1], "ab"] as [Any]),
        ] {
            let put = try await api.call(
                "PUT", "/v1/people/\(id)", key: tenant.app, json: ["attributes": ["tags": tags]])
            #expect(put.status == 200 || put.status == 201, "\(put.text)")
        }
        let cases: [(Any, [String])] = [
            (1.50, [mixed]), ("a", [mixed]), ("b", []), (NSNull(), [mixed]), (true, [mixed]), (false, []),
            (["j": 2, "k": 1], [mixed]), (["k": 1], [other]), ([1, 2], [mixed]), ([1], []), (2, []), (3, []),
            ([3], [other]),
        ]
        for (value, expected) in cases {
            let (count, sample) = try await Self.matches(
                api, tenant, ["attribute": "/tags", "op": "contains", "value": value])
            #expect(count == expected.count && sample == expected.sorted(), "contains \(value)")
        }
    }

    @Test("array indexes in an attribute pointer as RFC 6901 reads them: /tags/-1, /tags/01, /tags/+1 name no element")
    func arrayIndexes() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let s = try await Self.seed(api)
        let p5 = Fake.id("p5")
        let put = try await api.call(
            "PUT", "/v1/people/\(p5)", key: s.tenant.app,
            json: ["attributes": ["m": ["01": "k", "-1": "l", "0": "z", "-": "d"]]])
        #expect(put.status == 200 || put.status == 201, "\(put.text)")
        // p1's tags are [vip, beta], p2's [beta].
        let cases: [(String, String, [String])] = [
            ("/tags/0", "vip", [s.p1]), ("/tags/1", "beta", [s.p1]), ("/tags/0", "beta", [s.p2]),
            ("/tags/-1", "beta", []), ("/tags/01", "beta", []), ("/tags/+1", "beta", []), ("/tags/ 1", "beta", []),
            ("/tags/-", "beta", []), ("/m/01", "k", [p5]), ("/m/-1", "l", [p5]), ("/m/0", "z", [p5]),
            ("/m/-", "d", [p5]),
        ]
        for (pointer, value, expected) in cases {
            let (count, sample) = try await Self.matches(
                api, s.tenant, ["attribute": pointer, "op": "eq", "value": value])
            #expect(count == expected.count, "\(pointer) eq \(value): count")
            #expect(sample == expected.sorted(), "\(pointer) eq \(value)")
        }
        let (present, _) = try await Self.matches(api, s.tenant, ["attribute": "/tags/-1", "op": "exists"])
        #expect(present == 0)
    }

    @Test("ordered comparisons of numbers are exact: 16 significant digits, integers beyond 2^53, long fractions")
    func exactNumbers() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("segments-numbers-" + Fake.hex(6))
        // Epoch microseconds (16 digits), integers either side of 2^53, and doubles that differ in the 17th digit.
        let values: [(String, String)] = [
            ("us1", "1700000000123456"), ("us2", "1700000000123457"), ("us3", "1700000000123458"),
            ("big1", "9007199254740992"), ("big2", "9007199254740993"),
            ("f1", "1.0000000000000002"), ("f2", "1.0000000000000004"),
        ]
        var ids: [String: String] = [:]
        for (name, number) in values {
            let id = Fake.id(name)
            ids[name] = id
            let put = try await api.call(
                "PUT", "/v1/people/\(id)", key: tenant.app,
                body: Data("{\"attributes\": {\"n\": \(number)}}".utf8), contentType: "application/json")
            #expect(put.status == 200 || put.status == 201, "\(put.text)")
        }
        let cases: [(String, String, [String])] = [
            ("gt", "1700000000123456", ["us2", "us3"]),
            ("gte", "1700000000123457", ["us2", "us3"]),
            ("lt", "1700000000123458", ["us1", "us2"]),
            ("lte", "1700000000123457", ["us1", "us2"]),
            ("gt", "9007199254740992", ["big2"]),
            ("gte", "9007199254740993", ["big2"]),
            ("lt", "9007199254740993", ["big1"]),
            ("gt", "1.0000000000000002", ["f2"]),
            ("lte", "1.0000000000000002", ["f1"]),
        ]
        for (op, number, expected) in cases {
            // Within this test's people of the same kind (by the magnitude of n); numbers as written, not through
            // JSONSerialization.
            let range =
                number.contains(".")
                ? ("gt", "0", "lt", "2")
                : number.hasPrefix("17")
                    ? ("gt", "2", "lt", "1800000000000000") : ("gt", "1800000000000000", "lt", "1e17")
            let filter = """
                {"name": "n", "filter": {"and": [{"attribute": "/n", "op": "\(op)", "value": \(number)},
                 {"attribute": "/n", "op": "\(range.0)", "value": \(range.1)},
                 {"attribute": "/n", "op": "\(range.2)", "value": \(range.3)}]}}
                """
            let segment = Fake.id("seg")
            let put = try await api.call(
                "PUT", "/v1/segments/\(segment)", key: tenant.app, body: Data(filter.utf8),
                contentType: "application/json")
            #expect(put.status == 201, "\(put.text)")
            let preview = try await api.call("POST", "/v1/segments/\(segment)/preview", key: tenant.app).json()
            let want = expected.map { ids[$0]! }.sorted()
            #expect(preview["count"] as? Int == want.count, "\(op) \(number): count")
            #expect(preview["sample"] as? [String] == want, "\(op) \(number)")
        }
    }

    @Test("a bad filter is a 422 naming the bad node by JSON pointer")
    func badFilters() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("segments-bad-" + Fake.hex(6))
        var deep: [String: Any] = ["has_device": [:] as [String: Any]]
        for _ in 0..<SegmentFilter.Limits.depth { deep = ["not": deep] }
        let wide: [String: Any] = ["or": (0..<SegmentFilter.Limits.nodes).map { _ in ["email_domain": "a.b"] }]
        let cases: [(String, Any?, String)] = [
            (
                "unknown operator", ["and": [["email_domain": "a.b"], ["attribute": "/a", "op": "like", "value": 1]]],
                "/filter/and/1/op"
            ),
            ("empty or", ["or": [Any]()], "/filter/or"),
            ("unknown key", ["team": "lions"], "/filter/team"),
            ("two keys", ["email_domain": "a.b", "has_device": [:] as [String: Any]], "/filter"),
            ("not a pointer", ["attribute": "team", "op": "eq", "value": 1], "/filter/attribute"),
            ("missing value", ["attribute": "/team", "op": "eq"], "/filter/value"),
            ("in needs an array", ["attribute": "/team", "op": "in", "value": "lions"], "/filter/value"),
            (
                "in too long",
                [
                    "attribute": "/t", "op": "in",
                    "value": Array(repeating: 1, count: SegmentFilter.Limits.inValues + 1),
                ],
                "/filter/value"
            ),
            ("lt with a boolean", ["attribute": "/age", "op": "lt", "value": true], "/filter/value"),
            ("extra key in a condition", ["attribute": "/a", "op": "exists", "sql": "x"], "/filter/sql"),
            ("platform", ["not": ["has_device": ["platform": "windows"]]], "/filter/not/has_device/platform"),
            ("activity type", ["has_push_to_start": "nodots"], "/filter/has_push_to_start"),
            ("too deep", deep, "/filter" + String(repeating: "/not", count: SegmentFilter.Limits.depth)),
            ("too many nodes", wide, "/filter/or/\(SegmentFilter.Limits.nodes - 1)"),
            ("not an object", ["and": ["x"]], "/filter/and/0"),
            ("missing", nil, "filter"),
        ]
        for (name, filter, field) in cases {
            var body: [String: Any] = ["name": "bad"]
            if let filter { body["filter"] = filter }
            let response = try await api.call("PUT", "/v1/segments/bad", key: tenant.app, json: body)
            let slug = filter == nil || name == "missing value" ? "missing-field" : "invalid-field"
            expectProblem(response, 422, slug, field: field, name)
        }
        expectProblem(
            try await api.call("PUT", "/v1/segments/ok", key: tenant.app, json: ["filter": ["email_domain": "a.b"]]),
            422, "missing-field", field: "name")
        expectProblem(
            try await api.call(
                "PUT", "/v1/segments/a%20b", key: tenant.app, json: ["name": "x", "filter": ["email_domain": "a.b"]]),
            422, "invalid-field", field: "segment_id")
        #expect(try await api.call("GET", "/v1/segments/bad", key: tenant.app).status == 404, "nothing was saved")
    }

    @Test("the compiled SQL holds no value: each is a bind parameter, and the text is the same for any values")
    func compiledShape() throws {
        func compile(_ json: String) throws -> PostgresQuery {
            var q = SegmentSQL.Builder()
            SegmentSQL.condition(try SegmentFilter(JSONValue.parse(Array(json.utf8))), into: &q)
            return q.query
        }
        let template = """
            {"and": [{"attribute": "/%1", "op": "eq", "value": "%2"}, {"email_domain": "%3"},
                     {"not": {"attribute": "/a", "op": "lt", "value": "%4"}}, {"has_push_to_start": "com.example.x"},
                     {"attribute": "/b", "op": "contains", "value": "%6"}]}
            """
        let plain = try compile(template.replacingOccurrences(of: "%", with: "v"))
        let evil = try compile(template.replacingOccurrences(of: "%", with: "q'--"))
        #expect(plain.sql == evil.sql, "only binds differ")
        #expect(!evil.sql.contains("q'--"))
        #expect(evil.binds.count == 8, "two per attribute condition (path, value), one per other leaf")
    }

    @Test("values that look like SQL are only ever values")
    func injection() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("segments-sql-" + Fake.hex(6))
        let evil = "x'); DROP TABLE people; --"
        let person = Fake.id("bobby")
        let put = try await api.call(
            "PUT", "/v1/people/\(person)", key: tenant.app,
            json: ["email": "\(person)@example.com", "attributes": ["name": evil, "' OR 1=1 --": "k"]])
        #expect(put.status == 200 || put.status == 201, "\(put.text)")
        let other = Fake.id("alice")
        _ = try await api.call("PUT", "/v1/people/\(other)", key: tenant.app, json: ["attributes": ["name": "alice"]])
        let cases: [([String: Any], [String])] = [
            (["attribute": "/name", "op": "eq", "value": evil], [person]),
            (["attribute": "/name", "op": "eq", "value": "' OR '1'='1"], []),
            (["attribute": "/' OR 1=1 --", "op": "exists"], [person]),
            (["attribute": "/name", "op": "contains", "value": "%"], []),
            (["attribute": "/name", "op": "in", "value": ["') OR true --", evil]], [person]),
            (["email_domain": "example.com'OR'1'='1"], []),
            (["has_push_to_start": "com.x.y--"], []),
            (["attribute": "/name", "op": "gt", "value": "'; SELECT pg_sleep(10); --"], [other, person].sorted()),
        ]
        for (filter, expected) in cases {
            let (count, sample) = try await Self.matches(api, tenant, filter)
            #expect(count == expected.count && sample == expected, "\(filter)")
        }
        #expect(try await fixture.pool.count("SELECT count(*)::int AS n FROM people WHERE id = \(person)") == 1)
    }

    @Test("save, replace, read, page through, delete; a missing segment is 404 everywhere")
    func lifecycle() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant("segments-crud-" + Fake.hex(6))
        let filter: [String: Any] = ["attribute": "/plan", "op": "eq", "value": "pro"]
        let created = try await api.call(
            "PUT", "/v1/segments/pro", key: tenant.app, json: ["name": "Pro", "filter": filter])
        #expect(created.status == 201, "\(created.text)")
        #expect(try created.json()["segment_id"] as? String == "pro")
        let replaced = try await api.call(
            "PUT", "/v1/segments/pro", key: tenant.app, json: ["name": "Pro users", "filter": filter])
        #expect(replaced.status == 200, "\(replaced.text)")
        let read = try await api.call("GET", "/v1/segments/pro", key: tenant.app).json()
        #expect(read["name"] as? String == "Pro users")
        #expect((read["filter"] as? [String: Any])?["value"] as? String == "pro")

        for i in 0..<4 {
            _ = try await api.call(
                "PUT", "/v1/segments/s\(i)", key: tenant.app,
                json: ["name": "S\(i)", "filter": ["email_domain": "a.b"]])
        }
        var seen: [String] = []
        var cursor: String?
        repeat {
            let page = try await api.call(
                "GET", "/v1/segments?limit=2" + (cursor.map { "&cursor=\($0)" } ?? ""), key: tenant.app
            ).json()
            let items = (page["data"] as? [[String: Any]]) ?? []
            #expect(items.count <= 2)
            seen += items.compactMap { $0["segment_id"] as? String }
            cursor = page["next_cursor"] as? String
        } while cursor != nil && seen.count < 20
        #expect(seen == ["pro", "s0", "s1", "s2", "s3"])

        #expect(try await api.call("DELETE", "/v1/segments/pro", key: tenant.app).status == 204)
        expectProblem(try await api.call("GET", "/v1/segments/pro", key: tenant.app), 404, "not-found")
        expectProblem(try await api.call("DELETE", "/v1/segments/pro", key: tenant.app), 404, "not-found")
        expectProblem(try await api.call("POST", "/v1/segments/pro/preview", key: tenant.app), 404, "not-found")
        expectProblem(try await api.call("GET", "/v1/segments/pro", key: tenant.sdk), 403, "forbidden")
    }
}
