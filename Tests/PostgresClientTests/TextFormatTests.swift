import Foundation
import Testing

@testable import PostgresClient

@Suite("Text formats (no database)")
struct TextFormatTests {
    /// An independent oracle: Foundation's Gregorian calendar in UTC.
    func utc(_ year: Int, _ month: Int, _ day: Int, _ hour: Int = 0, _ minute: Int = 0, _ second: Int = 0) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(
            from: DateComponents(year: year, month: month, day: day, hour: hour, minute: minute, second: second))!
    }

    /// Parses `text` alone and as a slice in the middle of a larger buffer (as a result cell is), which must agree:
    /// the bytes around it ("C" after, so reading past the end finds " BC" in "… B") are never read.
    func parse(_ text: String) -> Date? {
        let alone = PostgresTimestamp.parse(ArraySlice(text.utf8))
        let buffer = Array("##".utf8) + Array(text.utf8) + Array("C#".utf8)
        let inside = PostgresTimestamp.parse(buffer[2..<(buffer.count - 2)])
        #expect(alone == inside, "\(text)")
        return alone
    }

    @Test("timestamptz output with fractions and offsets")
    func timestampParsing() {
        let base = utc(2024, 3, 5, 12, 34, 56)
        #expect(parse("2024-03-05 12:34:56+00") == base)
        #expect(parse("2024-03-05 12:34:56.5+00") == base + 0.5)
        #expect(parse("2024-03-05 12:34:56.123456+00") == Date(timeIntervalSince1970: 1_709_642_096.123456))
        #expect(parse("2024-03-05 18:04:56+05:30") == base)
        #expect(parse("2024-03-05 09:34:56-03") == base)
        #expect(parse("2024-03-05 12:34:56Z") == base)
        #expect(parse("2024-03-05T12:34:56.000+00:00") == base)
        #expect(parse("2024-03-05 12:40:56+00:06:00") == base)
        #expect(parse("1900-01-01 00:17:30+00:17:30") == utc(1900, 1, 1))
        #expect(parse("2024-03-05 12:34:56") == base)
        #expect(parse("2024-03-05") == utc(2024, 3, 5))
        #expect(parse("1969-12-31 23:59:59.999999+00") == Date(timeIntervalSince1970: -0.000001))
        #expect(parse("10000-01-01 00:00:00+00") == utc(10000, 1, 1))
        // Proleptic Gregorian, as PostgreSQL computes it (Foundation's calendar turns Julian before 1582).
        #expect(parse("0044-03-15 00:00:00+00 BC") == Date(timeIntervalSince1970: -63_517_824_000))
        #expect(parse("infinity") == .distantFuture)
        #expect(parse("-infinity") == .distantPast)
        for bad in [
            "", "2024-13-01", "2024-03-05 12:34", "2024-03-05 12:34:56+", "yesterday", "2024-03-05 12:34:56 x",
            "2024-03-05 12:34:56 B",
        ] {
            #expect(parse(bad) == nil, "\(bad)")
        }
    }

    @Test("timestamp formatting round-trips through the parser")
    func timestampFormatting() {
        #expect(PostgresTimestamp.format(utc(2024, 3, 5, 12, 34, 56) + 0.25) == "2024-03-05 12:34:56.250000+00")
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: -0.5)) == "1969-12-31 23:59:59.500000+00")
        #expect(
            PostgresTimestamp.format(Date(timeIntervalSince1970: -63_517_824_000)) == "0044-03-15 00:00:00.000000+00 BC"
        )
        for seconds in [0, 1_709_642_096.123456, -2_208_988_800.5, 253_402_300_799.999999] {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(parse(PostgresTimestamp.format(date)) == date, "\(seconds)")
        }
    }

    @Test("a date whose microseconds do not fit in 64 bits is clamped to infinity, never a trap")
    func timestampFormattingOutOfRange() {
        // Year 300000 (what an ISO 8601 formatter reads from "300000-01-01T00:00:00Z") and its mirror image.
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: 9_404_694_918_400)) == "infinity")
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: -9_404_694_918_400)) == "-infinity")
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: .greatestFiniteMagnitude)) == "infinity")
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: .nan)) == "NaN")
        // A count that still fits is formatted as a date (beyond PostgreSQL's range: it refuses it, no trap).
        #expect(PostgresTimestamp.format(Date(timeIntervalSince1970: 9_000_000_000_000)).hasSuffix("+00"))
    }

    @Test("array literals: quoting, escapes, NULL, whitespace, bounds")
    func arrayParsing() throws {
        func parse(_ text: String) throws -> [String?] {
            try PostgresArrayText.parse(ArraySlice(text.utf8)).map { $0.map { String(decoding: $0, as: UTF8.self) } }
        }
        #expect(try parse("{}") == [])
        #expect(try parse("{a,b}") == ["a", "b"])
        #expect(try parse(#"{"a,b","c\"d","e\\f",NULL,"NULL",""}"#) == ["a,b", "c\"d", "e\\f", nil, "NULL", ""])
        #expect(try parse("{ a , null }") == ["a", nil])
        #expect(try parse("[0:1]={x,y}") == ["x", "y"])
        #expect(try parse(#"{"{braces}","multi word"}"#) == ["{braces}", "multi word"])
        for bad in ["", "{", "{a", #"{"a}"#, "{{1,2},{3,4}}", "{a}x", "a,b"] {
            #expect(throws: (any Error).self, "\(bad)") { try parse(bad) }
        }
    }

    @Test("bytea hex and escape output")
    func byteaDecoding() {
        #expect(PostgresByteaText.decode(ArraySlice(#"\x00ff10"#.utf8)) == [0, 255, 16])
        #expect(PostgresByteaText.decode(ArraySlice(#"\x"#.utf8)) == [])
        #expect(PostgresByteaText.decode(ArraySlice(#"ab\\\000\377"#.utf8)) == [97, 98, 92, 0, 255])
        #expect(PostgresByteaText.decode(ArraySlice(#"\x0"#.utf8)) == nil)
        #expect(PostgresByteaText.decode(ArraySlice(#"\xzz"#.utf8)) == nil)
    }

    @Test("COPY text escaping")
    func copyEscaping() throws {
        var out: [UInt8] = []
        try PostgresCopyText.appendField(PostgresBind(text: "a\tb\nc\rd\\e"), to: &out)
        out.append(0x09)
        try PostgresCopyText.appendField(.null(), to: &out)
        out.append(0x09)
        try PostgresCopyText.appendField([UInt8]([0x5C, 0x00]).encodePostgres(), to: &out)
        #expect(String(decoding: out, as: UTF8.self) == #"a\tb\nc\rd\\e"# + "\t" + #"\N"# + "\t" + #"\\x5c00"#)
    }

    @Test("decoding errors name the column, not the value")
    func decodingErrors() throws {
        let cell = PostgresCell(bytes: ArraySlice("secret-ish".utf8), typeOID: PostgresOID.text, columnName: "age")
        let error = #expect(throws: PostgresError.self) { try cell.decode(Int.self) }
        #expect(error?.code == .decoding)
        #expect(error?.column == "age")
        #expect(error?.description.contains("secret-ish") == false)
        let null = PostgresCell(bytes: nil, typeOID: PostgresOID.int8, columnName: "n")
        #expect(throws: PostgresError.self) { try null.decode(Int.self) }
        #expect(try null.decode(Int?.self) == nil)
        let big = PostgresCell(bytes: ArraySlice("40000".utf8), typeOID: PostgresOID.int4, columnName: "n")
        #expect(throws: PostgresError.self) { try big.decode(Int16.self) }
        #expect(try big.decode(Int32.self) == 40000)
    }

    @Test("uuid text: PostgreSQL's form both ways, as Foundation reads and writes it; anything else refused")
    func uuidText() {
        for _ in 0..<1_000 {
            let id = UUID()
            let text = PostgresUUIDText.format(id)
            #expect(text == id.uuidString.lowercased())
            #expect(PostgresUUIDText.parse(ArraySlice(text.utf8)) == id)
            #expect(PostgresUUIDText.parse(ArraySlice(id.uuidString.utf8)) == id, "upper case")
        }
        let sample = "0190f3a2-7c1e-7d3b-9a4f-1e2d3c4b5a69"
        #expect(PostgresUUIDText.parse(ArraySlice(sample.utf8)) == UUID(uuidString: sample))
        for bad in [
            "", "0190f3a2-7c1e-7d3b-9a4f-1e2d3c4b5a6", "0190f3a2-7c1e-7d3b-9a4f-1e2d3c4b5a690",
            "0190f3a2x7c1e-7d3b-9a4f-1e2d3c4b5a69", "0190f3a2-7c1e-7d3b-9a4f-1e2d3c4b5a6g",
            "0190f3a27c1e7d3b9a4f1e2d3c4b5a69----",
        ] {
            #expect(PostgresUUIDText.parse(ArraySlice(bad.utf8)) == nil, "\(bad)")
        }
    }
}
