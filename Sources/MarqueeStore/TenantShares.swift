import Foundation
import PostgresClient
import Synchronization

/// How many of one tenant's transactions may hold (or wait for) a pool connection at once.
///
/// The pool is shared by every tenant of a process and hands its connections out first come, first served: without a
/// share, one tenant's burst (a fleet of apps registering tokens at once, or a flood with its public sdk key) queued
/// ahead of every other tenant's requests, which waited behind all of it and timed out. With a share, a tenant's
/// requests beyond it wait in a queue of their own, and another tenant's request waits at most for a connection the
/// busy tenant's admitted work (no more than `limit` transactions) gives back. A wait longer than `timeout` fails as
/// a wait for the pool does (`.poolTimeout`: 503 `database-unavailable`).
public final class TenantShares: Sendable {
    private struct Waiter {
        var id: UInt64
        var continuation: CheckedContinuation<Void, any Error>
        /// Ends the wait after `timeout`; cancelled when the wait ends otherwise (a sleeping task is kept until its
        /// sleep would have ended unless cancelled).
        var timer: Task<Void, Never>?
    }

    private struct State {
        var held: [UUID: Int] = [:]
        var waiting: [UUID: [Waiter]] = [:]
        var nextID: UInt64 = 0
    }

    /// Transactions of one tenant admitted at once.
    public let limit: Int
    /// How long a transaction waits for its tenant's share.
    public let timeout: Duration
    private let state = Mutex(State())

    public init(limit: Int, timeout: Duration) {
        self.limit = max(1, limit)
        self.timeout = timeout
    }

    /// Half of the pool's connections for any one tenant, waited for as long as the pool is.
    public convenience init(pool: PostgresPool) {
        self.init(limit: pool.options.maxConnections / 2, timeout: pool.options.acquireTimeout)
    }

    /// Runs `body` once `tenant` has a share free, and gives the share back after.
    public func withShare<T: Sendable>(_ tenant: UUID, _ body: () async throws -> T) async throws -> T {
        try await acquire(tenant)
        defer { release(tenant) }
        return try await body()
    }

    /// The tenant's transactions admitted now, and those waiting (for tests and metrics).
    public func counts(_ tenant: UUID) -> (held: Int, waiting: Int) {
        state.withLock { ($0.held[tenant] ?? 0, $0.waiting[tenant]?.count ?? 0) }
    }

    private func acquire(_ tenant: UUID) async throws {
        let id: UInt64? = state.withLock { state in
            if state.held[tenant, default: 0] < limit, state.waiting[tenant] == nil {
                state.held[tenant, default: 0] += 1
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                state.withLock { $0.waiting[tenant, default: []].append(Waiter(id: id, continuation: continuation)) }
                // Cancelled before the waiter was there to be found.
                if Task.isCancelled { abandon(tenant, id, CancellationError()) }
                // A share given back between the two locks found no waiter: hand the free one on now.
                handOff(tenant)
                let timer = Task { [timeout] in
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    self.abandon(
                        tenant, id,
                        PostgresError(
                            code: .poolTimeout, context: "the tenant's share of connections was busy for \(timeout)"))
                }
                let waiting = state.withLock { state in
                    guard let index = state.waiting[tenant]?.firstIndex(where: { $0.id == id }) else { return false }
                    state.waiting[tenant]![index].timer = timer
                    return true
                }
                if !waiting { timer.cancel() }
            }
        } onCancel: {
            abandon(tenant, id, CancellationError())
        }
    }

    private func release(_ tenant: UUID) {
        state.withLock { state in
            let held = state.held[tenant, default: 1] - 1
            state.held[tenant] = held > 0 ? held : nil
        }
        handOff(tenant)
    }

    /// Admits the first waiter of `tenant` if its share has room.
    private func handOff(_ tenant: UUID) {
        let next: Waiter? = state.withLock { state in
            guard state.held[tenant, default: 0] < limit, var queue = state.waiting[tenant], !queue.isEmpty else {
                return nil
            }
            let first = queue.removeFirst()
            state.waiting[tenant] = queue.isEmpty ? nil : queue
            state.held[tenant, default: 0] += 1
            return first
        }
        next?.timer?.cancel()
        next?.continuation.resume()
    }

    /// Ends a wait that timed out or was cancelled, if it is still waiting (if it was admitted, it runs).
    private func abandon(_ tenant: UUID, _ id: UInt64, _ error: any Error) {
        let waiter: Waiter? = state.withLock { state in
            guard var queue = state.waiting[tenant], let index = queue.firstIndex(where: { $0.id == id }) else {
                return nil
            }
            let waiter = queue.remove(at: index)
            state.waiting[tenant] = queue.isEmpty ? nil : queue
            return waiter
        }
        waiter?.timer?.cancel()
        waiter?.continuation.resume(throwing: error)
    }
}
