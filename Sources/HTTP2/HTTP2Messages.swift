/// A request sent by `HTTP2Client`.
public struct HTTP2Request: Sendable {
    /// The method, `POST` by default.
    public var method: String
    /// The `:path`, e.g. `/3/device/…`.
    public var path: String
    /// The `:authority`; `nil` uses the client's host (and port when it is not 443).
    public var authority: String?
    /// Regular headers. Names are sent in lower case.
    public var headers: [(String, String)]
    /// The body; empty sends no DATA frame.
    public var body: [UInt8]
    /// The deadline for this request from the moment it is sent; `nil` uses the client's `requestTimeout`.
    public var timeout: Duration?

    /// Creates a request.
    public init(
        method: String = "POST", path: String, authority: String? = nil, headers: [(String, String)] = [],
        body: [UInt8] = [], timeout: Duration? = nil
    ) {
        self.method = method
        self.path = path
        self.authority = authority
        self.headers = headers
        self.body = body
        self.timeout = timeout
    }
}

/// A response received by `HTTP2Client`.
public struct HTTP2Response: Sendable {
    /// The `:status`.
    public var status: Int
    /// Response headers (lower-case names, in arrival order), trailers appended.
    public var headers: [(String, String)]
    /// The body.
    public var body: [UInt8]

    /// Creates a response.
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// The first value of header `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        let lowered = lowercasedHeaderName(name)
        return headers.first { $0.0 == lowered }?.1
    }
}

/// A request received by `HTTP2Server`.
public struct HTTP2ServerRequest: Sendable {
    /// The `:method`.
    public var method: String
    /// The `:path`.
    public var path: String
    /// The `:authority`, if sent.
    public var authority: String?
    /// The `:scheme`, if sent.
    public var scheme: String?
    /// Regular headers (lower-case names).
    public var headers: [(String, String)]
    /// The body.
    public var body: [UInt8]
    /// An identifier of the connection the request arrived on (unique within the process).
    public var connectionID: Int
    /// The HTTP/2 stream ID.
    public var streamID: Int32

    /// Creates a request (the server builds these; tests may too).
    public init(
        method: String, path: String, authority: String? = nil, scheme: String? = nil,
        headers: [(String, String)] = [], body: [UInt8] = [], connectionID: Int = 0, streamID: Int32 = 1
    ) {
        self.method = method
        self.path = path
        self.authority = authority
        self.scheme = scheme
        self.headers = headers
        self.body = body
        self.connectionID = connectionID
        self.streamID = streamID
    }

    /// The first value of header `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        let lowered = lowercasedHeaderName(name)
        return headers.first { $0.0 == lowered }?.1
    }
}

/// What `HTTP2Server` does with a stream: answer it, or inject a failure.
public struct HTTP2ServerResponse: Sendable {
    enum Kind: Sendable {
        case response(status: Int, headers: [(String, String)], body: [UInt8])
        case goAway(HTTP2ErrorCode)
        case reset(HTTP2ErrorCode)
    }

    let kind: Kind

    /// A normal response.
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        kind = .response(status: status, headers: headers, body: body)
    }

    private init(kind: Kind) { self.kind = kind }

    /// Answers nothing for this stream; sends GOAWAY with a last stream ID below it (so this stream and later ones
    /// count as unprocessed) and closes the connection once the earlier streams have finished.
    public static func goAway(errorCode: HTTP2ErrorCode = .noError) -> HTTP2ServerResponse {
        HTTP2ServerResponse(kind: .goAway(errorCode))
    }

    /// Resets the stream (e.g. `.refusedStream`, which clients may retry).
    public static func reset(errorCode: HTTP2ErrorCode) -> HTTP2ServerResponse {
        HTTP2ServerResponse(kind: .reset(errorCode))
    }
}

/// How a server's responder answers a request: at once, on the connection's I/O thread, or later, from a task of
/// `HTTP2Server.run()`.
///
/// `.now` costs no task and no hand-off between threads (for answers computed in microseconds without blocking);
/// anything that waits, sleeps or takes long belongs in `.later`, since it would hold up every connection of that
/// I/O thread.
public enum HTTP2ServerReply: Sendable {
    case now(HTTP2ServerResponse)
    case later(@Sendable () async -> HTTP2ServerResponse)
}
