import Foundation
import PostgresClient
import Synchronization

/// Commits many requests' writes in one transaction (group commit), so that throughput is not bounded by one
/// commit — one WAL flush — per request.
///
/// Each submission is a `SetWrite` for one tenant: the batch's writes of one kind and tenant share one statement over
/// arrays. Batches form as `Batches` forms them (no background loop; up to `writers` at once, each of up to
/// `maxBatch`). A batch is one pipelined round trip with one sync point: `BEGIN; generic plans; (enter tenant; its
/// statements…)…; pg_notify(channel); COMMIT`. Every caller is answered only after COMMIT succeeded, so an accepted
/// request is durable. If anything in a batch fails, the batch is rolled back and each submission is written alone
/// (the same transaction with one write), so one bad request never fails the others. The single NOTIFY per batch is
/// the coalesced wake-up for workers.
///
/// A batch whose connection is lost once its COMMIT was sent (a PostgreSQL restart, a network cut, a terminated
/// backend) may have committed, so it is not written again before that is known: each transaction reads its own ID
/// first (`pipelineTransaction(_:begin:identified:)`), and the committer asks another connection whether it committed
/// (`resolve`). Aborted: each submission is written alone, as for any failure. Committed: the writes are durable, but
/// their rows are lost; every caller gets `UnansweredCommit(.committed)`, and a store re-reads its answer where the
/// write records one (a start's instance, an Idempotency-Key's record). Not known within `inDoubtTimeout`: every
/// caller gets `UnansweredCommit(.unknown)`.
public final class GroupCommitter: Sendable {
    public struct Configuration: Sendable {
        /// Batches committed at once (each on its own connection). Default 2: fewer batches in flight are larger,
        /// and a set-based statement's fixed cost (its plan's set-up, its triggers) is shared by more requests
        /// (bench/RESULTS.md, "batches in flight").
        public var writers: Int
        /// Statements per transaction at most. Default 128.
        public var maxBatch: Int
        /// Channel notified once per committed batch; nil for none. Default `marquee_deliveries`.
        public var notifyChannel: String?
        /// How long to try learning whether a batch whose connection was lost with its COMMIT in flight committed.
        /// A transaction still in progress after half of it (its backend has not noticed the lost connection) has its
        /// backend terminated, which settles it. Default 5 s.
        public var inDoubtTimeout: Duration

        public init(
            writers: Int = 2, maxBatch: Int = 128, notifyChannel: String? = "marquee_deliveries",
            inDoubtTimeout: Duration = .seconds(5)
        ) {
            self.writers = writers
            self.maxBatch = maxBatch
            self.notifyChannel = notifyChannel
            self.inDoubtTimeout = inDoubtTimeout
        }
    }

    /// Counts for metrics: batches committed and statements in them, batches written again alone, and transactions
    /// whose connection was lost with their COMMIT in flight, by what was learned of them.
    public struct Statistics: Sendable, Equatable {
        public var batches: Int = 0
        public var statements: Int = 0
        public var fallbacks: Int = 0
        /// Committed: their callers got `UnansweredCommit(.committed)`.
        public var inDoubtCommitted: Int = 0
        /// Not committed: written again alone (a batch), or failed with the lost connection (a write alone).
        public var inDoubtAborted: Int = 0
        /// Not known within `inDoubtTimeout`: their callers got `UnansweredCommit(.unknown)`.
        public var inDoubtUnknown: Int = 0

        public init(
            batches: Int = 0, statements: Int = 0, fallbacks: Int = 0, inDoubtCommitted: Int = 0,
            inDoubtAborted: Int = 0, inDoubtUnknown: Int = 0
        ) {
            self.batches = batches
            self.statements = statements
            self.fallbacks = fallbacks
            self.inDoubtCommitted = inDoubtCommitted
            self.inDoubtAborted = inDoubtAborted
            self.inDoubtUnknown = inDoubtUnknown
        }
    }

    /// A `SetWrite` for a tenant, its type erased: `compose` builds the statement of a group of writes of its kind.
    private struct Submission: Sendable {
        var tenant: UUID
        var kind: ObjectIdentifier
        var keys: [String]
        var write: any SetWrite
        var compose: @Sendable (_ tenant: UUID, _ writes: [any SetWrite]) -> [PostgresQuery]
    }

    /// A submission's row: the rows of the statement it ran in and its row there.
    private struct Answer: Sendable {
        var rows: PostgresRows
        var row: Int
    }

    private let pool: PostgresPool
    private let notifyChannel: String?
    private let inDoubtTimeout: Duration
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
        self.inDoubtTimeout = configuration.inDoubtTimeout
        self.onBatch = onBatch
        batches = Batches(concurrency: configuration.writers, maxBatch: configuration.maxBatch)
    }

    public var statistics: Statistics { statisticsState.withLock { $0 } }

    /// Submissions waiting for a writer.
    var queued: Int { batches.queued }

    /// Runs `write` for `tenant` in a shared transaction, in one statement with the batch's other writes of its kind
    /// and tenant (set-based); returns its row of that statement once the transaction has committed.
    public func submit<Write: SetWrite>(tenant: UUID, _ write: Write) async throws -> PostgresRow {
        let submission = Submission(
            tenant: tenant, kind: ObjectIdentifier(Write.self), keys: write.exclusiveKeys, write: write,
            compose: { tenant, writes in
                let writes = writes.compactMap { $0 as? Write }
                return [Write.statement(tenant: tenant, writes)]
                    + [Write.afterwards(tenant: tenant, writes)].compactMap { $0 }
            })
        let answer = try await batches.submit(submission) { await self.commit($0) }
        guard answer.row < answer.rows.count else { throw SetWriteUnanswered() }
        return answer.rows[answer.row]
    }

    /// One tenant's statements, as `rounds` places its writes. Each member's statement and row.
    private static func statements(_ members: [(index: Int, submission: Submission)], tenant: UUID) -> (
        queries: [PostgresQuery], members: [(index: Int, statement: Int, row: Int)]
    ) {
        var queries: [PostgresQuery] = []
        var placed: [(index: Int, statement: Int, row: Int)] = []
        for round in rounds(members.map { (kind: $0.submission.kind, keys: $0.submission.keys) }) {
            let writes = round.map { members[$0] }
            for (row, write) in writes.enumerated() {
                placed.append((write.index, queries.count, row))
            }
            queries.append(contentsOf: writes[0].submission.compose(tenant, writes.map(\.submission.write)))
        }
        return (queries, placed)
    }

    /// Where one tenant's writes go: the writes of each kind in as few statements as their exclusive keys allow. A
    /// write goes to the first statement of its kind after every statement holding one of its keys, so the writes of
    /// one key run in the order they came and never share a statement. Kinds follow each other in the order of their
    /// first write. Returns the statements in order, each the indices of its writes (in `members`), in order.
    static func rounds(_ members: [(kind: ObjectIdentifier, keys: [String])]) -> [[Int]] {
        var groups: [ObjectIdentifier: [(writes: [Int], keys: Set<String>)]] = [:]
        var kinds: [ObjectIdentifier] = []
        for (index, member) in members.enumerated() {
            if groups[member.kind] == nil { kinds.append(member.kind) }
            var rounds = groups[member.kind, default: []]
            var round = rounds.count
            while round > 0, rounds[round - 1].keys.isDisjoint(with: member.keys) { round -= 1 }
            if round == rounds.count { rounds.append(([], [])) }
            rounds[round].writes.append(index)
            rounds[round].keys.formUnion(member.keys)
            groups[member.kind] = rounds
        }
        return kinds.flatMap { groups[$0, default: []].map(\.writes) }
    }

    private func commit(_ batch: [Submission]) async -> [Result<Answer, any Error>] {
        do {
            let answers = try await settled(batch)
            return answers.map { .success($0) }
        } catch {
            // The database cannot be reached (no connection, the pool exhausted or closed): the batch never ran, and
            // neither would its writes alone, each after its own wait for a connection (up to 128 of them in a row
            // during an outage: minutes). Every caller hears it at once.
            if Self.unreachable(error) { return batch.map { _ in .failure(error) } }
            // The batch committed, or may have: writing its submissions again could apply them twice.
            if error is UnansweredCommit { return batch.map { _ in .failure(error) } }
            // A statement failed, or the connection was lost before the batch could commit (COMMIT not sent, or the
            // server says it aborted): the batch was rolled back, and each is written alone, which reports each
            // caller's own outcome.
        }
        statisticsState.withLock { $0.fallbacks += 1 }
        var answers: [Result<Answer, any Error>] = []
        for item in batch {
            // Once the database cannot be reached, the rest fail with that at once, as above.
            if case .failure(let error)? = answers.last, Self.unreachable(error) {
                answers.append(.failure(error))
                continue
            }
            do {
                answers.append(.success(try await settled([item])[0]))
            } catch {
                answers.append(.failure(error))
            }
        }
        return answers
    }

    /// Writes `batch` (`write`) and counts it once committed. When its connection was lost with COMMIT in flight, asks
    /// whether it committed (`resolve`): throws `UnansweredCommit` if it did or if that cannot be learned, and the
    /// lost connection's error if it did not.
    private func settled(_ batch: [Submission]) async throws -> [Answer] {
        do {
            let answers = try await write(batch)
            committed(batch.count)
            return answers
        } catch let error as PostgresError {
            guard let transaction = error.inDoubt else { throw error }
            let status = await resolve(transaction)
            statisticsState.withLock {
                switch status {
                case .committed?: $0.inDoubtCommitted += 1
                case .aborted?: $0.inDoubtAborted += 1
                case .inProgress?, nil: $0.inDoubtUnknown += 1
                }
            }
            switch status {
            case .committed?:
                committed(batch.count)
                throw UnansweredCommit(outcome: .committed)
            case .aborted?:
                throw error
            case .inProgress?, nil:
                throw UnansweredCommit(outcome: .unknown)
            }
        }
    }

    private func committed(_ statements: Int) {
        statisticsState.withLock {
            $0.batches += 1
            $0.statements += statements
        }
        onBatch(statements)
    }

    /// Whether `transaction`, whose connection was lost with its COMMIT in flight, committed: asked on another
    /// connection, again (backing off) while it is in progress or no connection answers. A transaction still in progress
    /// after half of `inDoubtTimeout` has its backend terminated: it has not noticed the lost connection (a network
    /// cut) and would hold its locks until TCP gives up on it, or it is waiting to read COMMIT, which it never will.
    /// Terminated, it aborts (or completes a commit already under way). Nil when not known within `inDoubtTimeout`.
    func resolve(_ transaction: InDoubtTransaction) async -> TransactionStatus? {
        let clock = ContinuousClock()
        let deadline = clock.now + inDoubtTimeout
        let terminateAt = clock.now + inDoubtTimeout / 2
        var pause = Duration.milliseconds(5)
        while !Task.isCancelled {
            let terminate = clock.now >= terminateAt
            let wait = max(deadline - clock.now, .milliseconds(100))
            do {
                let status = try await pool.withConnection { connection in
                    if terminate { _ = try connection.terminate(transaction, waiting: wait) }
                    return try connection.status(of: transaction)
                }
                guard status == .inProgress else { return status }
            } catch {
                // No answer (the server restarting, say): ask again until the deadline.
            }
            let now = clock.now
            guard now < deadline else { break }
            try? await Task.sleep(until: min(now + pause, deadline), clock: clock)
            pause = min(pause * 2, .milliseconds(250))
        }
        return nil
    }

    /// Whether `error` says the database could not be reached at all (nothing of the transaction was sent).
    static func unreachable(_ error: any Error) -> Bool {
        guard let error = error as? PostgresError else { return false }
        return [.connectionFailed, .poolTimeout, .poolClosed].contains(error.code)
    }

    /// Writes `batch` in one transaction and round trip. Each tenant is entered once, its statements after it
    /// (entering costs more than a short statement: it switches the role). The submissions of a batch are
    /// independent requests, committed together or written alone, so grouping them by tenant (and a tenant's writes
    /// into shared statements) changes no outcome.
    private func write(_ batch: [Submission]) async throws -> [Answer] {
        var queries: [PostgresQuery] = Self.planSettings
        var position = [(statement: Int, row: Int)](repeating: (0, 0), count: batch.count)
        var tenants: [UUID] = []
        var byTenant: [UUID: [(index: Int, submission: Submission)]] = [:]
        for (i, item) in batch.enumerated() {
            if byTenant[item.tenant] == nil { tenants.append(item.tenant) }
            byTenant[item.tenant, default: []].append((i, item))
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
        let results = try await pool.withConnection { try $0.pipelineTransaction(statements, identified: true) }
        return position.map { Answer(rows: results[$0.statement], row: $0.row) }
    }

    /// How a batch's statements are planned: `genericPlans` and `indexScans`, set first in every batch's transaction.
    static let planSettings: [PostgresQuery] = [genericPlans, indexScans]

    /// Makes a transaction's statements use their generic plans. A batch's statements are the same few statements
    /// over arrays of 1 to `maxBatch` rows, planned for that: left to `auto`, PostgreSQL re-planned the set-based write
    /// in one call of ten (4 ms a plan, 1.8 s of a 10-second api-update run) and the batched targets read in more than
    /// half (2.7 s: more than running it). The workers' claims use it too (`DeliveryQueue.claim`).
    static let genericPlans: PostgresQuery = "SET LOCAL plan_cache_mode = force_generic_plan"

    /// Keeps a batch's writes on their indexes. A generic plan is costed on the table's statistics, not on the values:
    /// with another tenant's 100,000 pushes queued (few instances, many devices), the change write's look for an
    /// instance's queued rows was estimated at most of the queue and planned as a sequential scan, 47 ms a write
    /// during the drain (bench/latency with BACKLOG). Every statement of a batch is driven by its own rows, which
    /// each have an index to be found by.
    static let indexScans: PostgresQuery = "SET LOCAL enable_seqscan = off"
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
    /// A statement to run right after `statement`, in the same transaction but with a snapshot of its own (what
    /// committed while `statement` ran is seen), or nil. Its rows are not read.
    static func afterwards(tenant: UUID, _ writes: [Self]) -> PostgresQuery?
}

extension SetWrite {
    public static func afterwards(tenant: UUID, _ writes: [Self]) -> PostgresQuery? { nil }
}

/// A set-based statement returned fewer rows than it had writes (a bug).
struct SetWriteUnanswered: Error {}

/// A group-commit write whose transaction's connection was lost after its COMMIT was sent, so that its row (its
/// answer) was lost with it. The write was not run again: it committed, or may have.
public struct UnansweredCommit: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Outcome: Sendable, Equatable {
        /// The transaction committed: the write is durable (or found nothing to do, e.g. a version check it lost), and
        /// must not be made again as a new write.
        case committed
        /// Whether the transaction committed could not be learned (no connection answered in time).
        case unknown
    }

    public var outcome: Outcome

    public init(outcome: Outcome) {
        self.outcome = outcome
    }

    public var description: String {
        switch outcome {
        case .committed: return "UnansweredCommit: committed, its answer lost with the connection"
        case .unknown: return "UnansweredCommit: the connection was lost with COMMIT in flight, outcome unknown"
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
