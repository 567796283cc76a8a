import Crypto
import Foundation
import PostgresClient

/// Moves every sealed secret (tenant delivery secrets, identity secrets current and previous, APNs keys, FCM service
/// accounts) to the key ring's current
/// key, so that a previous master key can be retired. Each secret is opened with whichever key sealed it and sealed
/// again under the current one, with the same associated data; rows already under the current key are opened (to prove
/// the key still opens them) and left alone.
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

    /// Secrets that no key of the ring opens: the run changes nothing and throws this. A blob may name the current key's
    /// ID and still not open, when `MARQUEE_MASTER_KEY` was changed (or mistyped) and its ID kept.
    public struct UnopenableSecrets: Error, Sendable, CustomStringConvertible {
        /// How many of each kind did not open.
        public var counts = Counts()
        /// The key IDs those blobs name (never key material).
        public var keyIDs: Set<String> = []
        /// The first ten tenants they belong to.
        public var tenants: [UUID] = []
        /// Whether they belong to more tenants than `tenants` lists.
        public var moreTenants = false

        mutating func record(_ kind: WritableKeyPath<Counts, Int>, tenant: UUID, keyID: String?) {
            counts[keyPath: kind] += 1
            keyIDs.insert(keyID ?? "(unreadable)")
            guard !tenants.contains(tenant) else { return }
            if tenants.count < 10 { tenants.append(tenant) } else { moreTenants = true }
        }

        /// Counts by kind, key IDs and tenants: never a secret or a key.
        public var description: String {
            let kinds = [
                (counts.deliverySecrets, "delivery secret(s)"), (counts.apnsKeys, "APNs key(s)"),
                (counts.fcmAccounts, "FCM service account(s)"), (counts.identitySecrets, "identity secret(s)"),
            ].filter { $0.0 > 0 }.map { "\($0.0) \($0.1)" }
            let more = moreTenants ? ", …" : ""
            return "\(counts.total) secret(s) cannot be opened with any key of the ring (MARQUEE_MASTER_KEY and "
                + "MARQUEE_MASTER_KEYS_PREVIOUS): \(kinds.joined(separator: ", ")), sealed under key ID(s) "
                + "\(keyIDs.sorted().joined(separator: ", ")), of tenant(s) "
                + tenants.map { $0.uuidString.lowercased() }.joined(separator: ", ") + more + ". Nothing was "
                + "re-sealed. Is MARQUEE_MASTER_KEY the key that sealed them (a new key needs a new "
                + "MARQUEE_MASTER_KEY_ID), and is every earlier key in MARQUEE_MASTER_KEYS_PREVIOUS? Drop no key now."
        }
    }

    /// A dry run's counts, thrown to roll its transaction back.
    private struct DryRun: Error {
        var counts: Counts
    }

    /// Re-seals what is not under the current key. Every secret is opened first, whatever key ID it names: when any
    /// does not open, nothing changes and `UnopenableSecrets` is thrown. With `dryRun`, changes nothing: counts what
    /// would be re-sealed, for `marquee reseal --check` before a previous key is dropped.
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
            var unopenable = UnopenableSecrets()
            /// `sealed` sealed again under the current key; nil when it is under the current key already, or when it
            /// does not open (recorded in `unopenable`). Opened either way: the key ID alone does not say the key is
            /// the one that sealed it.
            func resealed(
                _ sealed: [UInt8], _ context: [UInt8], tenant: UUID, kind: WritableKeyPath<Counts, Int>
            ) throws -> [UInt8]? {
                let plaintext: [UInt8]
                do {
                    plaintext = try keyRing.open(sealed, associatedData: context)
                } catch let error as CryptoError where error.code == .openFailed || error.code == .unknownKeyID {
                    unopenable.record(kind, tenant: tenant, keyID: keyRing.keyID(of: sealed))
                    return nil
                }
                guard keyRing.needsReseal(sealed) else { return nil }
                return try keyRing.seal(plaintext, associatedData: context)
            }
            for row in try connection.query("SELECT id, sealed_delivery_secret FROM tenants FOR UPDATE") {
                let tenant = try row.decode(UUID.self, "id")
                let sealed = try row.decode([UInt8].self, "sealed_delivery_secret")
                let context = TenantStore.deliverySecretContext(tenant)
                guard let again = try resealed(sealed, context, tenant: tenant, kind: \.deliverySecrets) else {
                    continue
                }
                try connection.execute("UPDATE tenants SET sealed_delivery_secret = \(again) WHERE id = \(tenant)")
                counts.deliverySecrets += 1
            }
            for row in try connection.query("SELECT tenant_id, sealed_private_key FROM apns_credentials FOR UPDATE") {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let sealed = try row.decode([UInt8].self, "sealed_private_key")
                let context = CredentialStore.context(tenant, "apns")
                guard let again = try resealed(sealed, context, tenant: tenant, kind: \.apnsKeys) else { continue }
                try connection.execute(
                    "UPDATE apns_credentials SET sealed_private_key = \(again) WHERE tenant_id = \(tenant)")
                counts.apnsKeys += 1
            }
            for row in try connection.query(
                "SELECT tenant_id, sealed_service_account FROM fcm_credentials FOR UPDATE")
            {
                let tenant = try row.decode(UUID.self, "tenant_id")
                let sealed = try row.decode([UInt8].self, "sealed_service_account")
                let context = CredentialStore.context(tenant, "fcm")
                guard let again = try resealed(sealed, context, tenant: tenant, kind: \.fcmAccounts) else { continue }
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
                    guard let sealed = index == 0 ? current : previous,
                        let again = try resealed(sealed, context, tenant: tenant, kind: \.identitySecrets)
                    else { continue }
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
            // Thrown, so the transaction rolls back: a run that cannot open everything changes nothing.
            if unopenable.counts.total > 0 { throw unopenable }
            if dryRun { throw DryRun(counts: counts) }
            return counts
        }
    }
}
