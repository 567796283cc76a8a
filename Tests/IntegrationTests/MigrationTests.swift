import Foundation
import MarqueeStore
import PostgresClient
import Testing

@Suite("Migrations")
struct MigrationTests {
    /// A temporary Migrations directory with the given files.
    func directory(_ files: [String: String]) throws -> String {
        let dir = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for (name, sql) in files {
            try sql.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        }
        return dir
    }

    @Test("the project's migrations apply to an empty database, once, and the status is then current")
    func applyProjectMigrations() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
        defer { pool.close() }
        let migrations = try MigrationFiles.load(directory: TestEnvironment.migrationsDirectory)
        #expect(!migrations.isEmpty)
        let migrator = Migrator(pool: pool, migrations: migrations)
        #expect(try await migrator.status().isCurrent == false)
        let applied = try await migrator.migrate()
        #expect(applied.map(\.version) == migrations.map(\.version))
        #expect(try await migrator.status().isCurrent)
        #expect(try await migrator.migrate().isEmpty)
        let rows = try await pool.query("SELECT count(*)::int AS n FROM schema_migrations")
        #expect(try rows.first!.decode(Int.self, "n") == migrations.count)
    }

    @Test("two `marquee migrate` processes started at once both exit 0 and each migration is applied once")
    func concurrentMigrators() async throws {
        let url = try await TestEnvironment.makeDatabase()
        // A slow first migration widens the race window.
        let dir = try directory([
            "0001_slow.sql": "SELECT pg_sleep(0.5); CREATE TABLE a (id int PRIMARY KEY);",
            "0002_more.sql": "CREATE TABLE b (id int PRIMARY KEY); INSERT INTO b VALUES (1);",
        ])
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": dir]
        async let first = runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        async let second = runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        let results = try await [first, second]
        for result in results {
            #expect(result.status == 0, "\(result.output)")
        }
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let rows = try await pool.query("SELECT version FROM schema_migrations ORDER BY version")
        #expect(try rows.map { try $0.decode(Int.self, "version") } == [1, 2])
        let b = try await pool.query("SELECT count(*)::int AS n FROM b")
        #expect(try b.first!.decode(Int.self, "n") == 1)
        let status = try await runCommand(TestEnvironment.marqueeBinary, ["migrate", "--status"], environment: env)
        #expect(status.status == 0)
        #expect(status.output.contains("applied\t0002_more.sql"))
    }

    @Test("a changed applied file is refused before anything else is applied")
    func changedFileRefused() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let v1 = Migration(version: 1, name: "one", sql: "CREATE TABLE one (id int);")
        try await Migrator(pool: pool, migrations: [v1]).migrate()

        let edited = Migration(version: 1, name: "one", sql: "CREATE TABLE one (id bigint);")
        let v2 = Migration(version: 2, name: "two", sql: "CREATE TABLE two (id int);")
        let migrator = Migrator(pool: pool, migrations: [edited, v2])
        let status = try await migrator.status()
        #expect(status.changed == [1])
        #expect(!status.isCurrent)
        await #expect(throws: MigrationError.self) { try await migrator.migrate() }
        let two = try await pool.query("SELECT to_regclass('two') IS NULL AS absent")
        #expect(try two.first!.decode(Bool.self, "absent"))

        let dir = try directory(["0001_one.sql": "CREATE TABLE one (id bigint);"])
        let cli = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": dir])
        #expect(cli.status == 1)
        #expect(cli.output.contains("changed after it was applied"))
    }

    @Test("a failing migration rolls back entirely and is not recorded")
    func failingMigrationRollsBack() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let bad = Migration(version: 1, name: "bad", sql: "CREATE TABLE half (id int); SELECT no_such_function();")
        await #expect(throws: MigrationError.self) { try await Migrator(pool: pool, migrations: [bad]).migrate() }
        let rows = try await pool.query(
            "SELECT to_regclass('half') IS NULL AS absent, (SELECT count(*)::int FROM schema_migrations) AS n")
        #expect(try rows.first!.decode(Bool.self, "absent"))
        #expect(try rows.first!.decode(Int.self, "n") == 0)
    }

    @Test("file names are checked")
    func fileNames() throws {
        let bad = try directory(["1_short.sql": "SELECT 1;"])
        #expect(throws: MigrationError.self) { try MigrationFiles.load(directory: bad) }
        let duplicate = try directory(["0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 2;"])
        #expect(throws: MigrationError.self) { try MigrationFiles.load(directory: duplicate) }
        let fine = try directory(["0002_b.sql": "SELECT 2;", "0001_a.sql": "SELECT 1;", "README": "not sql"])
        #expect(try MigrationFiles.load(directory: fine).map(\.fileName) == ["0001_a.sql", "0002_b.sql"])
    }
}
