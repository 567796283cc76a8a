/// An HTTP/2 wire error code (RFC 9113 §7), as carried by RST_STREAM and GOAWAY.
public struct HTTP2ErrorCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The 32-bit code on the wire.
    public var rawValue: UInt32

    /// Wraps a wire code.
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// `NO_ERROR` (0): graceful shutdown.
    public static let noError = HTTP2ErrorCode(rawValue: 0x0)
    /// `PROTOCOL_ERROR` (1).
    public static let protocolError = HTTP2ErrorCode(rawValue: 0x1)
    /// `INTERNAL_ERROR` (2).
    public static let internalError = HTTP2ErrorCode(rawValue: 0x2)
    /// `FLOW_CONTROL_ERROR` (3).
    public static let flowControlError = HTTP2ErrorCode(rawValue: 0x3)
    /// `STREAM_CLOSED` (5).
    public static let streamClosed = HTTP2ErrorCode(rawValue: 0x5)
    /// `REFUSED_STREAM` (7): the stream was not processed and can be retried.
    public static let refusedStream = HTTP2ErrorCode(rawValue: 0x7)
    /// `CANCEL` (8).
    public static let cancel = HTTP2ErrorCode(rawValue: 0x8)
    /// `ENHANCE_YOUR_CALM` (0xb).
    public static let enhanceYourCalm = HTTP2ErrorCode(rawValue: 0xb)

    /// The RFC name for known codes, `0x…` otherwise.
    public var description: String {
        switch rawValue {
        case 0x0: "NO_ERROR"
        case 0x1: "PROTOCOL_ERROR"
        case 0x2: "INTERNAL_ERROR"
        case 0x3: "FLOW_CONTROL_ERROR"
        case 0x4: "SETTINGS_TIMEOUT"
        case 0x5: "STREAM_CLOSED"
        case 0x6: "FRAME_SIZE_ERROR"
        case 0x7: "REFUSED_STREAM"
        case 0x8: "CANCEL"
        case 0x9: "COMPRESSION_ERROR"
        case 0xa: "CONNECT_ERROR"
        case 0xb: "ENHANCE_YOUR_CALM"
        case 0xc: "INADEQUATE_SECURITY"
        case 0xd: "HTTP_1_1_REQUIRED"
        default: "0x" + String(rawValue, radix: 16)
        }
    }
}

/// An error from the HTTP/2 client or server.
///
/// `description` is safe to log: it never contains header values, bodies or tokens. Library and system details
/// (OpenSSL error strings, errno text) are only in `debugDescription`.
public struct HTTP2Error: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, in a form callers can switch on. New codes may be added over time.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A stable dotted name, e.g. `http2.goaway`.
        public let name: String

        /// Creates a code.
        public init(_ name: String) { self.name = name }

        /// The name.
        public var description: String { name }

        /// The TCP connection could not be established (resolution, refusal, connect timeout).
        public static let connectFailed = Code("http2.connect_failed")
        /// The TLS handshake failed for a reason other than certificate verification.
        public static let tlsFailed = Code("http2.tls_failed")
        /// The peer's certificate chain or name did not verify.
        public static let certificateVerifyFailed = Code("http2.certificate_verify_failed")
        /// The peer did not select `h2` with ALPN.
        public static let alpnMismatch = Code("http2.alpn_mismatch")
        /// The peer sent GOAWAY and the request could not be retried (any more).
        public static let goAway = Code("http2.goaway")
        /// The peer reset the stream.
        public static let streamReset = Code("http2.stream_reset")
        /// The request's deadline passed.
        public static let timeout = Code("http2.timeout")
        /// The connection closed (or stopped answering PINGs) while the request was in flight.
        public static let connectionClosed = Code("http2.connection_closed")
        /// The peer violated the protocol, or nghttp2 reported an error.
        public static let protocolError = Code("http2.protocol_error")
        /// Too many requests are waiting for a stream.
        public static let queueFull = Code("http2.queue_full")
        /// The client or server is shutting down.
        public static let shutdown = Code("http2.shutdown")
        /// The response body grew past `maxResponseBodySize`; the stream was reset.
        public static let responseTooLarge = Code("http2.response_too_large")
        /// Every address the host resolved to is a special one (loopback, private, link-local, …) and the client
        /// was told to refuse those.
        public static let addressRefused = Code("http2.address_refused")
        /// A configuration value (certificate, key, CA file, address) is unusable.
        public static let invalidConfiguration = Code("http2.invalid_configuration")
    }

    /// The kind of error.
    public var code: Code
    /// A redacted, human-readable message.
    public var message: String
    /// Whether the server may have seen (and acted on) the request. `false` means it certainly did not.
    public var mayHaveBeenProcessed: Bool
    /// The HTTP/2 error code of a RST_STREAM or GOAWAY, when one caused the error.
    public var wireCode: HTTP2ErrorCode?
    /// Extra details for logs (OpenSSL and system error text).
    public var details: String?

    /// Creates an error.
    public init(
        _ code: Code, _ message: String, mayHaveBeenProcessed: Bool = false, wireCode: HTTP2ErrorCode? = nil,
        details: String? = nil
    ) {
        self.code = code
        self.message = message
        self.mayHaveBeenProcessed = mayHaveBeenProcessed
        self.wireCode = wireCode
        self.details = details
    }

    /// `code: message`, plus the wire code when there is one.
    public var description: String {
        var text = "\(code): \(message)"
        if let wireCode { text += " [\(wireCode)]" }
        return text
    }

    /// The description plus library details.
    public var debugDescription: String {
        var text = description
        if mayHaveBeenProcessed { text += " (may have been processed)" }
        if let details { text += " (\(details))" }
        return text
    }

    func processed(_ value: Bool) -> HTTP2Error {
        var copy = self
        copy.mayHaveBeenProcessed = value
        return copy
    }
}
