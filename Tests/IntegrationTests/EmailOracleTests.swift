import Foundation
import PostgresClient
import Testing

/// The sdk key is public: without identity verification, a person write with it must not tell whether an email
/// belongs to someone else (a 409 did, so anyone could test whether an address is a customer's). Such a write is
/// answered as a success, the rest of it is written, the email moves nowhere, and it is counted and logged without the
/// email. App-key and identity-verified writes keep the 409.
@Suite("sdk email oracle")
struct EmailOracleTests {
    struct World {
        let fixture: RegistryFixture.Running
        let tenant: TestTenant
        /// The person who has the email, and the email.
        let owner: String
        let email: String
        /// A person who has an email of their own.
        let writer: String
        let writersEmail: String

        var api: API { fixture.api }

        static func make(_ tenant: TestTenant? = nil) async throws -> World {
            let fixture = try await RegistryFixture.get()
            var tenant = tenant
            if tenant == nil { tenant = try await fixture.api.createTenant() }
            guard let tenant else { throw TestFailure("no tenant") }
            let (owner, writer) = (Fake.id("owner"), Fake.id("writer"))
            let (email, writersEmail) = (owner + "@example.com", writer + "@example.com")
            for (person, address) in [(owner, email), (writer, writersEmail)] {
                let put = try await fixture.api.call(
                    "PUT", "/v1/people/\(person)", key: tenant.app, json: ["email": address])
                guard put.status == 200 else { throw TestFailure("seed: \(put.status) \(put.text)") }
            }
            return World(
                fixture: fixture, tenant: tenant, owner: owner, email: email, writer: writer,
                writersEmail: writersEmail)
        }

        /// person → email, as stored.
        func emails() async throws -> [String: String?] {
            var out: [String: String?] = [:]
            for row in try await fixture.pool.query("SELECT id, email FROM people WHERE tenant_id = \(tenant.uuid)") {
                out[try row.decode(String.self, "id")] = try row.decode(String?.self, "email")
            }
            return out
        }

        func conflicts(_ route: String) async throws -> Double {
            CompatIngestTests.sample(
                try await api.call("GET", "/metrics").text, "marquee_sdk_email_conflicts_total{route=\"\(route)\"}")
        }
    }

    @Test("sdk key, no verification: 200 {id}, the other person keeps the email, the writer keeps theirs; counted")
    func sdkUnverified() async throws {
        let w = try await World.make()
        let before = try await w.conflicts("people")
        let response = try await w.api.call(
            "PUT", "/v1/people/\(w.writer)", key: w.tenant.sdk,
            json: ["email": w.email.uppercased(), "attributes": ["plan": "pro"]])
        #expect(response.status == 200, "\(response.text)")
        #expect(try response.json().keys.sorted() == ["id"], "the answer a success gets: \(response.text)")
        #expect(try response.json().string("id") == w.writer)
        // A person created by the write is answered the same way, and created without the email.
        let newcomer = Fake.id("new")
        let created = try await w.api.call("PUT", "/v1/people/\(newcomer)", key: w.tenant.sdk, json: ["email": w.email])
        #expect(created.status == 200, "\(created.text)")
        #expect(try created.json().keys.sorted() == ["id"], "\(created.text)")

        let emails = try await w.emails()
        #expect(emails[w.owner] == .some(w.email), "the email did not move")
        #expect(emails[w.writer] == .some(w.writersEmail), "the writer's email is unchanged")
        #expect(emails[newcomer] == .some(nil))
        let plan = try await w.fixture.pool.query(
            "SELECT attributes->>'plan' AS plan FROM people WHERE tenant_id = \(w.tenant.uuid) AND id = \(w.writer)")
        #expect(try plan[0].decode(String?.self, "plan") == "pro", "the rest of the write applied")
        #expect(try await w.conflicts("people") >= before + 2)
        try await eventually("the conflict is logged with the person") {
            w.fixture.serve.log.split(separator: "\n").contains {
                $0.contains("sdk email conflict") && $0.contains(w.writer) && $0.contains(w.tenant.id.lowercased())
            }
        }
        #expect(!w.fixture.serve.log.lowercased().contains(w.email.lowercased()), "never the email")
    }

    @Test("the app key still gets 409 conflict on email, and nothing moves")
    func appKeyConflict() async throws {
        let w = try await World.make()
        expectProblem(
            try await w.api.call("PUT", "/v1/people/\(w.writer)", key: w.tenant.app, json: ["email": w.email]), 409,
            "conflict", field: "email")
        let emails = try await w.emails()
        #expect(emails[w.owner] == .some(w.email))
        #expect(emails[w.writer] == .some(w.writersEmail))
    }

    @Test("an identity-verified sdk write (the token vouches for the email) still gets 409")
    func sdkVerifiedConflict() async throws {
        let api = try await RegistryFixture.get().api
        let (tenant, secret) = try await IdentityVerificationTests.requiredTenant(api)
        let w = try await World.make(tenant)
        let token = IdentityVerificationTests.token(w.writer, secret, email: w.email)
        expectProblem(
            try await w.api.call(
                "PUT", "/v1/people/\(w.writer)", key: w.tenant.sdk, json: ["email": w.email],
                headers: [IdentityVerificationTests.header: token]), 409, "conflict", field: "email")
        let identify = try await w.api.call(
            "POST", "/v1/identify", key: w.tenant.sdk,
            json: CompatIngestTests.event("identify", userId: w.writer, properties: ["email": w.email]),
            headers: [IdentityVerificationTests.header: token])
        expectProblem(identify, 409, "conflict", field: "email")
        #expect(try await w.emails()[w.writer] == .some(w.writersEmail))
    }

    @Test("a Customer.io identify without verification is applied the same way, single and in a batch")
    func compatUnverified() async throws {
        let w = try await World.make()
        let before = try await w.conflicts("customerio")
        let identify = try await w.api.call(
            "POST", "/v1/identify", key: w.tenant.sdk,
            json: CompatIngestTests.event("identify", userId: w.writer, properties: ["email": w.email, "plan": "pro"]))
        #expect(identify.status == 200, "\(identify.text)")
        #expect(try identify.json()["applied"] as? Int == 1)
        let device = Fake.hex()
        let batch = try await w.api.call(
            "POST", "/v1/batch", key: w.tenant.sdk,
            json: CompatIngestTests.envelope(
                [
                    CompatIngestTests.event("identify", userId: w.writer, properties: ["email": w.email]),
                    CompatIngestTests.event(
                        "track", "Device Created or Updated", userId: w.writer, deviceToken: device),
                ], writeKey: w.tenant.sdk))
        #expect(batch.status == 200, "\(batch.text)")
        #expect(try batch.json()["applied"] as? Int == 2, "the batch's other events applied too")
        let emails = try await w.emails()
        #expect(emails[w.owner] == .some(w.email))
        #expect(emails[w.writer] == .some(w.writersEmail))
        let devices = try await w.fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM devices
            WHERE tenant_id = \(w.tenant.uuid) AND token = \(device) AND person_id = \(w.writer)
            """)
        #expect(devices == 1)
        #expect(try await w.conflicts("customerio") >= before + 2)
    }

    @Test("a write that meets another giving the email away at the same moment runs again and keeps it: 200, never 409")
    func racingWriter() async throws {
        let fixture = try await RegistryFixture.holding.running()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let (owner, writer) = (Fake.id("owner"), Fake.id("writer"))
        let email = owner + "@example.com"
        for person in [owner, writer] {
            #expect(try await api.call("PUT", "/v1/people/\(person)", key: tenant.app, json: [:]).status == 200)
        }
        // The owner takes the email in a transaction not committed yet: the write finds it free, then meets it in the
        // unique index.
        let tenantID = tenant.uuid
        let held = try await HeldTransaction.open(fixture.databaseURL) { c in
            try c.execute("UPDATE people SET email = \(email) WHERE tenant_id = \(tenantID) AND id = \(owner)")
        }
        let racing = Task {
            try await api.call("PUT", "/v1/people/\(writer)", key: tenant.sdk, json: ["email": email], timeout: 60)
        }
        try await held.waitedOn(via: fixture.pool, "the write waits for the email's owner")
        try await held.commit()
        let response = try await racing.value
        #expect(response.status == 200, "\(response.text)")
        let rows = try await fixture.pool.query(
            "SELECT id, email FROM people WHERE tenant_id = \(tenantID) ORDER BY id = \(owner) DESC")
        #expect(try rows.map { try $0.decode(String?.self, "email") } == [email, nil])
    }
}
