import Foundation
import Observability
import Synchronization
import Testing

@testable import ServiceLifecycle

/// A service that records whether it drained after cancellation.
final class DrainingService: Service {
    let drained = Mutex(false)
    let started = Mutex(false)
    let drainTime: Duration
    init(drainTime: Duration = .milliseconds(50)) { self.drainTime = drainTime }

    func run() async throws {
        started.withLock { $0 = true }
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(60))
        }
        // Finish "in-flight" work after cancellation, without honouring cancellation again.
        let clock = ContinuousClock()
        let end = clock.now + drainTime
        while clock.now < end { usleep(1000) }
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
}
