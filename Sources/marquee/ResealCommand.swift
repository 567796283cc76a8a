import Foundation
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// `marquee reseal`: after a master-key rotation (new `MARQUEE_MASTER_KEY` + `MARQUEE_MASTER_KEY_ID`, the old key in
/// `MARQUEE_MASTER_KEYS_PREVIOUS`), re-seals every stored secret under the new key in one transaction. Then, once
/// every process runs with the new key (a process still on the old one seals what it stores with it), `marquee reseal
/// --check` exits 0 only when nothing is left under another key: only then can the previous key be dropped. Both open
/// every secret, and fail (status 1, `SecretResealer.UnopenableSecrets`, nothing changed) when one does not open: a key
/// ID says which key sealed a secret only while nobody changed the key under that ID.
struct ResealCommand {
    var check = false

    init(arguments: [String]) throws {
        for argument in arguments {
            guard argument == "--check" else { throw UsageError("reseal: unknown option '\(argument)'") }
            check = true
        }
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        let logger = Startup.logger("marquee.reseal", configuration)
        let keyRing = try Startup.keyRing(configuration, command: "reseal")
        var pgConfiguration = try PostgresConfiguration(url: try configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-reseal"
        let pool = PostgresPool(pgConfiguration, options: .init(maxConnections: 1))
        defer { pool.close() }
        let resealer = SecretResealer(database: TenantDatabase(pool: pool), keyRing: keyRing)
        if check {
            let left = try await resealer.reseal(dryRun: true).total
            if left > 0 {
                print("\(left) secret(s) are not under key \(configuration.masterKeyID): run marquee reseal")
                exit(1)
            }
            print("every secret is under key \(configuration.masterKeyID)")
            return
        }
        let counts = try await resealer.reseal()
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
