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
