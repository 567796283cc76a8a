import Foundation

/// An HTTP response produced by a handler.
///
/// The server adds `X-Request-Id`, `Content-Length` and `Date`; a missing `Content-Type` on a non-empty body
/// becomes `application/octet-stream`.
public struct HTTPResponse: Sendable {
    /// The status code.
    public var status: Int
    /// Response headers. `Content-Length` is computed by the server and ignored here.
    public var headers: HTTPHeaders
    /// The body. Not sent for `HEAD` requests and 204/304 responses.
    public var body: [UInt8]

    /// Creates a response.
    public init(status: Int = 200, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A JSON response (`application/json`). Keys are sorted and dates are ISO 8601 unless `encoder` says
    /// otherwise. If encoding fails, the result is a 500 problem.
    public static func json<T: Encodable>(_ value: T, status: Int = 200, encoder: JSONEncoder? = nil) -> HTTPResponse {
        let encoder = encoder ?? makeEncoder()
        guard let data = try? encoder.encode(value) else {
            return .problem(.internalError(requestID: nil))
        }
        return HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: Array(data))
    }

    /// A text response.
    public static func text(
        _ s: String, status: Int = 200, contentType: String = "text/plain; charset=utf-8"
    ) -> HTTPResponse {
        HTTPResponse(status: status, headers: ["Content-Type": contentType], body: Array(s.utf8))
    }

    /// A problem+json response, with the problem's extra headers (e.g. `Allow`).
    public static func problem(_ p: HTTPProblem) -> HTTPResponse {
        var headers = p.headers
        headers["Content-Type"] = "application/problem+json"
        return HTTPResponse(status: p.status, headers: headers, body: p.jsonBody())
    }

    /// An empty response, 204 by default.
    public static func noContent(status: Int = 204) -> HTTPResponse {
        HTTPResponse(status: status)
    }

    static func makeEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }
}
