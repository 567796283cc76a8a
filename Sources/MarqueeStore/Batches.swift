import Synchronization

/// Runs the items concurrent callers submit in batches: one round trip (one transaction) for many requests instead
/// of one each. The group committer's writes and the change contexts' reads use it.
///
/// There is no background loop: the first submitter that finds fewer than `concurrency` batches in progress becomes
/// a runner and runs everything queued (its own item included) in batches of up to `maxBatch`; once its own item is
/// answered it hands what is still queued to a task of its own, which steps down when the queue is empty; the others
/// just wait for their answer. An idle process adds no delay (a lone item runs at
/// once, alone); under load, items queue while the runners are busy and go out together.
final class Batches<Item: Sendable, Output: Sendable>: Sendable {
    typealias Run = @Sendable (_ batch: [Item]) async -> [Result<Output, any Error>]

    private struct Pending: Sendable {
        var item: Item
        var promise: Promise<Output>
    }

    private struct State {
        var queue: [Pending] = []
        var running = 0
    }

    private let concurrency: Int
    private let maxBatch: Int
    private let state = Mutex(State())

    init(concurrency: Int, maxBatch: Int) {
        precondition(concurrency >= 1 && maxBatch >= 1)
        self.concurrency = concurrency
        self.maxBatch = maxBatch
    }

    /// Items waiting for a runner.
    var queued: Int { state.withLock { $0.queue.count } }

    /// Answers `item` once a batch with it ran. If this caller becomes a runner, `run` runs its batches (every caller
    /// of one `Batches` passes the same function); it answers every item of a batch, in order (a missing answer fails
    /// its item).
    func submit(_ item: Item, run: @escaping Run) async throws -> Output {
        let promise = Promise<Output>()
        let lead = state.withLock { state in
            state.queue.append(Pending(item: item, promise: promise))
            guard state.running < concurrency else { return false }
            state.running += 1
            return true
        }
        if lead { await drain(run, answering: promise) }
        return try await promise.value()
    }

    /// Runs batches until the queue is empty, or, for a caller's runner (`own`), until its own item was answered: what
    /// is queued then goes on in a task of its own, so a caller is not held after its answer for as long as others
    /// keep coming (at 1,000 updates/s, a runner's request waited for the queue to run dry: up to 1.5 s).
    private func drain(_ run: @escaping Run, answering own: Promise<Output>? = nil) async {
        while true {
            let batch: [Pending]? = state.withLock { state in
                if state.queue.isEmpty {
                    state.running -= 1
                    return nil
                }
                let count = min(maxBatch, state.queue.count)
                defer { state.queue.removeFirst(count) }
                return Array(state.queue.prefix(count))
            }
            guard let batch else { return }
            let answers = await run(batch.map(\.item))
            for (i, pending) in batch.enumerated() {
                pending.promise.fulfill(i < answers.count ? answers[i] : .failure(BatchUnanswered()))
            }
            if let own, own.isFulfilled {
                // The runner's place (`running`) passes to the task, or is given up when nothing waits.
                let more = state.withLock { state in
                    if state.queue.isEmpty { state.running -= 1 }
                    return !state.queue.isEmpty
                }
                if more { Task { await self.drain(run) } }
                return
            }
        }
    }
}

/// Answers a batch of reads with `read` (one answer per item, in order), or, if the batch fails as a whole, each item
/// alone, so that each caller gets its own answer or error.
func answerEach<Item: Sendable, Output: Sendable>(
    _ batch: [Item], _ read: ([Item]) async throws -> [Output]
) async -> [Result<Output, any Error>] {
    do {
        return try await read(batch).map { .success($0) }
    } catch {
        guard batch.count > 1 else { return [.failure(error)] }
        var answers: [Result<Output, any Error>] = []
        for item in batch {
            do {
                answers.append(.success(try await read([item])[0]))
            } catch {
                answers.append(.failure(error))
            }
        }
        return answers
    }
}

/// A batch's runner returned fewer answers than items (a bug): the unanswered ones fail with this.
struct BatchUnanswered: Error {}

/// A value produced once, awaited by one task.
final class Promise<Value: Sendable>: Sendable {
    private struct State {
        var result: Result<Value, any Error>?
        var waiter: CheckedContinuation<Value, any Error>?
    }

    private let state = Mutex(State())

    func fulfill(_ result: Result<Value, any Error>) {
        let waiter: CheckedContinuation<Value, any Error>? = state.withLock { state in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result)
    }

    /// Whether it was fulfilled.
    var isFulfilled: Bool { state.withLock { $0.result != nil } }

    func value() async throws -> Value {
        try await withCheckedThrowingContinuation { continuation in
            let ready: Result<Value, any Error>? = state.withLock { state in
                if let result = state.result { return result }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }
}
