import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

@testable import MarqueeAPI

@Suite("API key cache")
struct KeyCacheTests {
    static func request(_ key: String) -> HTTPRequest {
        HTTPRequest(method: .GET, target: "/v1/people", headers: ["Authorization": "Bearer " + key])
    }

    static func status(_ authenticator: Authenticator, _ key: String) async -> Int {
        do {
            _ = try await authenticator.require(request(key), kinds: [.sdk])
            return 200
        } catch let problem as HTTPProblem {
            return problem.status
        } catch {
            return 0  // the lookup failed: the database was needed
        }
    }

    @Test("a key found invalid is remembered for the cache's time: repeating it costs no lookup")
    func invalidKeysRemembered() async throws {
        let running = try await RegistryFixture.get()
        let tenant = try await running.api.createTenant()
        let pool = PostgresPool(try PostgresConfiguration(url: running.databaseURL), options: .init(maxConnections: 2))
        let authenticator = Authenticator(
            tenants: TenantStore(
                database: TenantDatabase(pool: pool), keyRing: try SealingKeyRing.fromBase64(MarqueeProcess.masterKey)),
            adminToken: nil, cacheTTL: .seconds(600))
        // Well formed, of the tenant, with a made-up secret (a revoked key answers the same).
        let forged = String(tenant.sdk.dropLast(8)) + "AAAAAAAA"
        let otherForged = String(tenant.sdk.dropLast(8)) + "BBBBBBBB"
        #expect(forged != tenant.sdk)
        #expect(await Self.status(authenticator, tenant.sdk) == 200)
        #expect(await Self.status(authenticator, forged) == 401)
        // Without the database: what was checked is answered from memory; anything else needs the lookup.
        pool.close()
        #expect(await Self.status(authenticator, tenant.sdk) == 200)
        #expect(await Self.status(authenticator, forged) == 401)
        #expect(await Self.status(authenticator, otherForged) == 0)
    }
}
