/// The JSON Schema subset Marquee checks content states against: `type`, `properties`, `required`, `enum`,
/// `minimum`/`maximum`, `minLength`/`maxLength`, `items` and `additionalProperties`. Annotations (`title`,
/// `description`, `$schema`, `$comment`, `default`, `examples`, `format`) are accepted and ignored; any other keyword
/// is refused when the schema is defined, so a team never believes a rule is enforced when it is not.
public indirect enum ContentSchema: Sendable, Equatable {
    case schema(Node)

    public struct Node: Sendable, Equatable {
        public var types: Set<String>?
        public var properties: [String: ContentSchema] = [:]
        public var required: [String] = []
        public var enumValues: [JSONValue]?
        public var minimum: Double?
        public var maximum: Double?
        public var minLength: Int?
        public var maxLength: Int?
        public var items: ContentSchema?
        /// nil: any extra property allowed; `.some(nil)`: forbidden (`false`); `.some(schema)`: checked against it.
        public var additionalProperties: AdditionalProperties = .allowed
    }

    public enum AdditionalProperties: Sendable, Equatable {
        case allowed
        case forbidden
        indirect case schema(ContentSchema)
    }

    static let knownTypes: Set<String> = ["null", "boolean", "integer", "number", "string", "array", "object"]
    static let annotations: Set<String> = [
        "title", "description", "$schema", "$comment", "default", "examples", "format",
    ]

    /// Parses a schema document; errors name the schema location as a JSON pointer.
    public init(_ value: JSONValue, field: String = "content_state_schema") throws(ValidationError) {
        self = try Self.parse(value, at: JSONPointer(), field: field)
    }

    private static func parse(_ value: JSONValue, at pointer: JSONPointer, field: String) throws(ValidationError)
        -> ContentSchema
    {
        func fail(_ p: JSONPointer, _ reason: String) -> ValidationError {
            ValidationError(.invalidField, field: field + p.description, reason: reason)
        }
        if value == .bool(true) { return .schema(Node()) }
        guard let object = value.objectValue else { throw fail(pointer, "a schema must be an object") }
        var node = Node()
        for (key, v) in object {
            let here = pointer.appending(key)
            switch key {
            case "type":
                let names: [String]
                if let s = v.stringValue {
                    names = [s]
                } else if let a = v.arrayValue, !a.isEmpty, a.allSatisfy({ $0.stringValue != nil }) {
                    names = a.map { $0.stringValue! }
                } else {
                    throw fail(here, "must be a type name or a non-empty array of type names")
                }
                for name in names where !knownTypes.contains(name) {
                    throw fail(here, "unknown type '\(name)'")
                }
                node.types = Set(names)
            case "properties":
                guard let props = v.objectValue else { throw fail(here, "must be an object of schemas") }
                for (name, sub) in props {
                    node.properties[name] = try parse(sub, at: here.appending(name), field: field)
                }
            case "required":
                guard let a = v.arrayValue, a.allSatisfy({ $0.stringValue != nil }) else {
                    throw fail(here, "must be an array of property names")
                }
                node.required = a.map { $0.stringValue! }
            case "enum":
                guard let a = v.arrayValue, !a.isEmpty else { throw fail(here, "must be a non-empty array") }
                node.enumValues = a
            case "minimum", "maximum":
                guard let d = v.doubleValue else { throw fail(here, "must be a number") }
                if key == "minimum" { node.minimum = d } else { node.maximum = d }
            case "minLength", "maxLength":
                guard let i = v.intValue, i >= 0 else { throw fail(here, "must be a non-negative integer") }
                if key == "minLength" { node.minLength = Int(i) } else { node.maxLength = Int(i) }
            case "items":
                node.items = try parse(v, at: here, field: field)
            case "additionalProperties":
                switch v {
                case .bool(true): node.additionalProperties = .allowed
                case .bool(false): node.additionalProperties = .forbidden
                default: node.additionalProperties = .schema(try parse(v, at: here, field: field))
                }
            case _ where annotations.contains(key):
                continue
            default:
                throw fail(here, "unsupported keyword '\(key)'")
            }
        }
        return .schema(node)
    }

    /// One place where a value breaks the schema.
    public struct Violation: Sendable, Equatable, CustomStringConvertible {
        /// Pointer to the offending value inside the validated document.
        public var pointer: JSONPointer
        public var reason: String
        public var description: String { "\(pointer.description.isEmpty ? "/" : pointer.description): \(reason)" }
    }

    /// The first violation found (depth-first, properties in name order), or nil when `value` conforms.
    public func firstViolation(in value: JSONValue) -> Violation? {
        check(value, at: JSONPointer())
    }

    private func check(_ value: JSONValue, at pointer: JSONPointer) -> Violation? {
        guard case .schema(let node) = self else { return nil }
        if let types = node.types, !Self.matches(value, types) {
            let expected = types.sorted().joined(separator: " or ")
            return Violation(pointer: pointer, reason: "expected \(expected), found \(value.typeName)")
        }
        if let allowed = node.enumValues, !allowed.contains(value) {
            return Violation(
                pointer: pointer, reason: "must be one of " + allowed.map { $0.serialized() }.joined(separator: ", "))
        }
        if let d = value.doubleValue {
            if let min = node.minimum, d < min {
                return Violation(pointer: pointer, reason: "must be at least \(JSONValue.double(min))")
            }
            if let max = node.maximum, d > max {
                return Violation(pointer: pointer, reason: "must be at most \(JSONValue.double(max))")
            }
        }
        if let s = value.stringValue {
            // Code points, as JSON Schema counts them (and the API's own string limits): Swift's `count` counts
            // grapheme clusters, and a string of combining marks would pass any `maxLength`.
            let length = s.unicodeScalars.count
            if let min = node.minLength, length < min {
                return Violation(pointer: pointer, reason: "must be at least \(min) characters")
            }
            if let max = node.maxLength, length > max {
                return Violation(pointer: pointer, reason: "must be at most \(max) characters")
            }
        }
        if let array = value.arrayValue, let items = node.items {
            for (i, element) in array.enumerated() {
                if let violation = items.check(element, at: pointer.appending(i)) { return violation }
            }
        }
        if let object = value.objectValue {
            for name in node.required where object[name] == nil {
                return Violation(pointer: pointer.appending(name), reason: "is required")
            }
            for name in object.keys.sorted() {
                let child = object[name]!
                if let sub = node.properties[name] {
                    if let violation = sub.check(child, at: pointer.appending(name)) { return violation }
                    continue
                }
                switch node.additionalProperties {
                case .allowed: continue
                case .forbidden:
                    return Violation(pointer: pointer.appending(name), reason: "is not an allowed property")
                case .schema(let sub):
                    if let violation = sub.check(child, at: pointer.appending(name)) { return violation }
                }
            }
        }
        return nil
    }

    private static func matches(_ value: JSONValue, _ types: Set<String>) -> Bool {
        switch value {
        case .null: types.contains("null")
        case .bool: types.contains("boolean")
        case .string: types.contains("string")
        case .array: types.contains("array")
        case .object: types.contains("object")
        case .int: types.contains("integer") || types.contains("number")
        case .double(let d): types.contains("number") || (types.contains("integer") && d == d.rounded())
        }
    }
}
