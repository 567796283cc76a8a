import Foundation
import Testing

@testable import MarqueeCore

@Suite("Content-state date fields")
struct DateFieldsTests {
    func normalize(_ value: JSONValue, _ encoding: DateEncoding) throws(ValidationError) -> JSONValue? {
        try DateFields.normalize(.object(["eta": value]), fields: ["/eta": encoding])["eta"]
    }

    @Test("epoch seconds in, each encoding out")
    func fromEpoch() throws {
        #expect(try normalize(.int(1_740_000_000), .epochSeconds) == .int(1_740_000_000))
        #expect(try normalize(.int(1_740_000_000), .appleReference) == .int(761_692_800))
        #expect(try normalize(.int(1_740_000_000), .iso8601) == .string("2025-02-19T21:20:00Z"))
        // A whole number written as a fraction stays an integer on output.
        let whole = try normalize(.double(1_740_000_000.0), .epochSeconds)
        #expect(whole?.serialized() == "1740000000")
        // Fractions are kept for Apple reference dates (a Double), rounded down for epoch seconds (Customer.io's
        // EpochSecondsDate reads an Int64) and truncated for ISO output (JSONDecoder's .iso8601 refuses fractions).
        #expect(try normalize(.double(1_740_000_000.5), .epochSeconds) == .int(1_740_000_000))
        #expect(try normalize(.double(1_740_000_000.999), .epochSeconds)?.serialized() == "1740000000")
        #expect(try normalize(.double(1_740_000_000.5), .appleReference) == .double(761_692_800.5))
        #expect(try normalize(.double(1_740_000_000.5), .iso8601) == .string("2025-02-19T21:20:00Z"))
    }

    @Test("ISO 8601 in, with Z, offsets and fractions, each encoding out")
    func fromISO() throws {
        for text in [
            "2025-02-19T21:20:00Z", "2025-02-19T22:20:00+01:00", "2025-02-19T16:20:00-05:00",
            "2025-02-19T16:20:00-0500",
            "2025-02-20T02:50:00+05:30", "2025-02-19t21:20:00z",
        ] {
            #expect(try normalize(.string(text), .epochSeconds) == .int(1_740_000_000), "\(text)")
            #expect(try normalize(.string(text), .appleReference) == .int(761_692_800), "\(text)")
            #expect(try normalize(.string(text), .iso8601) == .string("2025-02-19T21:20:00Z"), "\(text)")
        }
        #expect(try normalize(.string("2025-02-19T22:20:00.250+01:00"), .epochSeconds) == .int(1_740_000_000))
        #expect(try normalize(.string("2025-02-19T21:20:00.5Z"), .appleReference) == .double(761_692_800.5))
        #expect(try normalize(.string("2025-02-19T21:20:00.999Z"), .iso8601) == .string("2025-02-19T21:20:00Z"))
    }

    @Test("calendar edges: leap day, before 1970, the accepted range")
    func calendar() throws {
        #expect(try normalize(.string("2000-02-29T00:00:00Z"), .epochSeconds) == .int(951_782_400))
        #expect(try normalize(.int(951_782_400), .iso8601) == .string("2000-02-29T00:00:00Z"))
        #expect(try normalize(.int(-1), .iso8601) == .string("1969-12-31T23:59:59Z"))
        #expect(try normalize(.int(-62_135_596_800), .iso8601) == .string("0001-01-01T00:00:00Z"))
        #expect(try normalize(.int(253_402_300_799), .iso8601) == .string("9999-12-31T23:59:59Z"))
        #expect(throws: ValidationError.self) { try normalize(.int(253_402_300_800), .iso8601) }
        #expect(throws: ValidationError.self) { try normalize(.string("2025-02-29T00:00:00Z"), .iso8601) }
    }

    @Test("a value that is not a date names content_state + pointer and does not quote the value")
    func badValues() throws {
        for bad: JSONValue in [
            .bool(true), .string("tomorrow"), .string("2025-02-19"), .string("2025-02-19T21:20:00"),
            .string("2025-13-01T00:00:00Z"), .string("2025-02-19T24:00:00Z"), .string("2025-02-19T21:20:00.Z"),
            .string("2025-02-19T21:20:00+1:00"), .string("2025-02-19T21:20:00Z trailing"), .array([]), .object([:]),
        ] {
            do {
                _ = try normalize(bad, .epochSeconds)
                Issue.record("accepted \(bad)")
            } catch {
                #expect(error.field == "content_state/eta")
                #expect(error.code == .invalidField)
                if case .string(let text) = bad { #expect(!error.reason.contains(text)) }
            }
        }
        let state = try JSONValue.parse(#"{"stops":[{"at":1740000000},{"at":"soon"}]}"#)
        let error = #expect(throws: ValidationError.self) {
            try DateFields.normalize(state, fields: ["/stops/0/at": .iso8601, "/stops/1/at": .iso8601])
        }
        #expect(error?.field == "content_state/stops/1/at")
        let prefixed = #expect(throws: ValidationError.self) {
            try DateFields.normalize(state, fields: ["/stops/1/at": .iso8601], field: "push.content_state")
        }
        #expect(prefixed?.field == "push.content_state/stops/1/at")
    }

    @Test("absent pointers and nulls are left alone; nested and escaped pointers are rewritten")
    func pointers() throws {
        let state = try JSONValue.parse(#"{"a/b":"2025-02-19T21:20:00Z","stops":[{"at":0}],"gone":null,"x":1}"#)
        let out = try DateFields.normalize(
            state,
            fields: [
                "/a~1b": .epochSeconds, "/stops/0/at": .iso8601, "/missing": .iso8601, "/gone": .iso8601,
                "/stops/5/at": .epochSeconds,
            ])
        #expect(
            out.serialized() == #"{"a/b":1740000000,"gone":null,"stops":[{"at":"1970-01-01T00:00:00Z"}],"x":1}"#)
        #expect(throws: ValidationError.self) { try DateFields.normalize(state, fields: ["no-slash": .iso8601]) }
    }
}
