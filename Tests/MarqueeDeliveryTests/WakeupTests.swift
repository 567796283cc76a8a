import Foundation
import Synchronization
import Testing

@testable import MarqueeDelivery

@Suite("Wakeup: how a notification wakes the claimers")
struct WakeupTests {
    final class Count: Sendable {
        let value = Atomic<Int>(0)
        func add() { value.add(1, ordering: .relaxed) }
        var now: Int { value.load(ordering: .relaxed) }
    }

    /// Starts `count` waiters (each counts itself when woken) and returns once all are waiting.
    func waiters(_ wakeup: Wakeup, _ count: Int, woken: Count) async -> [Task<Void, Never>] {
        let tasks = (0..<count).map { _ in
            Task {
                await wakeup.wait(timeout: .seconds(60))
                woken.add()
            }
        }
        // Waiting means registered: a signal before that would be taken by `pending` instead.
        while wakeup.waiting < count { await Task.yield() }
        return tasks
    }

    @Test("signalOne wakes one waiter of three; signal wakes the rest")
    func one() async throws {
        let wakeup = Wakeup()
        let woken = Count()
        let tasks = await waiters(wakeup, 3, woken: woken)
        wakeup.signalOne()
        try await eventually { woken.now == 1 }
        #expect(wakeup.waiting == 2)
        wakeup.signal()
        for task in tasks { await task.value }
        #expect(woken.now == 3)
    }

    @Test("a signalOne with nobody waiting is kept for the next wait")
    func pending() async throws {
        let wakeup = Wakeup()
        wakeup.signalOne()
        let start = ContinuousClock.now
        await wakeup.wait(timeout: .seconds(60))
        #expect(ContinuousClock.now - start < .seconds(30))
    }

    func eventually(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw CancellationError() }
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}
