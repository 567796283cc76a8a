import Dispatch
import Foundation
import Observability

/// Notices when this process stops running its work, and says which kind of stop it was.
///
/// A thread of its own wakes every half second. If its sleep overran by more than `threshold`, the whole process (or
/// the machine) was paused: logged as `process paused`. Then it starts a probe task and waits for it to run: the time
/// the probe waited for one of Swift's cooperative threads goes into `marquee_runtime_task_start_lag_seconds`, and a
/// wait over `threshold` is logged as `cooperative threads stalled` (something blocked them, or too much queued).
/// A test server once stopped answering for 8 s while its neighbours went on; these lines tell the two causes apart.
enum StallWatch {
    static func start(logger: Logger, registry: MetricsRegistry, threshold: Duration = .seconds(1)) {
        let lag = registry.histogram(
            "marquee_runtime_task_start_lag_seconds",
            help: "How long a probe task, started every 500 ms, waited for a cooperative thread.",
            buckets: [0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10])
        let thread = Thread {
            let clock = ContinuousClock()
            let interval = Duration.milliseconds(500)
            while true {
                let slept = clock.now
                Thread.sleep(forTimeInterval: 0.5)
                let overrun = clock.now - slept - interval
                if overrun > threshold {
                    logger.warning("process paused", metadata: ["stall.ms": .int(milliseconds(overrun))])
                }
                let started = clock.now
                let ran = DispatchSemaphore(value: 0)
                Task.detached {
                    let waited = clock.now - started
                    lag.observe(waited)
                    if waited > threshold {
                        logger.warning(
                            "cooperative threads stalled", metadata: ["stall.ms": .int(milliseconds(waited))])
                    }
                    ran.signal()
                }
                ran.wait()
            }
        }
        thread.name = "stall-watch"
        thread.start()
    }

    private static func milliseconds(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.components
        return Int(seconds) * 1000 + Int(attoseconds / 1_000_000_000_000_000)
    }
}
