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

    @Test("a pipeline whose new statements fill the cache keeps the statements it names (no reset between them)")
    func cacheResetBeforeAPipeline() async throws {
        let pool = PostgresPool(try TestDatabase.configuration(), options: .init(maxConnections: 1))
        defer { pool.close() }
        let tag = UUID().uuidString.prefix(8).lowercased()
        try await pool.withConnection { connection in
            // A statement cached first, then the cache filled to one short of its limit.
            let cached: PostgresQuery = "SELECT \(1)::int AS n -- cached \(unsafeRaw: tag)"
            _ = try connection.query(cached)
            for i in 0..<(PostgresConnection.statementCacheLimit - 2) {
                _ = try connection.query("SELECT \(1)::int AS n -- \(unsafeRaw: tag) \(unsafeRaw: String(i))")
            }
            // One pipeline: the cached statement, then two new ones (the second does not fit).
            let rows = try connection.pipelined([
                cached,
                "SELECT \(1)::int + 1 AS n -- \(unsafeRaw: tag) a",
                "SELECT \(1)::int + 2 AS n -- \(unsafeRaw: tag) b",
            ])
            #expect(try rows.map { try $0[0].decode(Int.self, "n") } == [1, 2, 3])
            // And the cache works on afterwards.
            #expect(try connection.query(cached)[0].decode(Int.self, "n") == 1)
        }
    }

    @Test("a password is encrypted here, as the server would store it, without the password in the result")
    func encryptedPassword() async throws {
        let pool = PostgresPool(try TestDatabase.configuration(), options: .init(maxConnections: 1))
        defer { pool.close() }
        let password = "correct horse " + UUID().uuidString
        let verifier = try await pool.withConnection { try $0.encryptedPassword(password, user: "marquee_app") }
        #expect(verifier.hasPrefix("SCRAM-SHA-256$4096:"), "\(verifier)")
        #expect(!verifier.contains(password) && !verifier.contains("horse"))
        // A fresh salt each time: two verifiers of one password differ.
        let again = try await pool.withConnection { try $0.encryptedPassword(password, user: "marquee_app") }
        #expect(again != verifier)
    }
}
