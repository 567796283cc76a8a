import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// A delivery claimed by a worker, with everything needed to compose and send it.
public struct ClaimedDelivery: Sendable {
    public var tenantID: UUID
    public var id: UUID
    public var instanceID: String
    public var deviceToken: String
    public var provider: PlannedDelivery.Provider
    public var tokenKind: PlannedDelivery.TokenKind
    public var token: String
    public var operation: LiveActivityEvent
    /// This attempt's number, every one before it counted.
    public var attempts: Int
    /// This attempt's number among those that spend the retry budget (`RetryPolicy.spendsBudget`), were it to spend
    /// it.
    public var countedAttempts: Int
    public var createdAt: Date
    /// The instance as it is now: its state and expiry decide whether the delivery is still wanted.
    public var instanceState: InstanceState
    public var expiresAt: Date
    /// The instance's activity type, and what of it shapes a push.
    public var activityType: String
    public var profile: TypeProfile
    /// What this delivery sends, as it was queued (the instance row's current values for rows older than the
    /// snapshot columns): attributes, content state, options (alert included) and the push timestamp of its version.
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var options: StoredOptions
    public var contentTimestamp: Int64
    /// The instance's broadcast channel: a `channel` delivery broadcasts on it; a start carries it.
    public var channel: ChannelBinding?
    /// For a push-to-start of a channel-backed instance: the device's OS version, as its SDK reported it.
    public var deviceOSVersion: String?
    /// The claim's lease on it, should it still be being sent when the claim commits (`ClaimResults.stillSending`).
    public var lease: SendingLease

    /// What of an activity type shapes its pushes (a claim reads no more of the type than this).
    public struct TypeProfile: Sendable {
        public var attributesType: String
        public var payloadProfile: PayloadProfile
        public var dateFields: [String: DateEncoding]
        public var frequentUpdates: Bool
    }
}

/// An instance by its tenant and ID.
struct InstanceKey: Hashable {
    var tenant: UUID
    var instance: String

    init(_ tenant: UUID, _ instance: String) {
        self.tenant = tenant
        self.instance = instance
    }
}

/// How one attempt ended, to record.
public struct DeliveryResult: Sendable {
    /// `queued` is a retry; `parked` waits for the tenant to replace a broken credential; `superseded` was not sent
    /// because its instance ended or a newer version for its token exists.
    public typealias Status = DeliveryStatus
    public var tenantID: UUID
    public var id: UUID
    /// The delivery's instance: the record finds the row by it too, so that any of the queue's indexes that the
    /// planner picks serves the lookup (see `recordQuery`).
    public var instanceID: String
    public var status: Status
    public var providerID: String?
    public var httpStatus: Int?
    public var reason: String?
    /// For `queued` (a retry): how long to wait before trying again, from when the record is written, by the database's
    /// clock (as `SendingLease`): a worker whose clock is behind wrote retries already due (no backoff, a provider's
    /// Retry-After ignored), one ahead held them back.
    public var retryDelay: Duration?
    /// For an APNs push that was sent: the `apns-priority` it went out with.
    public var apnsPriority: Int?

    public init(
        tenantID: UUID, id: UUID, instanceID: String, status: Status, providerID: String? = nil,
        httpStatus: Int? = nil, reason: String? = nil, retryDelay: Duration? = nil, apnsPriority: Int? = nil
    ) {
        self.apnsPriority = apnsPriority
        self.tenantID = tenantID
        self.id = id
        self.instanceID = instanceID
        self.status = status
        self.providerID = providerID
        self.httpStatus = httpStatus
        self.reason = reason
        self.retryDelay = retryDelay
    }
}

/// A token to retire after the provider called it dead.
public struct TokenRetirement: Sendable {
    public var tenantID: UUID
    public var kind: PlannedDelivery.TokenKind
    public var deviceToken: String
    public var token: String
    public var reason: String
    /// Only retire if the token was not registered again after this (APNs 410 `timestamp`).
    public var unregisteredAt: Date?

    public init(
        tenantID: UUID, kind: PlannedDelivery.TokenKind, deviceToken: String, token: String, reason: String,
        unregisteredAt: Date?
    ) {
        self.tenantID = tenantID
        self.kind = kind
        self.deviceToken = deviceToken
        self.token = token
        self.reason = reason
        self.unregisteredAt = unregisteredAt
    }
}

/// Queue depth for metrics, for one provider: deliveries due (those being sent right now included, whose claims
/// hold them) and the age of the oldest.
public struct QueueStatistics: Sendable, Equatable {
    /// Due deliveries, of tenants not sending at their own send rate limit.
    public var due: Int
    /// The age of the oldest of `due`.
    public var oldestDueAge: Double
    /// Due deliveries of tenants sending at their own send rate limit now: more workers would not send them sooner.
    public var rateLimited: Int

    public init(due: Int = 0, oldestDueAge: Double = 0, rateLimited: Int = 0) {
        self.due = due
        self.oldestDueAge = oldestDueAge
        self.rateLimited = rateLimited
    }
}

/// A claim's lease on its deliveries still being sent when it commits (`ClaimResults.stillSending`): until the claim's
/// hold ends, by the database's clock (`now()`, the claim's start, plus the hold), so that a worker whose clock is off
/// neither leases them for nothing (due again at once: another worker sends them again) nor for too long. It is the
/// value the rows carry in `next_attempt_at` and `sending_until`, to the microsecond, which `recordLate` matches
/// exactly: a `Date` does not hold every microsecond of today, and a lease rounded is another lease.
public struct SendingLease: Sendable, Hashable {
    /// Microseconds since 1970-01-01 UTC, as the database computed them.
    let microseconds: Int64

    /// The lease's end, in SQL, for a claim held `milliseconds`: the same value in every statement of the claim's
    /// transaction (`now()` is its start).
    static func end(holdMilliseconds milliseconds: Int) -> String {
        "(now() + interval '\(milliseconds) milliseconds')"
    }

    /// `timestamp` (a timestamptz expression) as the microseconds of a lease, exactly (`extract` answers numeric).
    static func microseconds(of timestamp: String) -> String {
        "(extract(epoch FROM \(timestamp)) * 1000000)::int8"
    }
}

/// What a worker did with a claim, to record in the claim's transaction.
public struct ClaimResults: Sendable {
    public var results: [DeliveryResult]
    public var retirements: [TokenRetirement]
    /// Claimed deliveries still being sent (a slow endpoint): the claim commits without them, and they are leased
    /// until the claim's hold ends instead (`ClaimedDelivery.lease`; due again then, if the worker never records
    /// them), to be recorded with `recordLate`. Their lock is not held, so one slow tenant does not hold back the
    /// others' results; their `sending_until` marks them in flight until then, as a lock would (`marquee_being_sent`,
    /// migration 0074).
    public var stillSending: [(tenant: UUID, instance: String, id: UUID)]

    public init(
        results: [DeliveryResult], retirements: [TokenRetirement] = [],
        stillSending: [(tenant: UUID, instance: String, id: UUID)] = []
    ) {
        self.results = results
        self.retirements = retirements
        self.stillSending = stillSending
    }
}

/// A claimed row that could not be read: a stored document the service does not parse (nested deeper than
/// `JSONValue` reads, a value no version of it wrote). It is never sent: its claim records it failed (`unreadable`)
/// with the others' results, so that one such row does not fail every claim that takes it, and with those claims the
/// other tenants' deliveries in them.
public struct UnreadableDelivery: Sendable {
    public var tenantID: UUID
    public var id: UUID
    public var instanceID: String
    /// Nil when these too could not be read.
    public var provider: PlannedDelivery.Provider?
    public var operation: LiveActivityEvent?
    /// Why it could not be read (the decoding error).
    public var error: String

    /// Its record: failed, for good.
    var result: DeliveryResult {
        DeliveryResult(tenantID: tenantID, id: id, instanceID: instanceID, status: .failed, reason: Self.reason)
    }

    /// The reason it is recorded with (one of `DeliveryReason.workerReasons`).
    public static let reason = "unreadable"
}

/// Rows queued moments ago that a claim leaves to another one (the worker's express lane, which claims them on the
/// notification of their commit): those of tenants outside `except` that became due within the last `window`. Older
/// ones are claimed as usual, so nothing depends on the other claim coming.
public struct FreshRows: Sendable {
    public var window: Duration
    public var except: Set<UUID>

    public init(window: Duration, except: Set<UUID>) {
        self.window = window
        self.except = except
    }

    /// Milliseconds of `window` for each of `tenants` (0 for those in `except`).
    func milliseconds(_ tenants: [UUID]) -> [Int] {
        let ms = Int(window.components.seconds) * 1000 + Int(window.components.attoseconds / 1_000_000_000_000_000)
        return tenants.map { except.contains($0) ? 0 : ms }
    }
}

/// The delivery queue as workers see it: claims that lock their rows (`FOR UPDATE SKIP LOCKED`) for as long as the
/// worker sends them, results recorded and committed in the same transaction.
///
/// A claimed row carries no lease: it is "in flight" while its claim's transaction holds its lock (or, sent past its
/// claim, while its `sending_until` lease lasts: `ClaimResults.stillSending`). A worker that dies
/// loses its session and with it its locks, so its deliveries are due again at once; one that hangs is ended by
/// PostgreSQL after `hold` (idle_in_transaction_session_timeout). Other writers never wait on a held row (they lock
/// what they change with SKIP LOCKED, migration 0055).
///
/// Workers work across tenants, so these statements run as `marquee_system` (the worker's sessions start as that
/// role, migration 0010), which row-level security lets see every tenant; each still names `tenant_id` in its keys.
public struct DeliveryQueue: Sendable {
    let pool: PostgresPool

    public init(pool: PostgresPool) {
        self.pool = pool
    }

    /// The statement timeout of a claim's statements, in milliseconds (as text, for `set_config`).
    static let claimTimeoutMilliseconds = "2000"

    /// Claims up to `limit` due deliveries and hands them to `send` while their rows stay locked; what `send` returns
    /// is recorded and committed with the claim, then tokens are retired and instances marked `active` (one more
    /// short transaction). Returns how many were claimed (0: nothing was due; `send` was not called).
    ///
    /// Takes at most one delivery per (instance, token), the oldest version queued, so a token never gets version N+1
    /// while N is in flight or waiting for a retry. Tenants are interleaved (a skip scan over the tenants with due
    /// deliveries, an equal share of each, round robin), so one tenant's backlog never holds back another's update,
    /// and each tenant's send rate limit is spent before its rows are locked. Deliveries of a broken credential are
    /// `parked`, outside the due index, so no claim walks past them. Ended or expired instances' deliveries are
    /// claimed and settled by the worker without a send, from the joined instance row.
    ///
    /// If anything fails after the claim (the record, the commit, the connection), the transaction rolls back and the
    /// deliveries are due again: at-least-once, duplicates bounded by one claim. `tenants`, when given, restricts the
    /// claim to those tenants (a worker dedicated to some tenants; tests), and `excludingTenants` leaves some out
    /// (those other claims are busy with). Without `topUp`, a tenant's share left unused is not handed to the others
    /// (a small claim meant for the tenants that just queued something). `sparing` leaves rows queued moments ago to
    /// another claim.
    ///
    /// A claimed row that cannot be read is not sent: it is recorded failed with the claim's results and handed to
    /// `unreadable` once the claim committed (it counts in the number returned), the others are sent as usual.
    @discardableResult
    public func claim(
        limit: Int, hold: Duration, providers: [PlannedDelivery.Provider] = [.apns, .fcm], tenants only: [UUID]? = nil,
        excludingTenants excluded: Set<UUID> = [], skipping held: [UUID] = [], topUp: Bool = true,
        sparing fresh: FreshRows? = nil, unreadable report: ([UnreadableDelivery]) -> Void = { _ in },
        _ send: ([ClaimedDelivery]) async -> ClaimResults
    ) async throws -> Int {
        let providerNames = providers.map(\.rawValue)
        // A worker stuck past `hold` with its claim open is ended by PostgreSQL, which releases its rows.
        let holdMilliseconds = max(1000, Int(hold.components.seconds) * 1000)
        let leaseEnd = SendingLease.end(holdMilliseconds: holdMilliseconds)
        // Round trips are what a small claim costs (at a steady 1,000 updates/s most claims take a few rows): the
        // skip scan, the claim's BEGIN, settings and lock are one hop to the connection's thread and, in the common
        // case, two round trips; the record and its COMMIT one more; the settle one.
        let (count, unsettled, unreadable) = try await pool.withSession {
            session -> (Int, [PostgresQuery], [UnreadableDelivery]) in
            let locked = try await session.run {
                connection -> (claimed: [ClaimedDelivery], unreadable: [UnreadableDelivery], allowance: [UUID: Int])? in
                let (tenants, shares, allowance) = try Self.dueTenants(
                    connection, limit: limit, providers: providerNames, only: only, excluding: excluded)
                guard !tenants.isEmpty else { return nil }
                // A claim takes milliseconds. Planned on statistics from before a burst of queued rows (the table
                // "tiny"), its version check and the record's read the whole burst per claimed row (seconds to
                // minutes; auto_explain: 101,000 rows read per row, by sequential scan or by a whole index): both are
                // per-row lookups (OFFSET 0) planned without sequential scans, and a claim still slow is stopped,
                // after which the worker refreshes the statistics (marquee_refresh_queue_statistics) and claims again.
                // The claim's and the record's plans are generic, made once per connection and per statistics refresh
                // (an ANALYZE invalidates them): planned for each call's values, the claim spent more time planning
                // than running (pg_stat_statements with track_planning at 1,000 updates/s: 1.4 ms of planning a call,
                // half of the database's CPU).
                let first = try connection.pipelined([
                    "BEGIN",
                    """
                    SELECT set_config('statement_timeout', \(Self.claimTimeoutMilliseconds), true),
                           set_config('idle_in_transaction_session_timeout', \(String(holdMilliseconds)), true),
                           set_config('enable_seqscan', 'off', true),
                           \(unsafeRaw: SendingLease.microseconds(of: leaseEnd)) AS lease
                    """,
                    GroupCommitter.genericPlans,
                    Self.lockQuery(
                        tenants: tenants, shares: shares, excluding: held, providers: providerNames,
                        graceMilliseconds: fresh?.milliseconds(tenants)),
                ])
                let lease = SendingLease(microseconds: try first[1][0].decode(Int64.self, "lease"))
                var (claimed, unreadable) = try Self.claimedDeliveries(first[3], lease: lease)
                // A second pass when the batch came back short because some tenants had fewer due than their share:
                // what is left goes to those that filled theirs.
                if topUp, claimed.count + unreadable.count < limit {
                    var taken: [UUID: Int] = [:]
                    for d in claimed { taken[d.tenantID, default: 0] += 1 }
                    for d in unreadable { taken[d.tenantID, default: 0] += 1 }
                    let full = zip(tenants, shares).filter { taken[$0.0, default: 0] >= $0.1 }.map(\.0)
                    if !full.isEmpty {
                        let room = limit - claimed.count - unreadable.count
                        let more = Self.shares(count: full.count, limit: room).enumerated().map { index, share in
                            min(share, allowance[full[index]].map { $0 - (taken[full[index]] ?? 0) } ?? share)
                        }
                        let pairs = zip(full, more).filter { $0.1 > 0 }
                        if !pairs.isEmpty {
                            // This transaction's own locks do not make SKIP LOCKED skip a row: the first pass's rows
                            // are left out by ID.
                            let more = try Self.claimedDeliveries(
                                connection.query(
                                    Self.lockQuery(
                                        tenants: pairs.map(\.0), shares: pairs.map(\.1),
                                        excluding: held + claimed.map(\.id) + unreadable.map(\.id),
                                        providers: providerNames,
                                        graceMilliseconds: fresh?.milliseconds(pairs.map(\.0)))),
                                lease: lease)
                            claimed += more.deliveries
                            unreadable += more.unreadable
                        }
                    }
                }
                if claimed.isEmpty && unreadable.isEmpty { try connection.execute("COMMIT") }
                return (Self.roundRobin(claimed, tenants: tenants), unreadable, allowance)
            }
            guard let (claimed, unreadable, allowance) = locked else { return (0, [], []) }
            // What a limited tenant was allowed and did not use goes back to its bucket (not under this claim's
            // transaction: the bucket row is not held while the claim sends).
            if !allowance.isEmpty {
                var used: [UUID: Int] = [:]
                for d in claimed where allowance[d.tenantID] != nil { used[d.tenantID, default: 0] += 1 }
                let unused = allowance.map { ($0.key, $0.value - (used[$0.key] ?? 0)) }.filter { $0.1 > 0 }
                if !unused.isEmpty {
                    // Under the claim's statement timeout too: a bucket row held elsewhere fails the claim, not hang it.
                    try await pool.withConnection { connection in
                        _ = try connection.pipelined([
                            Self.withClaimTimeout,
                            """
                            UPDATE send_limits l SET tokens = LEAST(l.rate_per_second::float8, l.tokens + u.unused)
                            FROM unnest(\(unused.map(\.0))::uuid[], \(unused.map(\.1))::int[]) AS u(tenant_id, unused)
                            WHERE l.tenant_id = u.tenant_id
                            """,
                        ])
                    }
                }
            }
            guard !claimed.isEmpty || !unreadable.isEmpty else { return (0, [], []) }
            var sent = ClaimResults(results: [])
            if !claimed.isEmpty { sent = await send(claimed) }
            sent.results += unreadable.map(\.result)
            let outcome = sent
            let unsettled = try await session.run { connection -> [PostgresQuery] in
                // The record runs without a statement timeout (cancelling it would roll back the record of pushes
                // already sent, to be sent again; a worker stuck here is restarted by its liveness probe); then the
                // commit, in the same round trip.
                var statements: [PostgresQuery] = ["SET LOCAL statement_timeout TO 0"]
                let record = Self.recordQuery(outcome.results)
                if let record { statements.append(record) }
                if !outcome.stillSending.isEmpty {
                    statements.append(
                        """
                        UPDATE delivery_queue d
                        -- The lease of the claim's deliveries (ClaimedDelivery.lease: the same now()).
                        SET next_attempt_at = \(unsafeRaw: leaseEnd), sending_until = \(unsafeRaw: leaseEnd)
                        FROM unnest(\(outcome.stillSending.map(\.tenant))::uuid[],
                                    \(outcome.stillSending.map(\.instance))::text[],
                                    \(outcome.stillSending.map(\.id))::uuid[]) AS v(tenant_id, instance_id, id)
                        -- By the instance too, as the record (recordQuery).
                        WHERE d.tenant_id = v.tenant_id AND d.instance_id = v.instance_id AND d.id = v.id
                        """)
                }
                statements.append("COMMIT")
                let rows = try connection.pipelined(statements)
                let waiting = Self.waiting(claimed)
                let sentTo = try (record == nil ? [] : Self.sentTo(rows[1])).filter {
                    waiting.contains(InstanceKey($0.tenant, $0.instance))
                }
                // After the commit, in a transaction of its own (one round trip), planned generically like the
                // claim (planned for its values, the instances' UPDATE took longer to plan than to run).
                let settle = Self.settleStatements(sentTo: sentTo, retire: outcome.retirements)
                guard !settle.isEmpty else { return [] }
                do {
                    _ = try connection.pipelineTransaction([GroupCommitter.genericPlans] + settle)
                    return []
                } catch {
                    return settle  // tried again below, on a connection of its own
                }
            }
            return (claimed.count + unreadable.count, unsettled, unreadable)
        }
        if !unreadable.isEmpty { report(unreadable) }
        try await settleCommitted(unsettled, claimed: count)
        return count
    }

    /// Runs `settle` (`settleStatements`) after the records it follows committed: those deliveries are recorded and
    /// not due again, whatever happens to the settle (the instances marked active, the dead tokens retired). So a
    /// settle that fails (a lock wait past the statement timeout, a deadlock, a lost connection) is tried again, and
    /// still failing it is reported apart from a failed record (`SettleFailure`), with the `claimed` count.
    private func settleCommitted(_ settle: [PostgresQuery], claimed count: Int) async throws {
        guard !settle.isEmpty else { return }
        var failure: (any Error)?
        for pause in [Duration.milliseconds(100), .milliseconds(500), .zero] {
            do {
                try await pool.withConnection { connection in
                    _ = try connection.pipelineTransaction([GroupCommitter.genericPlans] + settle)
                }
                return
            } catch {
                failure = error
                try? await Task.sleep(for: pause)
            }
        }
        throw SettleFailure(claimed: count, reason: failure.map { String(describing: $0) } ?? "")
    }

    /// A claim that committed (its deliveries recorded) but whose settle failed three times: instances its pushes
    /// reached may still show `pending`, and tokens the providers called dead stay active until their next push.
    public struct SettleFailure: Error, Sendable {
        /// Deliveries the claim took, as `claim` returns them.
        public var claimed: Int
        public var reason: String
    }

    /// The instances a claim found waiting to become active, the only ones its pushes settle (the rule and its race:
    /// InstanceState.isActivatedByDelivery). A change to an active instance (every push of a campaign-wide update)
    /// has nothing to settle, and one that failed meanwhile stays failed.
    static func waiting(_ claimed: [ClaimedDelivery]) -> Set<InstanceKey> {
        Set(claimed.lazy.filter(\.instanceState.isActivatedByDelivery).map { InstanceKey($0.tenantID, $0.instanceID) })
    }

    /// Records the results of deliveries a claim committed while they were still being sent (`stillSending`), with
    /// the retirements among them; `claimed` are those deliveries as the claim read them, with their lease. Only rows
    /// still queued under that lease are written: one another worker took over after the lease ran out (or holds now)
    /// keeps its own result, and one the API superseded meanwhile stays superseded. As in the claim, only instances
    /// the claim found waiting are settled.
    public func recordLate(_ late: ClaimResults, claimed: [ClaimedDelivery]) async throws {
        let leases = Dictionary(claimed.map { ($0.id, $0.lease.microseconds) }, uniquingKeysWith: { first, _ in first })
        let reported = late.results.filter { leases[$0.id] != nil }
        guard !reported.isEmpty else { return }
        // Recorded first, settled after the commit as a claim's results are: a settle failing in the same transaction
        // took the records with it, and the pushes already delivered were sent again once their lease ran out.
        let settle = try await pool.transaction { connection in
            try connection.query(Self.withoutSequentialScans)  // as in the claim
            // The rows still queued under that lease (to the microsecond), locked; one another worker holds is
            // skipped, never waited on.
            let leased = try connection.query(
                """
                SELECT d.id FROM delivery_queue d
                JOIN unnest(\(reported.map(\.tenantID))::uuid[], \(reported.map(\.instanceID))::text[],
                            \(reported.map(\.id))::uuid[], \(reported.map { leases[$0.id]! })::int8[])
                     AS v(tenant_id, instance_id, id, lease)
                  ON d.tenant_id = v.tenant_id AND d.instance_id = v.instance_id AND d.id = v.id
                WHERE d.status = 'queued'
                  AND \(unsafeRaw: SendingLease.microseconds(of: "d.next_attempt_at")) = v.lease
                FOR NO KEY UPDATE OF d SKIP LOCKED
                """
            ).map { try $0.decode(UUID.self, "id") }
            let kept = Set(leased)
            let results = reported.filter { kept.contains($0.id) }
            let waiting = Self.waiting(claimed)
            let sentTo = try Self.record(connection, results).filter {
                waiting.contains(InstanceKey($0.tenant, $0.instance))
            }
            return Self.settleStatements(sentTo: sentTo, retire: late.retirements)
        }
        try await settleCommitted(settle, claimed: reported.count)
    }

    /// An equal share of `limit` for each of `count` tenants (the first ones get the remainder), at least one each.
    static func shares(count: Int, limit: Int) -> [Int] {
        guard count > 0 else { return [] }
        let base = max(1, limit / count)
        let extra = limit > count ? limit % count : 0
        return (0..<count).map { base + ($0 < extra ? 1 : 0) }
    }

    /// The claim's setting that matters to plans outside its transaction too: no sequential scans (never the right
    /// plan for a claim's statements, and stale statistics make them look free).
    static let withoutSequentialScans: PostgresQuery = "SELECT set_config('enable_seqscan', 'off', true)"

    /// The claim's statement timeout, for the statements after it in the same implicit transaction (one pipeline, one
    /// sync): discovery (`dueTenants`) runs before the claim's transaction, and is stopped as the claim's statements
    /// are (the worker then refreshes the statistics and claims again) rather than hang the worker's claim loop.
    static let withClaimTimeout: PostgresQuery =
        "SELECT set_config('statement_timeout', \(claimTimeoutMilliseconds), true)"

    /// The skip scan of `dueTenants`, after `withoutSequentialScans` and `withClaimTimeout` in the same implicit
    /// transaction (one pipeline, one sync). Planned on statistics from before a burst (the queue "empty"), it read the
    /// whole queue by sequential scan and sort, three times a call: auto_explain during bench/campaign's update showed
    /// calls of 128–333 ms and 14,286 buffers with 100,000 queued, where the index answers in well under a
    /// millisecond.
    static func dueTenantsStatements(limit: Int, providers: [String], only: [UUID]?) -> [PostgresQuery] {
        let pivot = SecureRandom.uuid()
        let skipScan: PostgresQuery =
            only.map { only in
                """
                SELECT DISTINCT d.tenant_id FROM delivery_queue d
                WHERE d.tenant_id = ANY(\(only)::uuid[]) AND d.status = 'queued' AND d.next_attempt_at <= now()
                  AND d.next_attempt_at > '-infinity' AND d.provider = ANY(\(providers)::text[])
                LIMIT \(limit)
                """
            } ?? """
                WITH RECURSIVE hi AS (
                    SELECT (SELECT d.tenant_id FROM delivery_queue d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id >= \(pivot)
                              AND d.provider = ANY(\(providers)::text[])
                            ORDER BY d.tenant_id LIMIT 1) AS tenant_id, 1 AS n
                    UNION ALL
                    SELECT (SELECT d.tenant_id FROM delivery_queue d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id > hi.tenant_id
                              AND d.provider = ANY(\(providers)::text[])
                            ORDER BY d.tenant_id LIMIT 1), hi.n + 1
                    FROM hi WHERE hi.tenant_id IS NOT NULL AND hi.n < \(limit)
                ), lo AS (
                    SELECT (SELECT d.tenant_id FROM delivery_queue d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id < \(pivot)
                              AND d.provider = ANY(\(providers)::text[])
                            ORDER BY d.tenant_id LIMIT 1) AS tenant_id, 1 AS n
                    UNION ALL
                    SELECT (SELECT d.tenant_id FROM delivery_queue d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id > lo.tenant_id
                              AND d.tenant_id < \(pivot) AND d.provider = ANY(\(providers)::text[])
                            ORDER BY d.tenant_id LIMIT 1), lo.n + 1
                    FROM lo WHERE lo.tenant_id IS NOT NULL AND lo.n < \(limit)
                )
                SELECT tenant_id FROM (
                    SELECT tenant_id, n FROM hi WHERE tenant_id IS NOT NULL
                    UNION ALL SELECT tenant_id, n + \(limit) FROM lo WHERE tenant_id IS NOT NULL
                ) t ORDER BY n LIMIT \(limit)
                """
        return [Self.withoutSequentialScans, Self.withClaimTimeout, skipScan]
    }

    /// The tenants with due deliveries (a skip scan over deliveries_due_by_tenant, starting at a random tenant and
    /// wrapping around, at most `limit` of them), each one's share of the claim, and what the rate-limited ones among
    /// them may send now — taken from their buckets here, in a statement of its own (committed at once). Both run under
    /// the claim's statement timeout (`withClaimTimeout`): a skip scan planned badly, or a bucket whose row another
    /// transaction holds, throws `queryCanceled` instead of hanging the claim.
    static func dueTenants(
        _ connection: PostgresConnection, limit: Int, providers: [String], only: [UUID]?, excluding: Set<UUID> = []
    ) throws -> (tenants: [UUID], shares: [Int], allowance: [UUID: Int]) {
        let tenantRows = try connection.pipelined(
            Self.dueTenantsStatements(limit: limit, providers: providers, only: only)
        ).last!
        var tenants = try tenantRows.map { try $0.decode(UUID.self, "tenant_id") }
        // Left out after the skip scan, not in it: a filter there would walk every queued row of an excluded tenant.
        if !excluding.isEmpty { tenants.removeAll { excluding.contains($0) } }
        guard !tenants.isEmpty else { return ([], [], [:]) }
        var shares = Self.shares(count: tenants.count, limit: limit)
        // Send rate limits: each limited tenant's bucket, refilled to now, gives at most its share in whole tokens,
        // spent at once (what the claim does not use is given back). Locked in tenant order, for this statement only.
        let buckets = try connection.pipelined([
            Self.withClaimTimeout,
            """
            WITH want AS (
                SELECT * FROM unnest(\(tenants)::uuid[], \(shares)::int[]) AS w(tenant_id, share)
            ), locked AS (
                -- FOR UPDATE returns each row as it is once locked: what another claim just spent is seen.
                SELECT l.tenant_id, l.tokens, l.rate_per_second, l.refilled_at FROM send_limits l
                WHERE l.tenant_id = ANY(\(tenants)::uuid[])
                ORDER BY l.tenant_id FOR UPDATE
            ), refilled AS (
                SELECT k.tenant_id, w.share, k.refilled_at, \(unsafeRaw: Self.refilledTokens("k")) AS tokens
                FROM locked k JOIN want w USING (tenant_id)
            )
            UPDATE send_limits l
            SET tokens = r.tokens - LEAST(r.share, floor(r.tokens)::int),
                refilled_at = GREATEST(r.refilled_at, clock_timestamp())
            FROM refilled r WHERE l.tenant_id = r.tenant_id
            RETURNING l.tenant_id, LEAST(r.share, floor(r.tokens)::int) AS allowance
            """,
        ]).last!
        var allowance: [UUID: Int] = [:]
        for row in buckets {
            allowance[try row.decode(UUID.self, "tenant_id")] = try row.decode(Int.self, "allowance")
        }
        for (index, tenant) in tenants.enumerated() {
            if let allowed = allowance[tenant] { shares[index] = min(shares[index], allowed) }
        }
        let keep = shares.indices.filter { shares[$0] > 0 }
        tenants = keep.map { tenants[$0] }
        shares = keep.map { shares[$0] }
        return (tenants, shares, allowance.filter { $0.value > 0 })
    }

    /// Locks up to each tenant's share of its due deliveries that are the oldest version queued for their (instance,
    /// token), skipping rows another claim holds, and reads what sending them needs. Rows are taken lane by lane from
    /// a random lane, oldest first within each (migration 0071), so concurrent claims do not all walk past the rows
    /// the others hold at the head of one order. Rows that fail the version check are never locked, so a claim holds
    /// only what it sends. A tenant's rows that became due within its `graceMilliseconds` are left alone. The claim
    /// starts at lane `startingLane` modulo the number of lanes (random unless a test picks it).
    static func lockQuery(
        tenants: [UUID], shares: [Int], excluding: [UUID], providers: [String], graceMilliseconds: [Int]? = nil,
        startingLane lane: Int = Int.random(in: 0..<1024)
    ) -> PostgresQuery {
        let grace = graceMilliseconds ?? Array(repeating: 0, count: tenants.count)
        return """
            WITH claimed AS (
                SELECT c.*
                FROM unnest(\(tenants)::uuid[], \(shares)::int[], \(grace)::int[]) AS t(tenant_id, share, grace_ms)
                CROSS JOIN LATERAL (
                    -- Lane by lane from a random one (migration 0071), each lane oldest first, read lazily: the
                    -- claim stops at its share, so it locks no row it does not send. No ORDER BY here: a sort would
                    -- read (and lock) every lane's due rows first.
                    SELECT l.* FROM generate_series(0, marquee_queue_lanes() - 1) AS g(n)
                    CROSS JOIN LATERAL (
                        SELECT d.* FROM delivery_queue d
                        WHERE d.tenant_id = t.tenant_id AND d.lane = (\(lane) + g.n) % marquee_queue_lanes()
                          AND d.status = 'queued'
                          AND d.next_attempt_at <= now() - t.grace_ms * interval '1 millisecond'
                          AND d.next_attempt_at > '-infinity'
                          AND d.provider = ANY(\(providers)::text[]) AND d.id <> ALL(\(excluding)::uuid[])
                          -- A token never gets version N+1 while N is in flight or waiting for its retry (nothing is
                          -- older than a first version: 0071). OFFSET 0 keeps this a per-row lookup of the token: as
                          -- an anti-join, planned on statistics from before a burst (the queue "empty"), it read the
                          -- whole burst once per claimed row.
                          AND (d.instance_version = 1
                               OR NOT EXISTS (
                                   SELECT 1 FROM delivery_queue o
                                   WHERE o.tenant_id = d.tenant_id AND o.instance_id = d.instance_id
                                     AND o.token = d.token AND o.status = 'queued'
                                     AND o.instance_version < d.instance_version
                                   OFFSET 0))
                        ORDER BY d.next_attempt_at
                        LIMIT t.share
                        FOR UPDATE OF d SKIP LOCKED
                    ) l
                    LIMIT t.share
                ) c
            )
            SELECT c.tenant_id, c.id AS delivery_id, c.instance_id, c.device_token, c.provider, c.token_kind,
                   c.token, c.operation, c.attempts + 1 AS attempt,
                   c.attempts - c.uncounted_attempts + 1 AS counted_attempt, c.created_at AS delivery_created_at,
                   COALESCE(c.attributes, i.attributes) AS snap_attributes,
                   COALESCE(c.content_state, i.content_state) AS snap_content_state,
                   COALESCE(c.options, i.options) AS snap_options,
                   COALESCE(c.content_timestamp, i.content_timestamp) AS snap_content_timestamp,
                   -- Only what sending needs: each column here is converted to text, sent and parsed per push.
                   i.state, i.expires_at, i.activity_type, i.channel_id,
                   -- A type a registration created (auto_created) has the first registrant's attributes type and
                   -- payload profile (its route's), and the sdk key is public: each push-to-start token goes with the
                   -- attributes type and the profile registered with it (migration 0102), so a wrong name or the
                   -- other SDK's route taken first spoils no other device's starts.
                   CASE WHEN c.token_kind = 'push_to_start' AND t.auto_created THEN
                       COALESCE((SELECT p.attributes_type FROM push_to_start_tokens p
                                 WHERE p.tenant_id = c.tenant_id AND p.device_token = c.device_token
                                   AND p.activity_type = i.activity_type AND p.token = c.token), t.attributes_type)
                       ELSE t.attributes_type
                   END AS attributes_type,
                   CASE WHEN c.token_kind = 'push_to_start' AND t.auto_created THEN
                       COALESCE((SELECT p.payload_profile FROM push_to_start_tokens p
                                 WHERE p.tenant_id = c.tenant_id AND p.device_token = c.device_token
                                   AND p.activity_type = i.activity_type AND p.token = c.token), t.payload_profile)
                       ELSE t.payload_profile
                   END AS payload_profile,
                   t.date_fields, t.frequent_updates,
                   \(unsafeRaw: LiveActivityStore.channelColumnsJoined),
                   CASE WHEN i.channel_id IS NOT NULL AND c.token_kind = 'push_to_start' THEN
                       (SELECT dv.os_version FROM devices dv
                        WHERE dv.tenant_id = c.tenant_id AND dv.token = c.device_token)
                   END AS device_os_version
            FROM claimed c
            JOIN instances i ON i.tenant_id = c.tenant_id AND i.id = c.instance_id
            JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type
            LEFT JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
            ORDER BY c.next_attempt_at
            """
    }

    /// The deliveries of a `lockQuery`'s rows, each read on its own: a row that cannot be read (its key aside) is
    /// `unreadable`, to be recorded failed, and the others are sent. A batch's rows mostly repeat their content state,
    /// options and type (a campaign's start or update: one content state and one set of options for every row; its
    /// attributes too, unless they are filled in per person), so each distinct text of those columns is parsed once
    /// per batch.
    static func claimedDeliveries(_ rows: PostgresRows, lease: SendingLease) throws -> (
        deliveries: [ClaimedDelivery], unreadable: [UnreadableDelivery]
    ) {
        var attributes = RepeatedTexts<JSONValue>()
        var contentStates = RepeatedTexts<JSONValue>()
        var options = RepeatedTexts<StoredOptions>()
        var dateFields = RepeatedTexts<[String: DateEncoding]>()
        var deliveries: [ClaimedDelivery] = []
        var unreadable: [UnreadableDelivery] = []
        deliveries.reserveCapacity(rows.count)
        for row in rows {
            // The key, without which nothing can be recorded (its columns are never NULL: a failure here is the
            // connection's, and fails the claim).
            let tenantID = try row.decode(UUID.self, "tenant_id")
            let id = try row.decode(UUID.self, "delivery_id")
            let instanceID = try row.decode(String.self, "instance_id")
            do {
                deliveries.append(
                    try Self.claimedDelivery(
                        row, tenantID: tenantID, id: id, instanceID: instanceID, lease: lease,
                        attributes: &attributes, contentStates: &contentStates, options: &options,
                        dateFields: &dateFields))
            } catch {
                unreadable.append(
                    UnreadableDelivery(
                        tenantID: tenantID, id: id, instanceID: instanceID,
                        provider: try? row.decodeRaw(PlannedDelivery.Provider.self, "provider"),
                        operation: try? row.decodeRaw(LiveActivityEvent.self, "operation"),
                        error: String(describing: error)))
            }
        }
        return (deliveries, unreadable)
    }

    /// One row of `claimedDeliveries`.
    private static func claimedDelivery(
        _ row: PostgresRow, tenantID: UUID, id: UUID, instanceID: String, lease: SendingLease,
        attributes: inout RepeatedTexts<JSONValue>, contentStates: inout RepeatedTexts<JSONValue>,
        options: inout RepeatedTexts<StoredOptions>, dateFields: inout RepeatedTexts<[String: DateEncoding]>
    ) throws -> ClaimedDelivery {
        ClaimedDelivery(
            tenantID: tenantID, id: id, instanceID: instanceID,
            deviceToken: try row.decode(String.self, "device_token"),
            provider: try row.decodeRaw(PlannedDelivery.Provider.self, "provider"),
            tokenKind: try row.decodeRaw(PlannedDelivery.TokenKind.self, "token_kind"),
            token: try row.decode(String.self, "token"),
            operation: try row.decodeRaw(LiveActivityEvent.self, "operation"),
            attempts: try row.decode(Int.self, "attempt"),
            countedAttempts: try row.decode(Int.self, "counted_attempt"),
            createdAt: try row.decode(Date.self, "delivery_created_at"),
            instanceState: try row.decodeRaw(InstanceState.self, "state"),
            expiresAt: try row.decode(Date.self, "expires_at"),
            activityType: try row.decode(String.self, "activity_type"),
            profile: ClaimedDelivery.TypeProfile(
                attributesType: try row.decode(String.self, "attributes_type"),
                payloadProfile: try row.decodeRaw(PayloadProfile.self, "payload_profile"),
                dateFields: try dateFields.value(of: row["date_fields"]) {
                    try RegistryStore.dateFields($0.decode(JSONValue.self))
                },
                frequentUpdates: try row.decode(Bool.self, "frequent_updates")),
            attributes: try attributes.value(of: row["snap_attributes"]) { try $0.decode(JSONValue.self) },
            contentState: try contentStates.value(of: row["snap_content_state"]) { try $0.decode(JSONValue.self) },
            options: try options.value(of: row["snap_options"]) {
                StoredOptions(json: try $0.decode(JSONValue.self))
            },
            contentTimestamp: try row.decode(Int64.self, "snap_content_timestamp"),
            channel: try ChannelBinding.decode(row),
            deviceOSVersion: try row.decode(String?.self, "device_os_version"), lease: lease)
    }

    /// Round robin over the tenants, in their claim order: each tenant's first delivery (oldest due), then each
    /// tenant's second, and so on — the order the worker starts the sends in.
    static func roundRobin(_ claimed: [ClaimedDelivery], tenants: [UUID]) -> [ClaimedDelivery] {
        let position = Dictionary(tenants.enumerated().map { ($1, $0) }, uniquingKeysWith: { first, _ in first })
        var rank: [UUID: Int] = [:]
        let ranked = claimed.map { d -> (Int, Int, ClaimedDelivery) in
            let r = rank[d.tenantID, default: 0]
            rank[d.tenantID] = r + 1
            return (r, position[d.tenantID] ?? 0, d)
        }
        return ranked.sorted { ($0.0, $0.1) < ($1.0, $1.1) }.map(\.2)
    }

    /// Records results of held deliveries, in the claim's transaction. An outcome moves the row from the queue to the
    /// history (`marquee_history_row`, migration 0057), in one statement for the batch; a retry or a park stays
    /// queued. A retry is superseded when a newer version for the same token exists (so N never reaches a token after
    /// N+1); a row to park is queued instead if its credential was replaced meanwhile (an upload under way is waited
    /// for: `marquee_credential_broken` holds a broken credential's row, migration 0104); a retry or a park of a push
    /// whose device was removed (or moved to another person) meanwhile is superseded (`device_removed`, migration
    /// 0083). Returns the instances something was sent to.
    static func record(_ connection: PostgresConnection, _ results: [DeliveryResult]) throws -> [(
        tenant: UUID, instance: String
    )] {
        guard let query = recordQuery(results) else { return [] }
        return try sentTo(connection.query(query))
    }

    /// The statement of `record` (nil for no results); its rows are the instances something was sent to (`sentTo`).
    static func recordQuery(_ results: [DeliveryResult]) -> PostgresQuery? {
        guard !results.isEmpty else { return nil }
        let tenants = results.map(\.tenantID)
        let ids = results.map(\.id)
        let instances = results.map(\.instanceID)
        let statuses = results.map(\.status.rawValue)
        let providerIDs = results.map(\.providerID)
        let httpStatuses = results.map { $0.httpStatus.map(String.init) }
        let reasons = results.map(\.reason)
        let delays = results.map { r in
            r.retryDelay.map {
                String($0.components.seconds * 1000 + $0.components.attoseconds / 1_000_000_000_000_000)
            }
        }
        let priorities = results.map { $0.apnsPriority.map(String.init) }
        // 1 for an attempt that does not spend the retry budget (RetryPolicy.spendsBudget, the rule's one home).
        let uncounted = results.map { RetryPolicy.spendsBudget($0.status, reason: $0.reason) ? 0 : 1 }
        return """
            WITH o AS (
                SELECT d.row_ctid, d.tenant_id, d.instance_id, d.id,
                       CASE WHEN x.departed IS NOT NULL THEN 'superseded'
                            WHEN v.status = 'queued' AND EXISTS (
                                SELECT 1 FROM deliveries n
                                WHERE n.tenant_id = d.tenant_id AND n.instance_id = d.instance_id
                                  AND n.token = d.token AND n.instance_version > d.instance_version
                                  AND n.status IN ('queued', 'parked', 'sent')
                                OFFSET 0) THEN 'superseded'
                            WHEN v.status = 'parked' AND NOT marquee_credential_broken(d.tenant_id, d.provider)
                                THEN 'queued'
                            ELSE v.status END AS status,
                       v.provider_id, v.http_status::int AS http_status, COALESCE(x.departed, v.reason) AS reason,
                       -- A retry's due time by the database's clock, from this statement (the claim's now() is its start).
                       statement_timestamp() + v.delay_ms::float8 * interval '1 millisecond' AS next_at,
                       v.apns_priority::smallint AS apns_priority, v.uncounted
                FROM unnest(\(tenants)::uuid[], \(ids)::uuid[], \(instances)::text[], \(statuses)::text[],
                            \(providerIDs)::text[], \(httpStatuses)::text[], \(reasons)::text[], \(delays)::text[],
                            \(priorities)::text[], \(uncounted)::int[])
                     AS v(tenant_id, id, instance_id, status, provider_id, http_status, reason, delay_ms, apns_priority,
                          uncounted)
                -- A lookup per row (OFFSET 0): as a join it was planned as a hash join over the whole queue (7 ms a
                -- batch with 20,000 queued). By the instance too: on statistics that did not know the tenant, the
                -- planner served (tenant_id, id) from deliveries_instance, whose key has instance_id between them —
                -- every entry of the tenant read per row (bench/campaign: records of 256 taking 1–3 s, 212,000
                -- buffers); with the instance, whichever index it picks is a lookup.
                CROSS JOIN LATERAL (
                    SELECT q.ctid AS row_ctid, q.* FROM delivery_queue q
                    WHERE q.tenant_id = v.tenant_id AND q.instance_id = v.instance_id AND q.id = v.id OFFSET 0
                ) d
                -- A retry or a park of a push whose device was removed while it was being sent (the removal skipped
                -- the held row), or moved to another person, is superseded instead: it was the last attempt to that
                -- device (marquee_device_departed, migration 0083, the rule's one home). Asked of retries and parks
                -- only, which are few: an outcome is recorded as it came.
                CROSS JOIN LATERAL (
                    SELECT CASE WHEN v.status IN ('queued', 'parked')
                                THEN marquee_device_departed(d.tenant_id, d.instance_id, d.device_token, d.token_kind)
                           END AS departed
                ) x
            -- The rows are then written where o found them (ctid: stable, as this transaction holds their locks since
            -- the claim): as joins, on statistics of an empty queue, the UPDATE and DELETE walked the whole queue once
            -- per recorded row (bench/campaign: 2.6 million join comparisons and 2 s for 256 rows).
            ), kept AS (
                UPDATE delivery_queue d SET
                    status = o.status, provider_id = COALESCE(o.provider_id, d.provider_id),
                    http_status = o.http_status, reason = o.reason, attempts = d.attempts + 1,
                    uncounted_attempts = d.uncounted_attempts + o.uncounted,
                    -- Without a retry's delay (a park, or one queued instead), due by now at the latest: a late
                    -- record's row still carries its lease as due time (sending_until), which ends here.
                    next_attempt_at = COALESCE(o.next_at, LEAST(d.next_attempt_at, statement_timestamp())),
                    updated_at = now(),
                    apns_priority = COALESCE(o.apns_priority, d.apns_priority), sending_until = NULL
                FROM o
                WHERE d.ctid = ANY(ARRAY(SELECT row_ctid FROM o WHERE status IN ('queued', 'parked')))
                  AND d.ctid = o.row_ctid AND o.status IN ('queued', 'parked')
            ), gone AS (
                DELETE FROM delivery_queue d USING o
                WHERE d.ctid = ANY(ARRAY(SELECT row_ctid FROM o WHERE status NOT IN ('queued', 'parked')))
                  AND d.ctid = o.row_ctid AND o.status NOT IN ('queued', 'parked')
                RETURNING d, o.status, o.provider_id, o.http_status, o.reason, o.apns_priority
            ), history AS (
                INSERT INTO delivery_history
                SELECT h.* FROM gone,
                     marquee_history_row(gone.d, gone.status, true, gone.provider_id, gone.http_status, gone.reason,
                                         gone.apns_priority) h
                RETURNING tenant_id, instance_id, status
            )
            SELECT DISTINCT tenant_id, instance_id FROM history WHERE status = 'sent'
            """
    }

    /// The instances a `recordQuery` sent something to.
    static func sentTo(_ rows: PostgresRows) throws -> [(tenant: UUID, instance: String)] {
        try rows.map { (try $0.decode(UUID.self, "tenant_id"), try $0.decode(String.self, "instance_id")) }
    }

    /// After a claim committed: the statements that mark instances `active` once something reached a device, and
    /// retire the tokens the providers called dead (run by `settleCommitted`); none when there is nothing to settle.
    /// Nothing here touches a held delivery except through SKIP LOCKED.
    static func settleStatements(sentTo: [(tenant: UUID, instance: String)], retire: [TokenRetirement])
        -> [PostgresQuery]
    {
        var statements: [PostgresQuery] = []
        if !sentTo.isEmpty {
            statements.append(
                """
                UPDATE instances i SET state = 'active', updated_at = now()
                FROM unnest(\(sentTo.map(\.tenant))::uuid[], \(sentTo.map(\.instance))::text[])
                     AS s(tenant_id, instance_id)
                WHERE i.tenant_id = s.tenant_id AND i.id = s.instance_id
                  AND i.state = ANY(\(InstanceState.allCases.filter(\.isActivatedByDelivery).map(\.rawValue))::text[])
                """)
        }
        // Devices before tokens, as every other writer takes them: a start holds its devices, then its push-to-start
        // tokens (StartWrite.statement), so a settle retiring a person's iPhone token before deleting their Android
        // phone could deadlock with a start for that person.
        for r in retire.filter({ $0.kind == .fcm }) + retire.filter({ $0.kind != .fcm }) {
            let before = r.unregisteredAt ?? Date.distantFuture
            switch r.kind {
            case .pushToStart:
                statements.append(
                    """
                    UPDATE push_to_start_tokens SET status = 'retired', retired_reason = \(r.reason), retired_at = now()
                    WHERE tenant_id = \(r.tenantID) AND device_token = \(r.deviceToken) AND token = \(r.token)
                      AND status = 'active' AND updated_at <= \(before)
                    """)
            case .activity:
                statements.append(
                    """
                    UPDATE activity_tokens SET status = 'retired', retired_reason = \(r.reason), retired_at = now()
                    WHERE tenant_id = \(r.tenantID) AND device_token = \(r.deviceToken) AND token = \(r.token)
                      AND status = 'active' AND updated_at <= \(before)
                    """)
            case .channel:
                // Apple no longer knows the channel (ChannelNotRegistered / BadChannelId): it is gone, and the
                // broadcasts still waiting on it fail with the same reason (one another worker holds is recorded by
                // it). Later changes plan none on it.
                statements.append(
                    """
                    UPDATE channels SET status = 'gone', status_reason = \(r.reason)
                    WHERE tenant_id = \(r.tenantID) AND apns_channel_id = \(r.token) AND status = 'active'
                    """)
                statements.append(
                    """
                    WITH gone AS (
                        DELETE FROM delivery_queue d
                        WHERE d.tenant_id = \(r.tenantID) AND d.id IN (
                            SELECT id FROM delivery_queue
                            WHERE tenant_id = \(r.tenantID) AND token_kind = 'channel' AND token = \(r.token)
                              AND NOT marquee_being_sent(sending_until)
                            FOR UPDATE SKIP LOCKED)
                        RETURNING d
                    )
                    INSERT INTO delivery_history
                    SELECT h.* FROM gone, marquee_history_row(gone.d, 'failed', p_reason => \(r.reason)) h
                    """)
            case .fcm:
                // An FCM registration token is the Android device's token: the device is gone.
                statements.append(
                    """
                    DELETE FROM devices
                    WHERE tenant_id = \(r.tenantID) AND token = \(r.token) AND updated_at <= \(before)
                    """)
            }
        }
        return statements
    }

    /// What `markCredentialBroken` did.
    public enum CredentialBreak: Sendable, Equatable {
        /// Marked broken: the tenant's queued deliveries through the provider are parked.
        case marked
        /// Left alone: already broken, replaced since it was loaded, or gone.
        case unchanged
        /// Left alone: FCM has accepted a push sent with the credential as it is (migration 0095), and the reason
        /// blames the token then (`FCMErrorCode.blamesCredentialUntilProven`).
        case proven
    }

    /// Marks a tenant's credentials for `provider` broken, so that its deliveries pause until they are replaced — if
    /// the stored row is still the one the provider rejected (`updatedAt`, as the worker loaded it): a rejection of a
    /// key the tenant has replaced meanwhile (a send in flight, a worker's cache) must not break its replacement.
    /// `unlessProven` (an FCM reason that blames the credential only until it has worked): not if the database holds
    /// the proof, whatever the caller's copy of it said (a worker loads it with the credential and keeps it for up to
    /// 30 s, while another worker may have proven the credential since).
    public func markCredentialBroken(
        tenant: UUID, provider: PlannedDelivery.Provider, reason: String, updatedAt: Date, unlessProven: Bool = false
    ) async throws -> CredentialBreak {
        let table = provider == .apns ? "apns_credentials" : "fcm_credentials"
        let proofCounts = unlessProven && provider == .fcm
        return try await pool.transaction { connection in
            // The row first, held (a proof being recorded holds it too: markFCMCredentialProven), then the proof and
            // the mark in statements of their own, which see what committed while this one waited.
            let held = try connection.query(
                """
                SELECT 1 FROM \(unsafeRaw: table)
                WHERE tenant_id = \(tenant) AND status <> 'broken' AND updated_at = \(updatedAt)
                FOR UPDATE
                """)
            guard !held.isEmpty else { return .unchanged }
            if proofCounts {
                let proof = try connection.query(
                    """
                    SELECT 1 FROM fcm_credential_checks
                    WHERE tenant_id = \(tenant) AND credential_updated_at = \(updatedAt)
                    """)
                if !proof.isEmpty { return .proven }
            }
            try connection.execute(
                "UPDATE \(unsafeRaw: table) SET status = 'broken', status_reason = \(reason) WHERE tenant_id = \(tenant)"
            )
            return .marked
        }
    }

    /// Analyses the queue table once a fifth of it changed since the last analysis (migration 0047), so a burst of
    /// enqueued deliveries does not leave the claim planned for an empty table. Returns whether it analysed.
    @discardableResult
    public func refreshStatistics() async throws -> Bool {
        let rows = try await pool.query("SELECT marquee_refresh_queue_statistics() AS analysed")
        return try rows.first?.decode(Bool.self, "analysed") ?? false
    }

    /// The workers' once-a-second tick, in one statement: the queue's statistics by its rule (`refreshStatistics`),
    /// and those of the tables the API's group reads plan on once grown ten-fold (`PlannerStatistics`, migration 0093),
    /// so that a burst of starts or registrations does not leave the API's reads planned for near-empty tables until
    /// autovacuum's minute. Returns whether it analysed the queue, and how many of those tables.
    @discardableResult
    public func refreshTickStatistics() async throws -> (queue: Bool, tables: Int) {
        let rows = try await pool.query(PlannerStatistics.query(growth: PlannerStatistics.tickGrowth, queue: true))
        guard let row = rows.first else { return (false, 0) }
        return (try row.decode(Bool.self, "queue"), try row.decode(Int.self, "analysed"))
    }

    /// Expired idempotency records deleted per statement by `expireIdempotencyKeys`.
    public static let idempotencySlice = 10_000

    /// Deletes idempotency records past their 24 hours, `limit` at a time (each slice its own short transaction)
    /// until none is left or `budget` has passed; returns how many went. One slice per pass kept up with at most
    /// `limit` records per pass (33 a second at one pass in five minutes): a client sending a key with each of
    /// 1,000 writes a second left the table growing without end. The budget is short: the pass runs in the workers'
    /// once-a-second tick (statistics, queue gauges), which waits for it.
    @discardableResult
    public func expireIdempotencyKeys(limit: Int = idempotencySlice, budget: Duration = .seconds(5)) async throws
        -> Int
    {
        let clock = ContinuousClock()
        let deadline = clock.now + budget
        var removed = 0
        while true {
            let slice = try await pool.execute(
                """
                DELETE FROM idempotency_keys k
                USING (SELECT tenant_id, key FROM idempotency_keys
                       WHERE created_at <= now() - interval '24 hours' LIMIT \(limit)) old
                WHERE k.tenant_id = old.tenant_id AND k.key = old.key
                """)
            removed += slice
            if slice < limit || clock.now >= deadline { return removed }
        }
    }

    /// The send tokens of the `send_limits` row `alias`, refilled to now: its rate a second, up to one second's worth
    /// (what a claim may spend, and what tells a tenant sending at its limit).
    static func refilledTokens(_ alias: String) -> String {
        """
        LEAST(\(alias).rate_per_second::float8, \(alias).tokens + \(alias).rate_per_second \
        * GREATEST(0, EXTRACT(epoch FROM clock_timestamp() - \(alias).refilled_at))::float8)
        """
    }

    /// Per provider: due deliveries and the age of the oldest, and apart from them the due deliveries of tenants
    /// sending at their own send rate limit (their bucket, refilled to now, short of a second's worth: claims are
    /// spending it). Those grow old by the tenant's choice; counted with the rest they paged the operator and scaled
    /// the workers out for nothing. A limited tenant whose bucket fills up is not being sent for, and counts again.
    /// Every provider is present (zeros when it has nothing queued), so gauges keep their series.
    public func statistics() async throws -> [PlannedDelivery.Provider: QueueStatistics] {
        let rows = try await pool.query(
            """
            WITH held AS (
                SELECT l.tenant_id FROM send_limits l
                WHERE \(unsafeRaw: Self.refilledTokens("l")) < l.rate_per_second
            )
            SELECT q.provider, count(*) FILTER (WHERE h.tenant_id IS NULL)::int AS due,
                   COALESCE(extract(epoch FROM now() - min(q.next_attempt_at) FILTER (WHERE h.tenant_id IS NULL)),
                            0)::float8 AS oldest,
                   count(*) FILTER (WHERE h.tenant_id IS NOT NULL)::int AS limited
            FROM delivery_queue q LEFT JOIN held h ON h.tenant_id = q.tenant_id
            WHERE q.status = 'queued' AND q.next_attempt_at <= now() AND q.next_attempt_at > '-infinity'
            GROUP BY q.provider
            """)
        var byProvider = Dictionary(
            uniqueKeysWithValues: PlannedDelivery.Provider.allCases.map { ($0, QueueStatistics()) })
        for row in rows {
            guard let provider = PlannedDelivery.Provider(rawValue: try row.decode(String.self, "provider")) else {
                continue
            }
            byProvider[provider] = QueueStatistics(
                due: try row.decode(Int.self, "due"), oldestDueAge: try row.decode(Double.self, "oldest"),
                rateLimited: try row.decode(Int.self, "limited"))
        }
        return byProvider
    }

    /// The tenant's APNs credential row (sealed key included), for the worker's credential cache.
    public func apnsCredential(tenant: UUID) async throws -> (APNsCredentialInfo, sealed: [UInt8])? {
        let rows = try await pool.query(
            """
            SELECT \(unsafeRaw: CredentialStore.apnsColumns), sealed_private_key FROM apns_credentials
            WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else { return nil }
        return (try CredentialStore.apnsInfo(row), try row.decode([UInt8].self, "sealed_private_key"))
    }

    /// The tenant's FCM credential row (sealed service account included).
    public func fcmCredential(tenant: UUID) async throws -> (FCMCredentialInfo, sealed: [UInt8], proven: Bool)? {
        let rows = try await pool.query(
            """
            SELECT \(unsafeRaw: CredentialStore.fcmColumns), sealed_service_account,
                   EXISTS (SELECT 1 FROM fcm_credential_checks k
                           WHERE k.tenant_id = fcm_credentials.tenant_id
                             AND k.credential_updated_at = fcm_credentials.updated_at) AS proven
            FROM fcm_credentials
            WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else { return nil }
        return (
            try CredentialStore.fcmInfo(row), try row.decode([UInt8].self, "sealed_service_account"),
            try row.decode(Bool.self, "proven")
        )
    }

    /// Records that FCM accepted a push sent with the tenant's credential as it was at `credentialUpdatedAt`
    /// (migration 0095): from then on a SENDER_ID_MISMATCH blames the token, not the credential. Nothing when the
    /// credential changed since. The credential's row is held until the proof commits, so that a break being decided
    /// (`markCredentialBroken`) sees it, or comes first and leaves nothing to prove.
    public func markFCMCredentialProven(tenant: UUID, credentialUpdatedAt: Date) async throws {
        try await pool.execute(
            """
            INSERT INTO fcm_credential_checks (tenant_id, credential_updated_at)
            SELECT tenant_id, updated_at FROM fcm_credentials
            WHERE tenant_id = \(tenant) AND updated_at = \(credentialUpdatedAt)
            FOR SHARE
            ON CONFLICT (tenant_id) DO UPDATE
            SET credential_updated_at = EXCLUDED.credential_updated_at, proven_at = now()
            """)
    }

    /// The tenant's sealed delivery secret.
    public func sealedDeliverySecret(tenant: UUID) async throws -> [UInt8]? {
        let rows = try await pool.query("SELECT sealed_delivery_secret FROM tenants WHERE id = \(tenant)")
        return try rows.first?.decode([UInt8].self, "sealed_delivery_secret")
    }
}
