import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// A tenant (workspace).
public struct Tenant: Sendable, Equatable {
    public var id: UUID
    public var name: String
    public var createdAt: Date
}

/// An API key as listed: never its text, which is shown once at creation.
public struct APIKeyRecord: Sendable, Equatable {
    public var id: UUID
    public var tenantID: UUID
    public var kind: APIKeyKind
    public var hint: String
    public var createdAt: Date
    public var revokedAt: Date?
    public var lastUsedAt: Date?
}

/// A freshly made key: the record and the one-time text.
public struct IssuedKey: Sendable {
    public var record: APIKeyRecord
    public var text: String
}

/// A new tenant with its first app and sdk keys.
public struct CreatedTenant: Sendable {
    public var tenant: Tenant
    public var appKey: IssuedKey
    public var sdkKey: IssuedKey
}

/// Who is calling, once a key has been checked.
public struct Principal: Sendable, Equatable {
    public var tenantID: UUID
    public var keyID: UUID
    public var kind: APIKeyKind
    /// The tenant's own request rate limit for keys of this kind (`tenant_settings`, migration 0084), read and cached
    /// with the key; nil: the process default (`RequestLimits` in MarqueeAPI applies it).
    public var requestsPerSecond: Int?

    public init(tenantID: UUID, keyID: UUID, kind: APIKeyKind, requestsPerSecond: Int? = nil) {
        self.tenantID = tenantID
        self.keyID = keyID
        self.kind = kind
        self.requestsPerSecond = requestsPerSecond
    }
}

/// Tenants and their API keys.
public struct TenantStore: Sendable {
    let database: TenantDatabase
    let keyRing: SealingKeyRing

    public init(database: TenantDatabase, keyRing: SealingKeyRing) {
        self.database = database
        self.keyRing = keyRing
    }

    /// Creates a tenant with one app key and one sdk key, in one transaction.
    public func create(name: String) async throws -> CreatedTenant {
        let trimmed = name.trimmingCharacters(in: .whitespacesAndNewlines)
        // Counted as PostgreSQL's length() counts (code points), so the CHECK constraint can never refuse it.
        guard (1...200).contains(trimmed.unicodeScalars.count) else {
            throw ValidationError(field: "name", reason: "must be 1 to 200 characters")
        }
        let id = UUID()
        let secret = SecureRandom.bytes(32)
        let sealed = try keyRing.seal(secret, associatedData: Self.deliverySecretContext(id))
        return try await database.systemTransaction { connection in
            let rows = try connection.query(
                """
                INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (\(id), \(trimmed), \(sealed))
                RETURNING created_at
                """)
            let tenant = Tenant(id: id, name: trimmed, createdAt: try rows[0].decode(Date.self, "created_at"))
            let app = try Self.insertKey(connection, tenant: id, kind: .app)
            let sdk = try Self.insertKey(connection, tenant: id, kind: .sdk)
            return CreatedTenant(tenant: tenant, appKey: app, sdkKey: sdk)
        }
    }

    /// Every tenant, oldest first.
    public func list() async throws -> [Tenant] {
        try await database.systemTransaction { connection in
            try connection.query("SELECT id, name, created_at FROM tenants ORDER BY created_at, id").map(Self.tenant)
        }
    }

    /// One tenant.
    public func get(_ id: UUID) async throws -> Tenant {
        try await database.systemTransaction { connection in
            let rows = try connection.query("SELECT id, name, created_at FROM tenants WHERE id = \(id)")
            guard let row = rows.first else { throw NotFound("tenant") }
            return try Self.tenant(row)
        }
    }

    /// The tenant's keys, newest first.
    public func keys(tenant: UUID) async throws -> [APIKeyRecord] {
        try await database.systemTransaction { connection in
            guard try !connection.query("SELECT 1 FROM tenants WHERE id = \(tenant)").isEmpty else {
                throw NotFound("tenant")
            }
            return try connection.query(
                """
                SELECT id, tenant_id, kind, hint, created_at, revoked_at, last_used_at
                FROM api_keys WHERE tenant_id = \(tenant) ORDER BY created_at DESC, id
                """
            ).map(Self.keyRecord)
        }
    }

    /// Issues a new key of `kind`.
    public func createKey(tenant: UUID, kind: APIKeyKind) async throws -> IssuedKey {
        try await database.systemTransaction { connection in
            guard try !connection.query("SELECT 1 FROM tenants WHERE id = \(tenant)").isEmpty else {
                throw NotFound("tenant")
            }
            return try Self.insertKey(connection, tenant: tenant, kind: kind)
        }
    }

    /// Revokes a key, at once or after `grace` (to let clients switch). Revoking twice keeps the earlier time, so a
    /// key a rotation left working for a grace period stops at once when revoked at once.
    @discardableResult
    public func revokeKey(tenant: UUID, key: UUID, grace: Duration = .zero) async throws -> APIKeyRecord {
        try await database.systemTransaction { connection in
            guard let record = try Self.revoke(connection, tenant: tenant, key: key, grace: grace, onlyIfLive: false)
            else { throw NotFound("api_key") }
            return record
        }
    }

    /// The grace a rotated key may keep, in seconds: up to 30 days (the admin API and `marquee key rotate`).
    public static let rotationGraceSeconds: ClosedRange<Int> = 0...(30 * 86_400)

    /// Rotates a key: issues a new one of the same kind and revokes the old one after `grace`.
    public func rotateKey(tenant: UUID, key: UUID, grace: Duration = .zero) async throws -> IssuedKey {
        try await database.systemTransaction { connection in
            guard let old = try Self.revoke(connection, tenant: tenant, key: key, grace: grace, onlyIfLive: true) else {
                throw NotFound("api_key")
            }
            return try Self.insertKey(connection, tenant: tenant, kind: old.kind)
        }
    }

    /// The one home of a key's revocation: it ends `grace` from now, or at its earlier revocation time (a revocation
    /// never moves later). With `onlyIfLive`, a key already past its revocation is left alone and nil is returned, as
    /// for an unknown key.
    static func revoke(
        _ connection: PostgresConnection, tenant: UUID, key: UUID, grace: Duration, onlyIfLive: Bool
    ) throws -> APIKeyRecord? {
        let graceSeconds = Double(grace.components.seconds)
        let rows = try connection.query(
            """
            UPDATE api_keys
            SET revoked_at = LEAST(COALESCE(revoked_at, 'infinity'), now() + make_interval(secs => \(graceSeconds)))
            WHERE tenant_id = \(tenant) AND id = \(key)
              AND (NOT \(onlyIfLive) OR revoked_at IS NULL OR revoked_at > now())
            RETURNING id, tenant_id, kind, hint, created_at, revoked_at, last_used_at
            """)
        return try rows.first.map(keyRecord)
    }

    /// Checks a presented key. Returns nil for anything unknown, malformed or revoked (the caller answers 401
    /// without saying which). Records `last_used_at`, at most once a minute per key. The principal carries the
    /// tenant's request rate setting for the key's kind, read in the same statement.
    public func authenticate(_ presented: String) async throws -> Principal? {
        guard let parsed = APIKeyText(parsing: presented), let tenant = UUID(text: parsed.tenantUUIDString) else {
            return nil
        }
        let hash = SHA256.hash(Array(presented.utf8))
        // The tenant is part of the key text, so the lookup runs confined to it, like tenant work.
        let rows = try await database.tenantStatement(
            tenant,
            """
            WITH key AS (
                SELECT id, kind, last_used_at FROM api_keys
                WHERE tenant_id = \(tenant) AND hash = \(hash)
                  AND (revoked_at IS NULL OR revoked_at > now())
            ), touched AS (
                UPDATE api_keys SET last_used_at = now()
                WHERE tenant_id = \(tenant) AND id IN (
                    SELECT id FROM key WHERE last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')
                RETURNING id
            )
            SELECT key.id, key.kind, (SELECT count(*) FROM touched) AS touched,
                   CASE key.kind WHEN 'app' THEN s.app_requests_per_second ELSE s.sdk_requests_per_second END
                       AS requests_per_second
            FROM key LEFT JOIN tenant_settings s ON s.tenant_id = \(tenant)
            """)
        guard let row = rows.first, let kind = APIKeyKind(rawValue: try row.decode(String.self, "kind")),
            kind == parsed.kind
        else { return nil }
        return Principal(
            tenantID: tenant, keyID: try row.decode(UUID.self, "id"), kind: kind,
            requestsPerSecond: try row.decode(Int?.self, "requests_per_second"))
    }

    /// The tenant's HMAC key for delivery tokens.
    public func deliverySecret(tenant: UUID) async throws -> [UInt8] {
        // Confined to the tenant (marquee_api reads its own tenant row), in one round trip.
        let rows = try await database.tenantStatement(
            tenant, "SELECT sealed_delivery_secret FROM tenants WHERE id = \(tenant)")
        guard let row = rows.first else { throw NotFound("tenant") }
        let sealed = try row.decode([UInt8].self, "sealed_delivery_secret")
        return try keyRing.open(sealed, associatedData: Self.deliverySecretContext(tenant))
    }

    /// Associated data that binds a tenant's sealed delivery secret to that tenant.
    public static func deliverySecretContext(_ tenant: UUID) -> [UInt8] {
        Array("tenant:\(tenant.uuidString.lowercased()):delivery-secret".utf8)
    }

    static func insertKey(_ connection: PostgresConnection, tenant: UUID, kind: APIKeyKind) throws -> IssuedKey {
        let tenantHex = tenant.uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        let key = APIKeyText(kind: kind, tenantHex: tenantHex, secret: SecureRandom.token(byteCount: 32))
        let id = UUID()
        let hash = SHA256.hash(Array(key.text.utf8))
        let rows = try connection.query(
            """
            INSERT INTO api_keys (tenant_id, id, kind, hash, hint)
            VALUES (\(tenant), \(id), \(kind.rawValue), \(hash), \(key.hint))
            RETURNING id, tenant_id, kind, hint, created_at, revoked_at, last_used_at
            """)
        return IssuedKey(record: try keyRecord(rows[0]), text: key.text)
    }

    static func tenant(_ row: PostgresRow) throws -> Tenant {
        Tenant(
            id: try row.decode(UUID.self, "id"), name: try row.decode(String.self, "name"),
            createdAt: try row.decode(Date.self, "created_at"))
    }

    static func keyRecord(_ row: PostgresRow) throws -> APIKeyRecord {
        APIKeyRecord(
            id: try row.decode(UUID.self, "id"), tenantID: try row.decode(UUID.self, "tenant_id"),
            kind: try row.decodeRaw(APIKeyKind.self, "kind"),
            hint: try row.decode(String.self, "hint"), createdAt: try row.decode(Date.self, "created_at"),
            revokedAt: try row.decode(Date?.self, "revoked_at"), lastUsedAt: try row.decode(Date?.self, "last_used_at"))
    }
}
