import Foundation
import Testing

@testable import PostgresClient

@Suite("Prepared statements")
struct PreparedStatementTests {
    @Test("a statement with binds is prepared once per connection and reused; schema changes are survived")
    func reuse() async throws {
        let pool = PostgresPool(try TestDatabase.configuration(), options: .init(maxConnections: 1))
        defer { pool.close() }
        let table = "prep_" + UUID().uuidString.prefix(8).lowercased()
        try await pool.execute(PostgresQuery(unsafeSQL: "CREATE TABLE \(table) (id int, v text)"))
        for i in 0..<5 {
            try await pool.execute("INSERT INTO \(unsafeRaw: table) VALUES (\(i), \("v\(i)"))")
        }
        let prepared = try await pool.query(
            "SELECT count(*)::int AS n FROM pg_prepared_statements WHERE statement LIKE \("%INSERT INTO " + table + "%")"
        )
        #expect(try prepared[0].decode(Int.self, "n") == 1, "five executions, one prepared statement")
        // A column added after the statement was prepared: `SELECT *` must still work on the same connection.
        let rows1 = try await pool.query("SELECT * FROM \(unsafeRaw: table) WHERE id = \(1)")
        #expect(rows1.columns == ["id", "v"])
        try await pool.execute(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) ADD COLUMN w text"))
        let first = try? await pool.query("SELECT * FROM \(unsafeRaw: table) WHERE id = \(1)")
        let rows2 = try await pool.query("SELECT * FROM \(unsafeRaw: table) WHERE id = \(1)")
        #expect(rows2.columns == ["id", "v", "w"], "re-prepared after the schema change (first try: \(first != nil))")
    }
}
