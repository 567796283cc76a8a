import Foundation

/// RFC 9457 problem details, rendered as `application/problem+json`.
///
/// `type` is a stable identifier clients can switch on; `title` is a short human summary of that type;
/// `detail` explains this occurrence. `field` names the input at fault (a JSON pointer such as
/// `/devices/0/token` for body fields, or a parameter name). Extra members go in `extensions`.
public struct HTTPProblem: Error, Sendable, Equatable, Codable, CustomStringConvertible {
    /// The HTTP status code.
    public var status: Int
    /// A stable URI identifying the problem type, usually `HTTPProblem.typeBase` + a slug.
    public var type: String
    /// A short, human-readable summary of the problem type.
    public var title: String
    /// A human-readable explanation of this occurrence.
    public var detail: String?
    /// The request field at fault, as a JSON pointer or parameter name.
    public var field: String?
    /// A URI reference identifying this occurrence.
    public var instance: String?
    /// Additional string members rendered at the top level of the JSON object.
    /// Keys that clash with the standard members are ignored when rendering.
    public var extensions: [String: String]
    /// Extra response headers sent with this problem (e.g. `Allow` for 405, `Retry-After`). Not part of the body.
    public var headers: HTTPHeaders

    /// The prefix of the built-in problem `type` URIs; apps can build their own types from it,
    /// e.g. `HTTPProblem.typeBase + "tenant-suspended"`.
    public static let typeBase = "https://marquee.dev/problems/"

    /// Creates a problem.
    public init(
        status: Int,
        type: String,
        title: String,
        detail: String? = nil,
        field: String? = nil,
        instance: String? = nil,
        extensions: [String: String] = [:],
        headers: HTTPHeaders = [:]
    ) {
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.field = field
        self.instance = instance
        self.extensions = extensions
        self.headers = headers
    }

    /// Creates a problem whose type is `typeBase + slug`.
    public init(status: Int, slug: String, title: String, detail: String? = nil, field: String? = nil) {
        self.init(status: status, type: Self.typeBase + slug, title: title, detail: detail, field: field)
    }

    // MARK: Factories

    /// 400: the body is not well-formed JSON.
    public static func malformedJSON(detail: String? = nil) -> HTTPProblem {
        HTTPProblem(
            status: 400, slug: "malformed-json", title: "Malformed JSON",
            detail: detail ?? "The request body is not valid JSON.")
    }

    /// 400: a generic client error (bad query parameter, bad header…).
    public static func badRequest(detail: String, field: String? = nil) -> HTTPProblem {
        HTTPProblem(status: 400, slug: "bad-request", title: "Bad Request", detail: detail, field: field)
    }

    /// 404: no route matches the path. The path is carried as `instance`.
    public static func notFound(path: String) -> HTTPProblem {
        // The path is not echoed: paths can carry tokens, and error bodies never repeat them.
        _ = path
        return HTTPProblem(
            status: 404, slug: "not-found", title: "Not Found", detail: "No resource matches the request path.")
    }

    /// 405: the path exists but not with this method; sets the `Allow` header.
    public static func methodNotAllowed(allowed: [HTTPMethod]) -> HTTPProblem {
        let list = allowed.sorted { ($0.sortKey, $0.rawValue) < ($1.sortKey, $1.rawValue) }
            .map(\.rawValue).joined(separator: ", ")
        var problem = HTTPProblem(
            status: 405, slug: "method-not-allowed", title: "Method Not Allowed",
            detail: "This resource supports: \(list).")
        problem.headers["Allow"] = list
        return problem
    }

    /// 413: the body is larger than `limit` bytes.
    public static func payloadTooLarge(limit: Int) -> HTTPProblem {
        var problem = HTTPProblem(
            status: 413, slug: "payload-too-large", title: "Payload Too Large",
            detail: "The request body exceeds the limit of \(limit) bytes.")
        problem.extensions["limit_bytes"] = String(limit)
        return problem
    }

    /// 414: the request target is longer than `limit` bytes; `field` is `path` or `query`, the part that makes it long.
    public static func uriTooLong(limit: Int, field: String) -> HTTPProblem {
        var problem = HTTPProblem(
            status: 414, slug: "uri-too-long", title: "URI Too Long",
            detail: "The request target is longer than the limit of \(limit) bytes.", field: field)
        problem.extensions["limit_bytes"] = String(limit)
        return problem
    }

    /// 431: the request head (request line and header fields) takes `size` bytes, more than `limit`, counted as
    /// `RequestHead.size` does; `field` names the header field that takes most of it, if one does.
    public static func headerFieldsTooLarge(limit: Int, size: Int, fieldCount: Int, field: String?) -> HTTPProblem {
        var problem = HTTPProblem(
            status: 431, slug: "header-fields-too-large", title: "Request Header Fields Too Large",
            detail: "The request line and its \(fieldCount) header fields take \(size) bytes (each field, query "
                + "parameter and cookie counting \(RequestHead.recordSize) bytes besides its text); the limit is "
                + "\(limit) bytes.",
            field: field)
        problem.extensions["limit_bytes"] = String(limit)
        return problem
    }

    /// 415: the body's `Content-Type` is not one of `supported`.
    public static func unsupportedMediaType(
        contentType: String?, supported: [String] = ["application/json"]
    ) -> HTTPProblem {
        let got = contentType.map { "'\($0.prefix(100))'" } ?? "no Content-Type"
        var problem = HTTPProblem(
            status: 415, slug: "unsupported-media-type", title: "Unsupported Media Type",
            detail: "Expected \(supported.joined(separator: " or ")), got \(got).")
        problem.headers["Accept"] = supported.joined(separator: ", ")
        return problem
    }

    /// 422: well-formed input that fails validation; `field` names the input at fault.
    public static func validation(field: String?, detail: String) -> HTTPProblem {
        HTTPProblem(status: 422, slug: "validation-failed", title: "Validation Failed", detail: detail, field: field)
    }

    /// 500: something went wrong on the server. The detail only carries the request ID, never the error.
    public static func internalError(requestID: String?) -> HTTPProblem {
        var problem = HTTPProblem(
            status: 500, slug: "internal-error", title: "Internal Server Error",
            detail: requestID.map { "Internal error. Request ID: \($0)." } ?? "Internal error.")
        if let requestID { problem.extensions["request_id"] = requestID }
        return problem
    }

    /// 503: the server is shutting down or overloaded.
    public static func serviceUnavailable(detail: String, retryAfterSeconds: Int? = nil) -> HTTPProblem {
        var problem = HTTPProblem(
            status: 503, slug: "service-unavailable", title: "Service Unavailable", detail: detail)
        if let retryAfterSeconds { problem.headers["Retry-After"] = String(retryAfterSeconds) }
        return problem
    }

    /// `status type: title`, without detail (which may echo request input).
    public var description: String { "\(status) \(type): \(title)" }

    // MARK: Codable

    private struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    private static let standardKeys: Set<String> = ["type", "title", "status", "detail", "field", "instance"]

    /// Encodes the RFC 9457 JSON object (standard members plus `extensions`).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(type, forKey: Key("type"))
        try container.encode(title, forKey: Key("title"))
        try container.encode(status, forKey: Key("status"))
        try container.encodeIfPresent(detail, forKey: Key("detail"))
        try container.encodeIfPresent(field, forKey: Key("field"))
        try container.encodeIfPresent(instance, forKey: Key("instance"))
        for (key, value) in extensions where !Self.standardKeys.contains(key) {
            try container.encode(value, forKey: Key(key))
        }
    }

    /// Decodes a problem object; string-valued non-standard members become `extensions`, others are skipped.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        status = try container.decode(Int.self, forKey: Key("status"))
        type = try container.decodeIfPresent(String.self, forKey: Key("type")) ?? "about:blank"
        title = try container.decodeIfPresent(String.self, forKey: Key("title")) ?? ""
        detail = try container.decodeIfPresent(String.self, forKey: Key("detail"))
        field = try container.decodeIfPresent(String.self, forKey: Key("field"))
        instance = try container.decodeIfPresent(String.self, forKey: Key("instance"))
        extensions = [:]
        headers = [:]
        for key in container.allKeys where !Self.standardKeys.contains(key.stringValue) {
            if let value = try? container.decode(String.self, forKey: key) {
                extensions[key.stringValue] = value
            }
        }
    }

    /// The JSON body (`application/problem+json`), keys sorted.
    public func jsonBody() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        if let data = try? encoder.encode(self) {
            return Array(data)
        }
        return Array(#"{"status":\#(status),"title":"Error"}"#.utf8)
    }
}

/// An error that knows how to present itself to HTTP clients.
///
/// Handlers may throw these; the server renders `problem`. Any other error becomes a 500 whose body only
/// carries the request ID.
public protocol HTTPProblemConvertible: Error {
    /// The problem to send to the client. Must not contain secrets.
    var problem: HTTPProblem { get }
}

extension HTTPProblem: HTTPProblemConvertible {
    /// The problem itself.
    public var problem: HTTPProblem { self }
}
