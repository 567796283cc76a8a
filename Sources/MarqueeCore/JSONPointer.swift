/// An RFC 6901 JSON Pointer, e.g. `/content_state/eta`.
public struct JSONPointer: Sendable, Hashable, CustomStringConvertible {
    /// The unescaped reference tokens.
    public var tokens: [String]

    public init(tokens: [String] = []) { self.tokens = tokens }

    /// Parses `""` (the whole document) or `/a/b`, with `~1` for `/` and `~0` for `~`.
    ///
    /// Read scalar by scalar, as RFC 6901 defines it: as `Character`s, a `/` or `~` followed by a combining mark
    /// would be one character, neither `/` nor `~` (`/a/\u{301}b` one token, `/~\u{301}` taken, `/~0\u{301}`
    /// refused).
    public init?(_ text: String) {
        var scalars = text.unicodeScalars[...]
        guard let first = scalars.popFirst() else {
            tokens = []
            return
        }
        guard first == "/" else { return nil }
        var parsed: [String] = []
        var token = String.UnicodeScalarView()
        while let scalar = scalars.popFirst() {
            switch scalar {
            case "/":
                parsed.append(String(token))
                token = String.UnicodeScalarView()
            case "~":
                // Reject a `~` not followed by 0 or 1.
                switch scalars.popFirst() {
                case "0": token.append("~")
                case "1": token.append("/")
                default: return nil
                }
            default:
                token.append(scalar)
            }
        }
        parsed.append(String(token))
        tokens = parsed
    }

    /// The array element `token` names (RFC 6901 §4): `0`, or digits without a leading zero, within `Int`'s range.
    /// Any other token names no element, only an object's member of that name: `01`, `+1`, `-1`, ` 1`, and `-`
    /// (the element after the last, which never exists). The one home of that rule: the SQL that walks a pointer
    /// (segment filters, a campaign's `$person` fills) is compiled with it, since PostgreSQL's `#>` would
    /// read `-1` as the last element and `01`, `+1` or ` 1` as element 1.
    public static func arrayIndex(_ token: String) -> Int? {
        let utf8 = token.utf8
        guard let first = utf8.first, utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), first != 0x30 || utf8.count == 1
        else { return nil }
        return Int(token)
    }

    /// A pointer one level deeper.
    public func appending(_ token: String) -> JSONPointer { JSONPointer(tokens: tokens + [token]) }
    public func appending(_ index: Int) -> JSONPointer { appending(String(index)) }

    /// The pointer's text: each token after a `/`, with `~` written `~0` and `/` written `~1`, scalar by scalar
    /// (see `init(_:)`).
    public var description: String {
        var text = String.UnicodeScalarView()
        for token in tokens {
            text.append("/")
            for scalar in token.unicodeScalars {
                switch scalar {
                case "~": text.append(contentsOf: "~0".unicodeScalars)
                case "/": text.append(contentsOf: "~1".unicodeScalars)
                default: text.append(scalar)
                }
            }
        }
        return String(text)
    }
}

extension JSONValue {
    /// The value at `pointer`, or nil when some step does not exist.
    public subscript(pointer pointer: JSONPointer) -> JSONValue? {
        var current = self
        for token in pointer.tokens {
            switch current {
            case .object(let o):
                guard let next = o[token] else { return nil }
                current = next
            case .array(let a):
                guard let i = JSONPointer.arrayIndex(token), a.indices.contains(i) else { return nil }
                current = a[i]
            default:
                return nil
            }
        }
        return current
    }

    /// Replaces the value at an existing `pointer`; returns false (and changes nothing) if it does not exist.
    @discardableResult
    public mutating func replace(at pointer: JSONPointer, with value: JSONValue) -> Bool {
        replace(tokens: pointer.tokens[...], with: value)
    }

    private mutating func replace(tokens: ArraySlice<String>, with value: JSONValue) -> Bool {
        guard let first = tokens.first else {
            self = value
            return true
        }
        switch self {
        case .object(var o):
            guard var child = o[first] else { return false }
            guard child.replace(tokens: tokens.dropFirst(), with: value) else { return false }
            o[first] = child
            self = .object(o)
            return true
        case .array(var a):
            guard let i = JSONPointer.arrayIndex(first), a.indices.contains(i) else { return false }
            guard a[i].replace(tokens: tokens.dropFirst(), with: value) else { return false }
            self = .array(a)
            return true
        default:
            return false
        }
    }
}
