import Crypto
import Foundation
import PostgresClient

/// Moves every sealed secret (tenant delivery secrets, APNs keys, FCM service accounts) to the key ring's current
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
        public var total: Int { deliverySecrets + apnsKeys + fcmAccounts }
    }

    public func reseal() async throws -> Counts {
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
                try connection.execute(
                    "UPDATE fcm_credentials SET sealed_service_account = \(again) WHERE tenant_id = \(tenant)")
                counts.fcmAccounts += 1
            }
            return counts
        }
    }
}
