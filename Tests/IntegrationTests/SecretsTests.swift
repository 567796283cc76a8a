import Crypto
import Foundation
import MarqueeDelivery
import PostgresClient
import Testing

/// Uploaded private keys never come back out: not in responses, not in logs, not in clear text in the database.
@Suite("Secrets")
struct SecretsTests {
    /// 40-character pieces of a PEM's base64 body: both ends of every line, and the joined body cut in 40s.
    static func chunks(_ pem: String) -> [String] {
        let lines = pem.split(separator: "\n").map(String.init).filter { !$0.hasPrefix("-----") && $0.count >= 40 }
        var out: [String] = []
        for line in lines {
            out.append(String(line.prefix(40)))
            out.append(String(line.suffix(40)))
        }
        let body = Array(lines.joined())
        var start = 0
        while start + 40 <= body.count {
            out.append(String(body[start..<(start + 40)]))
            start += 40
        }
        return Array(Set(out))
    }

    /// Text as it would carry a chunk: JSON may escape `/`.
    static func normalized(_ text: String) -> String { text.replacingOccurrences(of: "\\/", with: "/") }

    /// The first chunk found in `text`, if any (as base64 or, for bytea output, as hex of its ASCII bytes).
    static func leak(_ chunks: [String], in text: String) -> String? {
        let plain = normalized(text)
        for chunk in chunks {
            if plain.contains(chunk) { return chunk }
            if plain.contains(hex(chunk)) { return chunk + " (hex)" }
        }
        return nil
    }

    static func hex(_ text: String) -> String {
        let digits = Array("0123456789abcdef")
        return String(text.utf8.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xF)]] })
    }

    @Test("an uploaded .p8 and FCM private key appear in no response, no log line and no database row")
    func privateKeysStayPrivate() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let p8 = ES256PrivateKey.generate().pkcs8PEM
        let rsa = try RS256PrivateKey.generate().pkcs8PEM
        // Keys sent in rejected uploads must not be echoed either.
        let rejectedForAPNs = try RS256PrivateKey.generate().pkcs8PEM
        let rejectedForFCM = ES256PrivateKey.generate().pkcs8PEM
        let secrets = Self.chunks(p8) + Self.chunks(rsa) + Self.chunks(rejectedForAPNs) + Self.chunks(rejectedForFCM)
        #expect(secrets.count > 40)

        var responses: [(String, HTTP.Response)] = []
        func record(_ label: String, _ response: HTTP.Response) { responses.append((label, response)) }
        let apns: [String: Any] = [
            "team_id": "ABCDE12345", "key_id": "KEY1234567", "private_key": p8, "bundle_id": "com.example.app",
            "environment": "sandbox",
        ]
        let putAPNs = try await api.call("PUT", "/v1/credentials/apns", key: tenant.app, json: apns)
        #expect(putAPNs.status == 200, "\(putAPNs.text)")
        record("PUT apns", putAPNs)
        let putFCM = try await api.call(
            "PUT", "/v1/credentials/fcm", key: tenant.app,
            json: ["service_account": RegistryTests.serviceAccount(pem: rsa)])
        #expect(putFCM.status == 200, "\(putFCM.text)")
        record("PUT fcm", putFCM)

        var wrong = apns
        wrong["private_key"] = rejectedForAPNs
        let badAPNs = try await api.call("PUT", "/v1/credentials/apns", key: tenant.app, json: wrong)
        expectProblem(badAPNs, 422, "invalid-key", field: "private_key")
        record("PUT apns (rejected)", badAPNs)
        let badFCM = try await api.call(
            "PUT", "/v1/credentials/fcm", key: tenant.app,
            json: ["service_account": RegistryTests.serviceAccount(pem: rejectedForFCM)])
        expectProblem(badFCM, 422, "invalid-key", field: "service_account.private_key")
        record("PUT fcm (rejected)", badFCM)

        let person = Fake.id("p")
        _ = try await api.call(
            "PUT", "/v1/people/\(person)/devices/\(Fake.hex())", key: tenant.sdk, json: ["platform": "ios"])
        _ = try await api.call(
            "PUT", "/v1/activity_types/\(Fake.activityType())", key: tenant.app, json: ["attributes_type": "A"])
        for path in ["/v1/credentials/apns", "/v1/credentials/fcm", "/v1/people/\(person)", "/v1/activity_types"] {
            let response = try await api.call("GET", path, key: tenant.app)
            #expect(response.status == 200, "\(path): \(response.text)")
            record("GET \(path)", response)
        }
        for path in ["/admin/v1/tenants", "/admin/v1/tenants/\(tenant.id)", "/admin/v1/tenants/\(tenant.id)/keys"] {
            record("GET \(path)", try await api.call("GET", path, key: MarqueeProcess.adminToken))
        }
        record("GET /metrics", try await api.call("GET", "/metrics"))

        for (label, response) in responses {
            let found = Self.leak(secrets, in: response.text)
            #expect(found == nil, "\(label) shows key material: \(found ?? "")")
        }
        // Credentials were really stored (so the scans below look at real rows).
        #expect(
            try await api.call("GET", "/v1/credentials/apns", key: tenant.app).json().string("team_id") == "ABCDE12345")

        let log = fixture.serve.log
        #expect(!log.isEmpty)
        let inLog = Self.leak(secrets, in: log)
        #expect(inLog == nil, "the server log shows key material: \(inLog ?? "")")

        // Every row of this tenant, and every row of the tables that belong to no tenant. (Not the other tenants'
        // rows: the shared fixture holds hundreds of thousands of them, from the import tests, and scanning them all
        // starved this test process for minutes.)
        let tables = try await fixture.pool.query(
            """
            SELECT t.tablename::text AS name,
                   EXISTS (SELECT 1 FROM information_schema.columns c
                           WHERE c.table_schema = 'public' AND c.table_name = t.tablename
                             AND c.column_name = 'tenant_id') AS tenanted
            FROM pg_tables t WHERE t.schemaname = 'public' ORDER BY 1
            """
        ).map { (try $0.decode(String.self, "name"), try $0.decode(Bool.self, "tenanted")) }
        #expect(tables.contains { $0.0 == "apns_credentials" } && tables.contains { $0.0 == "fcm_credentials" })
        var scanned = 0
        for (table, tenanted) in tables {
            let rows: PostgresRows
            do {
                rows = try await fixture.pool.query(
                    tenanted
                        ? "SELECT t::text AS row FROM \(identifier: table) t WHERE t.tenant_id = \(tenant.uuid)"
                        : table == "tenants"
                            ? "SELECT t::text AS row FROM tenants t WHERE t.id = \(tenant.uuid)"
                            : "SELECT t::text AS row FROM \(identifier: table) t")
            } catch let error as PostgresError where error.code == .undefinedTable {
                continue  // dropped since it was listed: a day partition retention dropped (other tests run passes)
            }
            for row in rows {
                let text = try row.decode(String.self, "row")
                scanned += 1
                let found = Self.leak(secrets, in: text)
                #expect(found == nil, "\(table) holds key material in clear: \(found ?? "")")
            }
        }
        #expect(scanned > 0)
        let sealed = try await fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM apns_credentials a JOIN fcm_credentials f USING (tenant_id)
            WHERE tenant_id = \(tenant.uuid) AND length(a.sealed_private_key) > 100 AND length(f.sealed_service_account) > 100
            """)
        #expect(sealed == 1, "both keys are stored, sealed")
    }
}

/// An APNs key is named after its public key (its provider-token cache and connections): a PEM must not carry another
/// key's public key beside its own private key.
@Suite("APNs key ownership")
struct APNsKeyOwnershipTests {
    /// `donor`'s PKCS#8 PEM with its public point replaced by `owner`'s: `donor`'s private key filed under `owner`'s
    /// public key. OpenSSL writes a P-256 PKCS#8 key with its uncompressed point (65 bytes) last.
    static func mismatched(privateOf donor: ES256PrivateKey, publicOf owner: ES256PrivateKey) throws -> String {
        func der(_ pem: String) throws -> [UInt8] {
            let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
            return Array(try #require(Data(base64Encoded: body)))
        }
        let donorDER = try der(donor.pkcs8PEM)
        let ownerPoint = try der(owner.pkcs8PEM).suffix(65)
        try #require(ownerPoint.first == 0x04 && donorDER.suffix(65).first == 0x04)
        try #require(try der(owner.publicKey.pem).suffix(65) == ownerPoint, "the point is the owner's public key")
        let spliced = Data(donorDER.dropLast(65) + ownerPoint).base64EncodedString(options: .lineLength64Characters)
        return "-----BEGIN PRIVATE KEY-----\n\(spliced)\n-----END PRIVATE KEY-----\n"
    }

    @Test(
        "another tenant's public key with one's own private key, team and key ID: 422 invalid-key, and no token cache")
    func foreignPublicKeyRefused() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (victim, attacker) = (try await api.createTenant(), try await api.createTenant())
        let victimKey = ES256PrivateKey.generate()
        var apns: [String: Any] = [
            "team_id": "VICTIM1234", "key_id": "VKEY123456", "private_key": victimKey.pkcs8PEM,
            "bundle_id": "com.example.app", "environment": "sandbox",
        ]
        let own = try await api.call("PUT", "/v1/credentials/apns", key: victim.app, json: apns)
        #expect(own.status == 200, "\(own.text)")

        let forged = try Self.mismatched(privateOf: ES256PrivateKey.generate(), publicOf: victimKey)
        apns["private_key"] = forged
        let refused = try await api.call("PUT", "/v1/credentials/apns", key: attacker.app, json: apns)
        expectProblem(refused, 422, "invalid-key", field: "private_key")
        #expect(refused.text.contains("does not belong to its private key"), "\(refused.text)")
        #expect(
            try await api.call("GET", "/v1/credentials/apns", key: attacker.app).status == 404, "nothing was stored")

        // The worker's registry of provider-token caches refuses it too: it is never handed the victim's cache.
        let caches = ProviderTokenCaches()
        let victimCache = try caches.cache(
            teamID: "VICTIM1234", keyID: "VKEY123456", pem: Array(victimKey.pkcs8PEM.utf8))
        #expect(throws: CryptoError.self) {
            let handed = try caches.cache(teamID: "VICTIM1234", keyID: "VKEY123456", pem: Array(forged.utf8))
            #expect(handed !== victimCache, "handed the victim's cache, which signs with the victim's key")
        }
    }
}
