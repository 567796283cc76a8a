/// A JSON document, parsed and serialized without Foundation so that errors carry positions and output is stable.
///
/// Integers and fractions are kept apart (`1` stays `1`, not `1.0`), but compare equal when numerically equal.
/// Objects serialize with sorted keys, so equal values always produce identical bytes.
public enum JSONValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    // MARK: Accessors

    public var objectValue: [String: JSONValue]? {
        if case .object(let o) = self { return o }
        return nil
    }
    public var arrayValue: [JSONValue]? {
        if case .array(let a) = self { return a }
        return nil
    }
    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }
    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }
    /// The value as a Double, for either number case.
    public var doubleValue: Double? {
        switch self {
        case .int(let i): Double(i)
        case .double(let d): d
        default: nil
        }
    }
    /// The value as an integer, for `.int` or a `.double` with no fraction.
    public var intValue: Int64? {
        switch self {
        case .int(let i): i
        case .double(let d) where d == d.rounded() && abs(d) < 9.2e18: Int64(d)
        default: nil
        }
    }
    public var isNull: Bool { self == .null }

    public subscript(key: String) -> JSONValue? {
        objectValue?[key]
    }

    /// The JSON type name used in error messages and schemas: `null`, `boolean`, `integer`, `number`, `string`,
    /// `array`, `object`.
    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "boolean"
        case .int: "integer"
        case .double(let d): d == d.rounded() && d.isFinite ? "integer" : "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    // MARK: Equality

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.string(let a), .string(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.object(let a), .object(let b)): a == b
        case (.int(let a), .int(let b)): a == b
        case (.int, .double), (.double, .int), (.double, .double): lhs.doubleValue! == rhs.doubleValue!
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .bool(let b): hasher.combine(b)
        case .int, .double: hasher.combine(doubleValue!)
        case .string(let s): hasher.combine(s)
        case .array(let a): hasher.combine(a)
        case .object(let o): hasher.combine(o)
        }
    }

    // MARK: Serialization

    /// Compact JSON with sorted object keys.
    public var description: String { serialized() }

    public func serialized() -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    /// UTF-8 bytes of `serialized()`, written byte by byte (no intermediate `String`).
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(to: &out)
        return out
    }

    func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): JSONValue.writeInteger(i, to: &out)
        case .double(let d):
            if !d.isFinite {
                out.append(contentsOf: "null".utf8)
            } else if d == d.rounded() && abs(d) < 1e15 {
                JSONValue.writeInteger(Int64(d), to: &out)
            } else {
                out.append(contentsOf: String(d).utf8)
            }
        case .string(let s): JSONValue.writeString(s, to: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (i, v) in a.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                v.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            // The pairs sorted, not the keys: no lookup per key afterwards.
            for (i, (key, value)) in o.sorted(by: { $0.key < $1.key }).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                value.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Decimal digits of `value`, written straight into `out` (no `String` in between).
    static func writeInteger(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var start = digits.count
            repeat {
                start -= 1
                digits[start] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            out.append(contentsOf: UnsafeBufferPointer(rebasing: digits[start...]))
        }
    }

    /// A JSON string literal. Only ASCII bytes are ever escaped, and every byte of a multi-byte UTF-8 sequence is
    /// 0x80 or above, so escaping the UTF-8 bytes one by one is exact; a string with nothing to escape is copied
    /// whole.
    static func writeString(_ s: String, to out: inout [UInt8]) {
        var s = s
        // The string's own contiguous UTF-8 (made so if it is not): scanned and copied as a buffer, not a byte at a
        // time through String.UTF8View.
        s.withUTF8 { utf8 in JSONValue.writeString(utf8: utf8, to: &out) }
    }

    static func writeString(utf8: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        if !utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
            out.append(contentsOf: utf8)
        } else {
            for byte in utf8 {
                switch byte {
                case UInt8(ascii: "\""): out.append(contentsOf: "\\\"".utf8)
                case UInt8(ascii: "\\"): out.append(contentsOf: "\\\\".utf8)
                case UInt8(ascii: "\n"): out.append(contentsOf: "\\n".utf8)
                case UInt8(ascii: "\r"): out.append(contentsOf: "\\r".utf8)
                case UInt8(ascii: "\t"): out.append(contentsOf: "\\t".utf8)
                case 0..<0x20:
                    let hex: [UInt8] = Array("0123456789abcdef".utf8)
                    out.append(contentsOf: "\\u00".utf8)
                    out.append(hex[Int(byte >> 4)])
                    out.append(hex[Int(byte & 0x0F)])
                default: out.append(byte)
                }
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// Why a document is not JSON, with the byte offset where parsing stopped.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var reason: String
    public var description: String { "\(reason) at byte \(offset)" }
}

extension JSONValue {
    /// The deepest nesting of arrays and objects any document may have, received or stored (`parse`,
    /// `parseStored`): `[[1]]` nests 2 deep. What the service composes from stored parts (a campaign's template filled
    /// with a person's attributes) must stay within it too, or it could not be read back.
    public static let maxDepth = 64

    /// Parses a complete JSON text (RFC 8259). Nesting is limited to `maxDepth` levels, a document to 100,000 values,
    /// and an object's keys must be unique (parsers that keep the first of two disagree with those that keep the last).
    ///
    /// An integer (a number without fraction or exponent) must fit in 64 bits (`Int64`): a larger one is refused
    /// ("number out of range") rather than rounded to a `Double`, which would change it (18446744073709551615 would
    /// be stored and sent as 1.8446744073709552e+19, and two such IDs would compare equal). Fractions and exponents
    /// are `Double`s. A document the service only reads, and never keeps or passes on (a provider's answer), may take
    /// such an integer as the nearest `Double` instead (`wideIntegers: .nearestDouble`), so that one number its reader
    /// ignores does not make the rest unreadable.
    ///
    /// Keys are unique by their UTF-8 bytes, as PostgreSQL's `jsonb` tells them apart. Two keys that are the same
    /// text in different Unicode forms (canonically equivalent, e.g. U+00C5 and U+212B) are two keys there but one to
    /// a Swift dictionary (`[String: JSONValue]`), which cannot hold both: an object with both is refused, with its own
    /// reason ("key canonically equivalent to an earlier key"), rather than keep one and drop the other.
    public static func parse(
        _ bytes: some Collection<UInt8>, wideIntegers: WideIntegers = .refuse
    ) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(Array(bytes), wideIntegers: wideIntegers)
        return try parser.parseDocument()
    }

    /// What the parser does with an integer literal beyond `Int64` (see `parse`).
    public enum WideIntegers: Sendable {
        /// Refuse the document: "number out of range". For what the service keeps or passes on.
        case refuse
        /// Take the nearest `Double`. For documents only read: stored rows, providers' answers.
        case nearestDouble
    }

    /// Parses a document the service stored itself (PostgreSQL's `jsonb` output): no limit on its number of values,
    /// which were checked when it came in, under the limits of the day (a row written before a limit existed must
    /// still read). Depth is still limited. An integer beyond 64 bits (written before `parse` refused them, or by SQL)
    /// reads as the nearest `Double`, as it did then, rather than failing the read of its row.
    public static func parseStored(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(Array(bytes), maxValues: .max, wideIntegers: .nearestDouble)
        return try parser.parseDocument()
    }

    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(Array(text.utf8))
    }
}

struct JSONParser {
    let bytes: [UInt8]
    var index = 0
    var depth = 0
    var values = 0
    static let maxDepth = JSONValue.maxDepth
    /// Values (of any kind, at any depth) in a document at most. What a document costs in memory is bounded by its
    /// number of values, not its size: a value takes 24 to ~400 bytes parsed (an object's dictionary), from as
    /// little as two bytes of text. The largest documents the API expects (a batch of 1,000 events, a campaign's
    /// 10,000 people) hold well under this.
    static let maxValues = 100_000

    let maxValues: Int
    let wideIntegers: JSONValue.WideIntegers

    init(_ bytes: [UInt8], maxValues: Int = Self.maxValues, wideIntegers: JSONValue.WideIntegers = .refuse) {
        self.bytes = bytes
        self.maxValues = maxValues
        self.wideIntegers = wideIntegers
    }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        if index != bytes.count { throw fail("unexpected data after the JSON value") }
        return value
    }

    func fail(_ reason: String) -> JSONParseError { JSONParseError(offset: index, reason: reason) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func parseValue() throws(JSONParseError) -> JSONValue {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        values += 1
        if values > maxValues { throw fail("more than \(maxValues) values") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw fail("unexpected character")
        }
    }

    mutating func literal(_ word: String, _ value: JSONValue) throws(JSONParseError) -> JSONValue {
        let w = Array(word.utf8)
        guard index + w.count <= bytes.count, Array(bytes[index..<index + w.count]) == w else {
            throw fail("invalid literal")
        }
        index += w.count
        return value
    }

    mutating func parseObject() throws(JSONParseError) -> JSONValue {
        depth += 1
        if depth > Self.maxDepth { throw fail("nesting too deep") }
        defer { depth -= 1 }
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            // The shared empty dictionary: no storage. (Storage reserved for `{}` made 1 MiB of `[{},{},…]` into
            // 250 MB.)
            return .object([:])
        }
        // Room for a few keys once there is one: growing 1 → 2 → 4 rehashes every key each time.
        var object = [String: JSONValue](minimumCapacity: 4)
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let keyAt = index
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            if object.updateValue(try parseValue(), forKey: key) != nil {
                // Swift's `==` on strings is canonical equivalence, PostgreSQL's jsonb compares keys by their bytes: a
                // key the dictionary already holds (its first spelling: `updateValue` keeps the key) is named twice
                // only if its bytes are the same. Another spelling is another key, which the dictionary cannot hold
                // beside the first: keeping one would drop the other, so it is refused too, saying why.
                let held = object[object.index(forKey: key)!].key
                index = keyAt
                throw fail(
                    held.utf8.elementsEqual(key.utf8)
                        ? "duplicate key"
                        : "key canonically equivalent to an earlier key (the same text in another Unicode form)")
            }
            skipWhitespace()
            guard index < bytes.count else { throw fail("unterminated object") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(object)
            }
            throw fail("expected ',' or '}'")
        }
    }

    mutating func parseArray() throws(JSONParseError) -> JSONValue {
        depth += 1
        if depth > Self.maxDepth { throw fail("nesting too deep") }
        defer { depth -= 1 }
        index += 1
        var array: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(array)
        }
        while true {
            skipWhitespace()
            array.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw fail("unterminated array") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(array)
            }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func parseString() throws(JSONParseError) -> String {
        index += 1  // opening quote
        // Fast path: most strings have no escape, and most are ASCII; copy the bytes up to the closing quote at once
        // (only a string with bytes above 0x7F needs its UTF-8 checked).
        let start = index
        var ascii = true
        while index < bytes.count {
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                guard let s = Self.string(bytes, start..<index, ascii: ascii) else {
                    throw fail("invalid UTF-8 in string")
                }
                index += 1
                return s
            }
            if c == UInt8(ascii: "\\") { break }
            if c < 0x20 { throw fail("control character in string") }
            if c >= 0x80 { ascii = false }
            index += 1
        }
        index = start
        var scalars = String.UnicodeScalarView()
        var runStart = index
        func flushRun(_ parser: JSONParser, upTo end: Int, into scalars: inout String.UnicodeScalarView) -> Bool {
            guard end > runStart else { return true }
            guard let s = JSONParser.string(parser.bytes, runStart..<end, ascii: false) else { return false }
            scalars.append(contentsOf: s.unicodeScalars)
            return true
        }
        while index < bytes.count {
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                guard flushRun(self, upTo: index, into: &scalars) else { throw fail("invalid UTF-8 in string") }
                index += 1
                return String(scalars)
            }
            if c < 0x20 { throw fail("control character in string") }
            if c == UInt8(ascii: "\\") {
                guard flushRun(self, upTo: index, into: &scalars) else { throw fail("invalid UTF-8 in string") }
                index += 1
                guard index < bytes.count else { throw fail("unterminated escape") }
                let e = bytes[index]
                index += 1
                switch e {
                case UInt8(ascii: "\""): scalars.append("\"")
                case UInt8(ascii: "\\"): scalars.append("\\")
                case UInt8(ascii: "/"): scalars.append("/")
                case UInt8(ascii: "b"): scalars.append("\u{08}")
                case UInt8(ascii: "f"): scalars.append("\u{0C}")
                case UInt8(ascii: "n"): scalars.append("\n")
                case UInt8(ascii: "r"): scalars.append("\r")
                case UInt8(ascii: "t"): scalars.append("\t")
                case UInt8(ascii: "u"):
                    var code = try hex4()
                    if (0xD800...0xDBFF).contains(code) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired surrogate") }
                        index += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("unpaired surrogate") }
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(code) {
                        throw fail("unpaired surrogate")
                    }
                    guard let scalar = Unicode.Scalar(code) else { throw fail("invalid escape") }
                    scalars.append(scalar)
                default:
                    throw fail("invalid escape")
                }
                runStart = index
                continue
            }
            index += 1
        }
        throw fail("unterminated string")
    }

    /// The string of `bytes[range]`, nil if it is not valid UTF-8. Decoding from a buffer is the standard library's
    /// fast path (validating an `ArraySlice` goes through generic code, and showed in profiles); decoding repairs
    /// invalid input rather than rejecting it, so a run with non-ASCII bytes must decode to exactly its own bytes.
    static func string(_ bytes: [UInt8], _ range: Range<Int>, ascii: Bool) -> String? {
        bytes.withUnsafeBufferPointer { all in
            let run = UnsafeBufferPointer(rebasing: all[range])
            let s = String(decoding: run, as: UTF8.self)
            if ascii { return s }
            return s.utf8.elementsEqual(run) ? s : nil
        }
    }

    mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    mutating func parseNumber() throws(JSONParseError) -> JSONValue {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw fail("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(bytes[index]) {
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        } else {
            throw fail("invalid number")
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            let digitsStart = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            if index == digitsStart { throw fail("invalid number") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            let digitsStart = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            if index == digitsStart { throw fail("invalid number") }
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        if isInteger {
            if let i = Int64(text) { return .int(i) }
            if wideIntegers == .refuse { throw JSONParseError(offset: start, reason: "number out of range") }
        }
        guard let d = Double(text), d.isFinite else {
            throw JSONParseError(offset: start, reason: "number out of range")
        }
        return .double(d)
    }
}
