import Crypto
import Foundation
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeDelivery

/// A clock the test moves.
final class ManualClock: Sendable {
    let now = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
    func advance(_ seconds: TimeInterval) { now.withLock { $0 = $0.addingTimeInterval(seconds) } }
    var read: @Sendable () -> Date { { self.now.withLock { $0 } } }
}

@Suite("APNs provider token")
struct ProviderTokenTests {
    @Test("an ES256 JWT with kid, iss and iat that our verifier accepts")
    func shape() throws {
        let key = ES256PrivateKey.generate()
        let clock = ManualClock()
        let cache = ProviderTokenCache(teamID: "TEAM123456", keyID: "KEY1234567", key: key, now: clock.read)
        let token = try cache.token()
        let (header, claims) = try JWT.verify(token, verifier: key.publicKey)
        #expect(header["alg"] == .string("ES256"))
        #expect(header["kid"] == .string("KEY1234567"))
        #expect(claims["iss"] == .string("TEAM123456"))
        #expect(claims["iat"] == .int(1_800_000_000))
    }

    @Test("one cache per key in a process: tenants with the same team, key ID and key share its token")
    func sharedPerKey() throws {
        let caches = ProviderTokenCaches()
        let key = Array(ES256PrivateKey.generate().pkcs8PEM.utf8)
        let other = Array(ES256PrivateKey.generate().pkcs8PEM.utf8)
        let first = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: key)
        let again = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: key)
        #expect(first === again)
        #expect(try first.token() == again.token())
        // Another key under the same names, or the same key under another key ID: caches of their own.
        #expect(try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: other) !== first)
        #expect(try caches.cache(teamID: "TEAM1", keyID: "KEY2", pem: key) !== first)
        #expect(throws: (any Error).self) {
            _ = try caches.cache(teamID: "T", keyID: "K", pem: Array("not a key".utf8))
        }
    }

    @Test("one key in two PEM encodings (LF and CRLF) is one cache and one connection identity")
    func encodings() throws {
        let caches = ProviderTokenCaches()
        let key = ES256PrivateKey.generate()
        let lf = key.pkcs8PEM
        let crlf = lf.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\r\n")
        #expect(crlf != lf)
        let first = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: Array(lf.utf8))
        let second = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: Array(crlf.utf8))
        #expect(first === second)
        #expect(first.connectionIdentity == second.connectionIdentity)
        #expect(try first.token() == second.token())
        // A cache made directly from the key (as tests and channel managers do) names the same connections.
        #expect(
            ProviderTokenCache(teamID: "TEAM1", keyID: "KEY1", key: key).connectionIdentity == first.connectionIdentity)
    }

    @Test("two keys under one team and key ID never share connections, even through ProviderConnections")
    func otherKeySameNames() async throws {
        let caches = ProviderTokenCaches()
        let right = try caches.cache(
            teamID: "TEAM1", keyID: "KEY1", pem: Array(ES256PrivateKey.generate().pkcs8PEM.utf8))
        let wrong = try caches.cache(
            teamID: "TEAM1", keyID: "KEY1", pem: Array(ES256PrivateKey.generate().pkcs8PEM.utf8))
        #expect(right !== wrong)
        #expect(right.connectionIdentity != wrong.connectionIdentity)
        #expect(right.connectionIdentity.hasPrefix("TEAM1/KEY1/"))
        let pools = ProviderConnections(.init(allowedHosts: ProviderHosts("a.test")!))
        let (_, k1) = try await pools.lease(host: "a.test", port: 443, identity: right.connectionIdentity)
        let (_, k2) = try await pools.lease(host: "a.test", port: 443, identity: wrong.connectionIdentity)
        #expect(k1 != k2)
        #expect(pools.pools.count == 2)
        pools.release(k1)
        pools.release(k2)
        await pools.shutdown()
    }

    @Test("past maxKeys a key still held elsewhere keeps its one cache; caches nobody holds are let go")
    func eviction() throws {
        let caches = ProviderTokenCaches(maxKeys: 4)
        let pem = Array(ES256PrivateKey.generate().pkcs8PEM.utf8)
        let held = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: pem)
        let token = try held.token()
        for i in 0..<20 {
            _ = try caches.cache(
                teamID: "TEAM2", keyID: "KEY\(i)", pem: Array(ES256PrivateKey.generate().pkcs8PEM.utf8))
        }
        // A worker still sending with `held` and a credential read again must agree on one token: a second cache
        // would sign a second token for the same connections.
        let again = try caches.cache(teamID: "TEAM1", keyID: "KEY1", pem: pem)
        #expect(again === held)
        #expect(try again.token() == token)
        #expect(caches.liveCount <= 5)
    }

    @Test("reused until 40 minutes old, then refreshed")
    func caching() throws {
        let clock = ManualClock()
        let cache = ProviderTokenCache(teamID: "T", keyID: "K", key: ES256PrivateKey.generate(), now: clock.read)
        let first = try cache.token()
        clock.advance(39 * 60)
        #expect(try cache.token() == first)
        clock.advance(2 * 60)
        let second = try cache.token()
        #expect(second != first)
        #expect(cache.issuedAt == Date(timeIntervalSince1970: 1_800_000_000 + 41 * 60))
    }

    @Test("a rejected token is replaced once, even when many senders report it")
    func refreshOnce() async throws {
        let clock = ManualClock()
        let cache = ProviderTokenCache(teamID: "T", keyID: "K", key: ES256PrivateKey.generate(), now: clock.read)
        // Many rounds: signing takes tens of microseconds, so a check-then-sign race shows within a few rounds.
        for _ in 0..<20 {
            let rejected = try cache.token()
            clock.advance(20 * 60)
            let replacements = try await Self.concurrently(50) { try cache.refresh(rejected: rejected) ?? "none" }
            #expect(replacements.count == 1)
            #expect(!replacements.contains(rejected))
            #expect(try cache.token() == replacements.first)
        }
    }

    @Test("senders that find no token, or a due one, at the same moment agree on one new token")
    func issueOnce() async throws {
        let clock = ManualClock()
        for _ in 0..<20 {
            let cache = ProviderTokenCache(teamID: "T", keyID: "K", key: ES256PrivateKey.generate(), now: clock.read)
            #expect(try await Self.concurrently(50) { try cache.token() }.count == 1)
            let first = try cache.token()
            clock.advance(41 * 60)
            let renewed = try await Self.concurrently(50) { try cache.token() }
            #expect(renewed.count == 1)
            #expect(!renewed.contains(first))
        }
    }

    @Test(
        "a token younger than 20 minutes that Apple calls expired is kept (no churn); older, or dated ahead, replaced")
    func refreshMinimumAge() throws {
        let clock = ManualClock()
        let cache = ProviderTokenCache(teamID: "T", keyID: "K", key: ES256PrivateKey.generate(), now: clock.read)
        let young = try cache.token()
        clock.advance(19 * 60)
        // Signed with this clock 19 minutes ago: only a clock Apple disagrees with makes it expired, and a new token
        // would be refused too while counting as a token update on the key's connections.
        #expect(try cache.refresh(rejected: young) == nil)
        #expect(try cache.token() == young)
        clock.advance(60)
        let replaced = try #require(try cache.refresh(rejected: young))
        #expect(replaced != young)
        #expect(try cache.token() == replaced)
        // A report about a token already replaced gets the replacement, whatever its age.
        #expect(try cache.refresh(rejected: young) == replaced)
        // Dated ahead of the clock (stepped back an hour since): replaced at once.
        clock.advance(-3600)
        let ahead = try #require(try cache.refresh(rejected: replaced))
        #expect(ahead != replaced)
    }

    @Test("a sender that finds the token due while another replaces it keeps the other's token: one rotation")
    func boundaryOnce() throws {
        // The second sender's token() runs inside the first's clock read: after the first found the token due and
        // before it signs. That is where two senders at the 40-minute boundary meet on two threads, made certain.
        final class Interleave: Sendable {
            let cache = Mutex<ProviderTokenCache?>(nil)
            let armed = Mutex(false)
            let second = Mutex<String?>(nil)
        }
        let interleave = Interleave()
        let clock = ManualClock()
        let cache = ProviderTokenCache(
            teamID: "T", keyID: "K", key: ES256PrivateKey.generate(),
            now: {
                if interleave.armed.withLock({ armed in
                    defer { armed = false }
                    return armed
                }) {
                    let other = try? interleave.cache.withLock { $0 }?.token()
                    interleave.second.withLock { $0 = other }
                }
                return clock.read()
            })
        interleave.cache.withLock { $0 = cache }
        let old = try cache.token()
        clock.advance(41 * 60)
        interleave.armed.withLock { $0 = true }
        let first = try cache.token()
        let second = try #require(interleave.second.withLock { $0 })
        #expect(second != old)
        #expect(first == second)
        #expect(try cache.token() == second)
    }

    /// The distinct results of `count` concurrent calls.
    private static func concurrently(
        _ count: Int, _ body: @escaping @Sendable () throws -> String
    ) async throws -> Set<String> {
        try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<count { group.addTask { try body() } }
            var all = Set<String>()
            for try await t in group { all.insert(t) }
            return all
        }
    }
}
