import Foundation
import MarqueeCore
import PostgresClient
import Testing

/// Person IDs are chosen by clients, the sdk key's holders among them (public): an ID with invisible, formatting or
/// direction-changing code points looks like another one in the console and in logs. Every write that would create
/// a record carrying such an ID refuses it (422 naming the field); people stored before the rule are still read,
/// paged and erased by theirs.
@Suite("Look-alike person IDs")
struct LookAlikeIDTests {
    /// One of each kind the rule refuses (Cc, Cf: zero-width, bidi marks, embeddings, overrides and isolates, Zl, Zp,
    /// Co, default-ignorable, noncharacters).
    static let refused: [(String, String)] = [
        ("NEL", u(0x0085)), ("zero-width space", u(0x200B)), ("zero-width joiner", u(0x200D)),
        ("left-to-right mark", u(0x200E)), ("right-to-left mark", u(0x200F)), ("Arabic letter mark", u(0x061C)),
        ("left-to-right embedding", u(0x202A)), ("right-to-left override", u(0x202E)),
        ("left-to-right isolate", u(0x2066)), ("pop directional isolate", u(0x2069)), ("BOM", u(0xFEFF)),
        ("soft hyphen", u(0x00AD)), ("line separator", u(0x2028)), ("paragraph separator", u(0x2029)),
        ("private use", u(0xE000)), ("variation selector", u(0xFE0F)), ("Hangul filler", u(0x3164)),
        ("noncharacter U+FDD0", u(0xFDD0)), ("noncharacter U+FFFF", u(0xFFFF)),
    ]

    /// The one-scalar string of `value` (Swift refuses noncharacters in literals).
    static func u(_ value: UInt32) -> String { String(Character(Unicode.Scalar(value)!)) }

    static func path(_ id: String) -> String { id.addingPercentEncoding(withAllowedCharacters: .alphanumerics)! }

    @Test("refused with 422 naming the field: PUT person, device and push-to-start, start, campaign, identify")
    func refusedWhereCreated() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let type = Fake.activityType()
        #expect(
            try await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "A"])
                .status == 201)
        for (name, text) in Self.refused {
            let id = "alice" + text + "-" + Fake.hex(6)
            let encoded = Self.path(id)
            expectProblem(
                try await api.call("PUT", "/v1/people/\(encoded)", key: tenant.sdk, json: ["email": "a@example.com"]),
                422, "invalid-field", field: "id", "PUT person, \(name)")
            expectProblem(
                try await api.call(
                    "PUT", "/v1/people/\(encoded)/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"]),
                422, "invalid-field", field: "id", "PUT device, \(name)")
            expectProblem(
                try await api.call(
                    "PUT", "/v1/people/\(encoded)/devices/\(Fake.hex())/push_to_start/\(type)", key: tenant.sdk,
                    json: ["token": Fake.hex()]), 422, "invalid-field", field: "id", "PUT push-to-start, \(name)")
            expectProblem(
                try await api.call(
                    "POST", "/v1/live_notifications/start", key: tenant.app,
                    json: [
                        "identifiers": ["id": id], "notification_type": type, "attributes": ["a": 1],
                        "content_state": ["b": 2], "push_payload": ["alert": ["title": "T", "body": "B"]],
                    ]), 422, "invalid-field", field: "identifiers.id", "start, \(name)")
            expectProblem(
                try await api.call(
                    "POST", "/v1/campaigns", key: tenant.app,
                    json: [
                        "name": "c", "notification_type": type, "audience": ["people": ["bob", id]],
                        "attributes": ["a": 1], "content_state": ["b": 2],
                        "push_payload": ["alert": ["title": "T", "body": "B"]],
                    ]), 422, "invalid-field", field: "audience.people[1]", "campaign, \(name)")
            let identify = try await api.call(
                "POST", "/v1/identify", key: tenant.sdk,
                json: CompatIngestTests.event("identify", userId: id, properties: ["email": "a@example.com"]))
            expectProblem(identify, 422, "invalid-field", field: "userId", "identify, \(name)")
        }
        let stored = try await fixture.pool.count(
            """
            SELECT ((SELECT count(*) FROM people WHERE tenant_id = \(tenant.uuid))
                    + (SELECT count(*) FROM instances WHERE tenant_id = \(tenant.uuid))
                    + (SELECT count(*) FROM campaigns WHERE tenant_id = \(tenant.uuid)))::int AS n
            """)
        #expect(stored == 0, "nothing was created")
    }

    @Test("an import reports each such line as rejected, field id, and imports the others")
    func importLinesRejected() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let good = Fake.id("good")
        var lines = [try PeopleImportTests.json(["id": good])]
        for (_, text) in Self.refused {
            lines.append(
                try PeopleImportTests.json([
                    "id": "alice" + text + "-" + Fake.hex(6), "devices": [["token": Fake.hex(), "platform": "ios"]],
                ]))
        }
        let response = try await PeopleImportTests.post(api, tenant.app, PeopleImportTests.ndjson(lines))
        #expect(response.status == 200, "\(response.text)")
        let body = try response.json()
        #expect(body["imported"] as? Int == 1)
        let rejected = body.array("rejected")
        #expect(rejected.map { $0["line"] as? Int } == Array(2...(Self.refused.count + 1)), "\(rejected)")
        #expect(rejected.allSatisfy { $0.string("field") == "id" && $0.string("reason")?.isEmpty == false })
        let people = try await fixture.pool.query(
            "SELECT id FROM people WHERE tenant_id = \(tenant.uuid)"
        ).map { try $0.decode(String.self, "id") }
        #expect(people == [good])
    }

    @Test("people stored before the rule are still read and erased, and their devices deleted, by their IDs")
    func legacyRowsStillNamed() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        for (name, text) in Self.refused where text != Self.u(0x85) {  // controls were refused before the rule too
            let id = "legacy" + text + "-" + Fake.hex(6)
            let device = Fake.hex()
            // As an earlier version stored them (the test's owner connection goes around the API).
            try await fixture.pool.execute(
                """
                INSERT INTO people (tenant_id, id, email) VALUES (\(tenant.uuid), \(id), \(Fake.hex(8) + "@example.com"))
                """)
            try await fixture.pool.execute(
                """
                INSERT INTO devices (tenant_id, token, person_id, platform) VALUES (\(tenant.uuid), \(device), \(id), 'ios')
                """)
            let encoded = Self.path(id)
            let read = try await api.call("GET", "/v1/people/\(encoded)", key: tenant.app)
            #expect(read.status == 200, "GET, \(name): \(read.text)")
            #expect(try read.json().string("id") == id, "GET, \(name)")
            let deleteDevice = try await api.call("DELETE", "/v1/people/\(encoded)/devices/\(device)", key: tenant.sdk)
            #expect(deleteDevice.status == 204, "DELETE device, \(name): \(deleteDevice.text)")
            let erase = try await api.call("DELETE", "/v1/people/\(encoded)", key: tenant.app)
            #expect(erase.status == 204, "DELETE person, \(name): \(erase.text)")
            expectProblem(
                try await api.call("GET", "/v1/people/\(encoded)", key: tenant.app), 404, "not-found", "gone, \(name)")
        }
        // A Customer.io `Device Deleted` names its person too.
        let id = "legacy\u{202E}-" + Fake.hex(6)
        let device = Fake.hex()
        try await fixture.pool.execute("INSERT INTO people (tenant_id, id) VALUES (\(tenant.uuid), \(id))")
        try await fixture.pool.execute(
            "INSERT INTO devices (tenant_id, token, person_id, platform) VALUES (\(tenant.uuid), \(device), \(id), 'ios')"
        )
        let deleted = try await api.call(
            "POST", "/v1/track", key: tenant.sdk,
            json: CompatIngestTests.event("track", "Device Deleted", userId: id, deviceToken: device))
        #expect(deleted.status == 200, "\(deleted.text)")
        #expect(try deleted.json()["applied"] as? Int == 1, "\(deleted.text)")
        let left = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM devices WHERE tenant_id = \(tenant.uuid) AND token = \(device)")
        #expect(left == 0)
    }
}
