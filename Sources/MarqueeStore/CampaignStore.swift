import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// Who a campaign addresses, resolved once when it starts.
public enum CampaignAudience: Sendable, Equatable {
    case segment(String)
    case people([String])
    case all

    public var json: JSONValue {
        switch self {
        case .segment(let id): .object(["segment": .string(id)])
        case .people(let ids): .object(["people": .array(ids.map(JSONValue.string))])
        case .all: .object(["all": .bool(true)])
        }
    }

    /// The stored form back; nil for anything else.
    public init?(json: JSONValue) {
        if let id = json["segment"]?.stringValue {
            self = .segment(id)
        } else if let ids = json["people"]?.arrayValue {
            self = .people(ids.compactMap(\.stringValue))
        } else if json["all"]?.boolValue == true {
            self = .all
        } else {
            return nil
        }
    }
}

/// A new campaign as the API validated it.
public struct CampaignCreate: Sendable {
    public var id: String
    public var name: String
    public var activityType: String
    public var audience: CampaignAudience
    public var template: PersonTemplate
    /// Device encoding, checked.
    public var contentState: JSONValue
    public var options: JSONValue
    public var platform: Platform?
    public var expiresAt: Date?
    public var rateLimitPerSecond: Int?
    public var startAt: Date
    /// How far a person's filled attributes may outgrow the template's sample before the payload is too large.
    public var headroom: Int
    /// The broadcast channel the campaign's instances subscribe to.
    public var channelID: UUID? = nil

    public init(
        id: String, name: String, activityType: String, audience: CampaignAudience, template: PersonTemplate,
        contentState: JSONValue, options: JSONValue, platform: Platform?, expiresAt: Date?, rateLimitPerSecond: Int?,
        startAt: Date, headroom: Int, channelID: UUID? = nil
    ) {
        self.channelID = channelID
        self.id = id
        self.name = name
        self.activityType = activityType
        self.audience = audience
        self.template = template
        self.contentState = contentState
        self.options = options
        self.platform = platform
        self.expiresAt = expiresAt
        self.rateLimitPerSecond = rateLimitPerSecond
        self.startAt = startAt
        self.headroom = headroom
    }
}

/// A campaign-wide update or end, run by the scheduler at its due time.
public struct CampaignChange: Sendable, Equatable {
    public typealias Operation = LifecyclePlanner.Operation
    public var operation: Operation
    public var content: ContentChange
    /// Options to set (a null value clears one): alert, deep_link, stale_date, relevance_score, priority,
    /// dismissal_date, in `StoredOptions`' JSON form.
    public var options: [String: JSONValue]

    public init(operation: Operation, content: ContentChange, options: [String: JSONValue]) {
        self.operation = operation
        self.content = content
        self.options = options
    }

    var json: JSONValue {
        var o: [String: JSONValue] = ["options": .object(options)]
        switch content {
        case .replace(let s): o["content_state"] = s
        case .patch(let p): o["content_state_patch"] = p
        case .none: break
        }
        return .object(o)
    }

    init(operation: Operation, json: JSONValue) {
        self.operation = operation
        if let s = json["content_state"] {
            content = .replace(s)
        } else if let p = json["content_state_patch"] {
            content = .patch(p)
        } else {
            content = .none
        }
        options = json["options"]?.objectValue ?? [:]
    }
}

/// A campaign as stored.
public struct CampaignRecord: Sendable, Equatable {
    public var id: String
    public var name: String
    public var activityType: String
    public var audience: JSONValue
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var options: JSONValue
    public var platform: Platform?
    public var expiresAt: Date?
    public var rateLimitPerSecond: Int?
    public var channelID: UUID?
    /// As clients see it (ending and ended derived from the instances).
    public var state: CampaignState
    public var failureReason: String?
    public var startAt: Date
    public var audienceSize: Int?
    public var startedAt: Date?
    public var endedAt: Date?
    public var cancelledAt: Date?
    public var createdAt: Date
    public var updatedAt: Date
}

/// A campaign's start or scheduled change.
public struct CampaignScheduleRecord: Sendable, Equatable {
    public var id: UUID
    public var operation: String
    public var dueAt: Date
    public var state: String
    public var result: JSONValue?
    public var createdAt: Date
    public var executedAt: Date?
}

/// One row of a funnel: a platform, an operation, and how the pushes went (per device token, or one broadcast on a
/// channel for all its subscribers).
public struct CampaignFunnelRow: Sendable, Equatable {
    public var platform: Platform
    public var operation: String
    /// `token` or `channel`.
    public var via: String
    public var targeted: Int
    public var queued: Int
    public var sent: Int
    public var failed: Int
    public var undeliverable: Int
    public var superseded: Int
    public var delivered: Int
    public var opened: Int
}

/// A campaign with its instance counts, funnel and schedules.
public struct CampaignDetail: Sendable {
    public var campaign: CampaignRecord
    /// Instances by state (open ones past their expiration count as expired).
    public var instances: [String: Int]
    public var skipped: [String: Int]
    public var funnel: [CampaignFunnelRow]
    public var schedules: [CampaignScheduleRecord]
}

/// What one scheduler run did.
public struct CampaignRun: Sendable, Equatable {
    public var tenantID: UUID
    public var campaignID: String
    public var scheduleID: UUID
    public var operation: String
    /// `done`; `starting` (a start with more of its audience to write: run again) or `broadcast` (the first half of a
    /// channel-backed change); `busy` (nothing done: its campaign is being written by another run, or an older change
    /// of it is still pending; skip it until the next wake-up); or `failed` with the reason in the result.
    public var state: String
    public var result: JSONValue
}

/// Why a schedule request cannot be accepted.
public enum CampaignScheduleRefusal: Error, Sendable, Equatable {
    /// The campaign is cancelled, failed, or has ended: nothing more can happen to it.
    case closed(CampaignState)
}

/// Campaigns: created with their start schedule, changed campaign-wide by schedules the worker pool runs exactly once,
/// read with their funnel. Every write that touches the audience is set-based.
public struct CampaignStore: Sendable {
    let database: TenantDatabase
    let notifyChannel: String

    public init(database: TenantDatabase, notifyChannel: String = "marquee_deliveries") {
        self.database = database
        self.notifyChannel = notifyChannel
    }

    public enum CreateOutcome: Sendable, Equatable {
        case created(state: CampaignState)
        /// The Idempotency-Key was used before: its stored response.
        case replay(StoredResponse)
        /// Another campaign has this ID.
        case idTaken
    }

    // MARK: Writes from the API

    /// Creates a campaign and its start schedule (due at `startAt`), and wakes the workers.
    public func create(
        tenant: UUID, _ c: CampaignCreate, response: @escaping @Sendable (CampaignState) -> JSONValue,
        idempotency: (key: String, hash: [UInt8])?
    ) async throws -> CreateOutcome {
        try await database.tenantTransaction(tenant) { connection in
            if let replay = try Self.claimKey(connection, tenant, idempotency) { return .replay(replay) }
            let rows = try connection.query(
                """
                INSERT INTO campaigns (tenant_id, id, name, activity_type, audience, attributes, content_state, options,
                                       platform, expires_at, rate_limit_per_second, state, start_at, channel_id)
                VALUES (\(tenant), \(c.id), \(c.name), \(c.activityType), \(c.audience.json), \(c.template.attributes),
                        \(c.contentState), \(c.options), \(c.platform?.rawValue), \(c.expiresAt),
                        \(c.rateLimitPerSecond), 'scheduled', \(c.startAt), \(c.channelID))
                ON CONFLICT (tenant_id, id) DO NOTHING
                RETURNING start_at > now() AS later
                """)
            guard let row = rows.first else {
                try connection.execute("ROLLBACK TO SAVEPOINT campaign_key")
                return .idTaken
            }
            let state: CampaignState = try row.decode(Bool.self, "later") ? .scheduled : .starting
            try connection.execute(
                """
                INSERT INTO campaign_schedules (tenant_id, campaign_id, id, operation, change, due_at)
                VALUES (\(tenant), \(c.id), \(ULIDGenerator.shared.next().uuid), 'start',
                        \(JSONValue.object([
                            "fills": c.template.fillsJSON, "sample": c.template.sample, "headroom": .int(Int64(c.headroom)),
                        ])), \(c.startAt))
                """)
            try Self.storeKey(connection, tenant, idempotency, status: 202, response: response(state))
            try connection.query("SELECT pg_notify(\(notifyChannel), '')")
            return .created(state: state)
        }
    }

    public enum ScheduleOutcome: Sendable, Equatable {
        case scheduled(id: UUID, dueAt: Date)
        case replay(StoredResponse)
    }

    /// Schedules a campaign-wide change at `at` (now when nil). `NotFound("campaign")` when there is no such campaign.
    public func schedule(
        tenant: UUID, campaignID: String, _ change: CampaignChange, at: Date?,
        response: @escaping @Sendable (UUID, Date) -> JSONValue, idempotency: (key: String, hash: [UInt8])?
    ) async throws -> ScheduleOutcome {
        try await database.tenantTransaction(tenant) { connection in
            if let replay = try Self.claimKey(connection, tenant, idempotency) { return .replay(replay) }
            // KEY SHARE: a cancel (FOR UPDATE) waits for this insert and sees it, or runs first and this sees its
            // outcome; a worker running a start step or a bulk write (FOR NO KEY UPDATE, seconds for a large audience)
            // does not hold this up, so a change is accepted at once, whatever the previous one is still writing.
            let rows = try connection.query(
                """
                SELECT \(unsafeRaw: Self.stateExpression) AS derived_state, start_at
                FROM campaigns c WHERE c.tenant_id = \(tenant) AND c.id = \(campaignID) FOR KEY SHARE
                """)
            guard let row = rows.first else { throw NotFound("campaign") }
            let state = try row.decodeRaw(CampaignState.self, "derived_state")
            guard state != .cancelled, state != .failed, state != .ended else {
                throw CampaignScheduleRefusal.closed(state)
            }
            let id = ULIDGenerator.shared.next().uuid
            let due = try connection.query(
                """
                INSERT INTO campaign_schedules (tenant_id, campaign_id, id, operation, change, due_at)
                VALUES (\(tenant), \(campaignID), \(id), \(change.operation.rawValue), \(change.json),
                        GREATEST(COALESCE(\(at), now()), \(try row.decode(Date.self, "start_at"))))
                RETURNING due_at
                """)[0].decode(Date.self, "due_at")
            try Self.storeKey(connection, tenant, idempotency, status: 202, response: response(id, due))
            try connection.query("SELECT pg_notify(\(notifyChannel), '')")
            return .scheduled(id: id, dueAt: due)
        }
    }

    public enum CancelOutcome: Sendable, Equatable {
        /// Whether the campaign itself was cancelled, and how many schedules were.
        case cancelled(campaign: Bool, schedules: Int)
        /// The Idempotency-Key was used before: its stored response.
        case replay(StoredResponse)
    }

    /// Cancels a campaign that has not started (it will never start), or else its pending scheduled changes; the
    /// answer (`response`) is kept under the Idempotency-Key, so a retry is told what the cancel did, not that a second
    /// one found nothing left. `NotFound` when there is no such campaign.
    public func cancel(
        tenant: UUID, campaignID: String, response: @escaping @Sendable (Bool, Int) -> JSONValue,
        idempotency: (key: String, hash: [UInt8])?
    ) async throws -> CancelOutcome {
        try await database.tenantTransaction(tenant) { connection in
            if let replay = try Self.claimKey(connection, tenant, idempotency) { return .replay(replay) }
            // Its pending schedules first, then the campaign row, in the order a worker running one takes them (the
            // schedule, then the campaign: CampaignRunner); the other way round, the two deadlocked. A worker running
            // one holds both until it commits, so what it did is seen here. A change a worker is running is waited
            // for: its outcome decides (no SKIP LOCKED here). A start a worker is running is not: its first step
            // resolves the whole audience in one statement, for up to the bulk statement timeout (minutes), which this
            // request would have waited out and answered 503. Being run, it has begun (below): it is left, with the
            // campaign row it holds, and the campaign's pending changes are cancelled.
            try connection.execute(
                """
                SELECT 1 FROM campaign_schedules
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND state = 'pending'
                  AND operation <> 'start'
                ORDER BY id FOR UPDATE
                """)
            let start = try connection.query(
                """
                SELECT count(*)::int AS pending,
                       (SELECT count(*) FROM (
                            SELECT 1 FROM campaign_schedules
                            WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND state = 'pending'
                              AND operation = 'start'
                            FOR UPDATE SKIP LOCKED) free)::int AS free
                FROM campaign_schedules
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND state = 'pending' AND operation = 'start'
                """)[0]
            let startRunning = try start.decode(Int.self, "pending") > start.decode(Int.self, "free")
            var stored: String?
            if !startRunning {
                let rows = try connection.query(
                    "SELECT state FROM campaigns WHERE tenant_id = \(tenant) AND id = \(campaignID) FOR UPDATE")
                guard let row = rows.first else { throw NotFound("campaign") }
                stored = try row.decode(String.self, "state")
            }
            // A start that has begun writing its audience (CampaignRunner, a step at a time, or one being run now)
            // has started: it runs to the end, and the campaign stays, to be updated and ended like any started one.
            // So does a change that has begun: partway through its instances, or its broadcast sent.
            let cancelled = try connection.query(
                """
                UPDATE campaign_schedules SET state = 'cancelled', executed_at = now()
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND state = 'pending'
                  AND NOT COALESCE(result ->> 'phase', '') = ANY(\(CampaignRunner.partwayPhases))
                  AND NOT (operation = 'start' AND \(startRunning))
                RETURNING operation
                """
            ).map { try $0.decode(String.self, "operation") }
            let notStarted = stored == "scheduled" && cancelled.contains("start")
            if notStarted {
                try connection.execute(
                    """
                    UPDATE campaigns SET state = 'cancelled', cancelled_at = now()
                    WHERE tenant_id = \(tenant) AND id = \(campaignID)
                    """)
            }
            try Self.storeKey(
                connection, tenant, idempotency, status: 200, response: response(notStarted, cancelled.count))
            return .cancelled(campaign: notStarted, schedules: cancelled.count)
        }
    }

    // MARK: Reads

    /// Whether the campaign `tenant`.`campaign` (SQL expressions) still has pushes to go: queued, or parked (waiting
    /// for a broken credential to be replaced) while their instance has not expired. The one home of the rule
    /// between `ending` and `ended`, for the campaign's state as read and as stored (`CampaignRunner.finalize`).
    static func pushesLeft(tenant: String, campaign: String) -> String {
        """
        EXISTS (SELECT 1 FROM instances i JOIN delivery_queue d
                  ON d.tenant_id = i.tenant_id AND d.instance_id = i.id
                 AND (d.status = 'queued' OR (d.status = 'parked' AND i.expires_at > now()))
                WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaign))
        """
    }

    /// `scheduled` / `active` as stored, refined: a due start is `starting`; a started campaign with no open instance
    /// is `ending` while pushes are left (`pushesLeft`), then `ended`.
    static let stateExpression = """
        CASE c.state
            WHEN 'scheduled' THEN CASE WHEN c.start_at > now() THEN 'scheduled' ELSE 'starting' END
            WHEN 'active' THEN CASE
                WHEN EXISTS (SELECT 1 FROM instances i
                             WHERE i.tenant_id = c.tenant_id AND i.campaign_id = c.id
                               AND i.state IN ('pending', 'active') AND i.expires_at > now()) THEN 'active'
                WHEN \(pushesLeft(tenant: "c.tenant_id", campaign: "c.id")) THEN 'ending'
                ELSE 'ended' END
            ELSE c.state END
        """

    static let columns = """
        c.id, c.name, c.activity_type, c.audience, c.attributes, c.content_state, c.options, c.platform, c.expires_at,
        c.rate_limit_per_second, c.failure_reason, c.start_at, c.audience_size, c.started_at, c.ended_at,
        c.cancelled_at, c.created_at, c.updated_at, c.channel_id
        """

    /// A campaign with its counts, funnel and schedules; `NotFound("campaign")` when none.
    public func get(tenant: UUID, id: String) async throws -> CampaignDetail {
        let rows = try await database.tenantRead(
            tenant,
            [
                // Hash joins: right after a run wrote 100,000 rows their statistics lag, and a nested loop planned on
                // a guess of a few rows walked a campaign's deliveries once per instance (minutes, seen in tests).
                "SELECT set_config('enable_nestloop', 'off', true)",
                """
                SELECT \(unsafeRaw: Self.columns), \(unsafeRaw: Self.stateExpression) AS derived_state
                FROM campaigns c WHERE c.tenant_id = \(tenant) AND c.id = \(id)
                """,
                """
                SELECT CASE WHEN state IN ('pending', 'active') AND expires_at <= now() THEN 'expired' ELSE state END
                           AS state, count(*)::int AS n
                FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(id) GROUP BY 1
                """,
                """
                SELECT skipped_reason, count(*)::int AS n FROM campaign_members
                WHERE tenant_id = \(tenant) AND campaign_id = \(id) AND skipped_reason IS NOT NULL GROUP BY 1
                """,
                """
                SELECT CASE d.provider WHEN 'apns' THEN 'ios' ELSE 'android' END AS platform, d.operation,
                       CASE WHEN d.token_kind = 'channel' THEN 'channel' ELSE 'token' END AS via,
                       -- A broadcast targets its channel: one.
                       count(DISTINCT d.device_token)::int AS targeted,
                       count(*) FILTER (WHERE d.status IN ('queued', 'parked'))::int AS queued,
                       count(*) FILTER (WHERE d.status = 'sent')::int AS sent,
                       count(*) FILTER (WHERE d.status = 'failed')::int AS failed,
                       count(*) FILTER (WHERE d.status = 'undeliverable')::int AS undeliverable,
                       count(*) FILTER (WHERE d.status = 'superseded')::int AS superseded,
                       -- SDK reports, one index probe per delivery (linear in the campaign's size, whatever the plan).
                       -- An opened push was delivered, whether or not its delivery was reported.
                       count(*) FILTER (WHERE EXISTS (
                           SELECT 1 FROM delivery_metrics m
                           WHERE m.tenant_id = d.tenant_id AND m.delivery_uuid = d.id))::int AS delivered,
                       count(*) FILTER (WHERE EXISTS (
                           SELECT 1 FROM delivery_metrics m
                           WHERE m.tenant_id = d.tenant_id AND m.delivery_uuid = d.id AND m.metric = 'opened'))::int
                           AS opened
                FROM instances i JOIN deliveries d ON d.tenant_id = i.tenant_id AND d.instance_id = i.id
                WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(id)
                GROUP BY 1, 2, 3 ORDER BY 1, array_position(ARRAY['start', 'update', 'end'], d.operation), 3 DESC
                """,
                """
                SELECT id, operation, due_at, state, result, created_at, executed_at FROM campaign_schedules
                WHERE tenant_id = \(tenant) AND campaign_id = \(id) ORDER BY due_at, id
                """,
            ])
        guard let row = rows[1].first else { throw NotFound("campaign") }
        var instances: [String: Int] = [:]
        for r in rows[2] { instances[try r.decode(String.self, "state")] = try r.decode(Int.self, "n") }
        var skipped: [String: Int] = [:]
        for r in rows[3] { skipped[try r.decode(String.self, "skipped_reason")] = try r.decode(Int.self, "n") }
        let funnel = try rows[4].map { r in
            CampaignFunnelRow(
                platform: try r.decodeRaw(Platform.self, "platform"), operation: try r.decode(String.self, "operation"),
                via: try r.decode(String.self, "via"),
                targeted: try r.decode(Int.self, "targeted"), queued: try r.decode(Int.self, "queued"),
                sent: try r.decode(Int.self, "sent"), failed: try r.decode(Int.self, "failed"),
                undeliverable: try r.decode(Int.self, "undeliverable"),
                superseded: try r.decode(Int.self, "superseded"), delivered: try r.decode(Int.self, "delivered"),
                opened: try r.decode(Int.self, "opened"))
        }
        let schedules = try rows[5].map { r in
            CampaignScheduleRecord(
                id: try r.decode(UUID.self, "id"), operation: try r.decode(String.self, "operation"),
                dueAt: try r.decode(Date.self, "due_at"), state: try r.decode(String.self, "state"),
                result: try r.decode(JSONValue?.self, "result"), createdAt: try r.decode(Date.self, "created_at"),
                executedAt: try r.decode(Date?.self, "executed_at"))
        }
        return CampaignDetail(
            campaign: try Self.campaign(row), instances: instances, skipped: skipped, funnel: funnel,
            schedules: schedules)
    }

    /// Campaigns newest first; `after` is the (created_at, id) of the previous page's last item.
    public func list(tenant: UUID, after: (Date, String)?, limit: Int) async throws -> [CampaignRecord] {
        let rows = try await database.tenantRead(
            tenant,
            [
                """
                SELECT \(unsafeRaw: Self.columns), \(unsafeRaw: Self.stateExpression) AS derived_state
                FROM campaigns c
                WHERE c.tenant_id = \(tenant)
                  AND (\(after?.0)::timestamptz IS NULL OR (c.created_at, c.id) < (\(after?.0), \(after?.1)))
                ORDER BY c.created_at DESC, c.id DESC LIMIT \(limit)
                """
            ])
        return try rows[0].map(Self.campaign)
    }

    /// What a campaign-wide change is checked against: the campaign's activity type, how its pushes are measured,
    /// and its own options (stored form). Nil when there is no such campaign.
    public func changeFacts(tenant: UUID, campaignID: String) async throws
        -> (type: ActivityType, sizing: CampaignSizing, options: JSONValue)?
    {
        let rows = try await database.tenantRead(
            tenant,
            [
                """
                SELECT \(unsafeRaw: CampaignRunner.typeColumns), \(unsafeRaw: CampaignRunner.sizingColumns)
                FROM campaigns c
                JOIN activity_types a ON a.tenant_id = c.tenant_id AND a.identifier = c.activity_type
                WHERE c.tenant_id = \(tenant) AND c.id = \(campaignID)
                """
            ])
        return try rows[0].first.map { row in
            (
                try RegistryStore.activityType(row), try CampaignRunner.sizing(row, campaignID: campaignID),
                try row.decode(JSONValue.self, "campaign_options")
            )
        }
    }

    /// The people a started campaign addressed, by person ID, with their instance or why they got none.
    public func members(tenant: UUID, campaignID: String, after: String?, limit: Int) async throws
        -> [(personID: String, instanceID: String, skippedReason: String?)]?
    {
        let rows = try await database.tenantRead(
            tenant,
            [
                "SELECT 1 FROM campaigns WHERE tenant_id = \(tenant) AND id = \(campaignID)",
                """
                SELECT person_id, instance_id, skipped_reason FROM campaign_members
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID)
                  AND (\(after)::text IS NULL OR person_id > \(after))
                ORDER BY person_id LIMIT \(limit)
                """,
            ])
        guard !rows[0].isEmpty else { return nil }
        return try rows[1].map { r in
            (
                try r.decode(String.self, "person_id"), try r.decode(String.self, "instance_id"),
                try r.decode(String?.self, "skipped_reason")
            )
        }
    }

    static func campaign(_ row: PostgresRow) throws -> CampaignRecord {
        CampaignRecord(
            id: try row.decode(String.self, "id"), name: try row.decode(String.self, "name"),
            activityType: try row.decode(String.self, "activity_type"),
            audience: try row.decode(JSONValue.self, "audience"),
            attributes: try row.decode(JSONValue.self, "attributes"),
            contentState: try row.decode(JSONValue.self, "content_state"),
            options: try row.decode(JSONValue.self, "options"),
            platform: try row.decode(String?.self, "platform").map { _ in try row.decodeRaw(Platform.self, "platform")
            },
            expiresAt: try row.decode(Date?.self, "expires_at"),
            rateLimitPerSecond: try row.decode(Int?.self, "rate_limit_per_second"),
            channelID: try row.decode(UUID?.self, "channel_id"),
            state: try row.decodeRaw(CampaignState.self, "derived_state"),
            failureReason: try row.decode(String?.self, "failure_reason"),
            startAt: try row.decode(Date.self, "start_at"), audienceSize: try row.decode(Int?.self, "audience_size"),
            startedAt: try row.decode(Date?.self, "started_at"), endedAt: try row.decode(Date?.self, "ended_at"),
            cancelledAt: try row.decode(Date?.self, "cancelled_at"), createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"))
    }

    // MARK: Idempotency

    /// The response an Idempotency-Key holds, if a request with it completed in the last 24 hours.
    public func idempotentResponse(tenant: UUID, key: String) async throws -> StoredResponse? {
        try await database.idempotentResponse(tenant: tenant, key: key)
    }

    /// Claims an Idempotency-Key for this transaction, or returns the response it already holds. The key's row is
    /// written first (under a savepoint), so two requests with one key meet at its primary key.
    static func claimKey(_ c: PostgresConnection, _ tenant: UUID, _ key: (key: String, hash: [UInt8])?) throws
        -> StoredResponse?
    {
        try c.execute("SAVEPOINT campaign_key")
        guard let key else { return nil }
        let claim = IdempotencyRecord(key: key.key, requestHash: key.hash, status: 0, response: .null)
        if try IdempotencyRecord.record(claim, tenant: tenant, on: c) { return nil }
        return try LiveActivityStore.storedResponse(
            c.query(LiveActivityStore.idempotencyQuery(tenant, key.key)))
    }

    static func storeKey(
        _ c: PostgresConnection, _ tenant: UUID, _ key: (key: String, hash: [UInt8])?, status: Int,
        response: JSONValue
    ) throws {
        guard let key else { return }
        try c.execute(
            """
            UPDATE idempotency_keys SET status = \(status), response = \(response)
            WHERE tenant_id = \(tenant) AND key = \(key.key)
            """)
    }
}
