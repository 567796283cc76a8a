import COpenSSL

/// The one error type thrown by the `Crypto` module.
///
/// `description` is safe to log or show to a client: it names what went wrong and what was expected, and never
/// contains key material, PEM text, tokens or plaintext. `debugDescription` adds the OpenSSL error queue, which
/// carries library reason strings only (no secrets), for server-side logs.
public struct CryptoError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What kind of failure this is. Extensible: new codes may be added without breaking callers.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        /// A key could not be parsed, or has the wrong size or format.
        public static let invalidKey = Code("invalidKey")
        /// A key parsed, but is not of the kind required (for example an RSA key given to ES256, or P-384).
        public static let unsupportedKeyType = Code("unsupportedKeyType")
        /// An RSA key is shorter than 2048 bits.
        public static let keyTooSmall = Code("keyTooSmall")
        /// An RSA key is longer than 4096 bits (each signature would cost too much).
        public static let keyTooLarge = Code("keyTooLarge")
        /// Key generation failed inside OpenSSL.
        public static let keyGenerationFailed = Code("keyGenerationFailed")
        /// Encryption failed.
        public static let sealFailed = Code("sealFailed")
        /// Decryption failed: the blob is malformed, was altered, or the key or associated data is wrong.
        public static let openFailed = Code("openFailed")
        /// A sealed blob names a key ID that the key ring does not hold.
        public static let unknownKeyID = Code("unknownKeyID")
        /// Signing failed inside OpenSSL.
        public static let signFailed = Code("signFailed")
        /// A JWT is not three base64url parts with JSON-object header and claims.
        public static let malformedToken = Code("malformedToken")
        /// A JWT signature does not verify.
        public static let badSignature = Code("badSignature")
        /// A JWT's `alg` header is not the verifier's algorithm.
        public static let algorithmMismatch = Code("algorithmMismatch")
        /// Building or encoding a certificate failed.
        public static let certificateFailed = Code("certificateFailed")

        /// The code's name, e.g. `invalidKey`.
        public var description: String { name }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A redacted, human-readable explanation, safe for logs and API responses.
    public var message: String
    /// Extra detail for server logs only (OpenSSL reason strings, sizes); never key material.
    public var details: String?

    /// Creates an error. `message` must not contain secrets; put diagnostic detail in `details`.
    public init(_ code: Code, _ message: String, details: String? = nil) {
        self.code = code
        self.message = message
        self.details = details
    }

    /// `Crypto.<code>: <message>`; never contains key material.
    public var description: String { "Crypto.\(code): \(message)" }

    /// The description plus `details`.
    public var debugDescription: String {
        guard let details, !details.isEmpty else { return description }
        return "\(description) [\(details)]"
    }

    /// Builds an error and drains the thread's OpenSSL error queue into `details`, so a stale entry can never be
    /// misread by a later, unrelated OpenSSL call on the same thread.
    static func openSSL(_ code: Code, _ message: String) -> CryptoError {
        let queue = drainOpenSSLErrors()
        return CryptoError(code, message, details: queue.isEmpty ? nil : "openssl: " + queue.joined(separator: "; "))
    }
}

/// Empties the calling thread's OpenSSL error queue and returns its entries as reason strings.
func drainOpenSSLErrors() -> [String] {
    var entries: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        let end = buffer.firstIndex(of: 0) ?? buffer.count
        entries.append(String(decoding: buffer[..<end].map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return entries
}
