import Foundation
import Synchronization

/// An HTTP request as seen by a handler: the body is fully received.
public struct HTTPRequest: Sendable {
    /// The request method.
    public var method: HTTPMethod
    /// The percent-decoded path, without the query string.
    public var path: String
    /// The path exactly as received (percent-encoded), without the query string. Routing uses this,
    /// decoding each segment separately so that `%2F` inside a parameter stays part of it.
    public var rawPath: String
    /// Query parameters, decoded (`+` is a space). When a name repeats, the first value wins; see `queryItems`.
    public var query: [String: String]
    /// Every query parameter in order, decoded.
    public var queryItems: [(name: String, value: String)]
    /// The request headers.
    public var headers: HTTPHeaders
    /// The request body.
    public var body: [UInt8]
    /// Values of the `{name}` segments of the matched route, percent-decoded.
    public var pathParameters: [String: String]
    /// The client's `X-Request-Id` when it is sane (1–128 characters of `[A-Za-z0-9._-]`), else a generated ID.
    public var requestID: String
    /// The client's IP address, when known: the peer's, or, when the peer is a trusted proxy, the address its
    /// `X-Forwarded-For` names (`Configuration.trustedProxies`).
    public var remoteAddress: String?
    /// The address of the connection's other end (a proxy's, behind one).
    public var peerAddress: String?
    /// The matched route pattern, e.g. `/v1/people/{id}` (nil before routing or when nothing matched).
    public var route: String?
    /// Why the request target cannot be taken as text (see `RequestTarget.problem`); the router answers it.
    var targetProblem: HTTPProblem?

    /// Creates a request from a request target such as `/v1/people/a%20b?limit=10`.
    ///
    /// `requestID` defaults to the `X-Request-Id` header when sane, else a fresh random ID.
    public init(
        method: HTTPMethod,
        target: String,
        headers: HTTPHeaders = [:],
        body: [UInt8] = [],
        requestID: String? = nil,
        remoteAddress: String? = nil,
        peerAddress: String? = nil
    ) {
        let parsed = RequestTarget(target)
        self.targetProblem = parsed.problem
        self.method = method
        self.rawPath = parsed.rawPath
        self.path = PercentDecoding.decode(parsed.rawPath)
        self.queryItems = parsed.queryItems
        var query: [String: String] = [:]
        for item in parsed.queryItems where query[item.name] == nil {
            query[item.name] = item.value
        }
        self.query = query
        self.headers = headers
        self.body = body
        self.pathParameters = [:]
        self.requestID = requestID ?? RequestID.accept(headers["X-Request-Id"]) ?? RequestID.generate()
        self.remoteAddress = remoteAddress
        self.peerAddress = peerAddress ?? remoteAddress
        self.route = nil
    }

    /// The `Content-Type` header's media type, lowercased and without parameters (e.g. `application/json`).
    public var mediaType: String? {
        guard let value = headers["Content-Type"] else { return nil }
        let base = value.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        let trimmed = HTTPHeaders.trimmed(base).lowercased()
        return trimmed.isEmpty ? nil : trimmed
    }

    /// Whether the `Content-Type` is `application/json` or an `application/…+json` type.
    public var hasJSONContentType: Bool {
        guard let mediaType else { return false }
        return mediaType == "application/json"
            || (mediaType.hasPrefix("application/") && mediaType.hasSuffix("+json"))
    }

    /// Decodes a JSON body.
    ///
    /// Throws problems: 415 if the `Content-Type` is not JSON, 400 when the body is empty or not well-formed
    /// JSON (the detail says where when the decoder knows), 422 when the JSON is well-formed but doesn't match
    /// `T`, with `field` set to a JSON pointer to the member at fault. An `HTTPProblemConvertible` error thrown
    /// from `T.init(from:)` is passed through. Dates are decoded as ISO 8601 unless `decoder` says otherwise.
    public func decodeJSON<T: Decodable>(_ type: T.Type, decoder: JSONDecoder? = nil) throws(HTTPProblem) -> T {
        try checkJSONBody()
        let decoder = decoder ?? Self.makeDecoder()
        do {
            return try decoder.decode(T.self, from: Data(body))
        } catch let error as DecodingError {
            throw JSONProblems.problem(for: error)
        } catch let error as any HTTPProblemConvertible {
            throw error.problem
        } catch {
            throw HTTPProblem.validation(field: nil, detail: "The request body does not match the expected format.")
        }
    }

    /// Parses a JSON object body. Returns nil when the body is empty.
    ///
    /// Throws 415 for a non-JSON `Content-Type`, 400 for malformed JSON, 422 when the top level is not an object.
    public func jsonObject() throws(HTTPProblem) -> [String: Any]? {
        if body.isEmpty { return nil }
        try checkJSONBody()
        let value: Any
        do {
            value = try JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
        } catch {
            throw HTTPProblem.malformedJSON()
        }
        guard let object = value as? [String: Any] else {
            throw HTTPProblem.validation(field: "", detail: "Expected a JSON object at the top level.")
        }
        return object
    }

    private func checkJSONBody() throws(HTTPProblem) {
        if !body.isEmpty || headers["Content-Type"] != nil {
            guard hasJSONContentType else {
                throw HTTPProblem.unsupportedMediaType(contentType: headers["Content-Type"])
            }
        }
        if body.isEmpty {
            throw HTTPProblem.malformedJSON(detail: "The request body is empty; expected a JSON document.")
        }
    }

    static func makeDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// Maps `DecodingError`s to 400/422 problems.
enum JSONProblems {
    static func problem(for error: DecodingError) -> HTTPProblem {
        switch error {
        case .dataCorrupted(let context) where context.codingPath.isEmpty:
            var detail = "The request body is not valid JSON"
            if let underlying = context.underlyingError {
                detail += ": " + String(describing: underlying).prefix(200)
            } else {
                detail += "."
            }
            return .malformedJSON(detail: detail)
        case .dataCorrupted(let context):
            return .validation(field: pointer(context.codingPath), detail: "The value is not valid here.")
        case .keyNotFound(let key, let context):
            let path = context.codingPath + [key]
            return .validation(field: pointer(path), detail: "The member '\(key.stringValue)' is required.")
        case .typeMismatch(let type, let context):
            return .validation(
                field: pointer(context.codingPath), detail: "Expected \(describe(type)).")
        case .valueNotFound(let type, let context):
            return .validation(
                field: pointer(context.codingPath), detail: "Expected \(describe(type)), got null.")
        @unknown default:
            return .validation(field: nil, detail: "The request body does not match the expected format.")
        }
    }

    /// An RFC 6901 JSON pointer for a coding path, e.g. `/devices/0/token`.
    static func pointer(_ path: [any CodingKey]) -> String {
        path.map { key -> String in
            if let index = key.intValue { return "/\(index)" }
            let escaped = key.stringValue.replacingOccurrences(of: "~", with: "~0")
                .replacingOccurrences(of: "/", with: "~1")
            return "/" + escaped
        }.joined()
    }

    private static func describe(_ type: Any.Type) -> String {
        if type == String.self { return "a string" }
        if type == Bool.self { return "a boolean" }
        if type == Double.self || type == Float.self { return "a number" }
        if type == Date.self { return "an ISO 8601 date-time string" }
        let integers: [Any.Type] = [Int.self, Int64.self, Int32.self, UInt.self, UInt64.self, UInt32.self]
        if integers.contains(where: { $0 == type }) { return "an integer" }
        let name = String(describing: type)
        if name.hasPrefix("Array") { return "an array" }
        if name.hasPrefix("Dictionary") { return "an object" }
        return "a value of type \(name)"
    }
}

/// Splits a request target into raw path and decoded query items.
struct RequestTarget {
    var rawPath: String
    var queryItems: [(name: String, value: String)]
    /// 400 `bad-request` when a path segment, query name or query value decodes to bytes that are not UTF-8 or
    /// hold U+0000: decoded lossily they would name another resource (`%FF` reads as U+FFFD), and PostgreSQL cuts a
    /// text parameter short at NUL (`person=alice%00zz` would read as `alice`). The router answers it. The same bytes
    /// sent raw are refused the same way: the server writes them percent-encoded first (`text(received:)`,
    /// `cutAtNUL(_:)`).
    var problem: HTTPProblem?

    init(_ target: String) {
        // Most targets are an origin-form path of plain characters (`/v1/live_notifications/update`): no query,
        // fragment or escape to take apart, nothing that could fail to be text.
        if target.utf8.first == 0x2F,
            target.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != 0x25 && $0 != 0x3F && $0 != 0x23 })
        {
            rawPath = target
            queryItems = []
            problem = nil
            return
        }
        var rest = Substring(target)
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        // absolute-form (RFC 9112 §3.2.2): drop scheme and authority
        if rest.hasPrefix("http://") || rest.hasPrefix("https://") {
            let afterScheme = rest[rest.index(rest.firstIndex(of: ":")!, offsetBy: 3)...]
            rest = afterScheme.firstIndex(where: { $0 == "/" || $0 == "?" }).map { afterScheme[$0...] } ?? "/"
        }
        let pathPart: Substring
        let queryPart: Substring?
        if let question = rest.firstIndex(of: "?") {
            pathPart = rest[..<question]
            queryPart = rest[rest.index(after: question)...]
        } else {
            pathPart = rest
            queryPart = nil
        }
        rawPath = pathPart.isEmpty ? "/" : String(pathPart)
        queryItems = []
        for segment in pathPart.split(separator: "/", omittingEmptySubsequences: true)
        where !PercentDecoding.decodeChecked(segment).isText {
            problem = .badRequest(
                detail: "A segment of the request path is not UTF-8 once percent-decoded, or holds U+0000.",
                field: "path")
            break
        }
        guard let queryPart else { return }
        for pair in queryPart.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = PercentDecoding.decodeChecked(parts[0], plusIsSpace: true)
            let value =
                parts.count > 1 ? PercentDecoding.decodeChecked(parts[1], plusIsSpace: true) : (text: "", isText: true)
            if problem == nil, !name.isText || !value.isText {
                problem = .badRequest(
                    detail: name.isText
                        ? "The query parameter \(name.text) is not UTF-8 once percent-decoded, or holds U+0000."
                        : "A query parameter name is not UTF-8 once percent-decoded, or holds U+0000.",
                    field: name.isText ? name.text : "query")
            }
            queryItems.append((name: name.text, value: value.text))
        }
    }

    /// The request target as libmicrohttpd hands it over (its bytes up to the first NUL), as text for `init(_:)`.
    ///
    /// UTF-8, as nearly every target is, is taken as it came. Otherwise each byte above 0x7F is written
    /// percent-encoded, so that percent-decoding gives the bytes that were sent and `init(_:)` refuses the target where
    /// they are not text, as it refuses their percent-encoded spelling (raw `caf\xE9` as `caf%E9`; a lossy decoding
    /// would have read both `caf\xE9` and `caf\xE8` as `caf\u{FFFD}`). Bytes below 0x80 keep their meaning, so the
    /// target's `/`, `?`, `&` and `=` still take it apart where they did.
    static func text(received bytes: UnsafeBufferPointer<UInt8>) -> String {
        if let text = String(validating: bytes, as: UTF8.self) { return text }
        let hex = Array("0123456789ABCDEF".utf8)
        var escaped: [UInt8] = []
        escaped.reserveCapacity(bytes.count * 3)
        for byte in bytes {
            if byte < 0x80 {
                escaped.append(byte)
            } else {
                escaped += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: escaped, as: UTF8.self)
    }

    /// The text (`text(received:)`) of a target that went on past a NUL, which libmicrohttpd's C string cuts off:
    /// `%00` where the NUL was, refused by `init(_:)` as a sent `%00` is (`/v1/people/alice\0zz` does not name
    /// `alice`). What came after the NUL is not needed for that.
    static func cutAtNUL(_ text: String) -> String {
        text + "%00"
    }

    /// The raw path's non-empty segments, each percent-decoded.
    static func segments(_ rawPath: String) -> [String] {
        rawPath.split(separator: "/", omittingEmptySubsequences: true).map { PercentDecoding.decode($0) }
    }
}

/// Percent-decoding (RFC 3986 §2.1). Malformed escapes are kept literally; invalid UTF-8 becomes U+FFFD.
enum PercentDecoding {
    static func decode<S: StringProtocol>(_ input: S, plusIsSpace: Bool = false) -> String {
        decodeChecked(input, plusIsSpace: plusIsSpace).text
    }

    /// The decoded text, and whether it is text as received: valid UTF-8 (nothing replaced by U+FFFD) without U+0000.
    static func decodeChecked<S: StringProtocol>(_ input: S, plusIsSpace: Bool = false) -> (
        text: String, isText: Bool
    ) {
        let utf8 = input.utf8
        guard utf8.contains(where: { $0 == 0x25 || (plusIsSpace && $0 == 0x2B) }) else {
            return (String(input), !utf8.contains(0))
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(utf8.count)
        var index = utf8.startIndex
        while index != utf8.endIndex {
            let byte = utf8[index]
            if byte == 0x25,
                let first = utf8.index(index, offsetBy: 1, limitedBy: utf8.endIndex), first != utf8.endIndex,
                let second = utf8.index(first, offsetBy: 1, limitedBy: utf8.endIndex), second != utf8.endIndex,
                let high = hexValue(utf8[first]), let low = hexValue(utf8[second])
            {
                bytes.append(high << 4 | low)
                index = utf8.index(after: second)
                continue
            }
            bytes.append(plusIsSpace && byte == 0x2B ? 0x20 : byte)
            index = utf8.index(after: index)
        }
        if !bytes.contains(0), let text = String(validating: bytes, as: UTF8.self) { return (text, true) }
        return (String(decoding: bytes, as: UTF8.self), false)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: byte - 0x30
        case 0x41...0x46: byte - 0x41 + 10
        case 0x61...0x66: byte - 0x61 + 10
        default: nil
        }
    }
}

/// Request ID validation and generation.
enum RequestID {
    /// Returns `candidate` if it is 1–128 characters of `[A-Za-z0-9._-]`.
    static func accept(_ candidate: String?) -> String? {
        guard let candidate, !candidate.isEmpty, candidate.utf8.count <= 128 else { return nil }
        let sane = candidate.utf8.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == 0x2E || byte == 0x5F || byte == 0x2D
        }
        return sane ? candidate : nil
    }

    /// 32 lowercase hex digits, unique within the process: a counter through keyed bijective mixes (random keys per
    /// process), so that IDs tell nothing of how many requests came between two (no system call per request: two
    /// `getrandom`s per request were 1.6% of the API's CPU under bench/api-update).
    static func generate() -> String {
        let n = counter.add(1, ordering: .relaxed).newValue
        let high = mix(mix(n ^ keys.0) &+ keys.1)
        let low = mix(mix(n ^ keys.2) &+ keys.3)
        return String(unsafeUninitializedCapacity: 32) { buffer in
            let digits: StaticString = "0123456789abcdef"
            digits.withUTF8Buffer { digits in
                for i in 0..<16 {
                    buffer[i] = digits[Int((high >> (60 - 4 * UInt64(i))) & 0xF)]
                    buffer[16 + i] = digits[Int((low >> (60 - 4 * UInt64(i))) & 0xF)]
                }
            }
            return 32
        }
    }

    private static let keys: (UInt64, UInt64, UInt64, UInt64) = {
        var generator = SystemRandomNumberGenerator()
        return (generator.next(), generator.next(), generator.next(), generator.next())
    }()
    private static let counter = Atomic<UInt64>(0)

    /// SplitMix64's finalizer: a bijection of 64-bit values, so distinct counters give distinct IDs.
    private static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
