import Foundation
import Observability
import Synchronization
import Testing

@testable import ProcessLifecycle

/// A service that works until graceful shutdown, then drains with ordinary awaits (which cancellation would break).
final class DrainingService: Service {
    let drained = Mutex(false)
    let started = Mutex(false)
    let drainTime: Duration
    init(drainTime: Duration = .milliseconds(50)) { self.drainTime = drainTime }

    func run() async throws {
        started.withLock { $0 = true }
        await gracefulShutdown()
        // Finish "in-flight" work: a sleep throws if the task was cancelled, so `drained` says the drain ran whole.
        try await Task.sleep(for: drainTime)
        drained.withLock { $0 = true }
    }
}

struct Failure: Error {}

@Suite("Service group", .serialized)
struct ServiceGroupTests {
    let logger = Logger(label: "test", sink: .discard)

    @Test("SIGTERM drains every service and reports the signal")
    func signalDrains() async throws {
        let a = DrainingService()
        let b = DrainingService(drainTime: .milliseconds(120))
        let group = ServiceGroup(
            services: [("a", a), ("b", b)], configuration: .init(signals: [SIGUSR1]), logger: logger)
        async let reason = group.run()
        // Services start only once the group observes its signals: then the signal cannot be lost.
        let deadline = ContinuousClock.now + .seconds(30)
        while !(a.started.withLock { $0 } && b.started.withLock { $0 }) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        kill(getpid(), SIGUSR1)
        #expect(try await reason == .signal(SIGUSR1))
        #expect(a.drained.withLock { $0 })
        #expect(b.drained.withLock { $0 })
    }

    @Test("a failing service stops the others and its error is rethrown")
    func failurePropagates() async throws {
        let survivor = DrainingService()
        let failing = ClosureService {
            try await Task.sleep(for: .milliseconds(50))
            throw Failure()
        }
        let group = ServiceGroup(
            services: [("survivor", survivor), ("failing", failing)], configuration: .init(signals: [SIGUSR2]),
            logger: logger)
        await #expect(throws: Failure.self) { try await group.run() }
        #expect(survivor.drained.withLock { $0 })
    }

    @Test("a service that returns early shuts the group down")
    func earlyReturn() async throws {
        let survivor = DrainingService()
        let group = ServiceGroup(
            services: [("survivor", survivor), ("oneshot", ClosureService {})],
            configuration: .init(signals: [SIGUSR2]), logger: logger)
        #expect(try await group.run() == .serviceFinished("oneshot"))
        #expect(survivor.drained.withLock { $0 })
    }

    @Test(
        "graceful shutdown is not cancellation: handlers run once, late ones at once, and the group's task can still cancel"
    )
    func gracefulIsNotCancellation() async throws {
        let shutdown = GracefulShutdown()
        let calls = Mutex(0)
        let waiting = Task {
            await shutdown.whileCurrent {
                await withGracefulShutdownHandler {
                    await gracefulShutdown()
                    // Shutdown began, the task is not cancelled: awaits work.
                    #expect(Task.isShuttingDownGracefully)
                    #expect(!Task.isCancelled)
                    try? await Task.sleep(for: .milliseconds(1))
                } onGracefulShutdown: {
                    calls.withLock { $0 += 1 }
                }
            }
        }
        try await Task.sleep(for: .milliseconds(20))
        shutdown.trigger()
        shutdown.trigger()
        await waiting.value
        #expect(calls.withLock { $0 } == 1)
        // Registered after the trigger: called at once.
        await shutdown.whileCurrent {
            await withGracefulShutdownHandler {
            } onGracefulShutdown: {
                calls.withLock { $0 += 1 }
            }
        }
        #expect(calls.withLock { $0 } == 2)
        // Outside a group, gracefulShutdown() waits for cancellation only.
        let outside = Task { await gracefulShutdown() }
        outside.cancel()
        await outside.value
        #expect(!Task.isShuttingDownGracefully)
    }

    @Test("a CancellingService is cancelled by graceful shutdown")
    func cancellingService() async throws {
        let cancelled = Mutex(false)
        let service = CancellingService {
            do {
                try await Task.sleep(for: .seconds(60))
            } catch {
                cancelled.withLock { $0 = true }
            }
        }
        let group = ServiceGroup(
            services: [("sleeper", service), ("oneshot", ClosureService {})], configuration: .init(signals: [SIGUSR2]),
            logger: logger)
        #expect(try await group.run() == .serviceFinished("oneshot"))
        #expect(cancelled.withLock { $0 })
    }
}
