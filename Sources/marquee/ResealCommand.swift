import Foundation
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// `marquee reseal`: after a master-key rotation (new `MARQUEE_MASTER_KEY` + `MARQUEE_MASTER_KEY_ID`, the old key in
/// `MARQUEE_MASTER_KEYS_PREVIOUS`), re-seals every stored secret under the new key in one transaction. Afterwards
/// the previous key can be dropped from the configuration.
struct ResealCommand {
    init(arguments: [String]) throws {
        if let first = arguments.first { throw UsageError("reseal: unknown option '\(first)'") }
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        let logger = Startup.logger("marquee.reseal", configuration)
        let keyRing = try Startup.keyRing(configuration, command: "reseal")
        var pgConfiguration = try PostgresConfiguration(url: try configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-reseal"
        let pool = PostgresPool(pgConfiguration, options: .init(maxConnections: 1))
        defer { pool.close() }
        let counts = try await SecretResealer(database: TenantDatabase(pool: pool), keyRing: keyRing).reseal()
        logger.info(
            "secrets re-sealed under the current master key",
            metadata: [
                "key.id": .string(configuration.masterKeyID), "resealed.delivery_secrets": .int(counts.deliverySecrets),
                "resealed.apns_keys": .int(counts.apnsKeys), "resealed.fcm_accounts": .int(counts.fcmAccounts),
                "resealed.identity_secrets": .int(counts.identitySecrets),
            ])
        print("re-sealed \(counts.total) secret(s) under key \(configuration.masterKeyID)")
    }
}
