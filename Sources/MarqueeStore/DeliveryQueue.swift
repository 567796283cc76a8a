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
    public var attempts: Int
    public var createdAt: Date
    /// The instance as it is now (its state decides whether the delivery is still wanted).
    public var instance: InstanceRecord
    public var activityType: ActivityType
    /// What this delivery sends, as it was queued (the instance row's current values for rows older than the
    /// snapshot columns): attributes, content state, options (alert included) and the push timestamp of its version.
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var options: JSONValue
    public var contentTimestamp: Int64
    /// The instance's broadcast channel: a `channel` delivery broadcasts on it; a start carries it.
    public var channel: ChannelBinding?
    /// For a push-to-start of a channel-backed instance: the device's OS version, as its SDK reported it.
    public var deviceOSVersion: String?
}

/// How one attempt ended, to record.
public struct DeliveryResult: Sendable {
    /// `queued` is a retry; `parked` waits for the tenant to replace a broken credential; `superseded` was not sent
    /// because its instance ended or a newer version for its token exists.
    public typealias Status = DeliveryStatus
    public var tenantID: UUID
    public var id: UUID
    public var status: Status
    public var providerID: String?
    public var httpStatus: Int?
    public var reason: String?
    /// For `queued` (a retry): when to try again.
    public var nextAttemptAt: Date?
    /// For an APNs push that was sent: the `apns-priority` it went out with.
    public var apnsPriority: Int?

    public init(
        tenantID: UUID, id: UUID, status: Status, providerID: String? = nil, httpStatus: Int? = nil,
        reason: String? = nil, nextAttemptAt: Date? = nil, apnsPriority: Int? = nil
    ) {
        self.apnsPriority = apnsPriority
        self.tenantID = tenantID
        self.id = id
        self.status = status
        self.providerID = providerID
        self.httpStatus = httpStatus
        self.reason = reason
        self.nextAttemptAt = nextAttemptAt
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

/// Queue depth for metrics, for one provider.
public struct QueueStatistics: Sendable, Equatable {
    public var due: Int
    public var oldestDueAge: Double
    public var inFlight: Int

    public init(due: Int = 0, oldestDueAge: Double = 0, inFlight: Int = 0) {
        self.due = due
        self.oldestDueAge = oldestDueAge
        self.inFlight = inFlight
    }
}

/// The delivery queue as workers see it: claims with `FOR UPDATE SKIP LOCKED` and a lease, results in batches.
///
/// Workers work across tenants, so these statements run as `marquee_system` (the worker's sessions start as that
/// role, migration 0010), which row-level security lets see every tenant; each still names `tenant_id` in its keys.
public struct DeliveryQueue: Sendable {
    let pool: PostgresPool

    public init(pool: PostgresPool) {
        self.pool = pool
    }

    /// Claims up to `limit` due deliveries for `worker`, leased until `lease` from now (`next_attempt_at` moves to the
    /// lease's end too, so that a dead worker's claims become due again by themselves). Takes at most one delivery
    /// per (instance, token), the oldest, and none for a token that has one in flight already, so a token never gets
    /// version N+1 while N is in flight or waiting for a retry. Deliveries of a broken credential are `parked`, outside
    /// the due index, so no claim walks past them. (Deliveries of ended or expired instances are claimed and settled
    /// by the worker without a send, from the joined instance row.)
    /// The statement timeout of a claim's statements, in milliseconds (as text, for `set_config`).
    static let claimTimeoutMilliseconds = "2000"

    public func claim(
        worker: String, limit: Int, lease: Duration, providers: [PlannedDelivery.Provider] = [.apns, .fcm]
    ) async throws -> [ClaimedDelivery] {
        let providerNames = providers.map(\.rawValue)
        let leaseSeconds = Double(lease.components.seconds)
        return try await pool.transaction { connection in
            // A claim takes milliseconds. One planned on statistics from before a burst of queued rows can scan the
            // whole burst per claimed row (seconds to minutes): it is stopped, and the worker refreshes the
            // statistics (marquee_refresh_queue_statistics) and claims again.
            try connection.query("SELECT set_config('statement_timeout', \(Self.claimTimeoutMilliseconds), true)")
            // Fairness: the tenants with due deliveries (a skip scan over deliveries_due_by_tenant, starting at a
            // random tenant and wrapping around, at most `limit` of them), then the oldest due deliveries of each,
            // an equal share, interleaved below, so one tenant's backlog never holds back another's update.
            // Leased rows carry next_attempt_at = lease end, so they are not due: no scan wades through them.
            let pivot = SecureRandom.uuid()
            let tenantRows = try connection.query(
                """
                WITH RECURSIVE hi AS (
                    SELECT (SELECT d.tenant_id FROM deliveries d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id >= \(pivot)
                              AND d.provider = ANY(\(providerNames)::text[])
                            ORDER BY d.tenant_id LIMIT 1) AS tenant_id, 1 AS n
                    UNION ALL
                    SELECT (SELECT d.tenant_id FROM deliveries d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id > hi.tenant_id
                              AND d.provider = ANY(\(providerNames)::text[])
                            ORDER BY d.tenant_id LIMIT 1), hi.n + 1
                    FROM hi WHERE hi.tenant_id IS NOT NULL AND hi.n < \(limit)
                ), lo AS (
                    SELECT (SELECT d.tenant_id FROM deliveries d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id < \(pivot)
                              AND d.provider = ANY(\(providerNames)::text[])
                            ORDER BY d.tenant_id LIMIT 1) AS tenant_id, 1 AS n
                    UNION ALL
                    SELECT (SELECT d.tenant_id FROM deliveries d
                            WHERE d.status = 'queued' AND d.next_attempt_at <= now()
                              AND d.next_attempt_at > '-infinity' AND d.tenant_id > lo.tenant_id
                              AND d.tenant_id < \(pivot) AND d.provider = ANY(\(providerNames)::text[])
                            ORDER BY d.tenant_id LIMIT 1), lo.n + 1
                    FROM lo WHERE lo.tenant_id IS NOT NULL AND lo.n < \(limit)
                )
                SELECT tenant_id FROM (
                    SELECT tenant_id, n FROM hi WHERE tenant_id IS NOT NULL
                    UNION ALL SELECT tenant_id, n + \(limit) FROM lo WHERE tenant_id IS NOT NULL
                ) t ORDER BY n LIMIT \(limit)
                """)
            var dueTenants = try tenantRows.map { try $0.decode(UUID.self, "tenant_id") }
            guard !dueTenants.isEmpty else { return [] }
            let share = max(1, (limit * 2 + dueTenants.count - 1) / dueTenants.count)
            // Send rate limits: the buckets of the limited tenants among them, locked in tenant order (two claims
            // never deadlock) until this claim commits, and refilled to now. A tenant gets at most its whole tokens.
            let buckets = try connection.query(
                """
                WITH locked AS (
                    SELECT tenant_id FROM send_limits WHERE tenant_id = ANY(\(dueTenants)::uuid[])
                    ORDER BY tenant_id FOR UPDATE
                )
                UPDATE send_limits l
                SET tokens = LEAST(l.rate_per_second::float8,
                                   l.tokens + l.rate_per_second
                                       * GREATEST(0, EXTRACT(epoch FROM clock_timestamp() - l.refilled_at))::float8),
                    refilled_at = GREATEST(l.refilled_at, clock_timestamp())
                FROM locked WHERE l.tenant_id = locked.tenant_id
                RETURNING l.tenant_id, floor(l.tokens)::int AS allowance
                """)
            var allowance: [UUID: Int] = [:]
            for row in buckets {
                allowance[try row.decode(UUID.self, "tenant_id")] = try row.decode(Int.self, "allowance")
            }
            dueTenants.removeAll { allowance[$0] == 0 }
            guard !dueTenants.isEmpty else { return [] }
            let shares = dueTenants.map { min(share, allowance[$0] ?? share) }
            let candidates = try connection.query(
                """
                SELECT c.tenant_id, c.id, c.instance_id, c.token, c.instance_version
                FROM unnest(\(dueTenants)::uuid[], \(shares)::int[]) WITH ORDINALITY AS t(tenant_id, share, position)
                CROSS JOIN LATERAL (
                    SELECT d.tenant_id, d.id, d.instance_id, d.token, d.instance_version, d.next_attempt_at
                    FROM deliveries d
                    WHERE d.tenant_id = t.tenant_id AND d.status = 'queued' AND d.next_attempt_at <= now()
                      AND d.next_attempt_at > '-infinity'
                      AND d.provider = ANY(\(providerNames)::text[])
                    ORDER BY d.next_attempt_at
                    LIMIT t.share
                    FOR UPDATE OF d SKIP LOCKED
                ) c
                ORDER BY t.position, c.next_attempt_at
                """)
            // Round robin: each tenant's first candidate, then each tenant's second, and so on.
            var rank: [UUID: Int] = [:]
            var ranked: [(rank: Int, tenantPosition: Int, row: PostgresRow)] = []
            let position = Dictionary(uniqueKeysWithValues: dueTenants.enumerated().map { ($1, $0) })
            for row in candidates {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let r = rank[tenant, default: 0]
                rank[tenant] = r + 1
                ranked.append((r, position[tenant] ?? 0, row))
            }
            ranked.sort { ($0.rank, $0.tenantPosition) < ($1.rank, $1.tenantPosition) }
            // Per (instance, token) the oldest version among the candidates: a newer one is not claimed while an
            // older one is queued, so picking it would claim nothing for that token.
            var slot: [String: Int] = [:]
            var picked: [(tenant: UUID, id: UUID, version: Int)] = []
            for row in ranked.map(\.row) {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let key =
                    "\(tenant)|\(try row.decode(String.self, "instance_id"))|\(try row.decode(String.self, "token"))"
                let candidate = (tenant, try row.decode(UUID.self, "id"), try row.decode(Int.self, "instance_version"))
                if let index = slot[key] {
                    if candidate.2 < picked[index].version { picked[index] = candidate }
                    continue
                }
                guard picked.count < limit else { continue }
                slot[key] = picked.count
                picked.append(candidate)
            }
            let tenants = picked.map(\.tenant)
            let ids = picked.map(\.id)
            guard !ids.isEmpty else { return [] }
            let rows = try connection.query(
                """
                WITH claimed AS (
                    UPDATE deliveries d
                    SET locked_until = now() + make_interval(secs => \(leaseSeconds)),
                        next_attempt_at = now() + make_interval(secs => \(leaseSeconds)), locked_by = \(worker),
                        attempts = attempts + 1, updated_at = now()
                    FROM unnest(\(tenants)::uuid[], \(ids)::uuid[]) AS c(tenant_id, id)
                    WHERE d.tenant_id = c.tenant_id AND d.id = c.id
                      -- A token never gets version N+1 while N is in flight or waiting for its retry.
                      AND NOT EXISTS (
                          SELECT 1 FROM deliveries o
                          WHERE o.tenant_id = d.tenant_id AND o.instance_id = d.instance_id AND o.token = d.token
                            AND o.status = 'queued' AND o.id <> d.id
                            AND (o.locked_until >= now() OR o.instance_version < d.instance_version))
                    RETURNING d.*
                )
                SELECT c.tenant_id, c.id AS delivery_id, c.instance_id, c.device_token, c.provider, c.token_kind,
                       c.token, c.operation, c.attempts, c.created_at AS delivery_created_at,
                       COALESCE(c.attributes, i.attributes) AS snap_attributes,
                       COALESCE(c.content_state, i.content_state) AS snap_content_state,
                       COALESCE(c.options, i.options) AS snap_options,
                       COALESCE(c.content_timestamp, i.content_timestamp) AS snap_content_timestamp,
                       \(unsafeRaw: LiveActivityStore.instanceColumns("i")), \(unsafeRaw: LiveActivityStore.typeColumnsJoined),
                       \(unsafeRaw: LiveActivityStore.channelColumnsJoined),
                       CASE WHEN i.channel_id IS NOT NULL AND c.token_kind = 'push_to_start' THEN
                           (SELECT dv.os_version FROM devices dv
                            WHERE dv.tenant_id = c.tenant_id AND dv.token = c.device_token)
                       END AS device_os_version
                FROM claimed c
                JOIN instances i ON i.tenant_id = c.tenant_id AND i.id = c.instance_id
                JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type
                LEFT JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
                """)
            if !allowance.isEmpty {
                // Spend what was claimed, under the locks taken above.
                var used: [UUID: Int] = [:]
                for row in rows {
                    let tenant = try row.decode(UUID.self, "tenant_id")
                    if allowance[tenant] != nil { used[tenant, default: 0] += 1 }
                }
                if !used.isEmpty {
                    try connection.execute(
                        """
                        UPDATE send_limits l SET tokens = GREATEST(0, l.tokens - u.used)
                        FROM unnest(\(Array(used.keys))::uuid[], \(Array(used.values))::int[]) AS u(tenant_id, used)
                        WHERE l.tenant_id = u.tenant_id
                        """)
                }
            }
            return try rows.map { row in
                ClaimedDelivery(
                    tenantID: try row.decode(UUID.self, "tenant_id"), id: try row.decode(UUID.self, "delivery_id"),
                    instanceID: try row.decode(String.self, "instance_id"),
                    deviceToken: try row.decode(String.self, "device_token"),
                    provider: try row.decodeRaw(PlannedDelivery.Provider.self, "provider"),
                    tokenKind: try row.decodeRaw(PlannedDelivery.TokenKind.self, "token_kind"),
                    token: try row.decode(String.self, "token"),
                    operation: try row.decodeRaw(LiveActivityEvent.self, "operation"),
                    attempts: try row.decode(Int.self, "attempts"),
                    createdAt: try row.decode(Date.self, "delivery_created_at"),
                    instance: try LiveActivityStore.instance(row), activityType: try RegistryStore.activityType(row),
                    attributes: try row.decode(JSONValue.self, "snap_attributes"),
                    contentState: try row.decode(JSONValue.self, "snap_content_state"),
                    options: try row.decode(JSONValue.self, "snap_options"),
                    contentTimestamp: try row.decode(Int64.self, "snap_content_timestamp"),
                    channel: try ChannelBinding.decode(row),
                    deviceOSVersion: try row.decode(String?.self, "device_os_version"))
            }
        }
    }

    /// Records results, retires dead tokens, and marks instances `active` once something reached a device — one
    /// transaction for the whole batch. Only rows still leased by `worker` are written (a lease that ran out and was
    /// claimed again belongs to the new claimant). A retry is superseded when a newer version for the same token
    /// exists (so N never reaches a token after N+1); a row to park is queued instead if its credential was replaced
    /// meanwhile.
    public func record(worker: String, _ results: [DeliveryResult], retire: [TokenRetirement]) async throws {
        guard !results.isEmpty || !retire.isEmpty else { return }
        let tenants = results.map(\.tenantID)
        let ids = results.map(\.id)
        let statuses = results.map(\.status.rawValue)
        let providerIDs = results.map(\.providerID)
        let httpStatuses = results.map { $0.httpStatus.map(String.init) }
        let reasons = results.map(\.reason)
        let nextAt = results.map { r in r.nextAttemptAt.map { String(format: "%.6f", $0.timeIntervalSince1970) } }
        let priorities = results.map { $0.apnsPriority.map(String.init) }
        try await pool.transaction { connection in
            if !ids.isEmpty {
                try connection.execute(
                    """
                    UPDATE deliveries d SET
                        status = CASE
                            WHEN v.status = 'queued' AND EXISTS (
                                SELECT 1 FROM deliveries n
                                WHERE n.tenant_id = d.tenant_id AND n.instance_id = d.instance_id
                                  AND n.token = d.token AND n.instance_version > d.instance_version
                                  AND n.status IN ('queued', 'parked', 'sent')) THEN 'superseded'
                            WHEN v.status = 'parked' AND NOT marquee_credential_broken(d.tenant_id, d.provider)
                                THEN 'queued'
                            ELSE v.status END,
                        provider_id = COALESCE(v.provider_id, d.provider_id),
                        http_status = v.http_status::int, reason = v.reason, locked_until = NULL,
                        next_attempt_at = COALESCE(to_timestamp(v.next_at::double precision), d.next_attempt_at),
                        sent_at = CASE WHEN v.status = 'sent' THEN now() ELSE d.sent_at END, updated_at = now(),
                        apns_priority = COALESCE(v.apns_priority::smallint, d.apns_priority)
                    FROM unnest(\(tenants)::uuid[], \(ids)::uuid[], \(statuses)::text[], \(providerIDs)::text[],
                                \(httpStatuses)::text[], \(reasons)::text[], \(nextAt)::text[], \(priorities)::text[])
                         AS v(tenant_id, id, status, provider_id, http_status, reason, next_at, apns_priority)
                    WHERE d.tenant_id = v.tenant_id AND d.id = v.id AND d.locked_by = \(worker)
                    """)
                try connection.execute(
                    """
                    UPDATE instances i SET state = 'active', updated_at = now()
                    FROM (SELECT DISTINCT d.tenant_id, d.instance_id FROM deliveries d
                          JOIN unnest(\(tenants)::uuid[], \(ids)::uuid[], \(statuses)::text[]) AS v(tenant_id, id, status)
                            ON d.tenant_id = v.tenant_id AND d.id = v.id
                          WHERE v.status = 'sent') s
                    WHERE i.tenant_id = s.tenant_id AND i.id = s.instance_id AND i.state IN ('pending', 'failed')
                    """)
            }
            for r in retire {
                let before = r.unregisteredAt ?? Date.distantFuture
                switch r.kind {
                case .pushToStart:
                    try connection.execute(
                        """
                        UPDATE push_to_start_tokens SET status = 'retired', retired_reason = \(r.reason), retired_at = now()
                        WHERE tenant_id = \(r.tenantID) AND device_token = \(r.deviceToken) AND token = \(r.token)
                          AND status = 'active' AND updated_at <= \(before)
                        """)
                case .activity:
                    try connection.execute(
                        """
                        UPDATE activity_tokens SET status = 'retired', retired_reason = \(r.reason), retired_at = now()
                        WHERE tenant_id = \(r.tenantID) AND device_token = \(r.deviceToken) AND token = \(r.token)
                          AND status = 'active' AND updated_at <= \(before)
                        """)
                case .channel:
                    // Apple no longer knows the channel (ChannelNotRegistered / BadChannelId): it is gone, and the
                    // broadcasts still waiting on it fail with the same reason. Later changes plan none on it.
                    try connection.execute(
                        """
                        UPDATE channels SET status = 'gone', status_reason = \(r.reason)
                        WHERE tenant_id = \(r.tenantID) AND apns_channel_id = \(r.token) AND status = 'active'
                        """)
                    try connection.execute(
                        """
                        UPDATE deliveries SET status = 'failed', reason = \(r.reason), updated_at = now()
                        WHERE tenant_id = \(r.tenantID) AND token_kind = 'channel' AND token = \(r.token)
                          AND status IN ('queued', 'parked') AND (locked_until IS NULL OR locked_until < now())
                        """)
                case .fcm:
                    // An FCM registration token is the Android device's token: the device is gone.
                    try connection.execute(
                        """
                        DELETE FROM devices
                        WHERE tenant_id = \(r.tenantID) AND token = \(r.token) AND updated_at <= \(before)
                        """)
                }
            }
        }
    }

    /// Marks a tenant's credentials for `provider` broken, so that its deliveries pause until they are replaced.
    public func markCredentialBroken(tenant: UUID, provider: PlannedDelivery.Provider, reason: String) async throws {
        let table = provider == .apns ? "apns_credentials" : "fcm_credentials"
        try await pool.execute(
            """
            UPDATE \(unsafeRaw: table) SET status = 'broken', status_reason = \(reason)
            WHERE tenant_id = \(tenant) AND status <> 'broken'
            """)
    }

    /// Returns leased deliveries to the queue at once (used when a worker stops before sending them).
    public func release(worker: String, ids: [(UUID, UUID)]) async throws {
        guard !ids.isEmpty else { return }
        try await pool.execute(
            """
            UPDATE deliveries d SET locked_until = NULL, attempts = greatest(attempts - 1, 0), updated_at = now()
            FROM unnest(\(ids.map(\.0))::uuid[], \(ids.map(\.1))::uuid[]) AS v(tenant_id, id)
            WHERE d.tenant_id = v.tenant_id AND d.id = v.id AND d.locked_by = \(worker) AND d.status = 'queued'
            """)
    }

    /// Analyses the queue table once a fifth of it changed since the last analysis (migration 0047), so a burst of
    /// enqueued deliveries does not leave the claim planned for an empty table. Returns whether it analysed.
    @discardableResult
    public func refreshStatistics() async throws -> Bool {
        let rows = try await pool.query("SELECT marquee_refresh_queue_statistics() AS analysed")
        return try rows.first?.decode(Bool.self, "analysed") ?? false
    }

    /// Deletes idempotency records past their 24 hours, a bounded number at a time; returns how many went.
    @discardableResult
    public func expireIdempotencyKeys(limit: Int = 10_000) async throws -> Int {
        try await pool.execute(
            """
            DELETE FROM idempotency_keys k
            USING (SELECT tenant_id, key FROM idempotency_keys
                   WHERE created_at <= now() - interval '24 hours' LIMIT \(limit)) old
            WHERE k.tenant_id = old.tenant_id AND k.key = old.key
            """)
    }

    /// Per provider: due deliveries, the age of the oldest, and how many are leased now. Every provider is present
    /// (zeros when it has nothing queued), so gauges keep their series.
    public func statistics() async throws -> [PlannedDelivery.Provider: QueueStatistics] {
        let rows = try await pool.query(
            """
            SELECT provider,
                   count(*) FILTER (WHERE locked_until IS NULL OR locked_until < now())::int AS due,
                   COALESCE(extract(epoch FROM now() - min(next_attempt_at)
                       FILTER (WHERE locked_until IS NULL OR locked_until < now())), 0)::float8 AS oldest,
                   count(*) FILTER (WHERE locked_until >= now())::int AS in_flight
            FROM deliveries WHERE status = 'queued' AND next_attempt_at <= now()
            GROUP BY provider
            """)
        var byProvider = Dictionary(
            uniqueKeysWithValues: PlannedDelivery.Provider.allCases.map { ($0, QueueStatistics()) })
        for row in rows {
            guard let provider = PlannedDelivery.Provider(rawValue: try row.decode(String.self, "provider")) else {
                continue
            }
            byProvider[provider] = QueueStatistics(
                due: try row.decode(Int.self, "due"), oldestDueAge: try row.decode(Double.self, "oldest"),
                inFlight: try row.decode(Int.self, "in_flight"))
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
    public func fcmCredential(tenant: UUID) async throws -> (FCMCredentialInfo, sealed: [UInt8])? {
        let rows = try await pool.query(
            """
            SELECT \(unsafeRaw: CredentialStore.fcmColumns), sealed_service_account FROM fcm_credentials
            WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else { return nil }
        return (try CredentialStore.fcmInfo(row), try row.decode([UInt8].self, "sealed_service_account"))
    }

    /// The tenant's sealed delivery secret.
    public func sealedDeliverySecret(tenant: UUID) async throws -> [UInt8]? {
        let rows = try await pool.query("SELECT sealed_delivery_secret FROM tenants WHERE id = \(tenant)")
        return try rows.first?.decode([UInt8].self, "sealed_delivery_secret")
    }
}
