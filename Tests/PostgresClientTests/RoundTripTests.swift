import Foundation
import PostgresClient
import Testing

@Suite("Value round trips (database)")
struct RoundTripTests {
    struct Payload: Codable, Equatable {
        var name: String
        var count: Int
        var tags: [String]
    }

    @Test("every supported type survives a trip through a table, including NULLs")
    func everyType() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let id = UUID()
        let when = Date(timeIntervalSince1970: 1_709_642_096.123456)
        let blob = [UInt8](0...255)
        let tags: [String?] = ["a,b", "quote\"d", "back\\slash", "{braces}", nil, "NULL", "", "ünï ☃"]
        let payload = Payload(name: "ünïcode 🎉", count: 3, tags: ["x"])
        let text = "héllo 'world' \"quoted\" \\ 🌍\n\ttabbed"

        let row = try await pool.withConnection { connection in
            try connection.execute(
                """
                CREATE TEMP TABLE everything (
                    t text, i8 int8, i4 int4, i2 int2, b bool, f8 float8, f4 float4, u uuid, ts timestamptz,
                    by bytea, d bytea, ta text[], ia int8[], ua uuid[], j jsonb, n int8, nt text, nts timestamptz)
                """)
            try connection.execute(
                """
                INSERT INTO everything VALUES (\(text), \(Int.max), \(Int32.min), \(Int16(-7)), \(true),
                    \(3.141592653589793), \(Float(1.5)), \(id), \(when), \(blob), \(Data([1, 2, 3])), \(tags),
                    \([Int.min, 0, 42]), \([id, UUID()]), \(try PostgresJSON(encoding: payload)),
                    \(Int?.none), \(String?.none), \(Date?.none))
                """)
            return try connection.query("SELECT * FROM everything")[0]
        }
        #expect(try row.decode(String.self, "t") == text)
        #expect(try row.decode(Int.self, "i8") == Int.max)
        #expect(try row.decode(Int64.self, "i8") == Int64.max)
        #expect(try row.decode(Int32.self, "i4") == Int32.min)
        #expect(try row.decode(Int16.self, "i2") == -7)
        #expect(try row.decode(Bool.self, "b") == true)
        #expect(try row.decode(Double.self, "f8") == 3.141592653589793)
        #expect(try row.decode(Float.self, "f4") == 1.5)
        #expect(try row.decode(UUID.self, "u") == id)
        #expect(try row.decode(Date.self, "ts") == when)
        #expect(try row.decode([UInt8].self, "by") == blob)
        #expect(try row.decode(Data.self, "d") == Data([1, 2, 3]))
        #expect(try row.decode([String?].self, "ta") == tags)
        #expect(throws: PostgresError.self) { try row.decode([String].self, "ta") }  // has a NULL element
        #expect(try row.decode([Int].self, "ia") == [Int.min, 0, 42])
        #expect(try row.decode([UUID].self, "ua").first == id)
        #expect(try row.decode(PostgresJSON.self, "j").decode(as: Payload.self) == payload)
        #expect(try row.decodeJSON(Payload.self, "j") == payload)
        #expect(try row.decode(Int?.self, "n") == nil)
        #expect(try row.decode(String?.self, "nt") == nil)
        #expect(try row.decode(Date?.self, "nts") == nil)
        #expect(try row.decode(Int?.self, "i8") == Int.max)
        #expect(row["n"].isNull)
        #expect(throws: PostgresError.self) { try row.decode(Int.self, "n") }
        #expect(throws: PostgresError.self) { try row.decode(Int.self, "no_such_column") }
        #expect(try row.decode(String.self, at: 0) == text)
    }

    @Test("special floats, empty arrays, and server-side literals decode")
    func serverLiterals() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let rows = try await pool.query(
            """
            SELECT 'NaN'::float8 AS nan, '-Infinity'::float8 AS ninf, \(Double.infinity) AS inf,
                '{}'::text[] AS empty, ARRAY['x y', NULL, 'z']::text[] AS arr, 'infinity'::timestamptz AS forever,
                '\\xdeadbeef'::bytea AS bytes, '{"a": [1, 2]}'::jsonb AS doc, 12345678901234::numeric AS big,
                \(Double(1e-300)) AS tiny, 'true'::bool AS yes
            """)
        let row = try #require(rows.first)
        #expect(try row.decode(Double.self, "nan").isNaN)
        #expect(try row.decode(Double.self, "ninf") == -.infinity)
        #expect(try row.decode(Double.self, "inf") == .infinity)
        #expect(try row.decode([String].self, "empty") == [])
        #expect(try row.decode([String?].self, "arr") == ["x y", nil, "z"])
        #expect(try row.decode(Date.self, "forever") == .distantFuture)
        #expect(try row.decode([UInt8].self, "bytes") == [0xDE, 0xAD, 0xBE, 0xEF])
        #expect(try row.decode(PostgresJSON.self, "doc").string == #"{"a": [1, 2]}"#)
        #expect(try row.decode(Int.self, "big") == 12_345_678_901_234)
        #expect(try row.decode(Double.self, "tiny") == 1e-300)
        #expect(try row.decode(Bool.self, "yes"))
        #expect(rows.columns.first == "nan")
    }

    @Test("timestamptz decodes correctly whatever the session time zone prints")
    func timeZones() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let when = Date(timeIntervalSince1970: 1_700_000_000.5)
        let decoded = try await pool.withConnection { connection -> [Date] in
            var dates: [Date] = []
            for zone in ["Asia/Kolkata", "America/St_Johns", "Pacific/Chatham", "UTC", "Europe/Amsterdam"] {
                try connection.execute(PostgresQuery(unsafeSQL: "SET TimeZone = '\(zone)'"))
                dates.append(try connection.query("SELECT \(when)::timestamptz AS ts")[0].decode(Date.self, "ts"))
            }
            // Local mean time offsets with seconds (Amsterdam before 1937: +00:19:32).
            try connection.execute("SET TimeZone = 'Europe/Amsterdam'")
            let text = try connection.query("SELECT '1900-01-01 00:00:00+00'::timestamptz::text AS t")[0]
            #expect(try text.decode(String.self, "t").hasSuffix("+00:19:32"))
            dates.append(
                try connection.query("SELECT '1900-01-01 00:00:00+00'::timestamptz AS ts")[0].decode(Date.self, "ts"))
            return dates
        }
        #expect(Array(decoded.prefix(5)) == Array(repeating: when, count: 5))
        #expect(decoded.last == Date(timeIntervalSince1970: -2_208_988_800))
    }

    @Test("a hostile string is stored as a value, not executed")
    func injectionAttempt() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let table = TestDatabase.uniqueName("inj")
        let hostile = "x'); DROP TABLE \(table); --"
        try await pool.execute("CREATE TABLE \(identifier: table) (name text)")
        try await pool.execute("INSERT INTO \(identifier: table) (name) VALUES (\(hostile))")
        let rows = try await pool.query("SELECT name FROM \(identifier: table) WHERE name = \(hostile)")
        #expect(rows.count == 1)
        #expect(try rows[0].decode(String.self, "name") == hostile)
        try await pool.execute("DROP TABLE \(identifier: table)")
    }

    @Test("affected rows and multi-statement scripts without binds")
    func affectedRows() async throws {
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let counts = try await pool.withConnection { connection -> [Int] in
            try connection.execute("CREATE TEMP TABLE n (v int); CREATE INDEX ON n (v)")
            let inserted = try connection.execute("INSERT INTO n SELECT generate_series(1, 10)")
            let updated = try connection.execute("UPDATE n SET v = v + 1 WHERE v > \(5)")
            let selected = try connection.query("SELECT v FROM n ORDER BY v")
            return [inserted, updated, selected.affectedRows, selected.count]
        }
        #expect(counts == [10, 5, 10, 10])
    }

    @Test("a text parameter holding a NUL is refused before it is sent, never cut at the NUL")
    func nulRefused() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        try await pool.withConnection { connection in
            func code(_ body: () throws -> Void) -> PostgresError.Code? {
                do {
                    try body()
                    return nil
                } catch {
                    return (error as? PostgresError)?.code
                }
            }
            let hostile = "projects/p/messages/1\u{0}x"
            // libpq sends text parameters as C strings: this came back as "projects/p/messages/1".
            #expect(code { try connection.query("SELECT \(hostile)::text AS t") } == .encoding)
            // In an array literal the cut made the statement fail as "malformed array literal", or worse, succeed.
            #expect(code { try connection.query("SELECT \(["ok", hostile])::text[] AS t") } == .encoding)
            #expect(code { try connection.query("SELECT \([Optional("ok"), nil, hostile])::text[] AS t") } == .encoding)
            #expect(code { _ = try connection.pipeline(["SELECT \(1)", "SELECT \(hostile)::text"]) } == .encoding)
            // In a transaction the throw rolls it back like any failed statement; the connection stays usable.
            try connection.execute("CREATE TEMP TABLE nul (s text)")
            #expect(
                code {
                    try connection.transaction { c in
                        try c.execute("INSERT INTO nul VALUES (\("kept?"))")
                        try c.execute("INSERT INTO nul VALUES (\(hostile))")
                    }
                } == .encoding)
            #expect(try connection.query("SELECT count(*) AS n FROM nul")[0].decode(Int.self, "n") == 0)
            #expect(
                code { _ = try connection.copyFrom(table: "nul", columns: ["s"], rows: [[hostile.encodePostgres()]]) }
                    == .encoding)
            // Binary bytea is not text: its zero bytes go through.
            #expect(
                try connection.query("SELECT \([UInt8]([0, 1, 0])) AS b")[0].decode([UInt8].self, "b") == [0, 1, 0])
        }
    }
}
