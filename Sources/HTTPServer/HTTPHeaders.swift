/// An ordered list of HTTP header fields with case-insensitive name lookup.
///
/// Order and the original spelling of names are kept; lookups ignore ASCII case.
public struct HTTPHeaders: Sendable, Sequence, Equatable, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    /// One header field.
    public typealias Element = (name: String, value: String)

    private var fields: [(name: String, value: String)]

    /// Creates an empty header list.
    public init() {
        fields = []
    }

    /// Creates a header list from name/value pairs, keeping their order.
    public init(_ fields: [(String, String)]) {
        self.fields = fields.map { (name: $0.0, value: $0.1) }
    }

    /// Creates a header list from a literal such as `["Content-Type": "application/json"]`.
    public init(dictionaryLiteral elements: (String, String)...) {
        self.init(elements)
    }

    /// The first value of the header `name` (case-insensitive); setting replaces every field of that name,
    /// and setting `nil` removes them.
    public subscript(name: String) -> String? {
        get { first(name) }
        set {
            if let newValue {
                replace(name, with: newValue)
            } else {
                remove(name)
            }
        }
    }

    /// The first value of the header `name`, ignoring case.
    public func first(_ name: String) -> String? {
        fields.first { Self.namesEqual($0.name, name) }?.value
    }

    /// All values of the header `name`, in order.
    public func values(_ name: String) -> [String] {
        fields.filter { Self.namesEqual($0.name, name) }.map(\.value)
    }

    /// Whether a header called `name` is present.
    public func contains(_ name: String) -> Bool {
        fields.contains { Self.namesEqual($0.name, name) }
    }

    /// Appends a field, keeping any existing fields of the same name.
    public mutating func add(_ name: String, _ value: String) {
        fields.append((name: name, value: value))
    }

    /// Replaces every field called `name` with a single field (added at the position of the first one,
    /// or at the end).
    public mutating func replace(_ name: String, with value: String) {
        if let index = fields.firstIndex(where: { Self.namesEqual($0.name, name) }) {
            fields[index] = (name: name, value: value)
            var next = fields.index(after: index)
            while next < fields.endIndex {
                if Self.namesEqual(fields[next].name, name) {
                    fields.remove(at: next)
                } else {
                    next = fields.index(after: next)
                }
            }
        } else {
            fields.append((name: name, value: value))
        }
    }

    /// Removes every field called `name`.
    public mutating func remove(_ name: String) {
        fields.removeAll { Self.namesEqual($0.name, name) }
    }

    /// The number of fields.
    public var count: Int { fields.count }

    /// Whether there are no fields.
    public var isEmpty: Bool { fields.isEmpty }

    /// Iterates the fields in order.
    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> {
        fields.makeIterator()
    }

    /// `Name: value` lines.
    public var description: String {
        fields.map { "\($0.name): \($0.value)" }.joined(separator: "\n")
    }

    /// Equal when the same fields appear in the same order (names compared case-insensitively).
    public static func == (lhs: HTTPHeaders, rhs: HTTPHeaders) -> Bool {
        guard lhs.fields.count == rhs.fields.count else { return false }
        return zip(lhs.fields, rhs.fields).allSatisfy { namesEqual($0.name, $1.name) && $0.value == $1.value }
    }

    /// `value` without the optional whitespace (spaces and tabs) HTTP allows around a field value and its parts,
    /// removed byte by byte. Foundation's `trimmingCharacters` goes through `NSString` on Linux: trimming the
    /// `Authorization` header that way was 6.5% of the API's CPU under bench/api-update.
    public static func trimmed(_ value: some StringProtocol) -> Substring {
        var text = Substring(value)
        while let first = text.utf8.first, first == 0x20 || first == 0x09 { text = text.dropFirst() }
        while let last = text.utf8.last, last == 0x20 || last == 0x09 { text = text.dropLast() }
        return text
    }

    /// ASCII case-insensitive comparison, which is what header names need (they are tokens).
    static func namesEqual(_ a: String, _ b: String) -> Bool {
        let x = a.utf8
        let y = b.utf8
        guard x.count == y.count else { return false }
        return zip(x, y).allSatisfy { asciiLower($0) == asciiLower($1) }
    }

    private static func asciiLower(_ byte: UInt8) -> UInt8 {
        (byte >= 0x41 && byte <= 0x5A) ? byte | 0x20 : byte
    }
}
