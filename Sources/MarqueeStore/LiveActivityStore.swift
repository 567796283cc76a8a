import Crypto
import Foundation
import MarqueeCore
import PostgresClient

extension ChannelBinding {
    /// The channel joined to an instance row (`channel_id`, `channel_status`, `apns_channel_id`,
    /// `channel_storage_policy`, `channel_bundle_id`, `channel_environment`); nil for an instance without one.
    static func decode(_ row: PostgresRow) throws -> ChannelBinding? {
        guard let id = try row.decode(UUID?.self, "channel_id"),
            let apnsID = try row.decode(String?.self, "apns_channel_id")
        else { return nil }
        return ChannelBinding(
            id: id, apnsChannelID: apnsID,
            storagePolicy: try row.decodeRaw(ChannelStoragePolicy.self, "channel_storage_policy"),
            bundleID: try row.decode(String.self, "channel_bundle_id"),
            active: try row.decode(String.self, "channel_status") == "active",
            environment: try row.decode(String.self, "channel_environment"), deliveryDevice: deliveryDevice(id))
    }

    /// The `device_token` of a broadcast delivery on channel `id`: one row stands for every subscribed device.
    static func deliveryDevice(_ id: UUID) -> String { "channel:" + ULID(uuid: id).description }
}

/// A response stored for an Idempotency-Key (or a start's client-chosen instance ID).
public struct StoredResponse: Sendable, Equatable {
    public var status: Int
    public var body: JSONValue
    public var requestHash: [UInt8]
}

/// What a start needs to know before it writes.
public struct StartContext: Sendable {
    public var activityType: ActivityType?
    /// The person's ID, resolved from `id` or `email`; nil when no such person.
    public var personID: String?
    public var candidates: [StartCandidate]
    public var idempotent: StoredResponse?
    /// The start response of an existing instance with the requested ID.
    public var existingStart: StoredResponse?
    public var existingInstance: Bool
    /// The channel the start names, when it names one that exists.
    public var channel: ChannelRecord?
}

/// What an update or end needs to know before it writes.
public struct ChangeContext: Sendable {
    public var instance: InstanceRecord?
    public var activityType: ActivityType?
    public var targets: [ActivityTarget]
    public var idempotent: StoredResponse?
    /// The instance's broadcast channel, if it is channel-backed.
    public var channel: ChannelBinding?
}

/// An idempotency record to write with a change.
public struct IdempotencyRecord: Sendable {
    public var key: String
    public var requestHash: [UInt8]
    public var status: Int
    public var response: JSONValue

    public init(key: String, requestHash: [UInt8], status: Int, response: JSONValue) {
        self.key = key
        self.requestHash = requestHash
        self.status = status
        self.response = response
    }
}

/// A planned start to write: the instance, its first deliveries and its Android devices.
public struct StartWrite: Sendable {
    public var request: LifecyclePlanner.StartRequest
    public var plan: LifecyclePlanner.StartPlan
    /// The person, as resolved from the request's ID or email.
    public var personID: String?
    public var personEmail: String?
    /// The start's answer, kept on the instance for a repeat with the same instance ID.
    public var response: JSONValue
    public var idempotency: IdempotencyRecord?

    public init(
        request: LifecyclePlanner.StartRequest, plan: LifecyclePlanner.StartPlan, personID: String?,
        personEmail: String?, response: JSONValue, idempotency: IdempotencyRecord?
    ) {
        self.request = request
        self.plan = plan
        self.personID = personID
        self.personEmail = personEmail
        self.response = response
        self.idempotency = idempotency
    }
}

/// A planned update or end to write, if the instance is still at the version it was planned from.
public struct ChangeWrite: Sendable {
    public typealias Operation = LifecyclePlanner.Operation
    public var instanceID: String
    public var operation: Operation
    public var plan: LifecyclePlanner.ChangePlan
    public var idempotency: IdempotencyRecord?

    public init(
        instanceID: String, operation: Operation, plan: LifecyclePlanner.ChangePlan, idempotency: IdempotencyRecord?
    ) {
        self.instanceID = instanceID
        self.operation = operation
        self.plan = plan
        self.idempotency = idempotency
    }
}

/// The outcome of a write.
public enum WriteOutcome: Sendable, Equatable {
    /// Written: the new version and the number of deliveries queued; `coalesced` when pacing queued them for later
    /// (a newer update before then replaces them).
    case written(version: Int, deliveries: Int, coalesced: Bool = false)
    /// Another request changed the instance first (update/end), or a device a start planned for went — read again
    /// and plan again.
    case versionConflict
    /// The instance ID or idempotency key was taken by a concurrent request — replay its stored response.
    case alreadyExists
}

/// A delivery as listed for attribution.
public struct DeliveryRecord: Sendable, Equatable {
    public var id: UUID
    public var instanceID: String
    public var deviceToken: String
    public var provider: PlannedDelivery.Provider
    public var tokenKind: PlannedDelivery.TokenKind
    public var operation: LiveActivityEvent
    public var instanceVersion: Int
    public var status: DeliveryStatus
    public var attempts: Int
    public var nextAttemptAt: Date
    public var providerID: String?
    public var httpStatus: Int?
    public var reason: String?
    public var createdAt: Date
    public var updatedAt: Date
    public var sentAt: Date?
}

/// Instances and deliveries: reads in one round trip, writes through the group committer.
public struct LiveActivityStore: Sendable {
    let database: TenantDatabase
    let committer: GroupCommitter
    let contexts: ChangeContexts
    let starts: StartContexts

    /// Up to `readBatches` batched reads of change contexts at once, and as many of start contexts; `onContextBatch`
    /// is told the size of every batch of change contexts read together (for a histogram).
    public init(
        database: TenantDatabase, committer: GroupCommitter, readBatches: Int = 2,
        onContextBatch: @escaping @Sendable (_ requests: Int) -> Void = { _ in }
    ) {
        self.database = database
        self.committer = committer
        contexts = ChangeContexts(database: database, readers: readBatches, onBatch: onContextBatch)
        starts = StartContexts(database: database, readers: readBatches)
    }

    // MARK: Reads before writes

    /// Everything a start needs, in one snapshot: its activity type, its person and their devices (with push-to-start
    /// tokens for the type), whether the instance ID is taken (and the start answer stored with it), the answer stored
    /// for the request's Idempotency-Key, and the channel it names. Read together with the other starts in flight
    /// (`StartContexts`).
    public func startContext(
        tenant: UUID, activityType: String, personID: String?, email: String?, instanceID: String,
        idempotencyKey: String?, channelID: UUID? = nil
    ) async throws -> StartContext {
        try await starts.read(
            .init(
                tenant: tenant, activityType: activityType, personID: personID, email: email, instanceID: instanceID,
                idempotencyKey: idempotencyKey, channelID: channelID))
    }

    /// Everything an update or end needs, in one snapshot: the instance with its activity type and channel, its
    /// active targets, and the answer stored for the request's Idempotency-Key. Read together with the other changes
    /// in flight (`ChangeContexts`).
    public func changeContext(tenant: UUID, instanceID: String, idempotencyKey: String?) async throws -> ChangeContext {
        try await contexts.read(.init(tenant: tenant, instanceID: instanceID, idempotencyKey: idempotencyKey))
    }

    /// The channel columns `ChannelBinding.decode` reads, for a join with `channels ch`.
    static let channelColumnsJoined = """
        ch.status AS channel_status, ch.apns_channel_id, ch.storage_policy AS channel_storage_policy, \
        ch.bundle_id AS channel_bundle_id, ch.environment AS channel_environment
        """

    /// Activity-type columns for a join with `instances i` (`t.identifier` keeps its name; `i.id` is `id`).
    static let typeColumnsJoined = """
        t.identifier, t.attributes_type, t.content_state_schema, t.date_fields, t.payload_profile, t.frequent_updates, \
        t.auto_created, \
        t.created_at AS type_created_at, t.updated_at AS type_updated_at
        """

    /// `instanceColumns` for a join with `instances i`, each `i.`-prefixed; built once (building it on every
    /// change-context read, trimming with Foundation, was 3.5–5.6% of the API's CPU).
    static let instanceColumnsJoined = instanceColumns.split(separator: ",")
        .map { "i." + $0.trimmingCharacters(in: .whitespacesAndNewlines) }.joined(separator: ", ")

    /// The stored response for an idempotency key, if any.
    public func idempotentResponse(tenant: UUID, key: String) async throws -> StoredResponse? {
        try await database.idempotentResponse(tenant: tenant, key: key)
    }

    static func idempotencyQuery(_ tenant: UUID, _ key: String?) -> PostgresQuery {
        idempotencyQuery(tenant, keys: key.map { [$0] } ?? [])
    }

    /// The responses stored for `keys` in the last 24 hours, with their `key`.
    static func idempotencyQuery(_ tenant: UUID, keys: [String]) -> PostgresQuery {
        """
        SELECT key, status, response, request_hash FROM idempotency_keys
        WHERE tenant_id = \(tenant) AND key = ANY(\(keys)::text[]) AND created_at > now() - interval '24 hours'
        """
    }

    static func storedResponse(_ rows: PostgresRows) throws -> StoredResponse? {
        try rows.first.map(storedResponse)
    }

    static func storedResponse(_ row: PostgresRow) throws -> StoredResponse {
        StoredResponse(
            status: try row.decode(Int.self, "status"), body: try row.decode(JSONValue.self, "response"),
            requestHash: try row.decode([UInt8].self, "request_hash"))
    }

    // MARK: Writes

    /// Writes a start: the instance, its deliveries and its Android devices. Concurrent starts share one set-based
    /// statement per batch and tenant (`StartWrite.statement`).
    ///
    /// `alreadyExists` also when the start committed but its answer was lost with the connection
    /// (`UnansweredCommit(.committed)`): the instance (or its Idempotency-Key's record) now holds the start's answer,
    /// read back as for a start that found its ID taken. `versionConflict` when a device it planned for went before
    /// its write (nothing is written). Throws `UnansweredCommit(.unknown)`.
    public func start(tenant: UUID, _ write: StartWrite) async throws -> WriteOutcome {
        let row: PostgresRow
        do {
            row = try await committer.submit(tenant: tenant, write)
        } catch let error as PostgresError where error.sqlState == Self.writeLost {
            return .alreadyExists  // its ID was taken meanwhile, and its key was not recorded (migration 0075)
        } catch let error as PostgresError where error.sqlState == Self.planStale {
            return .versionConflict  // a device it planned for went meanwhile (migration 0087): plan it again
        } catch let error as UnansweredCommit where error.outcome == .committed {
            return .alreadyExists
        }
        guard try row.decode(Bool.self, "created") else { return .alreadyExists }
        return .written(version: 1, deliveries: try row.decode(Int.self, "deliveries"))
    }

    /// Writes an update or end, if the instance is still at `expectedVersion`. Older queued deliveries to the same
    /// tokens are superseded (latest wins); ones a worker holds are left to finish. Concurrent changes share one
    /// set-based statement per batch and tenant (`ChangeWrite.statement`).
    ///
    /// A change with an Idempotency-Key that committed but whose answer was lost with the connection
    /// (`UnansweredCommit(.committed)`) is `alreadyExists`: its key's record holds its answer if it was written (if it
    /// lost its version check, nothing was, and reading again plans it again). One without a key records no answer,
    /// so that error is thrown, as is `UnansweredCommit(.unknown)`.
    public func change(tenant: UUID, _ write: ChangeWrite) async throws -> WriteOutcome {
        let row: PostgresRow
        do {
            row = try await committer.submit(tenant: tenant, write)
        } catch let error as UnansweredCommit where error.outcome == .committed && write.idempotency != nil {
            return .alreadyExists
        }
        guard let version = try row.decode(Int?.self, "version") else {
            if try row.decode(Bool.self, "key_taken") { return .alreadyExists }
            return .versionConflict
        }
        return .written(
            version: version, deliveries: try row.decode(Int.self, "deliveries"),
            coalesced: try row.decode(Bool.self, "coalesced"))
    }

    /// The SQLSTATE of a set-based write that lost its race after recording an Idempotency-Key (`marquee_write_lost`,
    /// migration 0075): the statement fails so that the record goes with it.
    static let writeLost = "MQ001"

    /// The SQLSTATE of a set-based start whose planned device went before its write (`marquee_plan_stale`, migration
    /// 0087): nothing of it is written, and it is planned again.
    static let planStale = "MQ002"

    /// Records an idempotent response for a request that wrote nothing else (a suppressed no-op).
    /// Returns false when the key was taken meanwhile (its own answer is then the one to give), and when the record
    /// committed but its answer was lost with the connection (`UnansweredCommit(.committed)`): the key's record, this
    /// one or the one that took the key, is then the answer.
    @discardableResult
    public func recordIdempotent(tenant: UUID, _ record: IdempotencyRecord) async throws -> Bool {
        do {
            return try await committer.submit(tenant: tenant, record).decode(Bool.self, "written")
        } catch let error as UnansweredCommit where error.outcome == .committed {
            return false
        }
    }

    /// Marks an open instance past its expiration as `expired` (so that workers skip it and lists show it).
    public func markExpired(tenant: UUID, instanceID: String) async throws {
        _ = try await database.tenantTransaction(tenant) { connection in
            try connection.execute(
                """
                UPDATE instances SET state = 'expired', updated_at = now()
                WHERE tenant_id = \(tenant) AND id = \(instanceID) AND state NOT IN ('ended', 'expired')
                  AND expires_at <= now()
                """)
        }
    }

    // MARK: Reads for the API

    /// An instance, its active targets, its latest delivery, and how many APNs pushes of it went out at priority 10
    /// in the last hour (what Apple's per-user budget counts).
    public func instance(tenant: UUID, id: String) async throws -> (
        InstanceRecord, [ActivityTarget], DeliveryRecord?, highPriorityLastHour: Int
    )? {
        let rows = try await database.tenantRead(
            tenant,
            [
                "SELECT \(unsafeRaw: Self.instanceColumns) FROM instances WHERE tenant_id = \(tenant) AND id = \(id)",
                RegistryStore.activityTargetsQuery(tenant: tenant, instanceIDs: [id]),
                """
                SELECT \(unsafeRaw: Self.deliveryColumns) FROM deliveries
                WHERE tenant_id = \(tenant) AND instance_id = \(id) ORDER BY id DESC LIMIT 1
                """,
                """
                SELECT count(*)::int AS n FROM delivery_history
                WHERE tenant_id = \(tenant) AND instance_id = \(id) AND apns_priority = 10
                  AND sent_at > now() - interval '1 hour'
                """,
            ])
        guard let row = rows[0].first else { return nil }
        return (
            try Self.instance(row), try rows[1].map(RegistryStore.activityTarget), try rows[2].first.map(Self.delivery),
            try rows[3][0].decode(Int.self, "n")
        )
    }

    /// A page of instances, newest first. `after` is the (started_at, id) of the last item of the previous page.
    public func instances(
        tenant: UUID, person: String?, activityType: String?, campaign: String? = nil, state: InstanceState?,
        after: (Date, String)?, limit: Int
    ) async throws -> [InstanceRecord] {
        let stateFilter = state?.rawValue
        let rows = try await database.tenantRead(
            tenant,
            [
                """
                SELECT \(unsafeRaw: Self.instanceColumns) FROM instances
                -- started_at > '-infinity' is what lets this list use instances_recent (migration 0053).
                WHERE tenant_id = \(tenant) AND started_at > '-infinity'
                  AND (\(person)::text IS NULL OR person_id = \(person))
                  AND (\(activityType)::text IS NULL OR activity_type = \(activityType))
                  AND (\(campaign)::text IS NULL OR campaign_id = \(campaign))
                  AND (\(stateFilter)::text IS NULL
                       OR (\(stateFilter) = 'expired' AND (state = 'expired'
                            OR (state NOT IN ('ended', 'expired') AND expires_at <= now())))
                       OR (\(stateFilter) <> 'expired' AND state = \(stateFilter)
                            AND (state IN ('ended', 'expired') OR expires_at > now())))
                  AND (\(after?.0)::timestamptz IS NULL OR (started_at, id) < (\(after?.0), \(after?.1)))
                ORDER BY started_at DESC, id DESC
                LIMIT \(limit)
                """
            ])
        return try rows[0].map(Self.instance)
    }

    /// A page of an instance's deliveries, newest first (delivery IDs are ULIDs: they sort by time).
    public func deliveries(tenant: UUID, instanceID: String, before: UUID?, limit: Int) async throws
        -> [DeliveryRecord]?
    {
        let rows = try await database.tenantRead(
            tenant,
            [
                "SELECT 1 FROM instances WHERE tenant_id = \(tenant) AND id = \(instanceID)",
                """
                SELECT \(unsafeRaw: Self.deliveryColumns) FROM deliveries
                WHERE tenant_id = \(tenant) AND instance_id = \(instanceID)
                  AND (\(before)::uuid IS NULL OR id < \(before))
                ORDER BY id DESC LIMIT \(limit)
                """,
            ])
        guard !rows[0].isEmpty else { return nil }
        return try rows[1].map(Self.delivery)
    }

    // MARK: Rows

    static let instanceColumns = """
        id, activity_type, person_id, person_email, state, failure_reason, attributes, content_state, options, \
        version, content_timestamp, target_platform, target_device, expires_at, started_at, ended_at, updated_at, \
        channel_id, campaign_id
        """
    static let deliveryColumns = """
        id, instance_id, device_token, provider, token_kind, operation, instance_version, status, attempts, \
        next_attempt_at, provider_id, http_status, reason, created_at, updated_at, sent_at
        """

    static func instance(_ row: PostgresRow) throws -> InstanceRecord {
        InstanceRecord(
            id: try row.decode(String.self, "id"), activityType: try row.decode(String.self, "activity_type"),
            personID: try row.decode(String?.self, "person_id"),
            personEmail: try row.decode(String?.self, "person_email"),
            state: try row.decodeRaw(InstanceState.self, "state"),
            failureReason: try row.decode(String?.self, "failure_reason"),
            attributes: try row.decode(JSONValue.self, "attributes"),
            contentState: try row.decode(JSONValue.self, "content_state"),
            options: try row.decode(JSONValue.self, "options"), version: try row.decode(Int.self, "version"),
            contentTimestamp: try row.decode(Int64.self, "content_timestamp"),
            targetPlatform: try row.decodeRaw(Platform?.self, "target_platform"),
            targetDevice: try row.decode(String?.self, "target_device"),
            expiresAt: try row.decode(Date.self, "expires_at"), startedAt: try row.decode(Date.self, "started_at"),
            endedAt: try row.decode(Date?.self, "ended_at"), updatedAt: try row.decode(Date.self, "updated_at"),
            channelID: try row.decode(UUID?.self, "channel_id"), campaignID: try row.decode(String?.self, "campaign_id")
        )
    }

    static func delivery(_ row: PostgresRow) throws -> DeliveryRecord {
        DeliveryRecord(
            id: try row.decode(UUID.self, "id"), instanceID: try row.decode(String.self, "instance_id"),
            deviceToken: try row.decode(String.self, "device_token"),
            provider: try row.decodeRaw(PlannedDelivery.Provider.self, "provider"),
            tokenKind: try row.decodeRaw(PlannedDelivery.TokenKind.self, "token_kind"),
            operation: try row.decodeRaw(LiveActivityEvent.self, "operation"),
            instanceVersion: try row.decode(Int.self, "instance_version"),
            status: try row.decodeRaw(DeliveryStatus.self, "status"),
            attempts: try row.decode(Int.self, "attempts"), nextAttemptAt: try row.decode(Date.self, "next_attempt_at"),
            providerID: try row.decode(String?.self, "provider_id"),
            httpStatus: try row.decode(Int?.self, "http_status"),
            reason: try row.decode(String?.self, "reason"), createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"), sentAt: try row.decode(Date?.self, "sent_at"))
    }
}

extension TenantDatabase {
    /// The response an Idempotency-Key holds, if a request with it completed in the last 24 hours.
    func idempotentResponse(tenant: UUID, key: String) async throws -> StoredResponse? {
        let rows = try await tenantRead(tenant, [LiveActivityStore.idempotencyQuery(tenant, key)])
        return try LiveActivityStore.storedResponse(rows[0])
    }
}

/// Column arrays for `unnest`.
struct DeliveryColumns {
    var ids: [UUID] = []
    var devices: [String] = []
    var providers: [String] = []
    var kinds: [String] = []
    var tokens: [String] = []

    init(_ deliveries: [PlannedDelivery]) {
        append(deliveries)
    }

    mutating func append(_ deliveries: [PlannedDelivery]) {
        for d in deliveries {
            ids.append(d.id)
            devices.append(d.deviceToken)
            providers.append(d.provider.rawValue)
            kinds.append(d.tokenKind.rawValue)
            tokens.append(d.token)
        }
    }
}
