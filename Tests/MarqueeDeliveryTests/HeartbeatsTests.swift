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

    @Test("the campaign runner may take its longest statement (a start's audience) beyond the bound, and no more")
    func campaignAllowance() {
        let clock = Mutex(ContinuousClock.now)
        let worker = DeliveryWorker.self
        let heartbeats = Heartbeats(
            allowances: [worker.campaignsLoop: .seconds(900)], now: { clock.withLock { $0 } })
        heartbeats.beat(worker.campaignsLoop)
        heartbeats.beat("loop 0")
        clock.withLock { $0 += .seconds(1000) }
        heartbeats.beat("loop 0")
        #expect(heartbeats.stalled(after: .seconds(181)).isEmpty, "1,000 s into an audience of up to 900 + 181 s")
        clock.withLock { $0 += .seconds(82) }
        #expect(heartbeats.stalled(after: .seconds(181)).map(\.loop) == [worker.campaignsLoop])
    }
}
