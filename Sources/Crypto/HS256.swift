import Foundation
import JSON

/// HS256 JSON Web Tokens (RFC 7519, HMAC-SHA256 per RFC 7518 §3.2): the short-lived user tokens a tenant's server
/// mints for one person, so that a device's writes can be bound to that person although the sdk key is public.
///
/// Verification is strict: the header and claims must be JSON objects that name each key once (a parser keeping the
/// first of two `sub`s and one keeping the last would read different persons), the header's `alg` must be exactly `HS256` (no `none`, no RS/ES confusion), `crit` is
/// refused, the signature is compared in constant time against each accepted secret (current and, during a
/// rotation's grace period, previous), `sub` must be a non-empty string and `exp` an integer that is neither past
/// nor further ahead than `maxLifetime`.
public enum HS256 {
    /// What a verified token says.
    public struct Claims: Sendable, Equatable {
        /// The person the token is for (`sub`).
        public var subject: String
        /// `exp`, in seconds since the epoch.
        public var expiresAt: Int64
        /// `email`, when the token vouches for the person's email too (a string claim; anything else is ignored).
        public var email: String?

        public init(subject: String, expiresAt: Int64, email: String? = nil) {
            self.subject = subject
            self.expiresAt = expiresAt
            self.email = email
        }
    }

    /// Why a token was refused. Descriptions never quote the token.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        case malformed
        case algorithm
        case signature
        case missingSubject
        case missingExpiry
        case expired
        case notYetValid
        case lifetimeTooLong

        public var description: String {
            switch self {
            case .malformed: "is not a JWT (three base64url parts with JSON objects, each naming a key once)"
            case .algorithm: "must be signed with alg HS256"
            case .signature: "has a signature that does not verify"
            case .missingSubject: "has no sub claim"
            case .missingExpiry: "has no integer exp claim"
            case .expired: "has expired"
            case .notYetValid: "is not valid yet (nbf)"
            case .lifetimeTooLong: "expires too far in the future"
            }
        }
    }

    /// The longest token accepted, in bytes.
    public static let maxLength = 4096

    /// Signs `{"sub": subject, "exp": expiresAt}`, with `email` when given (what a tenant's server does; used by tests
    /// and tools).
    public static func sign(subject: String, expiresAt: Int64, secret: [UInt8], email: String? = nil) -> String {
        let header = Base64URL.encode(Array(#"{"alg":"HS256","typ":"JWT"}"#.utf8))
        var claims: [String: JSONClaim] = ["sub": .string(subject), "exp": .int(expiresAt)]
        if let email { claims["email"] = .string(email) }
        let payload = Base64URL.encode((try? JSONEncoder().encode(claims)).map(Array.init) ?? [])
        let input = header + "." + payload
        return input + "." + Base64URL.encode(HMACSHA256.authenticationCode(key: secret, message: Array(input.utf8)))
    }

    /// Verifies `token` against any of `secrets` at `now` (seconds since the epoch), allowing `leeway` seconds of
    /// clock skew, and refusing an `exp` more than `maxLifetime` seconds ahead.
    public static func verify(
        _ token: String, secrets: [[UInt8]], now: Int64, maxLifetime: Int64 = 86_400, leeway: Int64 = 60
    ) throws(Failure) -> Claims {
        guard token.utf8.count <= maxLength else { throw .malformed }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = Base64URL.decode(parts[0]),
            let payloadBytes = Base64URL.decode(parts[1]), let signature = Base64URL.decode(parts[2]),
            let header = object(headerBytes), let payload = object(payloadBytes)
        else { throw .malformed }
        guard header["alg"] == .string("HS256"), header["crit"] == nil else { throw .algorithm }
        let input = Array(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        var matched = false
        for secret in secrets where !secret.isEmpty {
            // Every secret is tried, so the time taken does not say which one matched.
            if ConstantTime.equals(HMACSHA256.authenticationCode(key: secret, message: input), signature) {
                matched = true
            }
        }
        guard matched else { throw .signature }
        guard case .string(let subject)? = payload["sub"], !subject.isEmpty else { throw .missingSubject }
        guard case .int(let exp)? = payload["exp"] else { throw .missingExpiry }
        guard exp > now - leeway else { throw .expired }
        guard exp <= now + maxLifetime + leeway else { throw .lifetimeTooLong }
        if let nbf = payload["nbf"] {
            guard case .int(let notBefore) = nbf, notBefore <= now + leeway else { throw .notYetValid }
        }
        var email: String?
        if case .string(let claimed)? = payload["email"] { email = claimed }
        return Claims(subject: subject, expiresAt: exp, email: email)
    }

    /// The header or claims: a JSON object that names each key once (``JSONClaim/object(_:)``), or nil.
    static func object(_ bytes: [UInt8]) -> [String: JSONClaim]? { JSONClaim.object(bytes) }
}
