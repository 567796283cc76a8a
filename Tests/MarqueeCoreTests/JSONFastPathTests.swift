import Foundation
import Testing

@testable import MarqueeCore

/// The byte-level serialiser and the string fast path of the parser against the original algorithms, on a corpus.
@Suite("JSON fast paths")
struct JSONFastPathTests {
    /// The serialiser as it was before the byte-level one: escapes by Unicode scalar into a `String`.
    static func reference(_ value: JSONValue) -> String {
        func string(_ s: String, _ out: inout String) {
            out += "\""
            for scalar in s.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case let c where c.value < 0x20:
                    let hex = String(c.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                default: out.unicodeScalars.append(scalar)
                }
            }
            out += "\""
        }
        func write(_ v: JSONValue, _ out: inout String) {
            switch v {
            case .null: out += "null"
            case .bool(let b): out += b ? "true" : "false"
            case .int(let i): out += String(i)
            case .double(let d):
                if !d.isFinite {
                    out += "null"
                } else if d == d.rounded() && abs(d) < 1e15 {
                    out += String(Int64(d))
                } else {
                    out += String(d)
                }
            case .string(let s): string(s, &out)
            case .array(let a):
                out += "["
                for (i, e) in a.enumerated() {
                    if i > 0 { out += "," }
                    write(e, &out)
                }
                out += "]"
            case .object(let o):
                out += "{"
                for (i, key) in o.keys.sorted().enumerated() {
                    if i > 0 { out += "," }
                    string(key, &out)
                    out += ":"
                    write(o[key]!, &out)
                }
                out += "}"
            }
        }
        var out = ""
        write(value, &out)
        return out
    }

    /// A deterministic generator of varied values.
    struct Corpus {
        var state: UInt64
        mutating func next() -> UInt64 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return state >> 33
        }
        static let pieces = [
            "", "a", "order 42", "é", "naïve café", "日本語", "👩‍👩‍👧", "e\u{301}", "\"", "\\", "/", "\n", "\r", "\t",
            "\u{0}", "\u{1}", "\u{8}", "\u{c}", "\u{1f}", "\u{7f}", "\u{2028}", "\u{fffd}", "\u{10ffff}", "😀 ok",
            "{\"x\":1}", "</script>",
        ]
        mutating func string() -> String {
            (0..<Int(next() % 4)).map { _ in Self.pieces[Int(next() % UInt64(Self.pieces.count))] }.joined()
        }
        mutating func value(depth: Int = 0) -> JSONValue {
            switch next() % (depth > 3 ? 5 : 7) {
            case 0: return .null
            case 1: return .bool(next() % 2 == 0)
            case 2:
                let ints: [Int64] = [0, 1, -1, 42, Int64.max, Int64.min, 1_764_680_000_123]
                return .int(ints[Int(next() % UInt64(ints.count))])
            case 3:
                let doubles = [0.5, -0.0, 1e15, 1e15 - 1, 123.456, -7.25e-9, 3.0, .nan, .infinity, 1e300]
                return .double(doubles[Int(next() % UInt64(doubles.count))])
            case 4: return .string(string())
            case 5: return .array((0..<Int(next() % 4)).map { _ in value(depth: depth + 1) })
            default:
                var o: [String: JSONValue] = [:]
                for _ in 0..<Int(next() % 5) { o[string()] = value(depth: depth + 1) }
                return .object(o)
            }
        }
    }

    @Test("serialisation is byte-identical to the original on 5,000 varied values, and parses back equal")
    func corpus() throws {
        var corpus = Corpus(state: 20_261_203)
        for _ in 0..<5_000 {
            let value = corpus.value()
            let text = Self.reference(value)
            #expect(value.serialized() == text)
            #expect(value.bytes == Array(text.utf8))
            let reparsed = try JSONValue.parse(value.bytes)
            #expect(reparsed.serialized() == text, "parse(serialize(v)) serialises the same")
        }
    }

    @Test("strings: escapes decode, raw and escaped forms parse equal, bad UTF-8 and control bytes fail")
    func strings() throws {
        #expect(
            try JSONValue.parse(#""caf\u00e9 \ud83d\ude00 \" \\ \/ \b\f\n\r\t""#)
                == .string("café 😀 \" \\ / \u{8}\u{c}\n\r\t"))
        #expect(try JSONValue.parse("\"café 😀\"") == JSONValue.parse(#""caf\u00e9 \ud83d\ude00""#))
        #expect(
            try JSONValue.parse(#"{"k":"plain","e":"a\nb"}"#) == .object(["k": .string("plain"), "e": .string("a\nb")]))
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0x61, 0x0A, 0x22]) }
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0x61, 0x62]) }
        #expect(throws: JSONParseError.self) { try JSONValue.parse(#""\ud83d""#) }
    }

    @Test("non-ASCII strings are checked as UTF-8 even where repairing them would keep their length")
    func nonASCIIStrings() throws {
        #expect(try JSONValue.parse(Array("\"Zoë 😀 Ångström\"".utf8)) == .string("Zoë 😀 Ångström"))
        let rejected: [[UInt8]] = [
            [0xF0, 0x9F, 0x98, 0x41],  // a 4-byte sequence cut short: one U+FFFD, three bytes, as long as the cut
            [0xC0, 0xAF],  // overlong
            [0xED, 0xA0, 0x80],  // a UTF-16 surrogate
            [0xF4, 0x90, 0x80, 0x80],  // above U+10FFFF
            [0x80],  // a lone continuation byte
            [0x61, 0xE2, 0x82],  // cut at the end
        ]
        for bytes in rejected {
            #expect(throws: JSONParseError.self, "\(bytes)") { try JSONValue.parse([0x22] + bytes + [0x22]) }
            #expect(throws: JSONParseError.self, "\(bytes) as a key") {
                try JSONValue.parse(Array("{\"".utf8) + bytes + Array("\":1}".utf8))
            }
        }
    }

    @Test("integers are written digit by digit, the extremes included")
    func integers() {
        for value: Int64 in [0, 7, -7, 10, -10, 1_764_945_600, Int64.max, Int64.min, Int64.min + 1] {
            #expect(JSONValue.int(value).serialized() == String(value))
        }
        #expect(JSONValue.double(-0.0).serialized() == "0")
        #expect(JSONValue.double(-1e14).serialized() == "-100000000000000")
    }
}
