import Foundation
import PostgresClient
import Synchronization
import Testing

@Suite("Transactions (database)")
struct TransactionTests {
    struct Boom: Error {}

    @Test("commit on success, rollback on throw")
    func commitAndRollback() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let table = TestDatabase.uniqueName("tx")
        try await pool.execute("CREATE TABLE \(identifier: table) (v int)")

        let value = try await pool.transaction { connection in
            try connection.execute("INSERT INTO \(identifier: table) VALUES (1)")
            return 7
        }
        #expect(value == 7)
        await #expect(throws: Boom.self) {
            try await pool.transaction { connection in
                try connection.execute("INSERT INTO \(identifier: table) VALUES (2)")
                throw Boom()
            }
        }
        let rows = try await pool.query("SELECT v FROM \(identifier: table) ORDER BY v")
        #expect(try rows.map { try $0.decode(Int.self, "v") } == [1])
        try await pool.execute("DROP TABLE \(identifier: table)")
    }

    @Test("a swallowed statement error is not silently 'committed'")
    func swallowedError() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let table = TestDatabase.uniqueName("tx")
        try await pool.execute("CREATE TABLE \(identifier: table) (v int PRIMARY KEY)")
        let error = await #expect(throws: PostgresError.self) {
            try await pool.transaction { connection in
                try connection.execute("INSERT INTO \(identifier: table) VALUES (1)")
                _ = try? connection.execute("INSERT INTO \(identifier: table) VALUES (1)")
            }
        }
        #expect(error?.code == .uniqueViolation)
        #expect(try await pool.query("SELECT v FROM \(identifier: table)").isEmpty)
        try await pool.execute("DROP TABLE \(identifier: table)")
    }

    @Test("a real serialization failure (two repeatable-read transactions) is retried to success")
    func serializationFailureIsRetried() async throws {
        let configuration = try TestDatabase.configuration()
        let pool = PostgresPool(configuration)
        defer { pool.close() }
        let table = TestDatabase.uniqueName("ser")
        try await pool.execute("CREATE TABLE \(identifier: table) (id int PRIMARY KEY, v int)")
        try await pool.execute("INSERT INTO \(identifier: table) VALUES (1, 0)")
        let attempts = Locked(0)
        let observedErrors = Locked<[String?]>([])

        let final = try await pool.transaction(isolation: .repeatableRead) { connection in
            let attempt = attempts.withLock { value in
                value += 1
                return value
            }
            // Take the snapshot.
            let seen = try connection.query("SELECT v FROM \(identifier: table) WHERE id = 1")[0].decode(Int.self, "v")
            if attempt == 1 {
                // A concurrent transaction commits a change to the same row after our snapshot.
                let other = try PostgresConnection(connecting: configuration)
                try other.execute("UPDATE \(identifier: table) SET v = v + 100 WHERE id = 1")
            }
            do {
                try connection.execute("UPDATE \(identifier: table) SET v = \(seen + 1) WHERE id = 1")
            } catch let error as PostgresError {
                observedErrors.withLock { $0.append(error.sqlState) }
                throw error
            }
            return seen + 1
        }
        #expect(attempts.withLock { $0 } == 2)
        #expect(observedErrors.withLock { $0 } == ["40001"])
        #expect(final == 101)
        let stored = try await pool.query("SELECT v FROM \(identifier: table) WHERE id = 1")[0].decode(Int.self, "v")
        #expect(stored == 101)

        // With a single attempt allowed, the same conflict surfaces as serializationFailure.
        let error = await #expect(throws: PostgresError.self) {
            try await pool.transaction(isolation: .serializable, maxAttempts: 1) { connection in
                _ = try connection.query("SELECT v FROM \(identifier: table) WHERE id = 1")
                let other = try PostgresConnection(connecting: configuration)
                try other.execute("UPDATE \(identifier: table) SET v = v + 1 WHERE id = 1")
                try connection.execute("UPDATE \(identifier: table) SET v = 0 WHERE id = 1")
            }
        }
        #expect(error?.code == .serializationFailure)
        #expect(error?.isTransactionRetryable == true)
        try await pool.execute("DROP TABLE \(identifier: table)")
    }

    @Test("a transaction left open by withConnection is rolled back before reuse")
    func leftoverTransaction() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        try await pool.withConnection { connection in
            try connection.execute("BEGIN")
            try connection.execute("CREATE TEMP TABLE leftover (v int)")
        }
        let inTransaction = try await pool.withConnection { connection in
            let exists = try connection.query("SELECT to_regclass('pg_temp.leftover') IS NOT NULL AS e")[0]
            return (connection.isInTransaction, try exists.decode(Bool.self, "e"))
        }
        #expect(inTransaction.0 == false)
        #expect(inTransaction.1 == false)
    }
}
