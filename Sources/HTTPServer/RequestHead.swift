/// What a request's head (request line and header fields) takes of its connection's memory, and the limits on it
/// (`HTTPServer.Configuration.maxTargetLength`, `maxRequestHeadSize`).
///
/// libmicrohttpd keeps a request's head in a per-connection pool of fixed size, in place as it came, with a record
/// for each header field, query parameter and cookie (and a copy of the `Cookie` header, which it splits). When the
/// pool cannot hold a head, it answers on its own (414 or 431, with a short HTML page) before the server sees the
/// request. So the server sizes the pool at twice `maxRequestHeadSize` (`connectionMemory`), counts a head as the pool
/// holds it (`size`), and answers a head over the limit itself, with problem+json: a head within the limit always
/// reaches the server, and one up to about twice the limit is still answered by it.
struct RequestHead {
    /// What the pool takes for each header field, query parameter and cookie besides its text: libmicrohttpd's
    /// record (`struct MHD_HTTP_Header`, 56 bytes on 64-bit systems) rounded to the pool's 16-byte alignment.
    static let recordSize = 64

    /// Bytes of the request target as sent.
    var targetLength: Int
    /// Bytes of the head as it came: request line, header lines and the empty line that ends them.
    var textLength: Int
    /// Header fields.
    var fieldCount: Int
    /// Query parameters libmicrohttpd split off the target; nil when not counted: then at most one a byte of the
    /// target and one more.
    var queryParameterCount: Int?
    /// Cookies libmicrohttpd split off the first `Cookie` header; nil when not counted: then at most one a byte of
    /// the header and one more.
    var cookieCount: Int?
    /// Bytes of the first `Cookie` header's value (libmicrohttpd copies it to split it), 0 without one.
    var cookieHeaderLength: Int

    /// What the head takes of the pool; with a count not known, the most it can take.
    var size: Int {
        let parameters = queryParameterCount ?? targetLength + 1
        let cookies = cookieCount ?? (cookieHeaderLength == 0 ? 0 : cookieHeaderLength + 1)
        return textLength + cookieCopy + Self.recordSize * (fieldCount + parameters + cookies)
    }

    /// The copy of the `Cookie` header libmicrohttpd splits (with its terminating NUL, 16-byte aligned).
    private var cookieCopy: Int {
        cookieHeaderLength == 0 ? 0 : (cookieHeaderLength + 1 + 15) / 16 * 16
    }

    /// The per-connection pool for heads of at most `maxSize`: twice it, so that heads up to about twice the limit
    /// still reach the server (and get its problem+json answer), with room left for the body being read and the
    /// response's header.
    static func connectionMemory(maxSize: Int) -> Int { 2 * maxSize }

    /// 414 when the target is longer than `maxTargetLength`, 431 when the head takes more than `maxSize`; `nil` when it
    /// is within both. The problem's `field` names the part at fault: `path` or `query` for a long target; for a large
    /// head the header field (`Cookie` for the cookies) that takes more than half of it, if one does.
    func problem(maxTargetLength: Int, maxSize: Int, rawPath: String, headers: HTTPHeaders) -> HTTPProblem? {
        if targetLength > maxTargetLength {
            return .uriTooLong(limit: maxTargetLength, field: rawPath.utf8.count > maxTargetLength ? "path" : "query")
        }
        let size = size
        guard size > maxSize else { return nil }
        var field: String?
        for (name, value) in headers where 2 * (name.utf8.count + value.utf8.count + Self.recordSize) > size {
            field = name
        }
        if 2 * (cookieHeaderLength + cookieCopy + Self.recordSize * (cookieCount ?? 0)) > size { field = "Cookie" }
        return .headerFieldsTooLarge(limit: maxSize, size: size, fieldCount: fieldCount, field: field)
    }
}

extension RequestHead {
    /// 400 unless the request names one authority (RFC 9112 §3.2): an HTTP/1.1 request carries exactly one `Host`
    /// field, and a `Host` field's value is `uri-host [":" port]` or empty; HTTP/1.0 may leave it out. The server
    /// does not use the value, but a proxy in front of it does, and a request that two readers can take for two
    /// different hosts (two fields, or a value with spaces, `/` or `@`) is refused rather than guessed at.
    static func hostProblem(http10: Bool, hosts: [String]) -> HTTPProblem? {
        if hosts.count > 1 {
            return .badRequest(detail: "The request has \(hosts.count) Host header fields; send one.", field: "Host")
        }
        guard let host = hosts.first else {
            if http10 { return nil }
            return .badRequest(detail: "An HTTP/1.1 request needs a Host header field.", field: "Host")
        }
        if !isAuthority(host) {
            return .badRequest(
                detail: "The Host header field is not a host with an optional port (RFC 3986 §3.2.2–3.2.3).",
                field: "Host")
        }
        return nil
    }

    /// Whether `value` is `uri-host [":" port]` (RFC 3986): a registered name (unreserved, sub-delims and
    /// percent-encoded characters), an IPv4 address, or an IP literal in brackets, then an optional run of digits.
    /// Empty is allowed (a target without an authority).
    static func isAuthority(_ value: String) -> Bool {
        var bytes = value.utf8[...]
        if bytes.first == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else { return false }
            let literal = bytes[bytes.index(after: bytes.startIndex)..<close]
            // Hex digits and `:` (IPv6), or IPvFuture's unreserved and sub-delims: all of them name bytes or `:`.
            guard !literal.isEmpty, literal.allSatisfy({ $0 == UInt8(ascii: ":") || isName($0) })
            else { return false }
            bytes = bytes[bytes.index(after: close)...]
        } else {
            let end = bytes.firstIndex(of: UInt8(ascii: ":")) ?? bytes.endIndex
            guard bytes[..<end].allSatisfy(isName) else { return false }
            bytes = bytes[end...]
        }
        guard let colon = bytes.first else { return true }
        return colon == UInt8(ascii: ":") && bytes.dropFirst().allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }

    /// A byte of a registered name: unreserved, sub-delims, or `%` of a percent-encoding.
    private static func isName(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "-._~%!$&'()*+,;=".utf8.contains(byte)
        }
    }
}
