/// What the server reports once per request, when the request is over (response sent, or the exchange
/// failed). Apps use it for access logs and latency histograms by route and status.
public struct AccessLogRecord: Sendable {
    /// The request method.
    public var method: HTTPMethod
    /// The percent-decoded request path, without the query string.
    public var path: String
    /// The matched route pattern, nil when routing did not happen or found nothing (404).
    public var route: String?
    /// The status sent, or 0 if no response was produced (the client went away first).
    public var status: Int
    /// Body bytes received.
    public var bytesIn: Int
    /// Body bytes in the response.
    public var bytesOut: Int
    /// From the end of the request headers to the end of the exchange.
    public var duration: Duration
    /// The request ID (echoed or generated), also sent as `X-Request-Id`.
    public var requestID: String
    /// The client's IP address, when known (behind a trusted proxy, the one it names: `HTTPRequest.remoteAddress`).
    public var remoteAddress: String?
    /// The connection's other end: the proxy's address behind one, else the client's.
    public var peerAddress: String?
    /// The `User-Agent` header.
    public var userAgent: String?
    /// `String(describing:)` of a non-problem error the handler threw (the client only saw a 500 with the
    /// request ID). For server-side logs only: it may contain anything the error carried.
    public var handlerError: String?
    /// Whether the response was handed to the client completely.
    public var completed: Bool
    /// Why the server refused the request's body without running the handler, if it did (a 413 or a 503).
    public var bodyRejection: BodyRejection?

    /// Creates a record.
    public init(
        method: HTTPMethod, path: String, route: String?, status: Int, bytesIn: Int, bytesOut: Int,
        duration: Duration, requestID: String, remoteAddress: String?, userAgent: String?,
        handlerError: String? = nil, completed: Bool = true, bodyRejection: BodyRejection? = nil,
        peerAddress: String? = nil
    ) {
        self.method = method
        self.path = path
        self.route = route
        self.status = status
        self.bytesIn = bytesIn
        self.bytesOut = bytesOut
        self.duration = duration
        self.requestID = requestID
        self.remoteAddress = remoteAddress
        self.peerAddress = peerAddress ?? remoteAddress
        self.userAgent = userAgent
        self.handlerError = handlerError
        self.completed = completed
        self.bodyRejection = bodyRejection
    }
}

/// Why the server refused a request body before the handler ran.
public enum BodyRejection: String, Sendable, CaseIterable {
    /// Larger than the route's limit (or the server's `maxBodySize`): 413 `payload-too-large`.
    case tooLarge = "too_large"
    /// Taking it would have put the server over `maxBufferedBodySize`: 503 `service-unavailable`.
    case overBudget = "over_budget"
}
