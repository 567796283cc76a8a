import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import Synchronization
import Testing

@testable import MarqueeAPI

/// The request rate limits without sockets or a database: the token bucket, the per-process buckets and the 429.
@Suite("Request rate limits")
struct RequestLimitsTests {
    static let start = ContinuousClock.now
    static func at(_ seconds: Double) -> ContinuousClock.Instant {
        start + .milliseconds(Int64((seconds * 1000).rounded()))
    }
    static let oneASecondBurstTen = TokenBucket.Limit(perSecond: 1, burst: 10)

    @Test("a bucket starts full: a burst of its size goes through, the next request is refused for 1 s")
    func burst() {
        var bucket = TokenBucket(limit: Self.oneASecondBurstTen, now: Self.at(0))
        for _ in 0..<10 { #expect(bucket.take(at: Self.at(0)) == nil) }
        #expect(bucket.take(at: Self.at(0)) == 1)
        // A refusal takes nothing.
        #expect(bucket.take(at: Self.at(0.5)) == 1)
        #expect(bucket.take(at: Self.at(1)) == nil)
        #expect(bucket.take(at: Self.at(1)) == 1)
    }

    @Test("it refills at its rate, never beyond its burst")
    func refill() {
        var bucket = TokenBucket(limit: .init(perSecond: 100, burst: 200), now: Self.at(0))
        for _ in 0..<200 { #expect(bucket.take(at: Self.at(0)) == nil) }
        #expect(bucket.tokens(at: Self.at(0.5)) == 50)
        #expect(bucket.tokens(at: Self.at(1.5)) == 150)
        #expect(bucket.tokens(at: Self.at(3600)) == 200)
        // Time that runs backwards (it cannot, but) adds nothing.
        #expect(bucket.tokens(at: Self.at(-5)) == 0)
        for _ in 0..<50 { #expect(bucket.take(at: Self.at(0.5)) == nil) }
        #expect(bucket.take(at: Self.at(0.5)) == 1)
        #expect(bucket.isFull(at: Self.at(2.5)))
        #expect(!bucket.isFull(at: Self.at(2.4)))
    }

    @Test("Retry-After is the whole seconds until a token is back, rounded up, at least 1")
    func retryAfter() {
        // A quarter of a token a second: an empty bucket has its next token in 4 s.
        var slow = TokenBucket(limit: .init(perSecond: 0.25, burst: 1), now: Self.at(0))
        #expect(slow.take(at: Self.at(0)) == nil)
        #expect(slow.take(at: Self.at(0)) == 4)
        #expect(slow.take(at: Self.at(1)) == 3)
        #expect(slow.take(at: Self.at(1.5)) == 3)  // 2.5 s to go
        #expect(slow.take(at: Self.at(3.9)) == 1)  // 0.1 s to go: still 1, never 0
        #expect(slow.take(at: Self.at(4)) == nil)
        #expect(TokenBucket.retryAfter(missing: 0.001, perSecond: 1000) == 1)
        #expect(TokenBucket.retryAfter(missing: 1, perSecond: 0) == 86_400)
    }

    @Test("a request that counts for several takes as many tokens; one beyond the burst takes a full bucket")
    func count() {
        var bucket = TokenBucket(limit: Self.oneASecondBurstTen, now: Self.at(0))
        #expect(bucket.take(at: Self.at(0), count: 4) == nil)
        #expect(bucket.tokens(at: Self.at(0)) == 6)
        #expect(bucket.take(at: Self.at(0), count: 7) == 1)  // one short: a second
        #expect(bucket.take(at: Self.at(0), count: 9) == 3)
        #expect(bucket.tokens(at: Self.at(0)) == 6, "a refusal takes nothing")
        #expect(bucket.take(at: Self.at(0), count: 6) == nil)
        #expect(bucket.take(at: Self.at(10), count: 1_000) == nil, "a full bucket lets it through")
        #expect(bucket.tokens(at: Self.at(10)) == 0)
        #expect(bucket.take(at: Self.at(10), count: 0) == 1, "none counts as one")
    }

    @Test("looking without spending takes nothing")
    func look() {
        var bucket = TokenBucket(limit: .init(perSecond: 1, burst: 1), now: Self.at(0))
        #expect(bucket.take(at: Self.at(0), spend: false) == nil)
        #expect(bucket.take(at: Self.at(0), spend: false) == nil)
        #expect(bucket.take(at: Self.at(0)) == nil)
        #expect(bucket.take(at: Self.at(0), spend: false) == 1)
    }

    @Test("a lower limit applies at once: what the bucket holds is cut to the new burst")
    func limitChange() {
        var bucket = TokenBucket(limit: .init(perSecond: 100, burst: 1000), now: Self.at(0))
        bucket.advance(to: Self.at(0), limit: .init(perSecond: 1, burst: 2))
        #expect(bucket.take(at: Self.at(0)) == nil)
        #expect(bucket.take(at: Self.at(0)) == nil)
        #expect(bucket.take(at: Self.at(0)) == 1)
    }

    @Test("the tenant's own setting lowers the operator's limit, never raises it; 0 means none; the burst is seconds")
    func limits() {
        let limits = RequestLimits(appPerSecond: 1000, sdkPerSecond: 0, burstSeconds: 10)
        #expect(limits.perSecond(.app, setting: nil) == 1000)
        #expect(limits.perSecond(.app, setting: 5) == 5)
        #expect(limits.perSecond(.app, setting: 5000) == 1000, "the operator's limit is the ceiling")
        #expect(limits.ceiling(.app) == 1000)
        #expect(limits.ceiling(.sdk) == nil)
        #expect(limits.perSecond(.sdk, setting: nil) == nil)
        #expect(limits.perSecond(.sdk, setting: 7) == 7)
        #expect(limits.limit(.app, setting: 5) == .init(perSecond: 5, burst: 50))
        #expect(RequestLimits.off.limit(.app, setting: nil) == nil)
    }

    @Test("buckets are per tenant and kind of key: one that is spent holds back no other")
    func separateBuckets() {
        let limiter = RequestLimiter()
        let a = RequestLimiter.Key(tenant: UUID(), kind: .sdk)
        let aApp = RequestLimiter.Key(tenant: a.tenant, kind: .app)
        let b = RequestLimiter.Key(tenant: UUID(), kind: .sdk)
        let limit = TokenBucket.Limit(perSecond: 1, burst: 2)
        #expect(limiter.check(a, limit: limit, at: Self.at(0)) == .allowed)
        #expect(limiter.check(a, limit: limit, at: Self.at(0)) == .allowed)
        #expect(limiter.check(a, limit: limit, at: Self.at(0)) == .limited(retryAfter: 1, report: 1))
        #expect(limiter.check(aApp, limit: limit, at: Self.at(0)) == .allowed)
        #expect(limiter.check(b, limit: limit, at: Self.at(0)) == .allowed)
        #expect(limiter.count == 3)
    }

    @Test("a bucket's refusals are reported on the first one, then at most once per interval with their count")
    func reports() {
        let limiter = RequestLimiter(reportInterval: .seconds(10))
        let key = RequestLimiter.Key(tenant: UUID(), kind: .sdk)
        // A token every 64 s (exact in binary, so the waits below are whole seconds).
        let limit = TokenBucket.Limit(perSecond: 1.0 / 64, burst: 1)
        #expect(limiter.check(key, limit: limit, at: Self.at(0)) == .allowed)
        #expect(limiter.check(key, limit: limit, at: Self.at(0)) == .limited(retryAfter: 64, report: 1))
        for second in 1...9 {
            #expect(
                limiter.check(key, limit: limit, at: Self.at(Double(second)))
                    == .limited(retryAfter: 64 - second, report: nil))
        }
        #expect(limiter.check(key, limit: limit, at: Self.at(10)) == .limited(retryAfter: 54, report: 10))
        #expect(limiter.check(key, limit: limit, at: Self.at(11)) == .limited(retryAfter: 53, report: nil))
    }

    @Test("the number of buckets is bounded: refilled ones go first, then those closest to full; a spent one stays")
    func bounded() {
        let limiter = RequestLimiter(capacity: 3)
        let limit = TokenBucket.Limit(perSecond: 1, burst: 5)
        let spent = RequestLimiter.Key(tenant: UUID(), kind: .app)
        for _ in 0..<5 { #expect(limiter.check(spent, limit: limit, at: Self.at(0)) == .allowed) }
        #expect(limiter.check(spent, limit: limit, at: Self.at(0)) == .limited(retryAfter: 1, report: 1))
        // Two tenants that took one token each: full again after a second.
        for _ in 0..<2 {
            #expect(limiter.check(.init(tenant: UUID(), kind: .sdk), limit: limit, at: Self.at(0)) == .allowed)
        }
        #expect(limiter.count == 3)
        // A fourth tenant at 1.5 s: the two refilled buckets are forgotten, the spent one is not.
        let fourth = RequestLimiter.Key(tenant: UUID(), kind: .sdk)
        #expect(limiter.check(fourth, limit: limit, at: Self.at(1.5)) == .allowed)
        #expect(limiter.count == 2)
        #expect(limiter.check(spent, limit: limit, at: Self.at(1.5)) == .allowed)
        #expect(limiter.check(spent, limit: limit, at: Self.at(1.5)) == .limited(retryAfter: 1, report: nil))
        // Many more tenants, none of them idle long enough to refill: never more than the capacity.
        for i in 0..<100 {
            _ = limiter.check(.init(tenant: UUID(), kind: .app), limit: limit, at: Self.at(1.5 + Double(i) * 0.001))
            #expect(limiter.count <= 3)
        }
        // Those missing one token each went first: the spent bucket is still there (forgotten, it would have come back
        // full), and its tenant is still refused.
        #expect(limiter.check(spent, limit: limit, at: Self.at(1.7)) == .limited(retryAfter: 1, report: nil))
    }

    @Test("nested buckets: a request takes from each, or from none when one of them is spent")
    func nested() {
        let limiter = RequestLimiter()
        let (own, network) = (
            RequestLimiter.Key(tenant: nil, kind: nil, address: "a"),
            RequestLimiter.Key(
                tenant: nil, kind: nil, address: "n")
        )
        let small = TokenBucket.Limit(perSecond: 1, burst: 2)
        let large = TokenBucket.Limit(perSecond: 1, burst: 3)
        #expect(limiter.check([(own, small), (network, large)], at: Self.at(0)) == (2, .allowed))
        #expect(limiter.check([(own, small), (network, large)], at: Self.at(0)) == (2, .allowed))
        // The address's own is spent: refused there, and the network's keeps its last token.
        #expect(
            limiter.check([(own, small), (network, large)], at: Self.at(0)) == (0, .limited(retryAfter: 1, report: 1)))
        let other = RequestLimiter.Key(tenant: nil, kind: nil, address: "b")
        #expect(limiter.check([(other, small), (network, large)], at: Self.at(0)) == (2, .allowed))
        // Now the network's is spent: another address of it is refused there, and keeps its own tokens.
        #expect(
            limiter.check([(other, small), (network, large)], at: Self.at(0)) == (1, .limited(retryAfter: 1, report: 1))
        )
        #expect(limiter.check(other, limit: small, at: Self.at(0), spend: false) == .allowed)
    }

    @Test("an IPv6 client's /64s count within their /56: 100 of one /56 share 16 shares, not 100")
    func ipv6Network() throws {
        let rateGuard = RequestRateGuard(
            limits: RequestLimits(
                appPerSecond: 0, sdkPerSecond: 10_000, burstSeconds: 1, sdkPerAddressPerSecond: 2,
                keyLookupsPerAddressPerSecond: 1),
            metrics: MetricsRegistry(), logger: Logger(label: "test", sink: LogSink { _ in }), now: { Self.at(0) })
        let sdk = Principal(tenantID: UUID(), keyID: UUID(), kind: .sdk)
        func request(_ address: String) -> HTTPRequest {
            HTTPRequest(method: .PUT, target: "/v1/people/p1", requestID: "req-1", remoteAddress: address)
        }
        let addresses = (0..<100).map { "2001:db8:0:\(String($0, radix: 16))::1" }
        var allowed = 0
        var lookups = 0
        for address in addresses {
            for _ in 0..<2 {
                if (try? rateGuard.check(sdk, request(address))) != nil { allowed += 1 }
                if (try? rateGuard.admitLookup(request(address))) != nil { lookups += 1 }
            }
        }
        #expect(allowed == 32, "16 shares of 2 a second (bursts of 1 s), where each /64 alone would have had 2")
        #expect(lookups == 32, "key lookups too: 16 shares of bursts of 2")
        #expect(rateGuard.refusedAddresses.value([]) == 200 - 32)
        // Another /56 of the same /48 has its shares of its own; so has an IPv4 address.
        #expect((try? rateGuard.check(sdk, request("2001:db8:0:100::1"))) != nil)
        #expect((try? rateGuard.check(sdk, request("203.0.113.9"))) != nil)
        // A refusal of the network names it.
        var refused: HTTPProblem?
        do { try rateGuard.check(sdk, request("2001:db8:0:ff::1")) } catch let problem as HTTPProblem {
            refused = problem
        }
        #expect(refused?.extensions["scope"] == "client_address")
        #expect(refused?.detail?.contains("32 a second") == true, "\(String(describing: refused?.detail))")
    }

    @Test(
        "over its rate, a principal gets 429 rate-limited with Retry-After, counted by kind and logged without the key")
    func guardAnswers() throws {
        let metrics = MetricsRegistry()
        let lines = Mutex<[String]>([])
        let clock = Mutex(Self.at(0))
        let rateGuard = RequestRateGuard(
            limits: RequestLimits(appPerSecond: 0, sdkPerSecond: 2, burstSeconds: 1), metrics: metrics,
            logger: Logger(label: "test", sink: LogSink { line in lines.withLock { $0.append(line) } }),
            now: { clock.withLock { $0 } })
        let sdk = Principal(tenantID: UUID(), keyID: UUID(), kind: .sdk)
        let app = Principal(tenantID: sdk.tenantID, keyID: UUID(), kind: .app)
        let request = HTTPRequest(method: .PUT, target: "/v1/people/p1", requestID: "req-1")
        try rateGuard.check(sdk, request)
        try rateGuard.check(sdk, request)
        // A body admission only looks.
        #expect(throws: HTTPProblem.self) { try rateGuard.check(sdk, request, spend: false) }
        var refused: HTTPProblem?
        do { try rateGuard.check(sdk, request) } catch let problem as HTTPProblem { refused = problem }
        let problem = try #require(refused)
        #expect(problem.status == 429)
        #expect(problem.type == "https://marquee.dev/problems/rate-limited")
        #expect(problem.headers["Retry-After"] == "1")
        #expect(problem.detail?.contains("2 a second") == true)
        #expect(problem.extensions["key_kind"] == "sdk")
        // The app key is not limited (0), and has a bucket of its own anyway; a second later the sdk key goes on.
        for _ in 0..<100 { try rateGuard.check(app, request) }
        clock.withLock { $0 = Self.at(1) }
        try rateGuard.check(sdk, request)
        // A tenant's own setting wins over the default (none for app keys here): one a second.
        let own = Principal(tenantID: UUID(), keyID: UUID(), kind: .app, requestsPerSecond: 1)
        try rateGuard.check(own, request)
        #expect(throws: HTTPProblem.self) { try rateGuard.check(own, request) }
        #expect(rateGuard.refused.value(["sdk"]) == 2)
        #expect(rateGuard.refused.value(["app"]) == 1)
        #expect(metrics.exposition().contains(#"marquee_http_rate_limited_total{kind="sdk"} 2"#))
        let logged = lines.withLock { $0 }
        // One line per bucket's first refusal (then at most one per 10 s), naming the tenant and key, not the key text.
        #expect(logged.count == 2)
        #expect(logged.first?.contains(#""msg":"request rate limited""#) == true)
        #expect(logged.first?.contains(sdk.tenantID.uuidString.lowercased()) == true)
        #expect(logged.first?.contains(sdk.keyID.uuidString.lowercased()) == true)
        #expect(logged.first?.contains(#""rate_limit.per_second":2"#) == true)
    }

    @Test("a client address's sdk requests have their own share, asked first; IPv6 by its /64; app keys not by address")
    func perAddress() throws {
        let metrics = MetricsRegistry()
        let lines = Mutex<[String]>([])
        let rateGuard = RequestRateGuard(
            limits: RequestLimits(appPerSecond: 0, sdkPerSecond: 5, burstSeconds: 1, sdkPerAddressPerSecond: 2),
            metrics: metrics,
            logger: Logger(label: "test", sink: LogSink { line in lines.withLock { $0.append(line) } }),
            now: { Self.at(0) })
        let sdk = Principal(tenantID: UUID(), keyID: UUID(), kind: .sdk)
        func request(_ address: String?) -> HTTPRequest {
            HTTPRequest(method: .PUT, target: "/v1/people/p1", requestID: "req-1", remoteAddress: address)
        }
        func refusal(_ principal: Principal, _ address: String?) -> HTTPProblem? {
            do { try rateGuard.check(principal, request(address)) } catch let problem as HTTPProblem {
                return problem
            } catch { return nil }
            return nil
        }
        // One address: its two, then refused, and the refusals spend nothing of the tenant's five.
        #expect(refusal(sdk, "203.0.113.9") == nil && refusal(sdk, "203.0.113.9") == nil)
        for _ in 0..<10 {
            let problem = try #require(refusal(sdk, "203.0.113.9"))
            #expect(problem.status == 429 && problem.extensions["scope"] == "client_address")
            #expect(problem.detail?.contains("client address") == true)
        }
        // An IPv6 client counts by its /64: another address of the same network shares the bucket.
        #expect(refusal(sdk, "2001:db8:1:2::1") == nil && refusal(sdk, "2001:db8:1:2::ffff") == nil)
        #expect(refusal(sdk, "2001:db8:1:2:aaaa::1")?.extensions["scope"] == "client_address")
        // The tenant's bucket had 5: four taken above, one left for a third address; then the tenant is over.
        #expect(refusal(sdk, "198.51.100.1") == nil)
        #expect(refusal(sdk, "198.51.100.2")?.extensions["scope"] == "workspace")
        // App keys are not limited by address (and not at all here); another tenant's sdk key has its own share.
        let app = Principal(tenantID: sdk.tenantID, keyID: UUID(), kind: .app)
        for _ in 0..<20 { #expect(refusal(app, "203.0.113.9") == nil) }
        let other = Principal(tenantID: UUID(), keyID: UUID(), kind: .sdk)
        #expect(refusal(other, "203.0.113.9") == nil)
        // No known address: the tenant's bucket alone.
        #expect(refusal(other, nil) == nil)
        #expect(rateGuard.refusedAddresses.value([]) == 11)
        #expect(rateGuard.refused.value(["sdk"]) == 1)
        #expect(metrics.exposition().contains("marquee_http_rate_limited_addresses_total 11"))
        let logged = lines.withLock { $0 }.filter { $0.contains("for a client address") }
        #expect(logged.count == 2, "one line per address's first refusal: \(logged)")
        #expect(logged.first?.contains(#""rate_limit.client_address":"203.0.113.9""#) == true)
        #expect(lines.withLock { $0 }.contains { $0.contains(#""rate_limit.client_address":"2001:db8:1:2::/64""#) })
    }
}
