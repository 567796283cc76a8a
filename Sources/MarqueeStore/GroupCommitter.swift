import Foundation
import PostgresClient
import Synchronization

/// Commits many requests' writes in one transaction (group commit), so that throughput is not bounded by one
/// commit — one WAL flush — per request.
///
/// Each submission is one self-contained statement (typically a data-modifying CTE) for one tenant. There is no
/// background loop: the first submitter that finds fewer than `writers` batches in progress becomes a writer and
/// commits everything queued (its own statement included) in batches of up to `maxBatch`, then steps down when the
/// queue is empty; the others just wait for their result. A batch is one pipelined round trip:
/// `BEGIN; (enter tenant; statement)…; pg_notify(channel); COMMIT`. Every caller is answered only after COMMIT
/// succeeded, so an accepted request is durable. If anything in a batch fails, the batch is rolled back and each
/// statement is retried alone, so one bad request never fails the others. The single NOTIFY per batch is the
/// coalesced wake-up for workers.
public final class GroupCommitter: Sendable {
    public struct Configuration: Sendable {
        /// Batches committed at once (each on its own connection). Default 4.
        public var writers: Int
        /// Statements per transaction at most. Default 128.
        public var maxBatch: Int
        /// Channel notified once per committed batch; nil for none. Default `marquee_deliveries`.
        public var notifyChannel: String?

        public init(writers: Int = 4, maxBatch: Int = 128, notifyChannel: String? = "marquee_deliveries") {
            self.writers = writers
            self.maxBatch = maxBatch
            self.notifyChannel = notifyChannel
        }
    }

    /// Counts for metrics: batches committed and statements in them.
    public struct Statistics: Sendable, Equatable {
        public var batches: Int = 0
        public var statements: Int = 0
        public var fallbacks: Int = 0
    }

    private struct Pending: Sendable {
        var tenant: UUID
        var query: PostgresQuery
        var promise: Promise<PostgresRows>
    }

    private struct State {
        var queue: [Pending] = []
        var activeWriters = 0
        var statistics = Statistics()
    }

    private let pool: PostgresPool
    private let configuration: Configuration
    private let state = Mutex(State())
    private let onBatch: @Sendable (_ statements: Int) -> Void

    /// `onBatch` is told the size of every batch committed (for a histogram).
    public init(
        pool: PostgresPool, configuration: Configuration = .init(),
        onBatch: @escaping @Sendable (_ statements: Int) -> Void = { _ in }
    ) {
        self.pool = pool
        self.configuration = configuration
        self.onBatch = onBatch
    }

    public var statistics: Statistics { state.withLock { $0.statistics } }

    /// Runs `query` for `tenant` in a shared transaction; returns its rows once that transaction has committed.
    public func submit(tenant: UUID, _ query: PostgresQuery) async throws -> PostgresRows {
        let promise = Promise<PostgresRows>()
        let lead = state.withLock { state in
            state.queue.append(Pending(tenant: tenant, query: query, promise: promise))
            guard state.activeWriters < configuration.writers else { return false }
            state.activeWriters += 1
            return true
        }
        if lead { await write() }
        return try await promise.value()
    }

    /// Commits batches until the queue is empty.
    private func write() async {
        while true {
            let batch: [Pending]? = state.withLock { state in
                if state.queue.isEmpty {
                    state.activeWriters -= 1
                    return nil
                }
                let count = min(configuration.maxBatch, state.queue.count)
                let batch = Array(state.queue.prefix(count))
                state.queue.removeFirst(count)
                return batch
            }
            guard let batch else { return }
            await commit(batch)
        }
    }

    private func commit(_ batch: [Pending]) async {
        var queries: [PostgresQuery] = ["BEGIN"]
        for item in batch {
            queries.append("SELECT marquee_enter_tenant(\(item.tenant))")
            queries.append(item.query)
        }
        if let channel = configuration.notifyChannel {
            queries.append("SELECT pg_notify(\(channel), '')")
        }
        queries.append("COMMIT")
        let statements = queries
        do {
            let results = try await pool.withConnection { connection in
                let results = try connection.pipeline(statements)
                // A COMMIT after an error answers ROLLBACK without an error: check every result, COMMIT's too.
                if results.contains(where: { if case .failure = $0 { true } else { false } }) {
                    _ = try? connection.execute("ROLLBACK")
                    return [Result<PostgresRows, PostgresError>]?.none
                }
                return results
            }
            if let results {
                for (i, item) in batch.enumerated() {
                    item.promise.fulfill(results[2 + 2 * i].mapError { $0 as any Error })
                }
                state.withLock {
                    $0.statistics.batches += 1
                    $0.statistics.statements += batch.count
                }
                onBatch(batch.count)
                return
            }
        } catch {
            // The whole batch could not run (no connection, connection lost): fall through to one at a time, which
            // reports each caller's own error.
        }
        state.withLock { $0.statistics.fallbacks += 1 }
        for item in batch {
            item.promise.fulfill(await commitAlone(item))
        }
    }

    private func commitAlone(_ item: Pending) async -> Result<PostgresRows, any Error> {
        let channel = configuration.notifyChannel
        do {
            let rows = try await pool.transaction { connection in
                try connection.enterTenant(item.tenant)
                let rows = try connection.query(item.query)
                if let channel { try connection.query("SELECT pg_notify(\(channel), '')") }
                return rows
            }
            return .success(rows)
        } catch {
            return .failure(error)
        }
    }
}

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

extension TenantDatabase {
    /// Runs `queries` for `tenant` in one read-only transaction, in one round trip (pipelined), and returns each
    /// query's rows. Throws the first error. All the queries read one snapshot (REPEATABLE READ; a read-only
    /// transaction never fails to serialize there): under READ COMMITTED each would take its own, and a read could
    /// see a campaign's run done in one query and not yet in the one before.
    public func tenantRead(_ tenant: UUID, _ queries: [PostgresQuery]) async throws -> [PostgresRows] {
        var all: [PostgresQuery] = [
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SELECT marquee_enter_tenant(\(tenant))",
        ]
        all.append(contentsOf: queries)
        all.append("COMMIT")
        let statements = all
        let results = try await pool.withConnection { connection in
            let results = try connection.pipeline(statements)
            if results.contains(where: { if case .failure = $0 { true } else { false } }) {
                _ = try? connection.execute("ROLLBACK")
            }
            return results
        }
        var rows: [PostgresRows] = []
        for result in results.dropFirst(2).dropLast() {
            rows.append(try result.get())
        }
        return rows
    }
}
