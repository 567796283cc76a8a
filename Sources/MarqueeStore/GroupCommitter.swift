import Foundation
import PostgresClient
import Synchronization

/// Commits many requests' writes in one transaction (group commit), so that throughput is not bounded by one
/// commit — one WAL flush — per request.
///
/// Each submission is one self-contained statement (typically a data-modifying CTE) for one tenant. Batches form as
/// `Batches` forms them (no background loop; up to `writers` at once, each of up to `maxBatch`). A batch is one
/// pipelined round trip: `BEGIN; (enter tenant; its statements…)…; pg_notify(channel); COMMIT`. Every caller is answered
/// only after COMMIT succeeded, so an accepted request is durable. If anything in a batch fails, the batch is rolled
/// back and each statement is retried alone, so one bad request never fails the others. The single NOTIFY per batch
/// is the coalesced wake-up for workers.
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

    private struct Submission: Sendable {
        var tenant: UUID
        var query: PostgresQuery
    }

    private let pool: PostgresPool
    private let notifyChannel: String?
    private let statisticsState = Mutex(Statistics())
    private let onBatch: @Sendable (_ statements: Int) -> Void
    private let batches: Batches<Submission, PostgresRows>

    /// `onBatch` is told the size of every batch committed (for a histogram).
    public init(
        pool: PostgresPool, configuration: Configuration = .init(),
        onBatch: @escaping @Sendable (_ statements: Int) -> Void = { _ in }
    ) {
        self.pool = pool
        self.notifyChannel = configuration.notifyChannel
        self.onBatch = onBatch
        batches = Batches(concurrency: configuration.writers, maxBatch: configuration.maxBatch)
    }

    public var statistics: Statistics { statisticsState.withLock { $0 } }

    /// Runs `query` for `tenant` in a shared transaction; returns its rows once that transaction has committed.
    public func submit(tenant: UUID, _ query: PostgresQuery) async throws -> PostgresRows {
        try await batches.submit(Submission(tenant: tenant, query: query)) { await commit($0) }
    }

    private func commit(_ batch: [Submission]) async -> [Result<PostgresRows, any Error>] {
        // Each tenant is entered once, its statements after it in the order they came (entering costs more than a
        // short statement: it switches the role). Statements of one batch are independent requests, each committed
        // with all the others or retried alone, so grouping them by tenant changes no outcome.
        var queries: [PostgresQuery] = ["BEGIN"]
        var resultIndex = [Int](repeating: 0, count: batch.count)
        var tenants: [UUID] = []
        var byTenant: [UUID: [Int]] = [:]
        for (i, item) in batch.enumerated() {
            if byTenant[item.tenant] == nil { tenants.append(item.tenant) }
            byTenant[item.tenant, default: []].append(i)
        }
        for tenant in tenants {
            queries.append("SELECT marquee_enter_tenant(\(tenant))")
            for i in byTenant[tenant]! {
                resultIndex[i] = queries.count
                queries.append(batch[i].query)
            }
        }
        if let channel = notifyChannel {
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
                statisticsState.withLock {
                    $0.batches += 1
                    $0.statements += batch.count
                }
                onBatch(batch.count)
                return resultIndex.map { results[$0].mapError { $0 as any Error } }
            }
        } catch {
            // The whole batch could not run (no connection, connection lost): fall through to one at a time, which
            // reports each caller's own error.
        }
        statisticsState.withLock { $0.fallbacks += 1 }
        var answers: [Result<PostgresRows, any Error>] = []
        for item in batch {
            answers.append(await commitAlone(item))
        }
        return answers
    }

    private func commitAlone(_ item: Submission) async -> Result<PostgresRows, any Error> {
        let channel = notifyChannel
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

extension TenantDatabase {
    /// Runs `queries` for `tenant` in one read-only transaction, in one round trip (pipelined), and returns each
    /// query's rows. Throws the first error. All the queries read one snapshot (REPEATABLE READ; a read-only
    /// transaction never fails to serialize there): under READ COMMITTED each would take its own, and a read could
    /// see a campaign's run done in one query and not yet in the one before.
    public func tenantRead(_ tenant: UUID, _ queries: [PostgresQuery]) async throws -> [PostgresRows] {
        try await tenantReads([(tenant, queries)])[0]
    }

    /// `tenantRead` for several tenants in the same transaction and round trip: each tenant's queries run inside its
    /// own row-level security (entered before them). Returns each tenant's rows, in order.
    func tenantReads(_ reads: [(tenant: UUID, queries: [PostgresQuery])]) async throws -> [[PostgresRows]] {
        var all: [PostgresQuery] = ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"]
        for read in reads {
            all.append("SELECT marquee_enter_tenant(\(read.tenant))")
            all.append(contentsOf: read.queries)
        }
        all.append("COMMIT")
        let statements = all
        let results = try await pool.withConnection { connection in
            let results = try connection.pipeline(statements)
            if results.contains(where: { if case .failure = $0 { true } else { false } }) {
                _ = try? connection.execute("ROLLBACK")
            }
            return results
        }
        var rows: [[PostgresRows]] = []
        var next = 1
        for read in reads {
            _ = try results[next].get()  // entering the tenant
            next += 1
            rows.append(try results[next..<next + read.queries.count].map { try $0.get() })
            next += read.queries.count
        }
        return rows
    }
}
