import Crypto
import Foundation
import MarqueeStore
import PostgresClient
import Testing

@Suite("Master key rotation")
struct ResealTests {
    static func key() -> String { Data(SecureRandom.bytes(32)).base64EncodedString() }

    @Test("after `marquee reseal` every secret opens with the new key alone, and a second run has nothing to do")
    func rotate() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let base = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        #expect(try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: base).status == 0)
        let oldKey = Self.key()
        let newKey = Self.key()
        var old = base
        old["MARQUEE_MASTER_KEY"] = oldKey
        let created = try await runCommand(
            TestEnvironment.marqueeBinary, ["tenant", "create", "--name", "rotating", "--json"], environment: old)
        try #require(created.status == 0, "\(created.output)")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(created.output.utf8)) as? [String: Any])
        let idText = try #require(json["id"] as? String)
        let tenant = try #require(UUID(uuidString: idText))

        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
        defer { pool.close() }
        let database = TenantDatabase(pool: pool)
        let oldRing = try SealingKeyRing.fromBase64(oldKey, id: "k1")
        let newRing = try SealingKeyRing.fromBase64(newKey, id: "k2")
        let pem = ES256PrivateKey.generate().pkcs8PEM
        _ = try await CredentialStore(database: database, keyRing: oldRing).putAPNs(
            tenant: tenant,
            APNsCredentialInput(
                teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: pem, bundleID: "com.example.app",
                environment: "sandbox", endpoint: nil))
        // An FCM service account that FCM has accepted a push with (migration 0095's proof).
        let account = Array(#"{"type":"service_account","project_id":"p","private_key":"k"}"#.utf8)
        let fcm = try await CredentialStore(database: database, keyRing: oldRing).putFCM(
            tenant: tenant,
            FCMCredentialInput(
                serviceAccountJSON: account, projectID: "p", clientEmail: "a@p.iam.gserviceaccount.com",
                privateKeyID: nil, tokenURI: "https://oauth2.googleapis.com/token", endpoint: nil))
        try await DeliveryQueue(pool: pool).markFCMCredentialProven(tenant: tenant, credentialUpdatedAt: fcm.updatedAt)
        let secretBefore = try await TenantStore(database: database, keyRing: oldRing).deliverySecret(tenant: tenant)
        // An identity secret rotated once: both the current and the previous one are sealed.
        let oldSettings = TenantSettingsStore(database: database, keyRing: oldRing)
        let firstIdentity = try await oldSettings.rotateIdentitySecret(tenant: tenant).secret
        let secondIdentity = try await oldSettings.rotateIdentitySecret(tenant: tenant).secret
        // Required, so that `identityKeys` opens both below (it opens none while verification is off).
        _ = try await oldSettings.update(tenant: tenant, .init(identityVerification: .required))
        await #expect(throws: (any Error).self) {
            _ = try await CredentialStore(database: database, keyRing: newRing).apnsPrivateKey(tenant: tenant)
        }

        var rotated = base
        rotated["MARQUEE_MASTER_KEY"] = newKey
        rotated["MARQUEE_MASTER_KEY_ID"] = "k2"
        rotated["MARQUEE_MASTER_KEYS_PREVIOUS"] = "k1:" + oldKey
        let before = try await runCommand(TestEnvironment.marqueeBinary, ["reseal", "--check"], environment: rotated)
        #expect(before.status != 0 && before.output.contains("5 secret(s) are not under key k2"), "\(before.output)")
        let reseal = try await runCommand(TestEnvironment.marqueeBinary, ["reseal"], environment: rotated)
        #expect(reseal.status == 0, "\(reseal.output)")
        #expect(reseal.output.contains("re-sealed 5 secret(s) under key k2"), "\(reseal.output)")
        #expect(!reseal.output.contains(newKey) && !reseal.output.contains(oldKey), "keys are never printed")

        #expect(try await CredentialStore(database: database, keyRing: newRing).apnsPrivateKey(tenant: tenant) == pem)
        #expect(
            try await TenantStore(database: database, keyRing: newRing).deliverySecret(tenant: tenant) == secretBefore)
        let identity = try await TenantSettingsStore(database: database, keyRing: newRing).identityKeys(tenant: tenant)
        #expect(identity.current == secondIdentity && identity.previous == firstIdentity)
        // The same account sealed again keeps its proof (a foreign token still blames the token, not the account).
        let proven = try await DeliveryQueue(pool: pool).fcmCredential(tenant: tenant)
        #expect(proven?.proven == true)
        #expect(proven?.0.updatedAt != fcm.updatedAt, "the row was written again")
        await #expect(throws: (any Error).self) {
            _ = try await CredentialStore(database: database, keyRing: oldRing).apnsPrivateKey(tenant: tenant)
        }
        let checked = try await runCommand(TestEnvironment.marqueeBinary, ["reseal", "--check"], environment: rotated)
        #expect(checked.status == 0 && checked.output.contains("every secret is under key k2"), "\(checked.output)")
        let again = try await runCommand(TestEnvironment.marqueeBinary, ["reseal"], environment: rotated)
        #expect(again.output.contains("re-sealed 0 secret(s)"), "\(again.output)")
    }
}

extension ResealTests {
    @Test(
        "a new master key under the old key ID opens nothing: reseal and reseal --check fail, naming how many of what")
    func wrongKeyUnderSameID() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let base = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        #expect(try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: base).status == 0)
        let (oldKey, newKey) = (Self.key(), Self.key())
        var old = base
        old["MARQUEE_MASTER_KEY"] = oldKey
        let created = try await runCommand(
            TestEnvironment.marqueeBinary, ["tenant", "create", "--name", "mistyped", "--json"], environment: old)
        try #require(created.status == 0, "\(created.output)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(created.output.utf8)) as? [String: Any])
        let idText = try #require(json["id"] as? String)
        let tenant = try #require(UUID(uuidString: idText))
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
        defer { pool.close() }
        let database = TenantDatabase(pool: pool)
        let oldRing = try SealingKeyRing.fromBase64(oldKey)
        let pem = ES256PrivateKey.generate().pkcs8PEM
        _ = try await CredentialStore(database: database, keyRing: oldRing).putAPNs(
            tenant: tenant,
            APNsCredentialInput(
                teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: pem, bundleID: "com.example.app",
                environment: "sandbox", endpoint: nil))
        _ = try await TenantSettingsStore(database: database, keyRing: oldRing).rotateIdentitySecret(tenant: tenant)

        // The operator sets a new MARQUEE_MASTER_KEY (or mistypes it) and keeps the default key ID, k1: every blob
        // names k1, and none opens.
        var wrong = base
        wrong["MARQUEE_MASTER_KEY"] = newKey
        for arguments in [["reseal", "--check"], ["reseal"]] {
            let run = try await runCommand(TestEnvironment.marqueeBinary, arguments, environment: wrong)
            #expect(run.status != 0, "\(arguments): \(run.output)")
            #expect(!run.output.contains("every secret is under key"), "\(arguments): \(run.output)")
            #expect(
                run.output.contains("3 secret(s) cannot be opened with any key of the ring")
                    && run.output.contains("1 delivery secret(s)") && run.output.contains("1 APNs key(s)")
                    && run.output.contains("1 identity secret(s)") && run.output.contains("under key ID(s) k1"),
                "\(arguments): \(run.output)")
            #expect(!run.output.contains(newKey) && !run.output.contains(oldKey), "keys are never printed")
        }
        // Nothing was written: the old key still opens everything.
        #expect(try await CredentialStore(database: database, keyRing: oldRing).apnsPrivateKey(tenant: tenant) == pem)
        _ = try await TenantStore(database: database, keyRing: oldRing).deliverySecret(tenant: tenant)
        let checked = try await runCommand(TestEnvironment.marqueeBinary, ["reseal", "--check"], environment: old)
        #expect(checked.status == 0 && checked.output.contains("every secret is under key k1"), "\(checked.output)")
    }
}

@Suite("Key rotation from the command line")
struct KeyRotateCommandTests {
    @Test("marquee key rotate refuses a grace it does not understand instead of revoking the key at once")
    func graceParsedStrictly() async throws {
        let env = ["DATABASE_URL": TestEnvironment.databaseURL, "MARQUEE_MASTER_KEY": ResealTests.key()]
        let (tenant, key) = (UUID().uuidString, UUID().uuidString)
        for grace in ["1h", "3600s", "-60", "2592001", ""] {
            let run = try await runCommand(
                TestEnvironment.marqueeBinary,
                ["key", "rotate", "--tenant", tenant, "--key", key, "--grace-seconds", grace], environment: env)
            #expect(run.status != 0, "\(grace): \(run.output)")
            #expect(run.output.contains("--grace-seconds must be whole seconds from 0 to 2592000"), "\(run.output)")
        }
    }
}

@Suite("Housekeeping")
struct HousekeepingTests {
    @Test("idempotency records older than 24 hours are removed, newer ones kept")
    func expireIdempotencyKeys() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let base = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        #expect(try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: base).status == 0)
        var env = base
        env["MARQUEE_MASTER_KEY"] = ResealTests.key()
        let created = try await runCommand(
            TestEnvironment.marqueeBinary, ["tenant", "create", "--name", "housekeeping", "--json"], environment: env)
        let json = try #require(try JSONSerialization.jsonObject(with: Data(created.output.utf8)) as? [String: Any])
        let idText = try #require(json["id"] as? String)
        let tenant = try #require(UUID(uuidString: idText))
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        try await pool.execute(
            """
            INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at) VALUES
              (\(tenant), 'old', '\\x00', 200, '{}', now() - interval '25 hours'),
              (\(tenant), 'new', '\\x00', 200, '{}', now() - interval '23 hours')
            """)
        #expect(try await DeliveryQueue(pool: pool).expireIdempotencyKeys() == 1)
        let left = try await pool.query("SELECT key FROM idempotency_keys WHERE tenant_id = \(tenant)")
        #expect(try left.map { try $0.decode(String.self, "key") } == ["new"])
        // A backlog larger than a slice goes in one pass, slice after slice (a budget no loaded machine runs out of:
        // the slices are under test here, not the time).
        try await pool.execute(
            """
            INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at)
            SELECT \(tenant), 'old-' || i, '\\x00', 200, '{}', now() - interval '25 hours'
            FROM generate_series(1, 2500) i
            """)
        #expect(try await DeliveryQueue(pool: pool).expireIdempotencyKeys(limit: 1000, budget: .seconds(600)) == 2500)
        let kept = try await pool.query("SELECT count(*)::int AS n FROM idempotency_keys WHERE tenant_id = \(tenant)")
        #expect(try kept[0].decode(Int.self, "n") == 1)
    }
}
