import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// A tenant's recent activity at a glance (`GET /v1/overview`, the console's first screen).
public struct TenantOverview: Sendable, Equatable {
    /// Instances started since `instancesSince`, by effective state (an open instance past its expiry is `expired`).
    public var instancesSince: Date
    public var instancesByState: [InstanceState: Int]

    /// One line of the deliveries chart: the deliveries queued in each minute, of one provider, in one status now.
    public struct Series: Sendable, Equatable {
        public var provider: String
        public var status: String
        /// `minutes` counts, oldest minute first.
        public var counts: [Int]
    }
    /// The first minute of the chart; each bucket is 60 s.
    public var deliveriesSince: Date
    public var minutes: Int
    public var series: [Series]

    /// The tenant's queued deliveries: due now, or waiting for a later attempt (backoff, pacing, a schedule).
    public var queueDue: Int
    public var queueLater: Int
    public var queueByProvider: [String: Int]
    public var oldestDueAt: Date?
    /// True when the tenant has more queued deliveries than were counted (`OverviewStore.queueCap`).
    public var queueCapped: Bool
}

/// A tenant's recent failed and undeliverable deliveries, grouped by what went wrong.
public struct DeliveryFailures: Sendable, Equatable {
    public struct Failure: Sendable, Equatable {
        public var id: UUID
        public var instanceID: String
        public var operation: String
        public var httpStatus: Int?
        public var at: Date
    }

    public struct Group: Sendable, Equatable {
        public var provider: String
        public var status: String
        public var reason: String?
        public var count: Int
        public var lastAt: Date
        /// The newest few of the group, newest first.
        public var recent: [Failure]
    }

    public var since: Date
    public var total: Int
    /// True when the window holds more failures than were read (`OverviewStore.failureCap`): counts cover the newest.
    public var truncated: Bool
    /// How many groups the failures read fall in; `groups` holds the largest `OverviewStore.maximumGroups` of them.
    public var groupsTotal: Int
    /// Largest group first.
    public var groups: [Group]
}

/// The aggregate reads of the console: each is bounded in time and in rows, and walks an index, never the tenant's
/// whole delivery history (which may hold millions of rows).
public struct OverviewStore: Sendable {
    let database: TenantDatabase

    /// How many queued deliveries the overview counts at most.
    public static let queueCap = 100_000
    /// How many failures the failures read groups at most.
    public static let failureCap = 10_000
    /// How many deliveries of each failure group are listed.
    public static let failuresPerGroup = 5
    /// How many failure groups are listed at most, the largest. A reason is a provider's word (up to 64 characters,
    /// `ProviderNumbers.reasonText`), and a tenant's endpoint may answer a new one for every push: without this, the
    /// failures of a window could fall in as many groups as there are failures (10,000 cards in the console).
    public static let maximumGroups = 50
    /// How far back the overview counts instances. Instances live at most 8 hours, so every open one is in it.
    public static let instanceWindow: TimeInterval = 24 * 3600

    public init(database: TenantDatabase) { self.database = database }

    /// The overview at `now`: instances of the last day by state, deliveries queued in each of the last `minutes`
    /// minutes (the current one last) by provider and current status, and the queue. One snapshot.
    public func overview(tenant: UUID, now: Date, minutes: Int = 60) async throws -> TenantOverview {
        let instancesSince = now.addingTimeInterval(-Self.instanceWindow)
        let currentMinute = (now.timeIntervalSince1970 / 60).rounded(.down) * 60
        let deliveriesSince = Date(timeIntervalSince1970: currentMinute - Double(minutes - 1) * 60)
        // Delivery IDs are ULIDs (from Swift or marquee_new_ulid()): the smallest ID of the window's first millisecond
        // bounds the primary key's range, so only the window's deliveries are read (their number is the cost: about
        // 250 ms for 200,000 in the hour on the 2-core test machine). The queue is read through the fair-claim index
        // (tenant_id, next_attempt_at), whose predicate the query states on purpose (0046): without it the planner
        // took the global due index and walked every tenant's queue (74 ms with another tenant's 200,000 queued, for
        // an empty queue of this one; 0.1 ms with it). Oldest first, so the cap keeps the oldest due.
        let firstID = Self.smallestID(at: deliveriesSince)
        let rows = try await database.tenantRead(
            tenant,
            [
                Self.instancesQuery(tenant: tenant, since: instancesSince, now: now),
                """
                SELECT floor(extract(epoch FROM created_at - \(deliveriesSince)) / 60)::int AS minute, provider, status,
                       count(*)::int AS n
                FROM deliveries
                WHERE tenant_id = \(tenant) AND id >= \(firstID) AND created_at >= \(deliveriesSince)
                GROUP BY 1, 2, 3
                """,
                // Counted in the due index's order (by lane, migration 0071): queueCap + 1 rows are read to learn
                // that there are more, and only the first queueCap are counted (k), so the counts never add up to more
                // than the cap. The oldest due (of any provider) is the oldest of each lane's first, wherever the
                // count stopped.
                """
                SELECT provider, count(*) FILTER (WHERE k <= \(Self.queueCap) AND next_attempt_at <= \(now))::int AS due,
                       count(*) FILTER (WHERE k <= \(Self.queueCap) AND next_attempt_at > \(now))::int AS later,
                       bool_or(k > \(Self.queueCap)) AS capped,
                       (SELECT min(o.next_attempt_at)
                        FROM generate_series(0, marquee_queue_lanes() - 1) AS g(n)
                        CROSS JOIN LATERAL (
                            SELECT d.next_attempt_at FROM delivery_queue d
                            WHERE d.tenant_id = \(tenant) AND d.lane = g.n AND d.status = 'queued'
                              AND d.next_attempt_at > '-infinity' AND d.next_attempt_at <= \(now)
                            ORDER BY d.next_attempt_at LIMIT 1) o) AS oldest_due
                FROM (SELECT r.*, row_number() OVER () AS k
                      FROM (SELECT provider, next_attempt_at FROM delivery_queue
                            WHERE tenant_id = \(tenant) AND status = 'queued' AND next_attempt_at > '-infinity'
                            LIMIT \(Self.queueCap + 1)) r) q
                GROUP BY provider
                """,
            ])
        var byState: [InstanceState: Int] = [:]
        for state in InstanceState.allCases { byState[state] = 0 }
        for row in rows[0] {
            byState[try row.decodeRaw(InstanceState.self, "state")] = try row.decode(Int.self, "n")
        }
        var series: [String: TenantOverview.Series] = [:]
        for row in rows[1] {
            let minute = try row.decode(Int.self, "minute")
            guard (0..<minutes).contains(minute) else { continue }
            let provider = try row.decode(String.self, "provider")
            let status = try row.decode(String.self, "status")
            let key = provider + "/" + status
            var line =
                series[key]
                ?? TenantOverview.Series(
                    provider: provider, status: status, counts: Array(repeating: 0, count: minutes))
            line.counts[minute] += try row.decode(Int.self, "n")
            series[key] = line
        }
        var due = 0
        var later = 0
        var oldest: Date?
        var byProvider: [String: Int] = [:]
        var capped = false
        for row in rows[2] {
            let d = try row.decode(Int.self, "due")
            let l = try row.decode(Int.self, "later")
            due += d
            later += l
            byProvider[try row.decode(String.self, "provider")] = d + l
            if let o = try row.decode(Date?.self, "oldest_due") { oldest = min(oldest ?? o, o) }
            if try row.decode(Bool.self, "capped") { capped = true }
        }
        return TenantOverview(
            instancesSince: instancesSince, instancesByState: byState, deliveriesSince: deliveriesSince,
            minutes: minutes,
            series: series.values.sorted { ($0.provider, $0.status) < ($1.provider, $1.status) },
            queueDue: due, queueLater: later, queueByProvider: byProvider, oldestDueAt: oldest,
            queueCapped: capped)
    }

    /// The overview's instances started since `since`, by effective state. `started_at > '-infinity'` is what lets it
    /// read instances_recent (migration 0053) under a generic plan, which a prepared statement may get after a few runs:
    /// `started_at >= $3` alone does not imply the index's predicate (the value could be -infinity), and the generic
    /// plan then took instances_person, whose leading person_id it does not name: a walk of every tenant's entries.
    static func instancesQuery(tenant: UUID, since: Date, now: Date) -> PostgresQuery {
        """
        SELECT CASE WHEN state IN ('pending', 'active') AND expires_at <= \(now) THEN 'expired' ELSE state END
                   AS state, count(*)::int AS n
        FROM instances
        WHERE tenant_id = \(tenant) AND started_at > '-infinity' AND started_at >= \(since)
        GROUP BY 1
        """
    }

    /// The failed and undeliverable deliveries recorded since `since` (the newest `failureCap`), grouped by provider,
    /// status and reason, the largest `maximumGroups` groups, largest first, each with its newest few.
    public func failures(tenant: UUID, since: Date) async throws -> DeliveryFailures {
        // failureCap + 1 failures are read to learn that there are more (found), and only the newest failureCap (k)
        // are grouped and counted, so that the groups add up to the total. Groups are ranked by size, then by their
        // newest failure (provider, status and reason break the last ties, so that the rank names one group); a
        // group's first row (pos 1) counts the groups.
        let rows = try await database.tenantRead(
            tenant,
            [
                """
                SELECT * FROM (
                    SELECT r.*, count(*) FILTER (WHERE pos = 1) OVER () AS groups_total,
                           dense_rank() OVER (ORDER BY n DESC, last_at DESC, provider, status, reason) AS group_rank
                    FROM (
                        SELECT f.*, count(*) OVER () AS total, count(*) OVER g AS n, max(updated_at) OVER g AS last_at,
                               row_number() OVER (g ORDER BY updated_at DESC, id DESC) AS pos
                        FROM (SELECT l.*, row_number() OVER (ORDER BY updated_at DESC, id DESC) AS k,
                                     count(*) OVER () AS found
                              FROM (SELECT id, instance_id, provider, status, reason, http_status, operation,
                                           recorded_at AS updated_at
                                    FROM delivery_history
                                    WHERE tenant_id = \(tenant) AND status IN ('failed', 'undeliverable')
                                      AND recorded_at >= \(since)
                                    ORDER BY recorded_at DESC LIMIT \(Self.failureCap + 1)) l) f
                        WHERE k <= \(Self.failureCap)
                        WINDOW g AS (PARTITION BY provider, status, reason)
                    ) r
                    WHERE pos <= \(Self.failuresPerGroup)
                ) ranked
                WHERE group_rank <= \(Self.maximumGroups)
                ORDER BY group_rank, updated_at DESC, id DESC
                """
            ])
        var groups: [DeliveryFailures.Group] = []
        var total = 0
        var found = 0
        var groupsTotal = 0
        for row in rows[0] {
            total = Int(try row.decode(Int64.self, "total"))
            found = Int(try row.decode(Int64.self, "found"))
            groupsTotal = Int(try row.decode(Int64.self, "groups_total"))
            let provider = try row.decode(String.self, "provider")
            let status = try row.decode(String.self, "status")
            let reason = try row.decode(String?.self, "reason")
            if groups.last.map({ $0.provider != provider || $0.status != status || $0.reason != reason }) ?? true {
                groups.append(
                    DeliveryFailures.Group(
                        provider: provider, status: status, reason: reason,
                        count: Int(try row.decode(Int64.self, "n")), lastAt: try row.decode(Date.self, "last_at"),
                        recent: []))
            }
            groups[groups.count - 1].recent.append(
                DeliveryFailures.Failure(
                    id: try row.decode(UUID.self, "id"), instanceID: try row.decode(String.self, "instance_id"),
                    operation: try row.decode(String.self, "operation"),
                    httpStatus: try row.decode(Int?.self, "http_status"), at: try row.decode(Date.self, "updated_at")))
        }
        return DeliveryFailures(
            since: since, total: total, truncated: found > Self.failureCap,
            groupsTotal: groupsTotal, groups: groups)
    }

    /// The smallest ULID (as a UUID) of the millisecond `date` falls in: every delivery created at or after `date`
    /// has an ID at least this.
    static func smallestID(at date: Date) -> UUID {
        let milliseconds = UInt64(max(0, (date.timeIntervalSince1970 * 1000).rounded(.down)))
        var bytes = [UInt8](repeating: 0, count: 16)
        for index in 0..<6 { bytes[index] = UInt8(truncatingIfNeeded: milliseconds >> (8 * (5 - index))) }
        return ULID(bytes: bytes).uuid
    }
}
