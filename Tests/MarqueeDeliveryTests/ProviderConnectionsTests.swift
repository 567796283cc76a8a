import Foundation
import HTTP2
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeDelivery

/// A clock the test moves by hand.
private final class HandClock: Sendable {
    private let instant = Mutex(ContinuousClock.now)
    var now: ContinuousClock.Instant { instant.withLock { $0 } }
    func advance(_ duration: Duration) { instant.withLock { $0 += duration } }
}

@Suite("Provider pools: allowlisted, one per host and APNs key, evicted when idle, capped in number")
struct ProviderConnectionsTests {
    private func connections(maxPools: Int, clock: HandClock) -> ProviderConnections {
        ProviderConnections(
            .init(
                caFile: nil, connectionsPerHost: 1, requestTimeout: .seconds(5),
                allowedHosts: ProviderHosts("a.test,b.test,c.test,d.test:8443")!, maxPools: maxPools,
                poolIdleTimeout: .seconds(300)),
            now: { clock.now })
    }

    @Test("a host outside the allowlist is refused before any pool is made")
    func refused() async throws {
        let pools = connections(maxPools: 4, clock: HandClock())
        await #expect(throws: ProviderConnectionError.hostNotAllowed) {
            _ = try await pools.lease(host: "127.0.0.1", port: 443)
        }
        await #expect(throws: ProviderConnectionError.hostNotAllowed) {
            _ = try await pools.lease(host: "d.test", port: 443)
        }
        #expect(pools.pools.isEmpty)
        let decision = TransportFailure.decision(
            ProviderConnectionError.hostNotAllowed, provider: "apns", host: "x", port: 1, logger: nil)
        #expect(decision == .credentialBroken(reason: "endpoint_not_allowed"))
        await pools.shutdown()
    }

    @Test("an allowed host does not let another port or host through after it; its case does not make a new pool")
    func allowedThenRefused() async throws {
        let pools = connections(maxPools: 4, clock: HandClock())
        let (_, d) = try await pools.lease(host: "d.test", port: 8443)
        pools.release(d)
        await #expect(throws: ProviderConnectionError.hostNotAllowed) {
            _ = try await pools.lease(host: "d.test", port: 443)
        }
        await #expect(throws: ProviderConnectionError.hostNotAllowed) {
            _ = try await pools.lease(host: "e.test", port: 8443)
        }
        let (_, a) = try await pools.lease(host: "a.test", port: 443)
        pools.release(a)
        let (_, upper) = try await pools.lease(host: "A.Test", port: 443)
        pools.release(upper)
        #expect(pools.pools == ["a.test:443", "d.test:8443"])
        await pools.shutdown()
    }

    @Test("each sender identity (an APNs team and key) gets its own pool on a host; the same identity shares one")
    func perIdentity() async throws {
        let pools = connections(maxPools: 4, clock: HandClock())
        let (one, k1) = try await pools.lease(host: "a.test", port: 443, identity: "TEAM1/KEY1")
        let (two, k2) = try await pools.lease(host: "a.test", port: 443, identity: "TEAM2/KEY2")
        let (again, k3) = try await pools.lease(host: "a.test", port: 443, identity: "TEAM1/KEY1")
        let (shared, k4) = try await pools.lease(host: "a.test", port: 443)
        for key in [k1, k2, k3, k4] { pools.release(key) }
        #expect(one !== two && one === again && shared !== one && shared !== two)
        #expect(pools.pools == ["a.test:443 TEAM1/KEY1", "a.test:443 TEAM2/KEY2", "a.test:443"])
        await pools.shutdown()
    }

    @Test("pools unused for the idle period are closed on the next lease")
    func idleEviction() async throws {
        let clock = HandClock()
        let pools = connections(maxPools: 4, clock: clock)
        let (_, a) = try await pools.lease(host: "a.test", port: 443)
        pools.release(a)
        clock.advance(.seconds(200))
        let (_, b) = try await pools.lease(host: "b.test", port: 443)
        pools.release(b)
        #expect(pools.pools == ["a.test:443", "b.test:443"])
        clock.advance(.seconds(150))  // a: 350 s idle, b: 150 s
        let (_, c) = try await pools.lease(host: "c.test", port: 443)
        #expect(pools.pools == ["b.test:443", "c.test:443"])
        pools.release(c)
        await pools.shutdown()
    }

    @Test("at the cap a new host evicts the least recently used idle pool; when all are busy it fails retryably")
    func cap() async throws {
        let clock = HandClock()
        let pools = connections(maxPools: 2, clock: clock)
        let (_, a) = try await pools.lease(host: "a.test", port: 443)
        clock.advance(.seconds(1))
        let (_, b) = try await pools.lease(host: "b.test", port: 443)
        // Both busy: a third host must wait for a free slot.
        await #expect(throws: ProviderConnectionError.busy) { _ = try await pools.lease(host: "c.test", port: 443) }
        #expect(
            TransportFailure.decision(ProviderConnectionError.busy, provider: "fcm", host: "", port: 0, logger: nil)
                == .retry(reason: "transport_error", retryAfter: nil))
        pools.release(b)
        clock.advance(.seconds(1))
        pools.release(a)  // a is now the most recently used; b the least
        let (_, c) = try await pools.lease(host: "c.test", port: 443)
        #expect(pools.pools == ["a.test:443", "c.test:443"])
        pools.release(c)
        await pools.shutdown()
    }

    @Test("the API's channel client: tenants with keys of their own managing channels at once do not find it busy")
    func channelClientPools() async throws {
        let pools = ProviderConnections(
            APNsChannelClient.serving(caFile: nil, allowedHosts: ProviderHosts("a.test")!), name: "test")
        // Each tenant's request held (Apple slow to answer): every pool stays in use.
        var keys: [String] = []
        for tenant in 0..<32 {
            let (_, key) = try await pools.lease(host: "a.test", port: 2195, identity: "TEAM\(tenant)/KEY\(tenant)")
            keys.append(key)
        }
        #expect(pools.pools.count == 32)
        for key in keys { pools.release(key) }
        await pools.shutdown()
    }

    @Test("transport failures reach tenants as a fixed vocabulary, never the peer's address or library text")
    func vocabulary() {
        func reason(_ code: HTTP2Error.Code) -> DeliveryDecision {
            TransportFailure.decision(
                HTTP2Error(code, "connect to 10.0.0.7:5432 failed", details: "Connection refused (errno 111)"),
                provider: "apns", host: "10.0.0.7", port: 5432, logger: nil)
        }
        #expect(reason(.connectFailed) == .retry(reason: "transport_error", retryAfter: nil))
        #expect(reason(.tlsFailed) == .retry(reason: "tls_error", retryAfter: nil))
        #expect(reason(.certificateVerifyFailed) == .retry(reason: "tls_error", retryAfter: nil))
        #expect(reason(.alpnMismatch) == .retry(reason: "tls_error", retryAfter: nil))
        #expect(reason(.timeout) == .retry(reason: "timeout", retryAfter: nil))
        #expect(reason(.responseTooLarge) == .retry(reason: "transport_error", retryAfter: nil))
        #expect(reason(.addressRefused) == .retry(reason: "transport_error", retryAfter: nil))
        #expect(reason(.streamReset) == .retry(reason: "transport_error", retryAfter: nil))
    }
}
