import Foundation
import Testing

@testable import PostgresClient

@Suite("PostgresQuery interpolation (no database)")
struct QueryTests {
    @Test("interpolated values become numbered bind parameters")
    func interpolationBecomesBinds() {
        let tenant = 42
        let email = "a@example.com"
        let query: PostgresQuery = "SELECT * FROM people WHERE tenant_id = \(tenant) AND email = \(email)"
        #expect(query.sql == "SELECT * FROM people WHERE tenant_id = $1 AND email = $2")
        #expect(query.binds.count == 2)
        #expect(query.binds[0] == PostgresBind(text: "42", oid: PostgresOID.int8))
        #expect(query.binds[1] == PostgresBind(text: "a@example.com", oid: PostgresOID.text))
    }

    @Test("an injection attempt stays a bind value and never reaches the SQL text")
    func injectionStaysAValue() {
        let hostile = "x'); DROP TABLE people; --"
        let query: PostgresQuery = "SELECT 1 WHERE name = \(hostile)"
        #expect(query.sql == "SELECT 1 WHERE name = $1")
        #expect(!query.sql.contains("DROP"))
        #expect(query.binds.first?.bytes == Array(hostile.utf8))
    }

    @Test("NULLs, raw splices, identifiers and lists")
    func otherInterpolations() {
        let missing: Int? = nil
        let table = "we\"ird"
        let ids = [1, 2, 3]
        let query: PostgresQuery =
            "SELECT \(unsafeRaw: "count(*)") FROM \(identifier: "public.\(table)") WHERE a = \(missing) AND id IN (\(list: ids))"
        #expect(query.sql == "SELECT count(*) FROM \"public\".\"we\"\"ird\" WHERE a = $1 AND id IN ($2, $3, $4)")
        #expect(query.binds[0] == .null(oid: PostgresOID.int8))
        #expect(query.binds.count == 4)
        let empty: PostgresQuery = "SELECT 1 WHERE id IN (\(list: [Int]()))"
        #expect(empty.sql == "SELECT 1 WHERE id IN (NULL)")
    }

    @Test("description shows the SQL but never bound values")
    func descriptionIsRedacted() {
        let secret = "hunter2"
        let query: PostgresQuery = "UPDATE users SET password = \(secret)"
        #expect(!query.description.contains(secret))
        #expect(query.description.contains("$1"))
    }

    @Test("array and bytea encodings")
    func arrayEncodings() {
        let strings: [String?] = ["a,b", "quote\"", "back\\slash", nil, "NULL", ""]
        let bind = strings.encodePostgres()
        #expect(bind.oid == PostgresOID.textArray)
        #expect(
            String(decoding: bind.bytes!, as: UTF8.self) == #"{"a,b","quote\"","back\\slash",NULL,"NULL",""}"#)
        let bytes: [UInt8] = [0, 1, 255]
        #expect(bytes.encodePostgres() == PostgresBind(bytes: [0, 1, 255], oid: PostgresOID.bytea, binary: true))
        #expect([1, 2].encodePostgres() == PostgresBind(text: #"{"1","2"}"#, oid: PostgresOID.int8Array))
    }

    @Test("bad connection strings are rejected as invalid configuration")
    func badURLs() {
        for url in ["", "   ", "postgresql://[::1", "this is not a conninfo", "postgresql://localhost:notaport/db"] {
            let error = #expect(throws: PostgresError.self, "\(url)") { try PostgresConfiguration(url: url) }
            #expect(error?.code == .invalidConfiguration, "\(url)")
        }
    }

    @Test("configuration parses URIs and key=value strings and never prints the password")
    func configurationParsing() throws {
        let uri = try PostgresConfiguration(
            url: "postgresql://alice:s3cret@db.internal:6543/app?connect_timeout=7&application_name=api")
        #expect(uri.host == "db.internal")
        #expect(uri.port == "6543")
        #expect(uri.database == "app")
        #expect(uri.user == "alice")
        #expect(uri.connectTimeout == .seconds(7))
        #expect(uri.applicationName == "api")
        #expect(!uri.description.contains("s3cret"))
        let conninfo = try PostgresConfiguration(url: "host=127.0.0.1 port=5432 dbname=x user=bob")
        #expect(conninfo.host == "127.0.0.1")
        #expect(conninfo.connectTimeout == .seconds(3))
        let parameters = conninfo.connectionParameters()
        #expect(parameters.contains(.init(key: "connect_timeout", value: "3")))
        #expect(parameters.contains(.init(key: "client_encoding", value: "UTF8")))
        #expect(parameters.contains { $0.key == "options" && $0.value.contains("TimeZone=UTC") })
        // A dead peer is found within about 30 s, unless the URL says otherwise.
        #expect(parameters.contains(.init(key: "keepalives", value: "1")))
        #expect(parameters.contains(.init(key: "tcp_user_timeout", value: "30000")))
        let tuned = try PostgresConfiguration(url: "postgresql://db/app?tcp_user_timeout=5000&keepalives_idle=60")
            .connectionParameters()
        #expect(tuned.filter { $0.key == "tcp_user_timeout" }.map(\.value) == ["5000"])
        #expect(tuned.filter { $0.key == "keepalives_idle" }.map(\.value) == ["60"])
    }

    @Test("error descriptions are redacted; debug descriptions carry the detail")
    func errorRedaction() {
        var error = PostgresError(code: .uniqueViolation, sqlState: "23505")
        error.constraint = "people_email_key"
        error.serverMessage = "duplicate key value violates unique constraint"
        error.detail = "Key (email)=(secret@example.com) already exists."
        #expect(error.description == "PostgresError: unique violation (23505) on constraint people_email_key")
        #expect(!error.description.contains("secret@example.com"))
        #expect(error.debugDescription.contains("secret@example.com"))
        #expect(PostgresError.code(forSQLState: "40P01") == .deadlockDetected)
        #expect(PostgresError(code: PostgresError.code(forSQLState: "40001")).isTransactionRetryable)
        #expect(PostgresError.code(forSQLState: "08006") == .connectionLost)
        #expect(PostgresError.code(forSQLState: "XX000") == .server)
    }
}
