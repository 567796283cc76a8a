import Foundation
import HTTPServer
import MarqueeCore

/// A JSON object request body, with typed field access whose errors name the field.
struct JSONBody: Sendable {
    let object: [String: JSONValue]
    /// Prefix for field names in errors (for nested objects).
    let path: String

    init(object: [String: JSONValue], path: String = "") {
        self.object = object
        self.path = path
    }

    /// Parses the request body; an empty body reads as `{}` when `allowEmpty`.
    ///
    /// A string or key holding U+0000 is a 422 (see `nulField`) unless `allowNUL`, for callers that check parts of
    /// the body on their own, as the batch ingest does per event.
    static func parse(_ request: HTTPRequest, allowEmpty: Bool = false, allowNUL: Bool = false) throws(HTTPProblem)
        -> JSONBody
    {
        if request.body.isEmpty {
            if allowEmpty { return JSONBody(object: [:]) }
            throw HTTPProblem.malformedJSON(detail: "The request body is empty; a JSON object is required.")
        }
        let value: JSONValue
        do {
            value = try JSONValue.parse(request.body)
        } catch {
            throw HTTPProblem.malformedJSON(
                detail: "The body is not valid JSON: \(error.reason) at byte \(error.offset).")
        }
        guard let object = value.objectValue else {
            throw HTTPProblem(
                status: 400, slug: "malformed-json", title: "Malformed JSON",
                detail: "The body must be a JSON object, not \(value.typeName).")
        }
        if !allowNUL, let field = nulField(in: value) {
            throw Problems.validation(ValidationError(field: field, reason: JSONBody.nulReason))
        }
        return JSONBody(object: object)
    }

    /// The field (dotted, with `[index]` for arrays) of the first string or key that holds U+0000, if any.
    /// U+0000 is refused: PostgreSQL stores it neither in `text` (libpq cuts the value short) nor in `jsonb`.
    static func nulField(in value: JSONValue, path: String = "") -> String? {
        switch value {
        case .string(let s):
            return s.unicodeScalars.contains("\u{0}") ? path : nil
        case .array(let a):
            for (i, element) in a.enumerated() {
                if let found = nulField(in: element, path: "\(path)[\(i)]") { return found }
            }
            return nil
        case .object(let o):
            for key in o.keys.sorted() {
                // A key holding NUL cannot be named safely: the object holding it is reported ("" for the root).
                if key.unicodeScalars.contains("\u{0}") { return path }
                if let found = nulField(in: o[key]!, path: path.isEmpty ? key : path + "." + key) { return found }
            }
            return nil
        default:
            return nil
        }
    }

    static let nulReason = "must not contain U+0000 in any string or key"

    func name(_ key: String) -> String { path.isEmpty ? key : path + "." + key }

    func has(_ key: String) -> Bool { object[key].map { !$0.isNull } ?? false }

    func value(_ key: String) -> JSONValue? {
        guard let v = object[key], !v.isNull else { return nil }
        return v
    }

    /// A string field; `nil` when absent or null. Length counted in Unicode code points, as `maxLength` in
    /// openapi.yaml (JSON Schema) counts: a grapheme cluster can hold any number of them. Values that go into an
    /// index are bounded in bytes too, by their own rule (`RegistryRoutes.email`, `Identifiers.recipient`).
    func string(_ key: String, maxLength: Int = 1024, allowEmpty: Bool = false) throws(ValidationError) -> String? {
        guard let v = value(key) else { return nil }
        guard let s = v.stringValue else {
            throw ValidationError(field: name(key), reason: "must be a string")
        }
        if !allowEmpty && s.isEmpty { throw ValidationError(field: name(key), reason: "must not be empty") }
        if s.unicodeScalars.count > maxLength {
            throw ValidationError(field: name(key), reason: "must be at most \(maxLength) characters")
        }
        return s
    }

    func requiredString(_ key: String, maxLength: Int = 1024) throws(ValidationError) -> String {
        guard let s = try string(key, maxLength: maxLength) else { throw ValidationError.missing(name(key)) }
        return s
    }

    func enumValue<E: RawRepresentable & CaseIterable>(_ key: String, _ type: E.Type) throws(ValidationError) -> E?
    where E.RawValue == String {
        guard let s = try string(key) else { return nil }
        guard let e = E(rawValue: s) else {
            throw ValidationError(
                field: name(key), reason: "must be one of " + E.allCases.map { $0.rawValue }.joined(separator: ", "))
        }
        return e
    }

    func requiredEnum<E: RawRepresentable & CaseIterable>(_ key: String, _ type: E.Type) throws(ValidationError) -> E
    where E.RawValue == String {
        guard let e = try enumValue(key, type) else { throw ValidationError.missing(name(key)) }
        return e
    }

    func objectValue(_ key: String) throws(ValidationError) -> JSONValue? {
        guard let v = value(key) else { return nil }
        guard v.objectValue != nil else { throw ValidationError(field: name(key), reason: "must be a JSON object") }
        return v
    }

    func nested(_ key: String) throws(ValidationError) -> JSONBody? {
        guard let v = try objectValue(key) else { return nil }
        return JSONBody(object: v.objectValue!, path: name(key))
    }

    func bool(_ key: String) throws(ValidationError) -> Bool? {
        guard let v = value(key) else { return nil }
        guard let b = v.boolValue else { throw ValidationError(field: name(key), reason: "must be true or false") }
        return b
    }

    func integer(_ key: String, range: ClosedRange<Int64>) throws(ValidationError) -> Int64? {
        guard let v = value(key) else { return nil }
        guard let i = v.intValue, range.contains(i) else {
            throw ValidationError(
                field: name(key), reason: "must be an integer in \(range.lowerBound)...\(range.upperBound)")
        }
        return i
    }

    /// A timestamp given as epoch seconds (number) or an ISO 8601 string, within ``Timestamps/acceptedRange``
    /// either way.
    func timestamp(_ key: String) throws(ValidationError) -> Date? {
        guard let v = value(key) else { return nil }
        if let seconds = v.doubleValue, Timestamps.acceptedRange.contains(seconds) {
            return Date(timeIntervalSince1970: seconds)
        }
        if let s = v.stringValue, let date = Timestamps.parse(s),
            Timestamps.acceptedRange.contains(date.timeIntervalSince1970)
        {
            return date
        }
        throw ValidationError(
            field: name(key),
            reason: "must be epoch seconds or an ISO 8601 date-time, from 1970-01-01T00:00:00Z to before year 3000")
    }

    /// Rejects fields other than `allowed`, so a typo is an error instead of being ignored.
    func rejectUnknown(_ allowed: Set<String>) throws(ValidationError) {
        for key in object.keys.sorted() where !allowed.contains(key) {
            throw ValidationError(field: name(key), reason: "is not a known field")
        }
    }
}

/// ISO 8601 formatting and parsing for API responses and inputs.
enum Timestamps {
    /// The instants the API accepts as input, in epoch seconds: 1970-01-01T00:00:00Z to before
    /// 3000-01-01T00:00:00Z, whether spelled as a number or an ISO 8601 string (which reads years far beyond
    /// what PostgreSQL or a microsecond count in 64 bits can hold). The one home of this bound: request
    /// timestamps and list cursors are checked against it.
    static let acceptedRange: Range<Double> = 0..<32_503_680_000

    static func format(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    /// An ISO 8601 date-time with a zone (`Z` or an offset), read by MarqueeCore's strict reader (the one that reads
    /// content-state dates), not Foundation's: that one rolls a day that does not exist over into the next month, so a
    /// campaign asked to start on 2027-02-30 would have started on March 2nd.
    static func parse(_ text: String) -> Date? {
        DateFields.epochSeconds(from: .string(text)).map(Date.init(timeIntervalSince1970:))
    }
}

extension HTTPResponse {
    /// A JSON response from a `JSONValue`.
    static func json(_ value: JSONValue, status: Int = 200) -> HTTPResponse {
        HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: value.bytes)
    }
}

extension JSONValue {
    static func from(_ string: String?) -> JSONValue { string.map { .string($0) } ?? .null }
    static func from(_ date: Date?) -> JSONValue { date.map { .string(Timestamps.format($0)) } ?? .null }
}
