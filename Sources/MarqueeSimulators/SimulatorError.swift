/// An error of the APNs or FCM simulator: bad configuration or an I/O failure while starting.
///
/// `description` is safe to log (no keys or tokens); `debugDescription` adds the underlying details.
public struct SimulatorError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, extensible.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// The code's name, e.g. `simulator.invalid_configuration`.
        public let name: String

        /// Creates a code.
        public init(_ name: String) { self.name = name }

        /// The code's name.
        public var description: String { name }

        /// A key file, fault rule or other setting is unusable.
        public static let invalidConfiguration = Code("simulator.invalid_configuration")
        /// The TLS material could not be created.
        public static let certificateFailed = Code("simulator.certificate_failed")
        /// A file (CA output, records) could not be written.
        public static let ioFailed = Code("simulator.io_failed")
    }

    /// The kind of failure.
    public var code: Code
    /// A redacted message.
    public var message: String
    /// Underlying details (may name paths; never keys).
    public var details: String?

    /// Creates an error.
    public init(_ code: Code, _ message: String, details: String? = nil) {
        self.code = code
        self.message = message
        self.details = details
    }

    /// `code: message`.
    public var description: String { "\(code): \(message)" }

    /// `description` plus details.
    public var debugDescription: String {
        guard let details else { return description }
        return "\(description) (\(details))"
    }
}
