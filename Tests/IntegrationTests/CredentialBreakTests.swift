import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import Testing

@testable import MarqueeStore

/// A rejection marks broken only the credential that was rejected: a tenant that replaced a revoked key must not have
/// its replacement broken by a send still in flight with the old one, or by a worker whose cache still holds it.
extension DeliveryTests {
    @Test("a 403 for a replaced credential does not break its replacement; one for the stored credential does")
    func staleRejectionKeepsReplacement() async throws {
        let t = try await Self.tenant()
        let queue = DeliveryQueue(pool: t.fixture.pool)
        // What a worker loaded, and signed its request with.
        let loaded = try #require(try await queue.apnsCredential(tenant: t.tenant.uuid)).0.updatedAt
        // The tenant replaces it meanwhile.
        let replacement: [String: Any] = [
            "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
            "bundle_id": "com.example.app", "environment": "sandbox",
            "endpoint": "https://127.0.0.1:\(t.fixture.simulator.port)",
        ]
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: replacement).status == 200)
        func status() async throws -> String? {
            try await t.api.call("GET", "/v1/credentials/apns", key: t.tenant.app).json().string("status")
        }
        // The old key's rejection arrives: the replacement stays usable.
        let stale = try await queue.markCredentialBroken(
            tenant: t.tenant.uuid, provider: .apns, reason: "InvalidProviderToken", updatedAt: loaded)
        #expect(stale == .unchanged)
        #expect(try await status() == "ok")
        // A rejection of the stored credential, as loaded now, breaks it.
        let current = try #require(try await queue.apnsCredential(tenant: t.tenant.uuid)).0.updatedAt
        #expect(current != loaded)
        let marked = try await queue.markCredentialBroken(
            tenant: t.tenant.uuid, provider: .apns, reason: "InvalidProviderToken", updatedAt: current)
        #expect(marked == .marked)
        #expect(try await status() == "broken")
    }
}
