import Foundation
import MarqueeCore
import PostgresClient

/// What a channel create needs to know before it asks Apple.
public struct ChannelCreateContext: Sendable {
    public var activityTypeExists: Bool
    /// The stored answer for the request's Idempotency-Key (last 24 hours).
    public var idempotent: StoredResponse?
}

/// How recording a created channel went.
public enum ChannelInsertOutcome: Sendable, Equatable {
    case inserted
    /// A concurrent request took the Idempotency-Key first: nothing was written; replay its answer.
    case idempotencyKeyTaken
    /// The tenant has a channel with that `apns_channel_id` in that environment already: the management host
    /// answered an ID it had given before. Nothing was written, and the ID is that channel's (not to be deleted).
    case channelIDTaken
}

/// A tenant's broadcast channels.
public struct ChannelStore: Sendable {
    let database: TenantDatabase

    public init(database: TenantDatabase) {
        self.database = database
    }

    /// Whether the activity type exists, and the stored answer for `idempotencyKey`, in one transaction.
    public func createContext(tenant: UUID, activityType: String, idempotencyKey: String?) async throws
        -> ChannelCreateContext
    {
        try await database.tenantTransaction(tenant) { connection in
            let types = try connection.query(
                "SELECT 1 FROM activity_types WHERE tenant_id = \(tenant) AND identifier = \(activityType)")
            let stored = try idempotencyKey.map { key in
                try LiveActivityStore.storedResponse(
                    connection.query(LiveActivityStore.idempotencyQuery(tenant, key)))
            }
            return ChannelCreateContext(activityTypeExists: !types.isEmpty, idempotent: stored ?? nil)
        }
    }

    /// Records a channel Apple created, with the request's idempotency record when it has one (both or neither).
    public func insert(tenant: UUID, _ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws
        -> ChannelInsertOutcome
    {
        do {
            return try await insertRow(tenant: tenant, channel, idempotency: idempotency)
        } catch let error as PostgresError
            where error.code == .uniqueViolation && error.constraint == Self.apnsChannelIDConstraint
        {
            return .channelIDTaken
        }
    }

    /// Migration 0030's `UNIQUE (tenant_id, environment, apns_channel_id)`.
    static let apnsChannelIDConstraint = "channels_tenant_id_environment_apns_channel_id_key"

    private func insertRow(tenant: UUID, _ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws
        -> ChannelInsertOutcome
    {
        var idem = IdempotencyColumns()
        idem.append(idempotency)
        let rows = try await database.tenantStatement(
            tenant,
            """
            WITH req AS (
                SELECT * FROM unnest(\(idem.keys)::text[], \(idem.hashes)::text[], \(idem.statuses)::int[],
                                     \(idem.responses)::jsonb[])
                    AS r(idem_key, idem_hash, idem_status, idem_response)
            ), idem AS (
                \(unsafeRaw: IdempotencyColumns.write(response: "r.idem_response"))
            ), ins AS (
                INSERT INTO channels (tenant_id, id, activity_type, storage_policy, apns_channel_id, bundle_id,
                                      environment, status, created_at, updated_at)
                SELECT \(tenant), \(channel.id), \(channel.activityType), \(channel.storagePolicy.rawValue),
                       \(channel.apnsChannelID), \(channel.bundleID), \(channel.environment), \(channel.status),
                       \(channel.createdAt), \(channel.updatedAt)
                WHERE \(idempotency?.key)::text IS NULL OR EXISTS (SELECT 1 FROM idem)
                RETURNING 1
            )
            SELECT EXISTS (SELECT 1 FROM ins) AS created
            """)
        return try rows[0].decode(Bool.self, "created") ? .inserted : .idempotencyKeyTaken
    }

    /// One channel; `NotFound("channel")` when the tenant has no such channel.
    public func get(tenant: UUID, id: UUID) async throws -> ChannelRecord {
        let rows = try await database.tenantStatement(
            tenant, "SELECT \(unsafeRaw: Self.columns) FROM channels WHERE tenant_id = \(tenant) AND id = \(id)")
        guard let row = rows.first else { throw NotFound("channel") }
        return try Self.channel(row)
    }

    /// Channels newest first, before `before` (a cursor), optionally of one activity type.
    public func list(tenant: UUID, activityType: String?, before: UUID?, limit: Int) async throws -> [ChannelRecord] {
        let rows = try await database.tenantStatement(
            tenant,
            """
            SELECT \(unsafeRaw: Self.columns) FROM channels
            WHERE tenant_id = \(tenant)
              AND (\(activityType)::text IS NULL OR activity_type = \(activityType))
              AND (\(before)::uuid IS NULL OR id < \(before))
            ORDER BY id DESC LIMIT \(limit)
            """)
        return try rows.map(Self.channel)
    }

    /// Removes a channel's record; false when there was none (already deleted).
    public func delete(tenant: UUID, id: UUID) async throws -> Bool {
        let rows = try await database.tenantStatement(
            tenant, "DELETE FROM channels WHERE tenant_id = \(tenant) AND id = \(id) RETURNING 1")
        return !rows.isEmpty
    }

    static let columns = """
        id, activity_type, storage_policy, apns_channel_id, bundle_id, environment, status, status_reason, \
        created_at, updated_at
        """

    static func channel(_ row: PostgresRow) throws -> ChannelRecord {
        ChannelRecord(
            id: try row.decode(UUID.self, "id"), activityType: try row.decode(String.self, "activity_type"),
            storagePolicy: try row.decodeRaw(ChannelStoragePolicy.self, "storage_policy"),
            apnsChannelID: try row.decode(String.self, "apns_channel_id"),
            bundleID: try row.decode(String.self, "bundle_id"), environment: try row.decode(String.self, "environment"),
            status: try row.decode(String.self, "status"), statusReason: try row.decode(String?.self, "status_reason"),
            createdAt: try row.decode(Date.self, "created_at"), updatedAt: try row.decode(Date.self, "updated_at"))
    }
}
