import Foundation
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeStore

/// The group commit's rules without a database: where writes go, how batches form, and how a failed batch's callers
/// get their own answers.
@Suite("Group commit, planned")
struct GroupCommitPlanTests {
    /// Two kinds of write, as `ObjectIdentifier(Write.self)` names them.
    private struct ChangeKind {}
    private struct StartKind {}
    private static let change = ObjectIdentifier(ChangeKind.self)
    private static let start = ObjectIdentifier(StartKind.self)

    private static func keys(_ instance: String, _ key: String? = nil) -> [String] {
        IdempotencyColumns.exclusiveKeys(
            instanceID: instance,
            key.map { IdempotencyRecord(key: $0, requestHash: [1], status: 200, response: .null) })
    }

    @Test("a write's exclusive keys are its instance and its Idempotency-Key, when it has them")
    func exclusiveKeys() {
        #expect(Self.keys("order-1") == ["instance:order-1"])
        #expect(Self.keys("order-1", "k1") == ["instance:order-1", "key:k1"])
        #expect(
            IdempotencyColumns.exclusiveKeys(
                instanceID: nil, IdempotencyRecord(key: "k1", requestHash: [], status: 200, response: .null))
                == ["key:k1"])
        // An instance ID that looks like a key is still an instance.
        #expect(Set(Self.keys("key:k1")).isDisjoint(with: Self.keys("other", "k1")))
    }

    @Test("writes of different instances share one statement; a second write of an instance goes to the next")
    func sameInstanceNextStatement() {
        let rounds = GroupCommitter.rounds([
            (Self.change, Self.keys("a")), (Self.change, Self.keys("b")), (Self.change, Self.keys("a")),
            (Self.change, Self.keys("c")), (Self.change, Self.keys("a")),
        ])
        #expect(rounds == [[0, 1, 3], [2], [4]])
    }

    @Test("a write goes after every statement holding one of its keys, not just the last one")
    func afterEveryHolder() {
        // The third write shares its Idempotency-Key with the first and its instance with nothing: it must not join
        // the first statement, and it may join the second.
        let rounds = GroupCommitter.rounds([
            (Self.change, Self.keys("a", "k")), (Self.change, Self.keys("a")), (Self.change, Self.keys("b", "k")),
            (Self.change, Self.keys("c")),
        ])
        #expect(rounds == [[0, 3], [1, 2]])
        // Shares with the second statement only: goes to a third, whatever the first holds.
        let later = GroupCommitter.rounds([
            (Self.change, Self.keys("a")), (Self.change, Self.keys("a")), (Self.change, Self.keys("b")),
            (Self.change, Self.keys("a")), (Self.change, Self.keys("b")),
        ])
        #expect(later == [[0, 2], [1, 4], [3]])
    }

    @Test("kinds never share a statement; they follow each other in the order of their first write")
    func kindsApart() {
        let rounds = GroupCommitter.rounds([
            (Self.start, Self.keys("s1")), (Self.change, Self.keys("a")), (Self.start, Self.keys("s2")),
            (Self.change, Self.keys("a")), (Self.start, Self.keys("s1")),
        ])
        #expect(rounds == [[0, 2], [4], [1], [3]])
        #expect(GroupCommitter.rounds([]).isEmpty)
        // Every write is placed once.
        #expect(rounds.flatMap { $0 }.sorted() == Array(0..<5))
    }

    @Test("a claim's room is shared equally among tenants, the first ones taking the remainder, one each at least")
    func claimShares() {
        #expect(DeliveryQueue.shares(count: 3, limit: 10) == [4, 3, 3])
        #expect(DeliveryQueue.shares(count: 2, limit: 256) == [128, 128])
        #expect(DeliveryQueue.shares(count: 4, limit: 2) == [1, 1, 1, 1])
        #expect(DeliveryQueue.shares(count: 1, limit: 7) == [7])
        #expect(DeliveryQueue.shares(count: 0, limit: 7).isEmpty)
        for count in 1...40 {
            for limit in [1, 5, 39, 40, 41, 256] {
                let shares = DeliveryQueue.shares(count: count, limit: limit)
                #expect(shares.count == count && shares.allSatisfy { $0 >= 1 })
                #expect(shares.reduce(0, +) == max(count, limit), "count \(count), limit \(limit)")
                #expect(shares.max()! - shares.min()! <= 1)
            }
        }
    }
}

@Suite("Batches")
struct BatchesTests {
    private struct Bad: Error {}

    @Test("a batch that fails as a whole is read again an item at a time: each caller gets its own answer")
    func answerEachAlone() async {
        let reads = Mutex<[[Int]]>([])
        let answers = await answerEach([1, 2, 3]) { (batch: [Int]) async throws -> [Int] in
            reads.withLock { $0.append(batch) }
            if batch.contains(2) { throw Bad() }
            return batch.map { $0 * 10 }
        }
        #expect(reads.withLock { $0 } == [[1, 2, 3], [1], [2], [3]])
        #expect(answers.map { try? $0.get() } == [10, nil, 30])
        // A batch of one is not read again.
        let alone = await answerEach([2]) { (batch: [Int]) async throws -> [Int] in
            reads.withLock { $0.append(batch) }
            throw Bad()
        }
        #expect(alone.count == 1 && (try? alone[0].get()) == nil)
        #expect(reads.withLock { $0.count } == 5)
    }

    @Test("a lone item runs at once; items queued behind a busy runner go out together, at most maxBatch a batch")
    func queuedItemsGoTogether() async throws {
        let batches = Batches<Int, Int>(concurrency: 1, maxBatch: 3)
        let ran = Mutex<[[Int]]>([])
        let (release, open) = AsyncStream<Void>.makeStream()
        let run: Batches<Int, Int>.Run = { batch in
            ran.withLock { $0.append(batch) }
            if batch == [0] {
                for await _ in release { break }
            }
            return batch.map { .success($0 * 10) }
        }
        let first = Task { try await batches.submit(0, run: run) }
        try await Self.eventually("the first item runs alone") { ran.withLock { $0 } == [[0]] }
        let others = (1...5).map { item in Task { try await batches.submit(item, run: run) } }
        try await Self.eventually("five items wait for the busy runner") { batches.queued == 5 }
        open.yield()
        #expect(try await first.value == 0)
        for (offset, task) in others.enumerated() { #expect(try await task.value == (offset + 1) * 10) }
        let all = ran.withLock { $0 }
        #expect(all.first == [0] && all.dropFirst().allSatisfy { $0.count <= 3 }, "\(all)")
        #expect(all.dropFirst().flatMap { $0 }.sorted() == [1, 2, 3, 4, 5], "\(all)")
        #expect(all.count == 3, "five queued items in two batches: \(all)")
        #expect(batches.queued == 0)
    }

    @Test("a runner that answers fewer items than it was given fails the unanswered ones, not the others")
    func missingAnswers() async throws {
        let batches = Batches<Int, Int>(concurrency: 1, maxBatch: 8)
        let answered = try await batches.submit(7) { batch in batch.map { .success($0) } }
        #expect(answered == 7)
        await #expect(throws: BatchUnanswered.self) {
            try await batches.submit(8) { _ in [] }
        }
    }

    /// Polls `condition` until it holds, failing after `timeout` (a loaded machine may be slow; never a fixed sleep).
    static func eventually(
        _ what: String, timeout: Duration = .seconds(60), _ condition: () throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + timeout
        while try !condition() {
            guard ContinuousClock.now < deadline else {
                Issue.record("timed out waiting: \(what)")
                throw CancellationError()
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}
