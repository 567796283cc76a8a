import Crypto
import Foundation
import PostgresClient

/// Moves every sealed secret (tenant delivery secrets, identity secrets current and previous, APNs keys, FCM service
/// accounts) to the key ring's current
/// key, so that a previous master key can be retired. Each secret is opened with whichever key sealed it and sealed
/// again under the current one, with the same associated data; rows already under the current key are left alone.
public struct SecretResealer: Sendable {
    let database: TenantDatabase
    let keyRing: SealingKeyRing

    public init(database: TenantDatabase, keyRing: SealingKeyRing) {
        self.database = database
        self.keyRing = keyRing
    }

    /// How many secrets were re-sealed, by kind.
    public struct Counts: Sendable, Equatable {
        public var deliverySecrets = 0
        public var apnsKeys = 0
        public var fcmAccounts = 0
        /// Current and previous identity secrets, each counted.
        public var identitySecrets = 0
        public var total: Int { deliverySecrets + apnsKeys + fcmAccounts + identitySecrets }
    }

    /// A dry run's counts, thrown to roll its transaction back.
    private struct DryRun: Error {
        var counts: Counts
    }

    /// Re-seals what is not under the current key. With `dryRun`, changes nothing: counts what would be re-sealed
    /// (each secret is still opened, so a secret no key of the ring opens fails the run), for `marquee reseal --check`
    /// before a previous key is dropped.
    public func reseal(dryRun: Bool = false) async throws -> Counts {
        do {
            return try await run(dryRun: dryRun)
        } catch let dry as DryRun {
            return dry.counts
        }
    }

    private func run(dryRun: Bool) async throws -> Counts {
        let keyRing = self.keyRing
        return try await database.systemTransaction { connection in
            var counts = Counts()
            for row in try connection.query("SELECT id, sealed_delivery_secret FROM tenants FOR UPDATE") {
                let tenant = try row.decode(UUID.self, "id")
                let sealed = try row.decode([UInt8].self, "sealed_delivery_secret")
                guard keyRing.needsReseal(sealed) else { continue }
                let context = TenantStore.deliverySecretContext(tenant)
                let again = try keyRing.seal(try keyRing.open(sealed, associatedData: context), associatedData: context)
                try connection.execute("UPDATE tenants SET sealed_delivery_secret = \(again) WHERE id = \(tenant)")
                counts.deliverySecrets += 1
            }
            for row in try connection.query("SELECT tenant_id, sealed_private_key FROM apns_credentials FOR UPDATE") {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let sealed = try row.decode([UInt8].self, "sealed_private_key")
                guard keyRing.needsReseal(sealed) else { continue }
                let context = CredentialStore.context(tenant, "apns")
                let again = try keyRing.seal(try keyRing.open(sealed, associatedData: context), associatedData: context)
                try connection.execute(
                    "UPDATE apns_credentials SET sealed_private_key = \(again) WHERE tenant_id = \(tenant)")
                counts.apnsKeys += 1
            }
            for row in try connection.query(
                "SELECT tenant_id, sealed_service_account FROM fcm_credentials FOR UPDATE")
            {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let sealed = try row.decode([UInt8].self, "sealed_service_account")
                guard keyRing.needsReseal(sealed) else { continue }
                let context = CredentialStore.context(tenant, "fcm")
                let again = try keyRing.seal(try keyRing.open(sealed, associatedData: context), associatedData: context)
                // The same account sealed again: a proof that FCM accepted it (migration 0095, keyed by the row's
                // updated_at, which the touch trigger moves) follows it, or a mismatched token would be blamed on it.
                try connection.execute(
                    """
                    WITH old AS (SELECT updated_at FROM fcm_credentials WHERE tenant_id = \(tenant)),
                    new AS (
                        UPDATE fcm_credentials SET sealed_service_account = \(again) WHERE tenant_id = \(tenant)
                        RETURNING updated_at
                    )
                    UPDATE fcm_credential_checks k SET credential_updated_at = (SELECT updated_at FROM new)
                    WHERE k.tenant_id = \(tenant) AND k.credential_updated_at = (SELECT updated_at FROM old)
                    """)
                counts.fcmAccounts += 1
            }
            for row in try connection.query(
                """
                SELECT tenant_id, sealed_identity_secret, sealed_previous_identity_secret FROM tenant_settings
                FOR UPDATE
                """)
            {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let context = TenantSettingsStore.identitySecretContext(tenant)
                var current = try row.decode([UInt8]?.self, "sealed_identity_secret")
                var previous = try row.decode([UInt8]?.self, "sealed_previous_identity_secret")
                var changed = 0
                for index in 0..<2 {
                    guard let sealed = index == 0 ? current : previous, keyRing.needsReseal(sealed) else { continue }
                    let again = try keyRing.seal(
                        try keyRing.open(sealed, associatedData: context), associatedData: context)
                    if index == 0 { current = again } else { previous = again }
                    changed += 1
                }
                guard changed > 0 else { continue }
                try connection.execute(
                    """
                    UPDATE tenant_settings
                    SET sealed_identity_secret = \(current), sealed_previous_identity_secret = \(previous)
                    WHERE tenant_id = \(tenant)
                    """)
                counts.identitySecrets += changed
            }
            if dryRun { throw DryRun(counts: counts) }
            return counts
        }
    }
}
