import Crypto
import Foundation
import MarqueeCore
import Observability

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
