import Foundation
import PostgresClient
import Testing

@Suite("COPY and pipeline (database)")
struct CopyAndPipelineTests {
    static let tricky: [String?] = [
        "plain", "tab\there", "new\nline", "carriage\rreturn", "back\\slash", "\\N", "", nil, "ünïcode ☃ 日本",
        "quote\"s and 'apostrophes'", "ends with backslash\\", "\\.", "comma,separated",
    ]

    @Test("COPY of 50k rows with tricky strings, NULLs, bytea and arrays round-trips exactly")
    func copyManyRows() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let table = TestDatabase.uniqueName("copy")
        try await pool.execute(
            "CREATE TABLE \(identifier: table) (id int8 PRIMARY KEY, s text, b bytea, t timestamptz, tags text[])")
        // Microsecond-exact instants (what timestamptz stores).
        @Sendable func instant(_ id: Int) -> Date {
            Date(timeIntervalSince1970: Double(1_700_000_000_000_000 + id * 1000) / 1_000_000)
        }
        let count = 50_000
        @Sendable func row(_ id: Int) -> [PostgresBind] {
            let text = Self.tricky[id % Self.tricky.count]
            let bytes: [UInt8]? = id % 7 == 0 ? nil : [UInt8(id % 256), 0x5C, 0x09, 0x0A, 0x00, 0xFF]
            return [
                id.encodePostgres(), text.encodePostgres(), bytes.encodePostgres(),
                instant(id).encodePostgres(),
                [text, "x,y", nil].encodePostgres(),
            ]
        }
        // Correctness only: COPY's speed is measured in bench/pg-bulk, not here (a loaded CI machine took 21 s once).
        let copied = try await pool.withConnection { connection in
            try connection.copyFrom(
                table: table, columns: ["id", "s", "b", "t", "tags"], rows: (0..<count).lazy.map(row))
        }
        #expect(copied == count)

        let rows = try await pool.query("SELECT id, s, b, t, tags FROM \(identifier: table) ORDER BY id")
        #expect(rows.count == count)
        var mismatches = 0
        for (id, stored) in rows.enumerated() {
            let text = Self.tricky[id % Self.tricky.count]
            let ok =
                try stored.decode(Int.self, "id") == id && stored.decode(String?.self, "s") == text
                && stored.decode([UInt8]?.self, "b")
                    == (id % 7 == 0 ? nil : [UInt8(id % 256), 0x5C, 0x09, 0x0A, 0x00, 0xFF])
                && stored.decode(Date.self, "t") == instant(id)
                && stored.decode([String?].self, "tags") == [text, "x,y", nil]
            if !ok {
                mismatches += 1
            }
        }
        #expect(mismatches == 0)
        try await pool.execute("DROP TABLE \(identifier: table)")
    }

    @Test("COPY errors are reported and leave the connection usable")
    func copyErrors() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let results = try await pool.withConnection { connection -> [PostgresError.Code?] in
            try connection.execute("CREATE TEMP TABLE c (id int PRIMARY KEY, s text)")
            var codes: [PostgresError.Code?] = []
            let attempts: [[[PostgresBind]]] = [
                [[1.encodePostgres(), "a".encodePostgres()], [1.encodePostgres(), "b".encodePostgres()]],
                [[2.encodePostgres()]],
                [["not a number".encodePostgres(), "x".encodePostgres()]],
            ]
            for rows in attempts {
                do {
                    _ = try connection.copyFrom(table: "c", columns: ["id", "s"], rows: rows)
                    codes.append(nil)
                } catch let error as PostgresError {
                    codes.append(error.code)
                }
            }
            #expect(try connection.query("SELECT count(*) AS n FROM c")[0].decode(Int.self, "n") == 0)
            return codes
        }
        #expect(results == [.uniqueViolation, .encoding, .invalidTextRepresentation])
    }

    @Test("pipeline runs many statements in one go with per-statement results")
    func pipeline() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let (results, many, after) = try await pool.withConnection { connection in
            try connection.execute("CREATE TEMP TABLE p (id int PRIMARY KEY, s text)")
            let results = try connection.pipeline([
                "INSERT INTO p VALUES (\(1), \("one"))",
                "INSERT INTO p VALUES (\(1), \("dup"))",
                "SELECT s FROM p WHERE id = \(1)",
                "SELECT * FROM missing_table_for_pipeline",
                "UPDATE p SET s = \("uno") WHERE id = \(1)",
            ])
            let many = try connection.pipeline(
                (0..<2000).map { "INSERT INTO p VALUES (\($0 + 10), \(String(repeating: "x", count: 200)))" })
            let after = try connection.query("SELECT count(*) AS n FROM p")[0].decode(Int.self, "n")
            return (results, many, after)
        }
        #expect(results.count == 5)
        #expect(try results[0].get().affectedRows == 1)
        #expect(throws: PostgresError.self) { try results[1].get() }
        if case .failure(let error) = results[1] {
            #expect(error.code == .uniqueViolation)
        }
        #expect(try results[2].get().first?.decode(String.self, "s") == "one")
        if case .failure(let error) = results[3] {
            #expect(error.code == .undefinedTable)
        } else {
            Issue.record("query on a missing table should fail")
        }
        #expect(try results[4].get().affectedRows == 1)
        #expect(many.count == 2000)
        #expect(many.allSatisfy { (try? $0.get().affectedRows) == 1 })
        #expect(after == 2001)
    }

    @Test("a pipelined transaction commits everything, or on an error rolls back and throws that error")
    func pipelineTransaction() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let (rows, error, many, after) = try await pool.withConnection { connection in
            try connection.execute("CREATE TEMP TABLE t (id int PRIMARY KEY)")
            let rows = try connection.pipelineTransaction(
                ["INSERT INTO t VALUES (1)", "SELECT count(*)::int AS n FROM t", "INSERT INTO t VALUES (2)"])
            var error: PostgresError?
            do {
                // The duplicate fails; the statements after it are skipped; the first insert is rolled back.
                _ = try connection.pipelineTransaction(
                    ["INSERT INTO t VALUES (3)", "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (4)"],
                    begin: "BEGIN ISOLATION LEVEL REPEATABLE READ")
            } catch let e as PostgresError {
                error = e
            }
            let many = try connection.pipelineTransaction((10..<1010).map { "INSERT INTO t VALUES (\($0))" })
            let after = try connection.query("SELECT count(*)::int AS n FROM t")[0].decode(Int.self, "n")
            return (rows, error, many, after)
        }
        #expect(rows.count == 3)
        #expect(try rows[1][0].decode(Int.self, "n") == 1)
        #expect(error?.code == .uniqueViolation)
        #expect(many.count == 1000 && many.allSatisfy { $0.affectedRows == 1 })
        #expect(after == 1002)  // 1 and 2, then 10..<1010; neither 3 nor 4
    }

    @Test("pipelined statements may open a transaction, leave it open and end it later; an error aborts it")
    func pipelinedOpenTransaction() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let (inside, open, error, aborted, after) = try await pool.withConnection { connection in
            try connection.execute("CREATE TEMP TABLE t (id int PRIMARY KEY)")
            // One round trip opens the transaction, writes and reads; the transaction stays open.
            let inside = try connection.pipelined(
                ["BEGIN", "INSERT INTO t VALUES (1), (2)", "SELECT count(*)::int AS n FROM t"])
            let open = connection.isInTransaction
            // A later round trip ends it.
            _ = try connection.pipelined(["INSERT INTO t VALUES (3)", "COMMIT"])
            var error: PostgresError?
            do {
                _ = try connection.pipelined(["BEGIN", "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (4)"])
            } catch let e as PostgresError {
                error = e
            }
            let aborted = connection.isInTransaction
            try connection.execute("ROLLBACK")
            let after = try connection.query("SELECT count(*)::int AS n FROM t")[0].decode(Int.self, "n")
            return (inside, open, error, aborted, after)
        }
        #expect(inside.count == 3)
        #expect(try inside[2][0].decode(Int.self, "n") == 2)
        #expect(open)
        #expect(error?.code == .uniqueViolation)
        #expect(aborted)  // the caller rolls it back
        #expect(after == 3)  // 1, 2 and 3; not 4
    }
}
