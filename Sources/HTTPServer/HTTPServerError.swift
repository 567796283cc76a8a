/// Errors from starting or configuring the server.
///
/// `description` never contains request data; `debugDescription` adds system details (errno text etc.).
public struct HTTPServerError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, extensible.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A stable dotted name, e.g. `http.bind_failed`.
        public var name: String
        /// Creates a code.
        public init(_ name: String) { self.name = name }
        /// The name.
        public var description: String { name }

        /// The configuration is invalid (host not numeric, port out of range…).
        public static let invalidConfiguration = Code("http.invalid_configuration")
        /// The daemon could not start, typically because the address could not be bound.
        public static let bindFailed = Code("http.bind_failed")
        /// `start()` was called on a server that is running or was stopped.
        public static let invalidState = Code("http.invalid_state")
    }

    /// The kind of error.
    public var code: Code
    /// A redacted, human-readable message.
    public var message: String
    /// Extra details for logs (system error text and the like).
    public var details: String?

    /// Creates an error.
    public init(_ code: Code, _ message: String, details: String? = nil) {
        self.code = code
        self.message = message
        self.details = details
    }

    /// `code: message`.
    public var description: String { "\(code): \(message)" }

    /// `code: message (details)`.
    public var debugDescription: String {
        details.map { "\(description) (\($0))" } ?? description
    }
}
