/// How a request's body is delimited, read once from its header fields when they arrive: the body limit, the route's
/// admission, the body budget and the reading of the body all go by it.
///
/// It follows libmicrohttpd 0.9.75, which reads the body (`parse_connection_headers`): by `Transfer-Encoding` whenever
/// that field is present, ignoring `Content-Length` (chunked when its first value is `chunked` in any case, else
/// until the connection ends); otherwise by the first `Content-Length`, digits up to 2^64 − 1 (anything else it
/// answers itself, 400 or 413). Where the header fields could be read two ways, or name a framing the server does not
/// take, the request is refused before any of its body is read (RFC 9112 §6.1, §6.3), with `bad-request`:
/// - both `Transfer-Encoding` and `Content-Length` (`field` `Transfer-Encoding`): a proxy in front could take the body
///   by its length and the server by its chunks, and a second request would hide in the first (request smuggling);
///   libmicrohttpd itself would read a body the length never announced, past the limit checked against it;
/// - a `Transfer-Encoding` other than one field `chunked`, or one in an HTTP/1.0 request (`field`
///   `Transfer-Encoding`): RFC 9112 suggests 501 for a coding not understood; the server answers 400 as it does for
///   every request it will not read;
/// - a `Content-Length` that is not digits, or fields that disagree (`field` `Content-Length`).
///
/// A `Content-Length` too large for `Int` (libmicrohttpd takes up to 2^64 − 1) is over any body limit, and answered
/// 413 before the body like any other length over the limit.
enum BodyFraming: Equatable {
    /// Neither field: no body.
    case none
    /// `Content-Length` bytes.
    case length(Int)
    /// A `Content-Length` beyond `Int.max`.
    case tooLong
    /// `Transfer-Encoding: chunked`: the length is known when the last chunk comes.
    case chunked
    /// Refused before the body is read, and the connection closed.
    case refused(HTTPProblem)

    init(_ headers: HTTPHeaders, http10: Bool) {
        let encodings = headers.values("Transfer-Encoding")
        let lengths = headers.values("Content-Length")
        if !encodings.isEmpty {
            if !lengths.isEmpty {
                self = .refused(
                    .badRequest(
                        detail: "The request has both Transfer-Encoding and Content-Length; send one (RFC 9112 §6.1).",
                        field: "Transfer-Encoding"))
            } else if http10 {
                self = .refused(
                    .badRequest(
                        detail: "An HTTP/1.0 request cannot use Transfer-Encoding; send Content-Length.",
                        field: "Transfer-Encoding"))
            } else if encodings.count == 1, HTTPHeaders.namesEqual(encodings[0], "chunked") {
                self = .chunked
            } else {
                self = .refused(
                    .badRequest(
                        detail: "The only Transfer-Encoding taken is one field 'chunked'.", field: "Transfer-Encoding"))
            }
            return
        }
        guard let first = lengths.first else {
            self = .none
            return
        }
        // Digits only, as libmicrohttpd reads the first field; leading zeros do not make two values differ.
        func digits(_ value: String) -> Substring? {
            guard !value.isEmpty, value.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            let significant = value.drop { $0 == "0" }
            return significant.isEmpty ? "0" : significant
        }
        guard let length = digits(first), lengths.dropFirst().allSatisfy({ digits($0) == length }) else {
            self = .refused(
                .badRequest(
                    detail: lengths.count == 1
                        ? "Content-Length is not a number of bytes."
                        : "The request has \(lengths.count) Content-Length fields that are not all one number of "
                            + "bytes.",
                    field: "Content-Length"))
            return
        }
        self = Int(length).map { .length($0) } ?? .tooLong
    }

    /// The problem that refuses the request, if it is refused.
    var problem: HTTPProblem? {
        if case .refused(let problem) = self { return problem }
        return nil
    }

    /// The announced length, when it is known before the body and fits in `Int`.
    var length: Int? {
        if case .length(let length) = self { return length }
        return nil
    }

    /// Whether a body follows the head.
    var hasBody: Bool {
        switch self {
        case .length(let length): length > 0
        case .tooLong, .chunked: true
        case .none, .refused: false
        }
    }

    /// Whether the body is announced longer than `limit`.
    func exceeds(_ limit: Int) -> Bool {
        switch self {
        case .length(let length): length > limit
        case .tooLong: true
        case .none, .chunked, .refused: false
        }
    }
}
