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
    /// At most this many pushes a second for the tenant, across all workers; nil: no limit.
    public var sendRatePerSecond: Int?
    /// At most this many devices per person; a registration beyond it removes the person's least recently
    /// registered device (migration 0081, which holds the default).
    public var maxDevicesPerPerson: Int
    /// The tenant's own API request rate limits per `marquee serve` process, for app and sdk keys (migration 0084);
    /// nil: the operator's default (`RequestLimits` in MarqueeAPI applies them).
    public var appRequestsPerSecond: Int?
    public var sdkRequestsPerSecond: Int?
    /// At most this many activity types created by push-to-start registrations (`auto_created`); a registration
    /// naming an unknown type beyond it is refused (migration 0088, which holds the default).
    public var maxAutoCreatedActivityTypes: Int
}

/// What the identity check needs: the mode and, when verification is required, the opened secrets (current first; the
/// previous one with its end).
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
        try await database.tenantTransaction(tenant) { try Self.read($0, tenant) }
    }

    /// The settings as stored in this transaction: defaults where the tenant has no row.
    static func read(_ connection: PostgresConnection, _ tenant: UUID) throws -> TenantSettings {
        let rows = try connection.query(
            """
            SELECT COALESCE(s.identity_verification, 'off') AS identity_verification,
                   COALESCE(s.sealed_identity_secret IS NOT NULL, false) AS secret_set,
                   CASE WHEN s.previous_secret_valid_until > now() THEN s.previous_secret_valid_until END
                       AS previous_until,
                   l.rate_per_second, marquee_max_devices_per_person(t.tenant_id) AS max_devices_per_person,
                   s.app_requests_per_second, s.sdk_requests_per_second,
                   marquee_max_auto_created_activity_types(t.tenant_id) AS max_auto_created_activity_types
            FROM (SELECT \(tenant)::uuid AS tenant_id) t
            LEFT JOIN tenant_settings s ON s.tenant_id = t.tenant_id
            LEFT JOIN send_limits l ON l.tenant_id = t.tenant_id
            """)
        let row = rows[0]
        let mode = try row.decode(String.self, "identity_verification")
        guard let verification = IdentityVerification(rawValue: mode) else {
            throw PostgresError(code: .decoding, context: "unknown identity_verification \(mode)")
        }
        return TenantSettings(
            identityVerification: verification, identitySecretSet: try row.decode(Bool.self, "secret_set"),
            previousSecretValidUntil: try row.decode(Date?.self, "previous_until"),
            sendRatePerSecond: try row.decode(Int?.self, "rate_per_second"),
            maxDevicesPerPerson: try row.decode(Int.self, "max_devices_per_person"),
            appRequestsPerSecond: try row.decode(Int?.self, "app_requests_per_second"),
            sdkRequestsPerSecond: try row.decode(Int?.self, "sdk_requests_per_second"),
            maxAutoCreatedActivityTypes: try row.decode(Int.self, "max_auto_created_activity_types"))
    }

    /// What a settings change sets: nil leaves a setting as it is.
    public struct Change: Sendable {
        public var identityVerification: IdentityVerification?
        /// `.some(nil)` removes the limit.
        public var sendRatePerSecond: Int??
        /// `.some(nil)` restores the default.
        public var maxDevicesPerPerson: Int??
        /// `.some(nil)` restores the operator's default.
        public var appRequestsPerSecond: Int??
        public var sdkRequestsPerSecond: Int??
        /// `.some(nil)` restores the default.
        public var maxAutoCreatedActivityTypes: Int??

        public init(
            identityVerification: IdentityVerification? = nil, sendRatePerSecond: Int?? = nil,
            maxDevicesPerPerson: Int?? = nil, appRequestsPerSecond: Int?? = nil, sdkRequestsPerSecond: Int?? = nil,
            maxAutoCreatedActivityTypes: Int?? = nil
        ) {
            self.identityVerification = identityVerification
            self.sendRatePerSecond = sendRatePerSecond
            self.maxDevicesPerPerson = maxDevicesPerPerson
            self.appRequestsPerSecond = appRequestsPerSecond
            self.sdkRequestsPerSecond = sdkRequestsPerSecond
            self.maxAutoCreatedActivityTypes = maxAutoCreatedActivityTypes
        }
    }

    /// Applies `change` in one transaction. `required` verification needs an identity secret (422 otherwise). A
    /// new or changed send rate starts with at most one second's worth in the bucket.
    public func update(tenant: UUID, _ change: Change) async throws -> TenantSettings {
        try await database.tenantTransaction(tenant) { connection in
            if let mode = change.identityVerification {
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
                try connection.execute(
                    """
                    UPDATE tenant_settings SET identity_verification = \(mode.rawValue), updated_at = now()
                    WHERE tenant_id = \(tenant)
                    """)
            }
            switch change.sendRatePerSecond {
            case .none: break
            case .some(.some(let rate)):
                try connection.execute(
                    """
                    INSERT INTO send_limits (tenant_id, rate_per_second, tokens) VALUES (\(tenant), \(rate), \(rate))
                    ON CONFLICT (tenant_id) DO UPDATE SET
                        rate_per_second = EXCLUDED.rate_per_second,
                        tokens = LEAST(send_limits.tokens, EXCLUDED.rate_per_second), updated_at = now()
                    """)
            case .some(.none):
                try connection.execute("DELETE FROM send_limits WHERE tenant_id = \(tenant)")
            }
            if case .some(let cap) = change.maxDevicesPerPerson {
                // A lower cap applies to each person at their next device registration.
                try connection.execute(
                    """
                    INSERT INTO tenant_settings (tenant_id, max_devices_per_person) VALUES (\(tenant), \(cap))
                    ON CONFLICT (tenant_id) DO UPDATE SET
                        max_devices_per_person = EXCLUDED.max_devices_per_person, updated_at = now()
                    """)
            }
            if case .some(let cap) = change.maxAutoCreatedActivityTypes {
                // A lower cap refuses new types from the next registration on; the types already there stay.
                try connection.execute(
                    """
                    INSERT INTO tenant_settings (tenant_id, max_auto_created_activity_types) VALUES (\(tenant), \(cap))
                    ON CONFLICT (tenant_id) DO UPDATE SET
                        max_auto_created_activity_types = EXCLUDED.max_auto_created_activity_types, updated_at = now()
                    """)
            }
            if change.appRequestsPerSecond != nil || change.sdkRequestsPerSecond != nil {
                // Each given one is set (nil: the default again), the other kept.
                let setApp = change.appRequestsPerSecond != nil
                let setSDK = change.sdkRequestsPerSecond != nil
                let app = change.appRequestsPerSecond ?? nil
                let sdk = change.sdkRequestsPerSecond ?? nil
                try connection.execute(
                    """
                    INSERT INTO tenant_settings (tenant_id, app_requests_per_second, sdk_requests_per_second)
                    VALUES (\(tenant), \(app)::integer, \(sdk)::integer)
                    ON CONFLICT (tenant_id) DO UPDATE SET
                        app_requests_per_second = CASE WHEN \(setApp) THEN EXCLUDED.app_requests_per_second
                            ELSE tenant_settings.app_requests_per_second END,
                        sdk_requests_per_second = CASE WHEN \(setSDK) THEN EXCLUDED.sdk_requests_per_second
                            ELSE tenant_settings.sdk_requests_per_second END,
                        updated_at = now()
                    """)
            }
            return try Self.read(connection, tenant)
        }
    }

    /// A rotation refused because the previous identity secret is still in its grace (`rotationGrace`): rotating again
    /// would drop it at once, while the tenant's servers may still mint user tokens with it (e.g. a retried rotation
    /// whose answer was lost).
    public struct IdentitySecretInGrace: Error, Sendable, Equatable {
        /// When the previous secret's grace ends (a rotation is accepted from then on).
        public var previousValidUntil: Date
    }

    /// Makes a new identity secret (32 random bytes). An existing one becomes the previous secret, accepted for
    /// `rotationGrace` more. While an earlier previous secret is still in its grace, throws `IdentitySecretInGrace`
    /// unless `force` (which drops that secret at once). Returns the new secret and whether one existed before.
    public func rotateIdentitySecret(tenant: UUID, force: Bool = false) async throws -> (
        secret: [UInt8], rotated: Bool
    ) {
        let secret = SecureRandom.bytes(32)
        let sealed = try keyRing.seal(secret, associatedData: Self.identitySecretContext(tenant))
        let grace = Self.rotationGrace
        let rotated = try await database.tenantTransaction(tenant) { connection in
            // The upsert locks the tenant's row whether or not its WHERE holds, so the grace it judges is the one
            // read back below, and concurrent rotations are judged one after the other.
            let rows = try connection.query(
                """
                INSERT INTO tenant_settings (tenant_id, sealed_identity_secret) VALUES (\(tenant), \(sealed))
                ON CONFLICT (tenant_id) DO UPDATE SET
                    sealed_previous_identity_secret = tenant_settings.sealed_identity_secret,
                    previous_secret_valid_until = CASE WHEN tenant_settings.sealed_identity_secret IS NULL THEN NULL
                        ELSE now() + make_interval(secs => \(grace)) END,
                    sealed_identity_secret = EXCLUDED.sealed_identity_secret, updated_at = now()
                WHERE \(force) OR tenant_settings.sealed_previous_identity_secret IS NULL
                    OR tenant_settings.previous_secret_valid_until IS NULL
                    OR tenant_settings.previous_secret_valid_until <= now()
                RETURNING sealed_previous_identity_secret IS NOT NULL AS rotated
                """)
            guard let row = rows.first else {
                let held = try connection.query(
                    "SELECT previous_secret_valid_until FROM tenant_settings WHERE tenant_id = \(tenant)")
                throw IdentitySecretInGrace(
                    previousValidUntil: try held[0].decode(Date.self, "previous_secret_valid_until"))
            }
            return try row.decode(Bool.self, "rotated")
        }
        return (secret, rotated)
    }

    /// The mode and, when it requires verification, the opened secrets, for checking user tokens. With verification
    /// off nothing is opened: a secret sealed under a master key this process does not hold yet (another process
    /// rolled out with a new key and rotated the secret) must not fail requests that need no secret.
    public func identityKeys(tenant: UUID) async throws -> IdentityKeys {
        let rows = try await database.tenantStatement(
            tenant,
            """
            SELECT identity_verification, sealed_identity_secret, sealed_previous_identity_secret,
                   previous_secret_valid_until
            FROM tenant_settings WHERE tenant_id = \(tenant)
            """)
        guard let row = rows.first else { return IdentityKeys(verification: .off) }
        let verification = try row.decodeRaw(IdentityVerification.self, "identity_verification")
        guard verification == .required else { return IdentityKeys(verification: verification) }
        let context = Self.identitySecretContext(tenant)
        return IdentityKeys(
            verification: verification,
            current: try row.decode([UInt8]?.self, "sealed_identity_secret").map {
                try keyRing.open($0, associatedData: context)
            },
            previous: try row.decode([UInt8]?.self, "sealed_previous_identity_secret").map {
                try keyRing.open($0, associatedData: context)
            },
            previousValidUntil: try row.decode(Date?.self, "previous_secret_valid_until"))
    }
}

extension IdentityKeys {
    init(verification: IdentityVerification) {
        self.init(verification: verification, current: nil, previous: nil, previousValidUntil: nil)
    }
}
