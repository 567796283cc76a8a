import Foundation
import PostgresClient
import Synchronization

/// Commits many requests' writes in one transaction (group commit), so that throughput is not bounded by one
/// commit — one WAL flush — per request.
///
/// Each submission is, for one tenant, either a self-contained statement or a `SetWrite`: the batch's set writes of one
/// kind and tenant share one statement over arrays. Batches form as `Batches` forms them (no background loop; up to
/// `writers` at once, each of up to `maxBatch`). A batch is one pipelined round trip with one sync point: `BEGIN;
/// generic plans; (enter tenant; its statements…)…; pg_notify(channel); COMMIT`. Every caller is answered only after
/// COMMIT succeeded, so an accepted request is durable. If anything in a batch fails, the batch is rolled back and
/// each submission is retried alone, so one bad request never fails the others. The single NOTIFY per batch is the
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

    private struct Submission: Sendable {
        var tenant: UUID
        var body: Body
    }

    private enum Body: Sendable {
        /// A statement of its own.
        case query(PostgresQuery)
        /// A part of a set-based statement shared with the batch's other writes of its kind and tenant.
        case part(SetPart)
    }

    /// A `SetWrite`, its type erased: `compose` builds the statement of a group of writes of one kind.
    private struct SetPart: Sendable {
        var kind: ObjectIdentifier
        var keys: [String]
        var write: any SetWrite
        var compose: @Sendable (_ tenant: UUID, _ writes: [any SetWrite]) -> PostgresQuery
    }

    /// A batch member's answer: the rows of the statement it ran in and its row there (0 for a statement of its own).
    private struct Answer: Sendable {
        var rows: PostgresRows
        var row: Int
    }

    private let pool: PostgresPool
    private let notifyChannel: String?
    private let statisticsState = Mutex(Statistics())
    private let onBatch: @Sendable (_ statements: Int) -> Void
    private let batches: Batches<Submission, Answer>

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

    /// Submissions waiting for a writer.
    var queued: Int { batches.queued }

    /// Runs `query` for `tenant` in a shared transaction; returns its rows once that transaction has committed.
    public func submit(tenant: UUID, _ query: PostgresQuery) async throws -> PostgresRows {
        try await batches.submit(Submission(tenant: tenant, body: .query(query))) { await commit($0) }.rows
    }

    /// Runs `write` for `tenant` in a shared transaction, in one statement with the batch's other writes of its kind
    /// and tenant (set-based); returns its row of that statement once the transaction has committed.
    public func submit<Write: SetWrite>(tenant: UUID, _ write: Write) async throws -> PostgresRow {
        let part = SetPart(
            kind: ObjectIdentifier(Write.self), keys: write.exclusiveKeys, write: write,
            compose: { tenant, writes in Write.statement(tenant: tenant, writes.compactMap { $0 as? Write }) })
        let answer = try await batches.submit(Submission(tenant: tenant, body: .part(part))) { await commit($0) }
        guard answer.row < answer.rows.count else { throw SetWriteUnanswered() }
        return answer.rows[answer.row]
    }

    /// The statements of one tenant's part of a batch: each `.query` alone, and the set writes of each kind in as few
    /// statements as their exclusive keys allow (a write whose key an earlier write of the group has goes to a later
    /// statement, so the writes of one key run in the order they came). Each member's statement and row.
    private static func statements(_ members: [(index: Int, body: Body)], tenant: UUID) -> (
        queries: [PostgresQuery], members: [(index: Int, statement: Int, row: Int)]
    ) {
        var queries: [PostgresQuery] = []
        var placed: [(index: Int, statement: Int, row: Int)] = []
        // Groups of one kind, in the order of their first member: each a list of rounds (writes, keys taken).
        var groups: [ObjectIdentifier: [(writes: [(index: Int, part: SetPart)], keys: Set<String>)]] = [:]
        var kinds: [ObjectIdentifier] = []
        for member in members {
            switch member.body {
            case .query(let query):
                placed.append((member.index, queries.count, 0))
                queries.append(query)
            case .part(let part):
                if groups[part.kind] == nil { kinds.append(part.kind) }
                var rounds = groups[part.kind, default: []]
                // The first round after every round holding one of its keys.
                var round = rounds.count
                while round > 0, rounds[round - 1].keys.isDisjoint(with: part.keys) { round -= 1 }
                if round == rounds.count { rounds.append(([], [])) }
                rounds[round].writes.append((member.index, part))
                rounds[round].keys.formUnion(part.keys)
                groups[part.kind] = rounds
            }
        }
        for kind in kinds {
            for round in groups[kind]! {
                for (row, write) in round.writes.enumerated() {
                    placed.append((write.index, queries.count, row))
                }
                queries.append(round.writes[0].part.compose(tenant, round.writes.map(\.part.write)))
            }
        }
        return (queries, placed)
    }

    private func commit(_ batch: [Submission]) async -> [Result<Answer, any Error>] {
        // Each tenant is entered once, its statements after it (entering costs more than a short statement: it
        // switches the role). Statements of one batch are independent requests, each committed with all the others
        // or retried alone, so grouping them by tenant (and a tenant's set writes into shared statements) changes no
        // outcome.
        var queries: [PostgresQuery] = [Self.genericPlans]
        var position = [(statement: Int, row: Int)](repeating: (0, 0), count: batch.count)
        var tenants: [UUID] = []
        var byTenant: [UUID: [(index: Int, body: Body)]] = [:]
        for (i, item) in batch.enumerated() {
            if byTenant[item.tenant] == nil { tenants.append(item.tenant) }
            byTenant[item.tenant, default: []].append((i, item.body))
        }
        for tenant in tenants {
            queries.append("SELECT marquee_enter_tenant(\(tenant))")
            let part = Self.statements(byTenant[tenant]!, tenant: tenant)
            for member in part.members {
                position[member.index] = (queries.count + member.statement, member.row)
            }
            queries.append(contentsOf: part.queries)
        }
        if let channel = notifyChannel {
            queries.append("SELECT pg_notify(\(channel), '')")
        }
        let statements = queries
        do {
            let results = try await pool.withConnection { try $0.pipelineTransaction(statements) }
            statisticsState.withLock {
                $0.batches += 1
                $0.statements += batch.count
            }
            onBatch(batch.count)
            return position.map { .success(Answer(rows: results[$0.statement], row: $0.row)) }
        } catch {
            // A statement failed (the batch was rolled back), or the batch could not run at all (no connection,
            // connection lost): fall through to one at a time, which reports each caller's own outcome.
        }
        statisticsState.withLock { $0.fallbacks += 1 }
        var answers: [Result<Answer, any Error>] = []
        for item in batch {
            answers.append(await commitAlone(item))
        }
        return answers
    }

    /// Makes a transaction's statements use their generic plans. A batch's statements are the same few statements
    /// over arrays of 1 to `maxBatch` rows, planned for that: left to `auto`, PostgreSQL re-planned the set-based write
    /// in one call of ten (4 ms a plan, 1.8 s of a 10-second api-update run) and the batched targets read in more than
    /// half (2.7 s: more than running it).
    static let genericPlans: PostgresQuery = "SET LOCAL plan_cache_mode = force_generic_plan"

    private func commitAlone(_ item: Submission) async -> Result<Answer, any Error> {
        let channel = notifyChannel
        let query =
            switch item.body {
            case .query(let query): query
            case .part(let part): part.compose(item.tenant, [part.write])
            }
        do {
            let rows = try await pool.transaction { connection in
                try connection.query(Self.genericPlans)
                try connection.enterTenant(item.tenant)
                let rows = try connection.query(query)
                if let channel { try connection.query("SELECT pg_notify(\(channel), '')") }
                return rows
            }
            return .success(Answer(rows: rows, row: 0))
        } catch {
            return .failure(error)
        }
    }
}

/// A write that shares one statement with the other writes of its kind and tenant in a group-commit batch: one
/// set-based statement (arrays and `unnest()`) instead of one statement each.
public protocol SetWrite: Sendable {
    /// Two writes sharing a key never share a statement: the later one goes to a later statement of the same
    /// transaction (e.g. two changes of one instance).
    var exclusiveKeys: [String] { get }
    /// One statement writing all of `writes` (at least one; no two share an exclusive key) for `tenant`, inside its
    /// row-level security. Its result has one row per write, in the order of `writes`.
    static func statement(tenant: UUID, _ writes: [Self]) -> PostgresQuery
}

/// A set-based statement returned fewer rows than it had writes (a bug).
struct SetWriteUnanswered: Error {}

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
    ///
    /// `genericPlans`: the statements are planned once per connection and the plan reused whatever the values
    /// (`plan_cache_mode`, for this transaction): for statements over arrays of a batch's values, whose custom plans
    /// PostgreSQL would otherwise make again and again (a millisecond or more each, more than they take to run).
    func tenantReads(_ reads: [(tenant: UUID, queries: [PostgresQuery])], genericPlans: Bool = false) async throws
        -> [[PostgresRows]]
    {
        var all: [PostgresQuery] = genericPlans ? [GroupCommitter.genericPlans] : []
        for read in reads {
            all.append("SELECT marquee_enter_tenant(\(read.tenant))")
            all.append(contentsOf: read.queries)
        }
        let statements = all
        let results = try await pool.withConnection {
            try $0.pipelineTransaction(statements, begin: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        }
        var rows: [[PostgresRows]] = []
        var next = genericPlans ? 2 : 1  // after entering the first tenant
        for read in reads {
            rows.append(Array(results[next..<next + read.queries.count]))
            next += read.queries.count + 1
        }
        return rows
    }
}
