import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient
import Testing

@testable import MarqueeAPI

@Suite("API key cache")
struct KeyCacheTests {
    static func request(_ key: String, from address: String? = nil) -> HTTPRequest {
        HTTPRequest(
            method: .GET, target: "/v1/people", headers: ["Authorization": "Bearer " + key], remoteAddress: address)
    }

    static func status(_ authenticator: Authenticator, _ key: String, from address: String? = nil) async -> Int {
        do {
            _ = try await authenticator.require(request(key, from: address), kinds: [.sdk])
            return 200
        } catch let problem as HTTPProblem {
            return problem.status
        } catch {
            return 0  // the lookup failed: the database was needed
        }
    }

    /// A well-formed key of `tenant`'s, with a made-up secret.
    static func forged(_ key: String) -> String {
        String(key.dropLast(43)) + Base64URL.encode(SecureRandom.bytes(32))
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

    @Test("a request after this process forgot a tenant's keys (a revocation) joins no lookup begun before: its own")
    func noJoiningAnOlderLookup() async throws {
        let running = try await RegistryFixture.get()
        let tenant = try await running.api.createTenant()
        let pool = PostgresPool(try PostgresConfiguration(url: running.databaseURL), options: .init(maxConnections: 4))
        defer { pool.close() }
        let authenticator = Authenticator(
            tenants: TenantStore(
                database: TenantDatabase(pool: pool), keyRing: try SealingKeyRing.fromBase64(MarqueeProcess.masterKey)),
            adminToken: nil, cacheTTL: .seconds(600))
        // The key's lookup touches last_used_at when unset: a transaction holding the key's row makes it wait.
        try await running.pool.execute(
            "UPDATE api_keys SET last_used_at = NULL WHERE tenant_id = \(tenant.uuid) AND kind = 'sdk'")
        let held = try await HeldTransaction.open(running.databaseURL) { c in
            _ = try c.query("SELECT 1 FROM api_keys WHERE tenant_id = \(tenant.uuid) AND kind = 'sdk' FOR UPDATE")
        }
        let first = Task { await Self.status(authenticator, tenant.sdk) }
        try await held.waitedOn(via: running.pool, "the first lookup waits for the key's row")
        // This process revokes (forgets) the tenant's keys while that lookup is under way; the next request must not
        // be answered by it.
        authenticator.forgetKeys(of: tenant.uuid)
        let second = Task { await Self.status(authenticator, tenant.sdk) }
        let own =
            (try? await held.waitedOn(by: 2, via: running.pool, "the second request looks the key up itself")) != nil
        try await held.commit()
        #expect(own, "the second request joined the lookup begun before the revocation")
        let (one, two) = (await first.value, await second.value)
        #expect(one == 200 && two == 200)
    }

    @Test("a flood of made-up keys from one address gets 429 after its lookups, without asking the database again")
    func lookupsPerAddress() async throws {
        let running = try await RegistryFixture.get()
        let tenant = try await running.api.createTenant()
        let pool = PostgresPool(try PostgresConfiguration(url: running.databaseURL), options: .init(maxConnections: 2))
        let instant = ContinuousClock.now
        let metrics = MetricsRegistry()
        let authenticator = Authenticator(
            tenants: TenantStore(
                database: TenantDatabase(pool: pool), keyRing: try SealingKeyRing.fromBase64(MarqueeProcess.masterKey)),
            adminToken: nil, cacheTTL: .seconds(600),
            rateGuard: RequestRateGuard(
                limits: RequestLimits(
                    appPerSecond: 0, sdkPerSecond: 0, burstSeconds: 1, keyLookupsPerAddressPerSecond: 5),
                metrics: metrics, logger: Logger(label: "test", level: .critical), now: { instant }))
        let flooder = "203.0.113.7"
        // A valid key's lookup gives its token back: the address still has its burst of 10 after it.
        #expect(await Self.status(authenticator, tenant.sdk, from: flooder) == 200)
        for _ in 0..<10 { #expect(await Self.status(authenticator, Self.forged(tenant.sdk), from: flooder) == 401) }
        // The clock stands still: the rest of the flood is refused before the database, which is gone now (a
        // lookup would fail, 0).
        pool.close()
        var answers: [Int: Int] = [:]
        for _ in 0..<40 {
            answers[await Self.status(authenticator, Self.forged(tenant.sdk), from: flooder), default: 0] += 1
        }
        #expect(answers == [429: 40])
        #expect(metrics.exposition().contains("marquee_http_key_lookups_limited_total 40"))
        var refused: HTTPProblem?
        do {
            _ = try await authenticator.require(Self.request(Self.forged(tenant.sdk), from: flooder), kinds: [.sdk])
        } catch let problem as HTTPProblem { refused = problem }
        #expect(refused?.type == "https://marquee.dev/problems/rate-limited")
        #expect(refused?.extensions["scope"] == "key_lookup")
        #expect(refused?.headers["Retry-After"] == "1")
        // Keys checked before are still answered from the cache; another address has lookups of its own.
        #expect(await Self.status(authenticator, tenant.sdk, from: flooder) == 200)
        #expect(await Self.status(authenticator, Self.forged(tenant.sdk), from: "198.51.100.4") == 0)
    }
}
