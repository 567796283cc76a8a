import Crypto
import Foundation
import Testing

@testable import MarqueeDelivery

/// A broadcast channel lives in the APNs environment it was created in, whatever the credential says later.
@Suite("APNs environments")
struct APNsEnvironmentTests {
    static func credential(_ environment: String, endpoint: String? = nil) throws -> CredentialCache.APNs {
        let key = ES256PrivateKey.generate()
        let tokens = try ProviderTokenCaches().cache(
            teamID: "TEAM123456", keyID: "KEY1234567", pem: Array(key.pkcs8PEM.utf8))
        return CredentialCache.APNs(
            target: CredentialCache.APNs.target(environment: environment, endpoint: endpoint, tokens: tokens),
            bundleID: "com.example.app", environment: environment, endpoint: endpoint, updatedAt: Date(),
            loadedAt: Date())
    }

    @Test("a push for another environment goes to that environment's host, with the same key")
    func otherEnvironment() throws {
        let production = try Self.credential("production")
        #expect(production.target(environment: nil).host == "api.push.apple.com")
        #expect(production.target(environment: "production").host == "api.push.apple.com")
        let sandbox = production.target(environment: "sandbox")
        #expect(sandbox.host == "api.sandbox.push.apple.com" && sandbox.port == 443)
        #expect(sandbox.tokens === production.target.tokens)
        #expect(try Self.credential("sandbox").target(environment: "production").host == "api.push.apple.com")
        // An operator's override (a simulator) serves both.
        let simulated = try Self.credential("production", endpoint: "https://127.0.0.1:8443")
        #expect(simulated.target(environment: "sandbox").host == "127.0.0.1")
        #expect(simulated.target(environment: "sandbox").port == 8443)
    }
}
