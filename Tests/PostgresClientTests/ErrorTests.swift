import Foundation
import PostgresClient
import Testing

@Suite("SQLSTATE mapping (database)")
struct ErrorTests {
    @Test("unique, foreign key, check, not-null and invalid-text errors carry SQLSTATE and names, not values")
    func constraintErrors() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let secret = "secret-\(UUID())@example.com"
        let errors = try await pool.withConnection { connection -> [PostgresError] in
            try connection.execute(
                """
                CREATE TEMP TABLE parent (id int PRIMARY KEY, email text CONSTRAINT parent_email_key UNIQUE);
                CREATE TEMP TABLE child (parent_id int CONSTRAINT child_parent_fk REFERENCES parent (id),
                    qty int CONSTRAINT child_qty_positive CHECK (qty > 0), label text NOT NULL DEFAULT '')
                """)
            try connection.execute("INSERT INTO parent VALUES (1, \(secret))")
            var errors: [PostgresError] = []
            let statements: [PostgresQuery] = [
                "INSERT INTO parent VALUES (2, \(secret))",
                "INSERT INTO child (parent_id, qty) VALUES (\(99), 1)",
                "INSERT INTO child (parent_id, qty) VALUES (1, \(-1))",
                "INSERT INTO child (parent_id, qty, label) VALUES (1, 1, \(String?.none))",
                "SELECT \(secret)::int",
                "SELECT * FROM no_such_table_\(unsafeRaw: "xyz")",
            ]
            for statement in statements {
                do {
                    try connection.execute(statement)
                } catch let error as PostgresError {
                    errors.append(error)
                }
            }
            #expect(!connection.isBroken)
            return errors
        }
        try #require(errors.count == 6)
        #expect(
            errors.map(\.code) == [
                .uniqueViolation, .foreignKeyViolation, .checkViolation, .notNullViolation,
                .invalidTextRepresentation, .undefinedTable,
            ])
        #expect(errors.map(\.sqlState) == ["23505", "23503", "23514", "23502", "22P02", "42P01"])
        #expect(errors[0].constraint == "parent_email_key")
        #expect(errors[0].table == "parent")
        #expect(errors[1].constraint == "child_parent_fk")
        #expect(errors[2].constraint == "child_qty_positive")
        #expect(errors[3].column == "label")
        #expect(
            errors[0].description
                == "PostgresError: unique violation (23505) on constraint parent_email_key in table parent")
        for error in errors {
            #expect(!error.description.contains(secret), "\(error.code)")
        }
        #expect(errors[0].debugDescription.contains(secret))
        #expect(errors[4].debugDescription.contains(secret))
    }

    @Test("an unreachable server gives connectionFailed")
    func unreachable() async throws {
        var configuration = try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:1/marquee")
        configuration.connectTimeout = .seconds(2)
        let pool = PostgresPool(configuration)
        defer { pool.close() }
        let error = await #expect(throws: PostgresError.self) { try await pool.query("SELECT 1") }
        #expect(error?.code == .connectionFailed)
        #expect(pool.statistics.open == 0)
    }

    @Test("a statement timeout is queryCanceled and leaves the connection usable")
    func statementTimeout() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let error = await #expect(throws: PostgresError.self) {
            try await pool.withConnection { connection in
                try connection.execute("SET statement_timeout = '50ms'")
                defer { _ = try? connection.execute("RESET statement_timeout") }
                try connection.execute("SELECT pg_sleep(2)")
            }
        }
        #expect(error?.code == .queryCanceled)
        #expect(try await pool.query("SELECT 1 AS one")[0].decode(Int.self, "one") == 1)
    }
}
