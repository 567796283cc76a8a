import CMalloc
import Testing

@testable import JSON
@testable import MarqueeCore

@Suite("JSON values")
struct JSONValueTests {
    @Test("parses every kind of value and serializes with sorted keys")
    func roundTrip() throws {
        let text = #"{"b":[1,-2.5,true,false,null],"a":"x\"y\\z\n\u00e9\ud83d\ude00","c":{},"d":[],"e":1e3}"#
        let value = try JSONValue.parse(text)
        #expect(value["a"] == .string("x\"y\\z\né😀"))
        #expect(value["b"] == .array([.int(1), .double(-2.5), .bool(true), .bool(false), .null]))
        #expect(value["e"] == .int(1000))
        #expect(value.serialized() == #"{"a":"x\"y\\z\né😀","b":[1,-2.5,true,false,null],"c":{},"d":[],"e":1000}"#)
        #expect(try JSONValue.parse(value.serialized()) == value)
    }

    @Test(
        "malformed documents report where they stop",
        arguments: [
            ("{", 1), ("{\"a\":}", 5), ("[1,]", 3), ("tru", 0), ("\"abc", 4), ("01", 1), ("1.", 2), ("{\"a\" 1}", 5),
            ("[1] x", 4), ("\"\\ud800\"", 7), ("", 0),
        ])
    func malformed(text: String, offset: Int) {
        #expect(throws: JSONParseError.self) { try JSONValue.parse(text) }
        do {
            _ = try JSONValue.parse(text)
        } catch {
            #expect(error.offset == offset, "\(text): \(error)")
        }
    }

    @Test("control characters in strings and deep nesting are rejected")
    func limits() {
        #expect(throws: JSONParseError.self) { try JSONValue.parse("\"a\u{01}\"") }
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        #expect(throws: JSONParseError.self) { try JSONValue.parse(deep) }
        let ok = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        #expect((try? JSONValue.parse(ok)) != nil)
    }

    @Test("a document holds at most 100,000 values")
    func valueLimit() {
        let items = { (n: Int) in "[" + Array(repeating: "0", count: n).joined(separator: ",") + "]" }
        #expect((try? JSONValue.parse(items(99_999))) != nil)  // and the array: 100,000
        #expect(throws: JSONParseError(offset: 199_999, reason: "more than 100000 values")) {
            _ = try JSONValue.parse(items(100_000))
        }
        // What the service stored itself (a row written before the limit) still reads.
        #expect((try? JSONValue.parseStored(Array(items(100_000).utf8)))?.arrayValue?.count == 100_000)
        // The object and its 100,000 members' values.
        let objects = "{" + (0..<100_000).map { "\"k\($0)\":{}" }.joined(separator: ",") + "}"
        #expect(throws: JSONParseError.self) { _ = try JSONValue.parse(objects) }
    }

    @Test("an empty object takes no storage of its own")
    func emptyObjectsAreFree() throws {
        // 99,999 `{}`s: 2.3 MiB for the array's values; a dictionary's storage for each (as reserved before) was
        // ~740 bytes, 74 MB in all. Other tests allocating meanwhile stay far below the margin.
        let text = "[" + Array(repeating: "{}", count: 99_999).joined(separator: ",") + "]"
        let before = cmalloc_in_use()
        let value = try JSONValue.parse(text)
        let grown = Int(cmalloc_in_use()) - Int(before)
        #expect(value.arrayValue?.count == 99_999)
        #expect(grown < 16 << 20, "parsing 300 KB of empty objects took \(grown >> 20) MiB")
    }

    @Test("an object's keys are unique")
    func duplicateKeys() {
        #expect(throws: JSONParseError(offset: 8, reason: "duplicate key")) {
            try JSONValue.parse(#"{"a":1, "a":2}"#)
        }
        #expect(throws: JSONParseError.self) { try JSONValue.parse(#"{"x":{"b":[],"b":[]}}"#) }
        #expect(throws: JSONParseError(offset: 12, reason: "duplicate key")) {
            try JSONValue.parse(#"{"\u00e9":1,"\u00e9":2}"#)
        }
        // Canonically equivalent spellings are two keys to PostgreSQL (bytes), one to a Swift dictionary: an object
        // with both cannot be held, and is refused for that, not as naming a key twice.
        for (text, offset) in [(#"{"\u00C5":1,"\u212B":2}"#, 12), (#"{"é":1,"e\u0301":2}"#, 8)] {
            #expect(
                throws: JSONParseError(
                    offset: offset,
                    reason: "key canonically equivalent to an earlier key (the same text in another Unicode form)"),
                "\(text)"
            ) { try JSONValue.parse(text) }
        }
        #expect((try? JSONValue.parse(#"{"a":{"a":1}}"#)) != nil)
    }

    @Test("invalid UTF-8 is rejected")
    func invalidUTF8() {
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0xFF, 0x22]) }
    }

    @Test("numbers compare by value across int and double; integers stay integers")
    func numbers() throws {
        #expect(JSONValue.int(1) == .double(1.0))
        #expect(JSONValue.int(1).hashValue == JSONValue.double(1.0).hashValue)
        #expect(try JSONValue.parse("9223372036854775807") == .int(Int64.max))
        #expect(try JSONValue.parse("-9223372036854775808") == .int(Int64.min))
        // Fractions and exponents are Doubles, at any magnitude a Double holds.
        #expect(try JSONValue.parse("18446744073709551615.0") == .double(18_446_744_073_709_551_615.0))
        #expect(try JSONValue.parse("1e19") == .double(1e19))
        #expect(JSONValue.double(2.0).serialized() == "2")
        #expect(JSONValue.int(3).typeName == "integer")
        #expect(JSONValue.double(3.5).typeName == "number")
    }

    @Test("an integer beyond 64 bits is refused, not rounded; a stored one still reads, as a Double")
    func wideIntegers() throws {
        // Rounded to a Double, 18446744073709551615 would be stored and pushed as 1.8446744073709552e+19 (an app
        // decoding a UInt64 fails on it), and it and 18446744073709551614 would be one value.
        #expect(throws: JSONParseError(offset: 9, reason: "number out of range")) {
            try JSONValue.parse(#"{"order":18446744073709551615}"#)
        }
        for text in [
            "9223372036854775808", "-9223372036854775809", "92233720368547758070",
            "[1,\(String(repeating: "9", count: 400))]",
        ] {
            #expect(throws: JSONParseError.self, "\(text.prefix(30))") { try JSONValue.parse(text) }
        }
        // PostgreSQL's jsonb may hold one (written before the rule, or by SQL): reading its row does not fail.
        let stored = try JSONValue.parseStored(Array(#"{"order":18446744073709551615}"#.utf8))
        #expect(stored["order"] == .double(18_446_744_073_709_551_615))
        // So may a provider's answer, read and never kept: a number its reader ignores leaves the rest readable.
        let answer = try JSONValue.parse(
            Array(#"{"reason":"Unregistered","timestamp":99999999999999999999999}"#.utf8), wideIntegers: .nearestDouble)
        #expect(answer["reason"] == .string("Unregistered"))
        #expect(answer["timestamp"] == .double(1e23))
    }

    @Test("JSON pointers parse, escape and address values")
    func pointers() throws {
        let doc = try JSONValue.parse(#"{"a":{"b/c":[10,{"~d":true}]}}"#)
        let pointer = try #require(JSONPointer("/a/b~1c/1/~0d"))
        #expect(pointer.tokens == ["a", "b/c", "1", "~d"])
        #expect(pointer.description == "/a/b~1c/1/~0d")
        #expect(doc[pointer: pointer] == .bool(true))
        #expect(doc[pointer: JSONPointer("/a/b~1c/0")!] == .int(10))
        #expect(doc[pointer: JSONPointer("/a/missing")!] == nil)
        #expect(doc[pointer: JSONPointer("/a/b~1c/01")!] == nil)
        #expect(doc[pointer: JSONPointer("")!] == doc)
        #expect(JSONPointer("no-slash") == nil)
        #expect(JSONPointer("/bad~2") == nil)

        var copy = doc
        let replaced = copy.replace(at: JSONPointer("/a/b~1c/0")!, with: .string("x"))
        #expect(replaced)
        #expect(copy[pointer: JSONPointer("/a/b~1c/0")!] == .string("x"))
        let missing = copy.replace(at: JSONPointer("/nope/x")!, with: .null)
        #expect(!missing)
    }

    @Test("a JSON pointer is read scalar by scalar: a combining mark after `/` or `~` does not hide it")
    func pointerScalars() throws {
        // As Characters, `/` + U+0301 is one character, not a `/`: the pointer read as the single token `a/\u{301}b`.
        #expect(JSONPointer("/a/\u{301}b")?.tokens == ["a", "\u{301}b"])
        // RFC 6901: `~` must be followed by 0 or 1; `~` + U+0301 is not, and `~0` + U+0301 is `~` then U+0301.
        #expect(JSONPointer("/~\u{301}") == nil)
        #expect(JSONPointer("/~0\u{301}")?.tokens == ["~\u{301}"])
        #expect(JSONPointer("/~1\u{301}")?.tokens == ["/\u{301}"])
        // And written back the same way: every `~` and `/` escaped, whatever follows it.
        for tokens in [["~\u{301}"], ["/\u{301}", "a"], ["\u{301}b"]] {
            let pointer = JSONPointer(tokens: tokens)
            #expect(JSONPointer(pointer.description)?.tokens == tokens, "\(pointer)")
        }
        #expect(JSONPointer(tokens: ["~\u{301}", "/\u{301}"]).description == "/~0\u{301}/~1\u{301}")
    }

    @Test("an array element is named only by 0 or digits without a leading zero (RFC 6901); other tokens name members")
    func arrayIndexes() throws {
        for (token, index) in [("0", 0), ("1", 1), ("10", 10)] { #expect(JSONPointer.arrayIndex(token) == index) }
        for token in ["01", "00", "+1", "-1", " 1", "1 ", "-", "", "1e0", "0x1", "١", "99999999999999999999"] {
            #expect(JSONPointer.arrayIndex(token) == nil, "\(token)")
        }
        let doc = try JSONValue.parse(#"{"tags":["a","b"],"m":{"01":"k","-1":"l","0":"z"}}"#)
        for text in ["/tags/01", "/tags/+1", "/tags/-1", "/tags/ 1", "/tags/-", "/tags/2"] {
            let pointer = try #require(JSONPointer(text))
            #expect(doc[pointer: pointer] == nil, "\(text)")
            var copy = doc
            let replaced = copy.replace(at: pointer, with: .null)
            #expect(!replaced, "\(text)")
            #expect(copy == doc, "\(text)")
        }
        #expect(doc[pointer: JSONPointer("/tags/1")!] == .string("b"))
        // The same tokens name an object's members.
        #expect(doc[pointer: JSONPointer("/m/01")!] == .string("k"))
        #expect(doc[pointer: JSONPointer("/m/-1")!] == .string("l"))
        #expect(doc[pointer: JSONPointer("/m/0")!] == .string("z"))
    }
}
