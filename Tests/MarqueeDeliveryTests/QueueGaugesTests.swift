import MarqueeCore
import MarqueeStore
import Observability
import Synchronization
import Testing

@testable import MarqueeDelivery

@Suite("The queue gauges and their age")
struct QueueGaugesTests {
    /// A clock the test moves.
    final class ManualClock: Sendable {
        private let current = Mutex(ContinuousClock.now)
        var now: ContinuousClock.Instant { current.withLock { $0 } }
        func advance(_ duration: Duration) { current.withLock { $0 += duration } }
    }

    struct Unreachable: Error {}

    /// The sample age a scrape now reports.
    func age(_ registry: MetricsRegistry, _ metrics: WorkerMetrics) -> Double {
        _ = registry.exposition()
        return metrics.queueSampleAge.value()
    }

    @Test("a failed sample keeps the gauges, and the sample age grows until a sample succeeds again")
    func failingSamples() async {
        let registry = MetricsRegistry()
        let clock = ManualClock()
        let metrics = WorkerMetrics(registry: registry)
        let gauges = QueueGauges(metrics: metrics, registry: registry, now: { clock.now })
        clock.advance(.seconds(3))
        #expect(age(registry, metrics) == 3, "since start before the first sample")

        #expect(await gauges.sample { [.apns: QueueStatistics(due: 7, oldestDueAge: 12)] } == nil)
        #expect(age(registry, metrics) == 0)
        #expect(metrics.oldestDue.value(["apns"]) == 12)

        // PostgreSQL is unreachable for a minute and a half: every sample fails.
        for _ in 0..<18 {
            clock.advance(.seconds(5))
            #expect(await gauges.sample { throw Unreachable() } is Unreachable)
        }
        #expect(age(registry, metrics) == 90)
        #expect(metrics.oldestDue.value(["apns"]) == 12)

        #expect(await gauges.sample { [.apns: QueueStatistics(due: 900, oldestDueAge: 95)] } == nil)
        #expect(age(registry, metrics) == 0)
        #expect(metrics.oldestDue.value(["apns"]) == 95)
    }
}
