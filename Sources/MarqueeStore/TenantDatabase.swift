import Foundation
import MarqueeCore
import PostgresClient

/// The database as the stores see it: the pool plus tenant-scoped transactions.
///
/// `tenantTransaction` switches the transaction to the `marquee_api` role and sets `marquee.tenant_id`, both with
/// `SET LOCAL` semantics, so PostgreSQL's row-level security confines every statement in it to that tenant (the
/// stores also name `tenant_id` in every statement: isolation twice). Cross-tenant system work (creating tenants,
/// administering keys, resealing) uses `systemTransaction`, which switches to `marquee_system` (migration 0010).
/// The login role (`marquee_app`) has no privilege on tenant tables by itself: work that names neither role fails.
///
/// A tenant's work takes a share of the pool first (`shares`: half of it by default), so that one tenant's burst waits
/// behind itself, not in front of every other tenant.
public struct TenantDatabase: Sendable {
    public let pool: PostgresPool
    /// How many of one tenant's transactions hold or wait for a connection at once.
    public let shares: TenantShares

    public init(pool: PostgresPool) {
        self.pool = pool
        self.shares = TenantShares(pool: pool)
    }

    /// Runs `body` in one transaction confined to `tenant`.
    public func tenantTransaction<T: Sendable>(
        _ tenant: UUID, _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        try await shares.withShare(tenant) {
            try await pool.transaction { connection in
                try connection.enterTenant(tenant)
                return try body(connection)
            }
        }
    }

    /// Runs `query` for `tenant` (which it enters itself) in its own transaction, within the tenant's share.
    public func tenantQuery(_ tenant: UUID, _ query: PostgresQuery) async throws -> PostgresRows {
        try await shares.withShare(tenant) { try await pool.query(query) }
    }

    /// Runs `body` in one transaction as `marquee_system`: every tenant's rows, no DDL.
    public func systemTransaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T)
        async throws -> T
    {
        try await pool.transaction { connection in
            try connection.enterSystem()
            return try body(connection)
        }
    }

    /// Runs one statement for `tenant` in its own transaction, in one round trip (pipelined), and returns its rows.
    public func tenantStatement(_ tenant: UUID, _ statement: PostgresQuery) async throws -> PostgresRows {
        let statements: [PostgresQuery] = ["SELECT marquee_enter_tenant(\(tenant))", statement]
        return try await shares.withShare(tenant) {
            try await pool.withConnection { try $0.pipelineTransaction(statements) }[1]
        }
    }
}

extension PostgresConnection {
    /// Switches the current transaction to `marquee_system`, the cross-tenant role of system work.
    public func enterSystem() throws {
        try query("SELECT set_config('role', 'marquee_system', true)")
    }

    /// Confines the current transaction to `tenant` (role `marquee_api`, `marquee.tenant_id`).
    public func enterTenant(_ tenant: UUID) throws {
        try query(
            """
            SELECT set_config('role', 'marquee_api', true), set_config('marquee.tenant_id', \(tenant.uuidString), true)
            """)
    }
}

extension JSONValue: PostgresEncodable, PostgresDecodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.jsonb }

    public func encodePostgres() -> PostgresBind {
        PostgresBind(bytes: bytes, oid: PostgresOID.jsonb)
    }

    public static func decodePostgres(from cell: PostgresCell) throws -> JSONValue {
        let raw = try PostgresJSON.decodePostgres(from: cell)
        return try JSONValue.parseStored(raw.bytes)
    }
}

/// A record was not found in this tenant (or does not exist at all: the two are never told apart).
public struct NotFound: Error, Sendable, Equatable {
    /// What was looked for: `person`, `device`, `activity_type`, `tenant`, `api_key`, `credentials`.
    public var resource: String
    public init(_ resource: String) { self.resource = resource }
}

/// A request that conflicts with the current state (e.g. a push-to-start token for an Android device).
public struct Conflict: Error, Sendable, Equatable {
    public var field: String
    public var reason: String
    public init(field: String, reason: String) {
        self.field = field
        self.reason = reason
    }
}
