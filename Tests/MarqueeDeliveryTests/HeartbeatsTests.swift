import Synchronization
import Testing

@testable import MarqueeDelivery

@Suite("Worker loop heartbeats")
struct HeartbeatsTests {
    @Test("a loop is stalled once its last beat is older than the bound; a beat or its end clears it")
    func stalled() {
        let clock = Mutex(ContinuousClock.now)
        let heartbeats = Heartbeats(now: { clock.withLock { $0 } })
        func advance(_ duration: Duration) { clock.withLock { $0 += duration } }
        heartbeats.beat("loop 0")
        heartbeats.beat("loop 1")
        heartbeats.beat("campaigns")
        advance(.seconds(90))
        heartbeats.beat("campaigns")
        advance(.seconds(10))
        heartbeats.beat("loop 0")
        #expect(heartbeats.stalled(after: .seconds(120)).isEmpty)
        advance(.seconds(30))
        // loop 1's claim has not come back for 130 s.
        let stalled = heartbeats.stalled(after: .seconds(120))
        #expect(stalled.map(\.loop) == ["loop 1"])
        #expect(stalled.first?.since == .seconds(130))
        advance(.seconds(100))
        #expect(heartbeats.stalled(after: .seconds(120)).map(\.loop) == ["loop 1", "campaigns", "loop 0"])
        heartbeats.beat("loop 1")
        heartbeats.end("loop 0")
        #expect(heartbeats.stalled(after: .seconds(120)).map(\.loop) == ["campaigns"])
    }
}
