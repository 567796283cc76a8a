import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Testing

/// Tokens APNs refused because of the tenant's credential (BadDeviceToken: the wrong environment; DeviceTokenNotForTopic:
/// the wrong app) come back when the credential's environment, bundle ID or endpoint is corrected (migration 0077).
extension DeliveryTests {
    @Test("tokens retired for the credential's environment or app are active again once it is corrected")
    func tokensBackWhenCredentialCorrected() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let (wrongEnvironment, _) = try await t.iphone()
        let (wrongApp, _) = try await t.iphone()
        let (gone, _) = try await t.iphone()
        // As the worker's settle retires them: two for reasons the credential causes, one the device's own.
        for (device, reason) in [
            (wrongEnvironment, "BadDeviceToken"), (wrongApp, "DeviceTokenNotForTopic"), (gone, "Unregistered"),
        ] {
            try await pool.execute(
                """
                UPDATE push_to_start_tokens SET status = 'retired', retired_reason = \(reason), retired_at = now()
                WHERE tenant_id = \(tenant) AND device_token = \(device)
                """)
        }
        func status(_ device: String) async throws -> String {
            try await pool.query(
                "SELECT status FROM push_to_start_tokens WHERE tenant_id = \(tenant) AND device_token = \(device)"
            )[0].decode(String.self, "status")
        }
        var credential: [String: Any] = [
            "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
            "bundle_id": "com.example.app", "environment": "sandbox",
            "endpoint": "https://127.0.0.1:\(t.fixture.simulator.port)",
        ]
        // The same configuration uploaded again (a key rotation): nothing comes back.
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: credential).status == 200)
        #expect(try await status(wrongEnvironment) == "retired")
        // The environment corrected: the tokens the credential caused to be retired are active again.
        credential["environment"] = "production"
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: credential).status == 200)
        #expect(try await status(wrongEnvironment) == "active")
        #expect(try await status(wrongApp) == "active")
        #expect(try await status(gone) == "retired", "a token the device gave up stays retired")
    }

    @Test("a credential deleted and uploaded again corrected gives the tokens back too; the same one again does not")
    func tokensBackWhenCredentialDeletedAndCorrected() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let (wrongEnvironment, _) = try await t.iphone()
        func retire() async throws {
            try await pool.execute(
                """
                UPDATE push_to_start_tokens
                SET status = 'retired', retired_reason = 'BadDeviceToken', retired_at = now()
                WHERE tenant_id = \(tenant) AND device_token = \(wrongEnvironment)
                """)
        }
        func status() async throws -> String {
            try await pool.query(
                """
                SELECT status FROM push_to_start_tokens
                WHERE tenant_id = \(tenant) AND device_token = \(wrongEnvironment)
                """
            )[0].decode(String.self, "status")
        }
        var credential = Self.goodAPNsCredential(t)
        try await retire()
        // Deleted and uploaded again as it was (a key rotation the tenant did in two steps): nothing comes back.
        #expect(try await t.api.call("DELETE", "/v1/credentials/apns", key: t.tenant.app).status == 204)
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: credential).status == 200)
        #expect(try await status() == "retired")
        // Deleted and uploaded with the environment corrected: the token is active again.
        #expect(try await t.api.call("DELETE", "/v1/credentials/apns", key: t.tenant.app).status == 204)
        credential["environment"] = "production"
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: credential).status == 200)
        #expect(try await status() == "active")
        #expect(
            try await pool.count(
                "SELECT count(*)::int AS n FROM apns_credentials_removed WHERE tenant_id = \(tenant)") == 0,
            "the deleted configuration is forgotten once another is uploaded")
    }
}
