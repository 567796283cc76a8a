import Crypto
import Foundation
import PostgresClient

/// One numbered SQL file from `Migrations/`, e.g. `0001_foundation.sql`.
public struct Migration: Sendable, Equatable {
    /// The number before the underscore.
    public var version: Int
    /// The rest of the file name, without `.sql`.
    public var name: String
    /// The whole file, run as one script inside one transaction.
    public var sql: String
    /// SHA-256 of the file's bytes, hex; recorded when applied so later edits are detected.
    public var checksum: String

    public init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
        self.checksum = Hex.encode(SHA256.hash(Array(sql.utf8)))
    }

    /// `NNNN_name.sql`.
    public var fileName: String { "\(Self.paddedVersion(version))_\(name).sql" }

    static func paddedVersion(_ version: Int) -> String {
        let digits = String(version)
        return digits.count >= 4 ? digits : String(repeating: "0", count: 4 - digits.count) + digits
    }
}

/// A problem with the migration files or with what the database has recorded.
public struct MigrationError: Error, Sendable, CustomStringConvertible, Equatable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let raw: String
        public static let directoryNotFound = Code(raw: "directory not found")
        public static let badFileName = Code(raw: "bad file name")
        public static let duplicateVersion = Code(raw: "duplicate version")
        public static let changedAfterApply = Code(raw: "changed after it was applied")
        public static let failed = Code(raw: "failed")
        public var description: String { raw }
    }

    public var code: Code
    /// The file or version concerned.
    public var subject: String
    public var underlying: String?

    public init(code: Code, subject: String, underlying: String? = nil) {
        self.code = code
        self.subject = subject
        self.underlying = underlying
    }

    public var description: String {
        switch code {
        case .changedAfterApply:
            "migration \(subject) changed after it was applied; restore the original file and add a new migration instead"
        default:
            "migration \(subject): \(code)" + (underlying.map { " (\($0))" } ?? "")
        }
    }
}

/// Finds and reads the migration files.
public enum MigrationFiles {
    /// Reads every `NNNN_name.sql` in `directory`, sorted by version. Other files are ignored; a `.sql` file with a
    /// malformed name, or two files with one version, are errors.
    public static func load(directory: String) throws(MigrationError) -> [Migration] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw MigrationError(code: .directoryNotFound, subject: directory)
        }
        var migrations: [Migration] = []
        for file in names.sorted() where file.hasSuffix(".sql") {
            let stem = file.dropLast(4)
            guard let underscore = stem.firstIndex(of: "_"),
                let version = Int(stem[..<underscore]), stem[..<underscore].count == 4,
                !stem[stem.index(after: underscore)...].isEmpty
            else {
                throw MigrationError(code: .badFileName, subject: file, underlying: "expected NNNN_name.sql")
            }
            guard let data = FileManager.default.contents(atPath: directory + "/" + file),
                let sql = String(data: data, encoding: .utf8)
            else {
                throw MigrationError(code: .badFileName, subject: file, underlying: "not readable as UTF-8")
            }
            if migrations.contains(where: { $0.version == version }) {
                throw MigrationError(code: .duplicateVersion, subject: String(version))
            }
            migrations.append(
                Migration(version: version, name: String(stem[stem.index(after: underscore)...]), sql: sql))
        }
        return migrations.sorted { $0.version < $1.version }
    }

    /// The migrations directory: `explicit` if given, else `./Migrations`, else the first `Migrations` or
    /// `share/marquee/Migrations` found walking up from the executable's folder.
    public static func locate(explicit: String?, executablePath: String = CommandLine.arguments[0]) -> String? {
        if let explicit { return explicit }
        var isDirectory: ObjCBool = false
        let fm = FileManager.default
        if fm.fileExists(atPath: "Migrations", isDirectory: &isDirectory), isDirectory.boolValue {
            return fm.currentDirectoryPath + "/Migrations"
        }
        var dir = URL(fileURLWithPath: executablePath).resolvingSymlinksInPath().deletingLastPathComponent()
        for _ in 0..<6 {
            for candidate in ["Migrations", "share/marquee/Migrations"] {
                let path = dir.appendingPathComponent(candidate).path
                if fm.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue { return path }
            }
            dir = dir.deletingLastPathComponent()
        }
        return nil
    }
}

/// Where the database stands against the migration files.
public struct MigrationStatus: Sendable, Equatable {
    /// Versions recorded in `schema_migrations`.
    public var applied: [Int]
    /// Files not yet applied.
    public var pending: [Migration]
    /// Applied versions whose file now has another checksum.
    public var changed: [Int]
    /// Applied versions with no file here (a newer release ran); not an error for readiness.
    public var unknown: [Int]

    /// Every file is applied, unchanged.
    public var isCurrent: Bool { pending.isEmpty && changed.isEmpty }
}

/// Applies migrations in order, each in its own transaction, under an advisory lock so that concurrent migrators
/// (several replicas starting at once) are safe: the second waits, then finds nothing to do.
public struct Migrator: Sendable {
    /// Arbitrary constant naming Marquee's migration lock (`pg_advisory_lock` key).
    static let lockKey: Int64 = 0x4D51_4D49_4752  // "MQMIGR"

    private let pool: PostgresPool
    private let migrations: [Migration]
    /// How long a migration's statement waits for a table lock before its transaction is rolled back and tried again
    /// (`lockAttempts` times in all). Migrations run while the previous release serves: an `ALTER TABLE` queued behind
    /// a long transaction (an import, a campaign step) would queue every other statement on that table behind it.
    let lockTimeout: Duration
    let lockAttempts: Int

    public init(
        pool: PostgresPool, migrations: [Migration], lockTimeout: Duration = .seconds(5), lockAttempts: Int = 24
    ) {
        self.pool = pool
        self.migrations = migrations
        self.lockTimeout = lockTimeout
        self.lockAttempts = max(1, lockAttempts)
    }

    /// The same migrations, checked and applied through `pool`.
    public func using(_ pool: PostgresPool) -> Migrator {
        Migrator(pool: pool, migrations: migrations, lockTimeout: lockTimeout, lockAttempts: lockAttempts)
    }

    /// Compares the files with `schema_migrations` without changing anything.
    public func status() async throws -> MigrationStatus {
        let migrations = self.migrations
        return try await pool.withConnection { connection in
            let recorded = try Self.recorded(connection)
            return Self.compare(migrations, recorded)
        }
    }

    /// Applies every pending migration. Refuses (before applying anything) if an applied file has changed.
    /// Then runs `stillLocked` on the migrating connection, outside any transaction, before the migration lock is
    /// released: set-up that concurrent migrators must take turns at (`ALTER ROLE` of one role by two sessions at once
    /// fails the later one with "tuple concurrently updated"). The lock is the database's: migrators of other
    /// databases in the cluster do not wait for it. Returns what this call applied; empty when the database was
    /// already current.
    @discardableResult
    public func migrate(
        onApplied: @escaping @Sendable (Migration, Duration) -> Void = { _, _ in },
        stillLocked: @escaping @Sendable (PostgresConnection) throws -> Void = { _ in }
    ) async throws -> [Migration] {
        let migrations = self.migrations
        let (lockTimeout, lockAttempts) = (self.lockTimeout, self.lockAttempts)
        let timeoutText = "\(max(1, RetentionStore.milliseconds(lockTimeout)))ms"
        return try await pool.withConnection { connection in
            try connection.execute("SELECT pg_advisory_lock(\(Self.lockKey))")
            defer { _ = try? connection.execute("SELECT pg_advisory_unlock(\(Self.lockKey))") }
            try connection.execute(
                PostgresQuery(
                    unsafeSQL: """
                        CREATE TABLE IF NOT EXISTS schema_migrations (
                            version integer PRIMARY KEY,
                            name text NOT NULL,
                            checksum text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now(),
                            duration_ms integer NOT NULL
                        )
                        """))
            let status = Self.compare(migrations, try Self.recorded(connection))
            if let changed = status.changed.first {
                throw MigrationError(code: .changedAfterApply, subject: Migration.paddedVersion(changed))
            }
            var applied: [Migration] = []
            let clock = ContinuousClock()
            for migration in status.pending {
                var attempt = 1
                var start = clock.now
                try connection.execute("BEGIN")
                do {
                    while true {
                        do {
                            try connection.execute(
                                PostgresQuery(unsafeSQL: "SET LOCAL lock_timeout = '\(timeoutText)'"))
                            try connection.execute(PostgresQuery(unsafeSQL: migration.sql))
                            break
                        } catch let error as PostgresError where error.sqlState == "55P03" && attempt < lockAttempts {
                            // A lock not granted in time: let the statements queued behind it through, then again.
                            _ = try? connection.execute("ROLLBACK")
                            Thread.sleep(forTimeInterval: min(Double(attempt), 5) * 0.2)
                            attempt += 1
                            start = clock.now
                            try connection.execute("BEGIN")
                        }
                    }
                    let elapsed = clock.now - start
                    let millis = Int(
                        elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000)
                    try connection.execute(
                        """
                        INSERT INTO schema_migrations (version, name, checksum, duration_ms)
                        VALUES (\(migration.version), \(migration.name), \(migration.checksum), \(millis))
                        """)
                    try connection.execute("COMMIT")
                    onApplied(migration, elapsed)
                } catch {
                    _ = try? connection.execute("ROLLBACK")
                    throw MigrationError(
                        code: .failed, subject: migration.fileName,
                        underlying: String(describing: error))
                }
                applied.append(migration)
            }
            try stillLocked(connection)
            return applied
        }
    }

    private static func recorded(_ connection: PostgresConnection) throws -> [Int: String] {
        let exists = try connection.query("SELECT to_regclass('schema_migrations') IS NOT NULL AS present")
        guard let row = exists.first, try row.decode(Bool.self, "present") else { return [:] }
        var recorded: [Int: String] = [:]
        for row in try connection.query("SELECT version, checksum FROM schema_migrations") {
            recorded[try row.decode(Int.self, "version")] = try row.decode(String.self, "checksum")
        }
        return recorded
    }

    static func compare(_ migrations: [Migration], _ recorded: [Int: String]) -> MigrationStatus {
        let known = Set(migrations.map(\.version))
        return MigrationStatus(
            applied: recorded.keys.sorted(),
            pending: migrations.filter { recorded[$0.version] == nil },
            changed: migrations.filter { m in recorded[m.version].map { $0 != m.checksum } ?? false }.map(\.version),
            unknown: recorded.keys.filter { !known.contains($0) }.sorted())
    }
}
