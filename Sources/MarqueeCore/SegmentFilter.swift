/// A segment's filter: a small language over people and their devices (issue 12), parsed and checked here and
/// compiled to one parameterised SQL query by `SegmentSQL` (MarqueeStore). Values never become SQL text.
///
/// ```json
/// {"and": [
///   {"attribute": "/team", "op": "eq", "value": "lions"},
///   {"or": [{"email_domain": "example.com"}, {"not": {"has_device": {"platform": "android"}}}]},
///   {"has_push_to_start": "com.example.match"}
/// ]}
/// ```
public indirect enum SegmentFilter: Sendable, Equatable {
    case and([SegmentFilter])
    case or([SegmentFilter])
    case not(SegmentFilter)
    /// A person attribute (a JSON pointer into `attributes`) compared with `value`.
    case attribute(JSONPointer, Comparison)
    /// People whose email address is at this domain (case-insensitive).
    case emailDomain(String)
    /// People with a registered device, of one platform or any.
    case hasDevice(Platform?)
    /// People with an active push-to-start token for this activity type on one of their devices.
    case hasPushToStart(String)

    /// What an attribute condition asks.
    public enum Comparison: Sendable, Equatable {
        /// Equal as JSON (`1` and `1.0` are equal; `"1"` and `1` are not).
        case eq(JSONValue)
        /// Not equal, including people who lack the attribute: the exact complement of `eq`.
        case ne(JSONValue)
        /// Equal to one of the values.
        case `in`([JSONValue])
        /// Ordered comparisons: numbers with numbers, strings with strings (byte order, so ISO 8601 timestamps
        /// compare as times). An attribute of another type never matches.
        case lt(Bound)
        case lte(Bound)
        case gt(Bound)
        case gte(Bound)
        /// The attribute is present (any value, `null` included) or, with `false`, absent.
        case exists(Bool)
        /// An array attribute with an element equal to the value, or a string attribute containing the string.
        case contains(JSONValue)
    }

    /// The right-hand side of an ordered comparison.
    public enum Bound: Sendable, Equatable {
        /// A JSON number as parsed (`.int`, or a finite `.double`), compared exactly: an integer beyond 2^53 or a
        /// number of more than 15 significant digits (epoch microseconds) is not rounded first.
        case number(JSONValue)
        case string(String)
    }

    public enum Operator: String, Sendable, CaseIterable {
        case eq, ne, `in`, lt, lte, gt, gte, exists, contains
    }

    /// Limits that keep one filter cheap to check and to run.
    public enum Limits {
        /// Nesting of `and`, `or` and `not`.
        public static let depth = 8
        /// Conditions and combinators in the whole filter.
        public static let nodes = 100
        /// Values in one `in`.
        public static let inValues = 1_000
        /// Size of one comparison value, serialised.
        public static let valueBytes = 4_096
        /// Tokens in one attribute pointer.
        public static let pointerTokens = 8
    }

    /// Parses `value`; errors name the bad node by a JSON pointer under `field` (e.g. `/filter/and/2/op`).
    public init(_ value: JSONValue, field: String = "/filter") throws(ValidationError) {
        var nodes = 0
        self = try Self.parse(value, at: field, depth: 0, nodes: &nodes)
    }

    private static func parse(_ value: JSONValue, at path: String, depth: Int, nodes: inout Int) throws(ValidationError)
        -> SegmentFilter
    {
        nodes += 1
        guard nodes <= Limits.nodes else {
            throw ValidationError(field: path, reason: "the filter has more than \(Limits.nodes) nodes")
        }
        guard depth < Limits.depth else {
            throw ValidationError(field: path, reason: "the filter nests deeper than \(Limits.depth) levels")
        }
        guard let object = value.objectValue else {
            throw ValidationError(field: path, reason: "must be an object: a condition, or and/or/not")
        }
        if object["attribute"] != nil { return try attribute(object, at: path) }
        guard object.count == 1, let (key, inner) = object.first else {
            throw ValidationError(
                field: path,
                reason: "must have exactly one of and, or, not, attribute, email_domain, has_device, has_push_to_start")
        }
        let here = path + "/" + key
        switch key {
        case "and", "or":
            guard let items = inner.arrayValue, !items.isEmpty else {
                throw ValidationError(field: here, reason: "must be a non-empty array of filters")
            }
            var parsed: [SegmentFilter] = []
            for (index, item) in items.enumerated() {
                parsed.append(try parse(item, at: here + "/\(index)", depth: depth + 1, nodes: &nodes))
            }
            return key == "and" ? .and(parsed) : .or(parsed)
        case "not":
            return .not(try parse(inner, at: here, depth: depth + 1, nodes: &nodes))
        case "email_domain":
            guard let domain = inner.stringValue, (1...253).contains(domain.utf8.count), !domain.contains("@"),
                domain.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F })
            else {
                throw ValidationError(field: here, reason: "must be a domain name such as example.com")
            }
            return .emailDomain(domain)
        case "has_device":
            guard let options = inner.objectValue else {
                throw ValidationError(field: here, reason: "must be an object, e.g. {\"platform\": \"ios\"} or {}")
            }
            if let unknown = options.keys.first(where: { $0 != "platform" }) {
                throw ValidationError(field: here + "/" + unknown, reason: "is not a has_device option")
            }
            guard let platform = options["platform"] else { return .hasDevice(nil) }
            guard let parsed = platform.stringValue.flatMap(Platform.init(rawValue:)) else {
                throw ValidationError(field: here + "/platform", reason: "must be ios or android")
            }
            return .hasDevice(parsed)
        case "has_push_to_start":
            guard let text = inner.stringValue else {
                throw ValidationError(field: here, reason: "must be an activity type, e.g. com.example.match")
            }
            return .hasPushToStart(try Identifiers.activityType(text, field: here))
        default:
            throw ValidationError(
                field: here,
                reason: "is not a filter: use and, or, not, attribute, email_domain, has_device or has_push_to_start")
        }
    }

    private static func attribute(_ object: [String: JSONValue], at path: String) throws(ValidationError)
        -> SegmentFilter
    {
        if let unknown = object.keys.sorted().first(where: { !["attribute", "op", "value"].contains($0) }) {
            throw ValidationError(field: path + "/" + unknown, reason: "is not part of an attribute condition")
        }
        guard let text = object["attribute"]?.stringValue, let pointer = JSONPointer(text), !pointer.tokens.isEmpty,
            pointer.tokens.count <= Limits.pointerTokens, text.utf8.count <= 512
        else {
            throw ValidationError(
                field: path + "/attribute",
                reason: "must be a JSON pointer into the person's attributes, e.g. /team (at most "
                    + "\(Limits.pointerTokens) levels)")
        }
        guard let opText = object["op"]?.stringValue, let op = Operator(rawValue: opText) else {
            throw ValidationError(
                field: path + "/op",
                reason: "must be one of " + Operator.allCases.map(\.rawValue).joined(separator: ", "))
        }
        let valuePath = path + "/value"
        let value = object["value"]
        if let value, value.bytes.count > Limits.valueBytes {
            throw ValidationError(field: valuePath, reason: "is larger than \(Limits.valueBytes) bytes")
        }
        func required() throws(ValidationError) -> JSONValue {
            guard let value else { throw ValidationError.missing(valuePath) }
            return value
        }
        func bound() throws(ValidationError) -> Bound {
            switch try required() {
            case .int(let n): return .number(.int(n))
            case .double(let d) where d.isFinite: return .number(.double(d))
            case .string(let s): return .string(s)
            default: throw ValidationError(field: valuePath, reason: "must be a number or a string for \(opText)")
            }
        }
        let comparison: Comparison
        switch op {
        case .eq: comparison = .eq(try required())
        case .ne: comparison = .ne(try required())
        case .in:
            guard let values = try required().arrayValue, !values.isEmpty, values.count <= Limits.inValues else {
                throw ValidationError(
                    field: valuePath, reason: "must be an array of 1 to \(Limits.inValues) values for in")
            }
            comparison = .in(values)
        case .lt: comparison = .lt(try bound())
        case .lte: comparison = .lte(try bound())
        case .gt: comparison = .gt(try bound())
        case .gte: comparison = .gte(try bound())
        case .exists:
            guard let value else {
                comparison = .exists(true)
                break
            }
            guard let flag = value.boolValue else {
                throw ValidationError(field: valuePath, reason: "must be true or false for exists (default true)")
            }
            comparison = .exists(flag)
        case .contains:
            let needle = try required()
            if case .string(let s) = needle, s.isEmpty {
                throw ValidationError(field: valuePath, reason: "must not be empty for contains")
            }
            comparison = .contains(needle)
        }
        return .attribute(pointer, comparison)
    }
}
