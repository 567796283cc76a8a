import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient
import ProcessLifecycle
import Synchronization

/// The `marquee` command line: parses the subcommand and hands over to it.
@main
struct Marquee {
    static let usage = """
        usage: marquee <command> [options]

        commands:
          serve              run the REST API (MARQUEE_LISTEN, DATABASE_URL)
          worker             run one delivery worker (metrics on MARQUEE_METRICS_LISTEN)
          up                 run the simulators, the API and MARQUEE_WORKERS workers, supervised
          simulate apns|fcm  run an APNs or FCM simulator (HTTP/2 over TLS)
          migrate            apply pending migrations (safe to run concurrently)
          migrate --status   show applied and pending migrations; exit 1 if not current
          tenant create --name N [--json]
                             create a tenant; prints its ID, an app key and an sdk key (once)
          tenant list [--json]
          key create --tenant T --kind app|sdk
          key list --tenant T
          key revoke --tenant T --key K
          key rotate --tenant T --key K [--grace-seconds S]
                             key commands print JSON (--json is accepted); an option a
                             command does not take, or one given twice, is refused (exit 2)
          simulate apns|fcm  run the local APNs or FCM simulator (MARQUEE_SIM_*)
          reseal             re-seal every stored secret under the current master key (after a rotation)
          version            print the version
          help               show this text

        Configuration comes from the environment; see the README's configuration table.
        """

    static func main() async {
        // A peer that closes a TLS or HTTP connection while we write must cost an error, not the process.
        signal(SIGPIPE, SIG_IGN)
        var arguments = Array(CommandLine.arguments.dropFirst())
        guard !arguments.isEmpty else {
            FileHandle.standardError.write(Data((usage + "\n").utf8))
            exit(2)
        }
        let command = arguments.removeFirst()
        do {
            switch command {
            case "serve":
                try await ServeCommand(arguments: arguments).run()
            case "migrate":
                try await MigrateCommand(arguments: arguments).run()
            case "up":
                try await UpCommand(arguments: arguments).run()
            case "worker":
                try await WorkerCommand(arguments: arguments).run()
            case "reseal":
                try await ResealCommand(arguments: arguments).run()
            case "tenant", "key":
                try await TenantCommand(group: command, arguments: arguments).run()
            case "simulate":
                try await SimulateCommand(arguments: arguments).run()
            case "version", "--version":
                print("marquee \(MarqueeVersion.current)")
            case "help", "--help", "-h":
                print(usage)
            default:
                throw UsageError("unknown command '\(command)'")
            }
        } catch let error as UsageError {
            FileHandle.standardError.write(Data("marquee: \(error.message)\n\n\(usage)\n".utf8))
            exit(2)
        } catch let error as ConfigurationError {
            FileHandle.standardError.write(Data("marquee: \(error)\n".utf8))
            exit(2)
        } catch {
            FileHandle.standardError.write(Data("marquee: \(error)\n".utf8))
            exit(1)
        }
    }
}

/// A mistake in the command line.
struct UsageError: Error {
    var message: String
    init(_ message: String) { self.message = message }
}

/// Shared start-up steps of every command.
enum Startup {
    static func configuration() throws -> MarqueeConfiguration {
        try MarqueeConfiguration(environment: ProcessInfo.processInfo.environment)
    }

    /// The sealing keys: `MARQUEE_MASTER_KEY` (current, named `MARQUEE_MASTER_KEY_ID`) and the previous ones.
    static func keyRing(_ configuration: MarqueeConfiguration, command: String) throws -> SealingKeyRing {
        guard let masterKey = configuration.masterKey else {
            throw ConfigurationError(problems: [
                .init(variable: "MARQUEE_MASTER_KEY", reason: "is required by \(command)")
            ])
        }
        return try SealingKeyRing(
            current: (id: configuration.masterKeyID, key: masterKey),
            previous: configuration.previousMasterKeys.map { (id: $0.id, key: $0.key) })
    }

    static func logger(_ label: String, _ configuration: MarqueeConfiguration) -> Logger {
        Logger(label: label, level: LogLevel(string: configuration.logLevel) ?? .info)
    }
}

/// `serve` or `worker` found its database role too privileged (see `DatabaseRoleCheck`).
struct PrivilegedRoleError: Error, CustomStringConvertible {
    var command: String
    var check: DatabaseRoleCheck
    var description: String {
        "refusing to run \(command): \(check.summary). Row-level security does not hold for such a role. Connect as "
            + "marquee_app (created by `marquee migrate`; see the README's security section), or set "
            + "MARQUEE_ALLOW_PRIVILEGED_ROLE=true to run anyway (emergencies only)."
    }
}

/// `serve` or `worker` found that its sealing keys do not open the secrets stored (see `SealingKeyCheck`).
struct SealingKeyError: Error, CustomStringConvertible {
    var command: String
    var check: SealingKeyCheck
    var description: String {
        "refusing to run \(command): MARQUEE_MASTER_KEY does not open the secrets stored (\(check.summary)); every "
            + "credential and delivery would fail. Is MARQUEE_MASTER_KEY the key that sealed them, under the same "
            + "MARQUEE_MASTER_KEY_ID, with every earlier key in MARQUEE_MASTER_KEYS_PREVIOUS? `marquee reseal --check` "
            + "opens every secret."
    }
}

extension Startup {
    /// Checks the login role of `pool` against least privilege: refuses a privileged role (throws
    /// `PrivilegedRoleError`) unless `MARQUEE_ALLOW_PRIVILEGED_ROLE` is true, then it warns loudly; and checks that
    /// `keyRing` opens the secrets stored (throws `SealingKeyError` when it does not: `SealingKeyCheck`). If the
    /// database cannot be reached yet, the checks are repeated in the returned service until it can (a refusal then
    /// ends the process); nil when done already.
    static func databaseGuard(
        pool: PostgresPool, keyRing: SealingKeyRing, command: String, _ configuration: MarqueeConfiguration,
        logger: Logger
    ) async throws -> CancellingService? {
        // The role is checked once; the keys once the tenants table is there (`marquee migrate` may not have run).
        let roleChecked = Mutex(false)
        @Sendable func verifyRole() async throws -> Bool {
            if roleChecked.withLock({ $0 }) { return true }
            guard let check = try? await DatabaseRoleCheck.inspect(pool) else { return false }
            roleChecked.withLock { $0 = true }
            guard !check.isLeastPrivilege else { return true }
            let error = PrivilegedRoleError(command: command, check: check)
            guard configuration.allowPrivilegedRole else { throw error }
            logger.critical(
                "RUNNING WITH A PRIVILEGED DATABASE ROLE (MARQUEE_ALLOW_PRIVILEGED_ROLE=true): tenant isolation "
                    + "rests on Marquee's queries alone",
                metadata: ["db.role": .string(check.role), "problems": .string(check.problems.joined(separator: ", "))])
            return true
        }
        @Sendable func verifyKeys() async throws -> Bool {
            guard let keys = try? await SealingKeyCheck.inspect(TenantDatabase(pool: pool), keyRing: keyRing) else {
                return false
            }
            guard keys.isSound else { throw SealingKeyError(command: command, check: keys) }
            if !keys.unknownKeyIDs.isEmpty {
                logger.warning(
                    "some secrets are sealed under a key this process does not hold (a master key rollout?)",
                    metadata: ["sealing.check": .string(keys.summary)])
            }
            return true
        }
        @Sendable func verify() async throws -> Bool {
            guard try await verifyRole() else { return false }
            return try await verifyKeys()
        }
        if try await verify() { return nil }
        logger.warning(
            "database not reachable (or not migrated) yet; its role and the master key are checked once it is")
        return CancellingService {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                if Task.isCancelled { return }
                if try await verify() { break }
            }
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        }
    }
}
