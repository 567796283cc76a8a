import Foundation
import Synchronization
import Testing

@testable import MarqueeStore

@Suite("Batches: a runner's caller is answered with its own batch")
struct BatchesTests {
    /// A gate each batch passes: the test opens it one batch at a time.
    final class Gate: Sendable {
        private let state = Mutex<(open: Int, waiting: Int, ran: [[Int]])>((0, 0, []))
        func open() { state.withLock { $0.open += 1 } }
        var ran: [[Int]] { state.withLock { $0.ran } }
        var waiting: Int { state.withLock { $0.waiting } }
        func pass(_ batch: [Int]) async {
            state.withLock { $0.waiting += 1 }
            defer { state.withLock { $0.waiting -= 1 } }
            while true {
                let through = state.withLock { state -> Bool in
                    guard state.open > 0 else { return false }
                    state.open -= 1
                    state.ran.append(batch)
                    return true
                }
                if through { return }
                try? await Task.sleep(for: .milliseconds(1))
            }
        }
    }

    final class Answers: Sendable {
        private let state = Mutex<[Int: Int]>([:])
        func set(_ key: Int, _ value: Int) { state.withLock { $0[key] = value } }
        var all: [Int: Int] { state.withLock { $0 } }
    }

    @Test("the runner returns after its own batch while later items keep its queue busy; every item is answered")
    func runnerReturns() async throws {
        let batches = Batches<Int, Int>(concurrency: 1, maxBatch: 4)
        let gate = Gate()
        let run: @Sendable ([Int]) async -> [Result<Int, any Error>] = { batch in
            await gate.pass(batch)
            return batch.map { .success($0 * 10) }
        }
        let answered = Answers()
        // Item 0 makes its caller the runner; its batch waits at the gate while items 1...6 queue behind it.
        let first = Task {
            let value = try await batches.submit(0, run: run)
            answered.set(0, value)
        }
        try await eventually("item 0's batch running") { gate.waiting == 1 }
        let others = (1...6).map { n in
            Task {
                let value = try await batches.submit(n, run: run)
                answered.set(n, value)
            }
        }
        try await eventually("six items queued") { batches.queued == 6 }
        gate.open()  // the runner's own batch [0]
        // The runner's caller is answered while the rest still wait at the gate (a runner draining the whole queue
        // returned only after all of it, so this would wait out its deadline). The gate stays shut whatever the
        // time, so the deadline is generous: at 5 s this failed once on a loaded CI machine.
        let early: Void? = try? await eventually("the runner's caller answered") { answered.all[0] != nil }
        #expect(early != nil)
        #expect(gate.ran == [[0]])
        gate.open()
        gate.open()
        try await first.value
        for task in others { try await task.value }
        #expect(answered.all == Dictionary(uniqueKeysWithValues: (0...6).map { ($0, $0 * 10) }))
        #expect(gate.ran.map(\.count) == [1, 4, 2])  // the others in the order their tasks queued them
        #expect(gate.ran.flatMap { $0 }.sorted() == Array(0...6))
        // The runner's place was given back: a new item runs at once.
        gate.open()
        #expect(try await batches.submit(7, run: run) == 70)
    }
}
