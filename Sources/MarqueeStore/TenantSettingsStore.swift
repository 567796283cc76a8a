import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// Whether sdk-key writes about a person must carry a user token signed with the tenant's identity secret.
public enum IdentityVerification: String, Sendable, CaseIterable {
    case off
    case required
}

/// A tenant's settings as the API shows them (never a secret).
public struct TenantSettings: Sendable, Equatable {
    public var identityVerification: IdentityVerification
    public var identitySecretSet: Bool
    public var previousSecretValidUntil: Date?
}

/// What the identity check needs: the mode and the opened secrets (current first; the previous one with its end).
public struct IdentityKeys: Sendable {
    public var verification: IdentityVerification
    public var current: [UInt8]?
    public var previous: [UInt8]?
    public var previousValidUntil: Date?

    /// The secrets a user token may be signed with at `now`: the current one, and the previous one during its grace.
    public func secrets(at now: Date) -> [[UInt8]] {
        var out: [[UInt8]] = []
        if let current { out.append(current) }
        if let previous, let until = previousValidUntil, until > now { out.append(previous) }
        return out
    }
}

/// `tenant_settings`: a missing row means the defaults (verification off, no identity secret).
public struct TenantSettingsStore: Sendable {
    let database: TenantDatabase
    let keyRing: SealingKeyRing

    /// How long the previous identity secret stays valid after a rotation.
    public static let rotationGrace: TimeInterval = 24 * 3600

    public init(database: TenantDatabase, keyRing: SealingKeyRing) {
        self.database = database
        self.keyRing = keyRing
    }

    /// Associated data that binds a tenant's sealed identity secrets (current and previous) to that tenant.
    public static func identitySecretContext(_ tenant: UUID) -> [UInt8] {
        Array("tenant:\(tenant.uuidString.lowercased()):identity-secret".utf8)
    }

    /// The settings, defaults when the tenant has no row.
    public func settings(tenant: UUID) async throws -> TenantSettings {
        let rows = try await database.tenantStatement(
            tenant,
            """
            SELECT identity_verification, sealed_identity_secret IS NOT NULL AS secret_set,
                   CASE WHEN previous_secret_valid_until > now() THEN previous_secret_valid_until END AS previous_until
            FROM tenant_settings WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else {
            return TenantSettings(identityVerification: .off, identitySecretSet: false, previousSecretValidUntil: nil)
        }
        return try Self.settings(row)
    }

    /// Sets the verification mode. `required` needs an identity secret (422 otherwise).
    public func setIdentityVerification(tenant: UUID, _ mode: IdentityVerification) async throws -> TenantSettings {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                INSERT INTO tenant_settings (tenant_id, identity_verification) VALUES (\(tenant), 'off')
                ON CONFLICT (tenant_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id
                RETURNING sealed_identity_secret IS NOT NULL AS secret_set
                """)
            if mode == .required, try !rows[0].decode(Bool.self, "secret_set") {
                throw ValidationError(
                    field: "identity_verification",
                    reason: "cannot be required before an identity secret exists: create it first with "
                        + "POST /v1/settings/identity_secret")
            }
            let updated = try connection.query(
                """
                UPDATE tenant_settings SET identity_verification = \(mode.rawValue), updated_at = now()
                WHERE tenant_id = \(tenant)
                RETURNING identity_verification, sealed_identity_secret IS NOT NULL AS secret_set,
                    CASE WHEN previous_secret_valid_until > now() THEN previous_secret_valid_until END AS previous_until
                """)
            return try Self.settings(updated[0])
        }
    }

    /// Makes a new identity secret (32 random bytes). An existing one becomes the previous secret, accepted for
    /// `rotationGrace` more. Returns the new secret and whether one existed before.
    public func rotateIdentitySecret(tenant: UUID) async throws -> (secret: [UInt8], rotated: Bool) {
        let secret = SecureRandom.bytes(32)
        let sealed = try keyRing.seal(secret, associatedData: Self.identitySecretContext(tenant))
        let grace = Self.rotationGrace
        let rotated = try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                INSERT INTO tenant_settings (tenant_id, sealed_identity_secret) VALUES (\(tenant), \(sealed))
                ON CONFLICT (tenant_id) DO UPDATE SET
                    sealed_previous_identity_secret = tenant_settings.sealed_identity_secret,
                    previous_secret_valid_until = CASE WHEN tenant_settings.sealed_identity_secret IS NULL THEN NULL
                        ELSE now() + make_interval(secs => \(grace)) END,
                    sealed_identity_secret = EXCLUDED.sealed_identity_secret, updated_at = now()
                RETURNING sealed_previous_identity_secret IS NOT NULL AS rotated
                """)
            return try rows[0].decode(Bool.self, "rotated")
        }
        return (secret, rotated)
    }

    /// The mode and opened secrets, for checking user tokens.
    public func identityKeys(tenant: UUID) async throws -> IdentityKeys {
        let rows = try await database.tenantStatement(
            tenant,
            """
            SELECT identity_verification, sealed_identity_secret, sealed_previous_identity_secret,
                   previous_secret_valid_until
            FROM tenant_settings WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else { return IdentityKeys(verification: .off) }
        let context = Self.identitySecretContext(tenant)
        return IdentityKeys(
            verification: IdentityVerification(rawValue: try row.decode(String.self, "identity_verification")) ?? .off,
            current: try row.decode([UInt8]?.self, "sealed_identity_secret").map {
                try keyRing.open($0, associatedData: context)
            },
            previous: try row.decode([UInt8]?.self, "sealed_previous_identity_secret").map {
                try keyRing.open($0, associatedData: context)
            },
            previousValidUntil: try row.decode(Date?.self, "previous_secret_valid_until"))
    }

    static func settings(_ row: PostgresRow) throws -> TenantSettings {
        TenantSettings(
            identityVerification: IdentityVerification(
                rawValue: try row.decode(String.self, "identity_verification")) ?? .off,
            identitySecretSet: try row.decode(Bool.self, "secret_set"),
            previousSecretValidUntil: try row.decode(Date?.self, "previous_until"))
    }
}

extension IdentityKeys {
    init(verification: IdentityVerification) {
        self.init(verification: verification, current: nil, previous: nil, previousValidUntil: nil)
    }
}
