import Foundation
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// `marquee migrate [--status]`.
struct MigrateCommand {
    var statusOnly = false

    init(arguments: [String]) throws {
        for argument in arguments {
            switch argument {
            case "--status": statusOnly = true
            default: throw UsageError("migrate: unknown option '\(argument)'")
            }
        }
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        let logger = Startup.logger("marquee.migrate", configuration)
        let migrations = try Database.migrations(configuration)
        // The owner migrates: MARQUEE_MIGRATE_DATABASE_URL when the API's DATABASE_URL is the marquee_app role.
        var pgConfiguration = try PostgresConfiguration(
            url: try configuration.migrateDatabaseURL ?? configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-migrate"
        let pool = PostgresPool(pgConfiguration, options: .init(maxConnections: 1))
        defer { pool.close() }
        let migrator = Migrator(pool: pool, migrations: migrations)

        if statusOnly {
            let status = try await migrator.status()
            for migration in migrations {
                let state =
                    status.changed.contains(migration.version)
                    ? "CHANGED" : status.pending.contains(migration) ? "pending" : "applied"
                print("\(state)\t\(migration.fileName)")
            }
            for version in status.unknown { print("unknown\t\(version) (applied by a newer release)") }
            if !status.isCurrent { exit(1) }
            return
        }

        let password = configuration.appPassword
        let applied = try await migrator.migrate(
            onApplied: { migration, elapsed in
                logger.info(
                    "migration applied",
                    metadata: [
                        "migration.version": .int(migration.version), "migration.name": .string(migration.name),
                        "duration.ms": .double(
                            Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15),
                    ])
            },
            stillLocked: { connection in
                // Under the migration lock: every pod of a rollout runs this at once, and two ALTER ROLEs of one role
                // at once fail the later ("tuple concurrently updated").
                guard let password else { return }
                // The verifier, not the password: this runs at every start of every pod, and the statement's text
                // may be logged. ALTER ROLE takes no parameters: the server quotes the literal.
                let verifier = try connection.encryptedPassword(password, user: "marquee_app")
                let rows = try connection.query(
                    "SELECT format('ALTER ROLE marquee_app PASSWORD %L', \(verifier)::text) AS statement")
                try connection.execute(PostgresQuery(unsafeSQL: try rows[0].decode(String.self, "statement")))
            })
        if password != nil { logger.info("marquee_app password set from MARQUEE_APP_PASSWORD") }
        logger.info(
            applied.isEmpty ? "database is current" : "migrations done",
            metadata: ["migrations.applied": .int(applied.count), "migrations.known": .int(migrations.count)])
        let collation = try await pool.query(
            "SELECT datcollate FROM pg_database WHERE datname = current_database()"
        ).first?.decode(String.self, "datcollate")
        if let collation, !Database.bytewiseCollations.contains(collation) {
            logger.notice(
                "the database collates text by locale; Marquee's text keys compare faster byte by byte (LC_COLLATE C)",
                metadata: ["database.collation": .string(collation)])
        }
    }
}

/// Database set-up shared by commands.
enum Database {
    /// `jit` for the API's and the workers' sessions: off. Their statements are short and planned on estimates that
    /// a burst makes large: a claim over 100,000 queued rows crossed `jit_above_cost` and spent 67 ms of its 75 in
    /// LLVM compilation, every claim (auto_explain in bench/campaign; bench/RESULTS.md).
    static let jit = "off"

    /// Database collations under which PostgreSQL compares text byte by byte. Marquee's keys are text (instance,
    /// person, device and token IDs) in most of its indexes; under any other collation each comparison goes through
    /// the C library's strcoll (bench/RESULTS.md: 3–5% of PostgreSQL's CPU in a campaign start).
    static let bytewiseCollations: Set<String> = ["C", "POSIX"]

    static func migrations(_ configuration: MarqueeConfiguration) throws -> [Migration] {
        guard let directory = MigrationFiles.locate(explicit: configuration.migrationsDirectory) else {
            throw MigrationError(code: .directoryNotFound, subject: "Migrations (set MARQUEE_MIGRATIONS_DIR)")
        }
        return try MigrationFiles.load(directory: directory)
    }
}
