import Foundation
import Synchronization

/// One line per instance in this process: changes of the same instance wait for each other here instead of racing
/// for its row in PostgreSQL, and the change at the head of the line carries the ones queued behind it, so a burst
/// of updates to one hot instance (a live score) becomes one read and one write rather than a convoy of version
/// conflicts and retries.
///
/// There is no background task: a change that finds the line empty leads at once; one that finds it busy waits in
/// the queue until the leader answers it, or hands it the lead. A leader takes the queued changes that `canJoin`
/// allows after its own (at most `maxBatch`), runs them, answers them, and passes the lead to the first change still
/// queued, if any.
final class InstanceLines<Key: Hashable & Sendable, Change: Sendable, Answer: Sendable>: Sendable {
    typealias Answers = [Result<Answer, any Error>]

    private enum Turn: Sendable {
        case lead
        case answer(Result<Answer, any Error>)
    }

    private struct Ticket: Sendable {
        var change: Change
        var continuation: CheckedContinuation<Turn, Never>
    }

    private let lines = Mutex<[Key: [Ticket]]>([:])
    private let maxBatch: Int
    private let canJoin: @Sendable (_ leader: Change, _ next: Change) -> Bool

    /// `canJoin` says whether `next` may be run in the same batch as `leader` (a change that must run alone, such
    /// as one with an Idempotency-Key, answers false either way).
    init(maxBatch: Int = 64, canJoin: @escaping @Sendable (_ leader: Change, _ next: Change) -> Bool) {
        self.maxBatch = maxBatch
        self.canJoin = canJoin
    }

    /// Runs `change` in `key`'s line: `run` gets it with the changes that joined it (it first) and returns one answer
    /// per change, in order.
    func submit(
        _ key: Key, _ change: Change, run: (_ batch: [Change]) async -> Answers
    ) async throws -> Answer {
        let turn = await withCheckedContinuation { (continuation: CheckedContinuation<Turn, Never>) in
            let lead = lines.withLock { lines -> Bool in
                guard lines[key] != nil else {
                    lines[key] = []
                    return true
                }
                lines[key]!.append(Ticket(change: change, continuation: continuation))
                return false
            }
            if lead { continuation.resume(returning: .lead) }
        }
        if case .answer(let result) = turn { return try result.get() }

        let joined = lines.withLock { lines -> [Ticket] in
            var queue = lines[key] ?? []
            var taken: [Ticket] = []
            while let next = queue.first, taken.count + 1 < maxBatch, canJoin(change, next.change) {
                taken.append(queue.removeFirst())
            }
            lines[key] = queue
            return taken
        }
        var answers = await run([change] + joined.map(\.change))
        // Every change gets an answer, whatever `run` returned.
        while answers.count < joined.count + 1 { answers.append(.failure(CancellationError())) }
        for (ticket, answer) in zip(joined, answers.dropFirst()) {
            ticket.continuation.resume(returning: .answer(answer))
        }
        let next = lines.withLock { lines -> Ticket? in
            guard var queue = lines[key], !queue.isEmpty else {
                lines[key] = nil
                return nil
            }
            let first = queue.removeFirst()
            lines[key] = queue
            return first
        }
        next?.continuation.resume(returning: .lead)
        return try answers[0].get()
    }
}
