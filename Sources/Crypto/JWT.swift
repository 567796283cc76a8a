import Foundation
import JSON

/// A JSON value in a JWT header or claims set.
public enum JSONClaim: Sendable, Equatable, Codable {
    /// A JSON string.
    case string(String)
    /// A JSON number that is an integer (e.g. `iat`, `exp`).
    case int(Int64)
    /// Any other JSON number.
    case double(Double)
    /// `true` or `false`.
    case bool(Bool)
    /// A JSON array (e.g. a multi-valued `aud`).
    case array([JSONClaim])
    /// A nested JSON object.
    case object([String: JSONClaim])
    /// JSON `null`.
    case null

    /// Decodes any JSON value; integers that fit `Int64` become `.int`, other numbers `.double`.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .int(value)
        } else if let value = try? container.decode(Double.self) {
            self = .double(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONClaim].self) {
            self = .array(value)
        } else if let value = try? container.decode([String: JSONClaim].self) {
            self = .object(value)
        } else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "unsupported JSON value")
        }
    }

    /// The JSON object `bytes` hold, parsed by `JSONValue` (MarqueeCore): nil for anything else, and for an object
    /// that names a key twice (Foundation's decoder keeps the first, other parsers the last, so the header or claims
    /// this service checks could differ from those another reader of the same token sees).
    static func object(_ bytes: [UInt8]) -> [String: JSONClaim]? {
        guard case .object(let object)? = try? JSONValue.parse(bytes) else { return nil }
        return object.mapValues(JSONClaim.init)
    }

    /// The same value as a claim.
    init(_ value: JSONValue) {
        switch value {
        case .null: self = .null
        case .bool(let b): self = .bool(b)
        case .int(let i): self = .int(i)
        case .double(let d): self = .double(d)
        case .string(let s): self = .string(s)
        case .array(let a): self = .array(a.map(JSONClaim.init))
        case .object(let o): self = .object(o.mapValues(JSONClaim.init))
        }
    }

    /// Encodes as the plain JSON value.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .bool(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        case .null: try container.encodeNil()
        }
    }

    /// The string, if this is `.string`.
    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// The integer, if this is `.int` (or a `.double` with an exact integer value).
    public var intValue: Int64? {
        switch self {
        case .int(let value): return value
        case .double(let value): return Int64(exactly: value)
        default: return nil
        }
    }

    /// The number as a `Double`, if this is `.int` or `.double`.
    public var doubleValue: Double? {
        switch self {
        case .int(let value): return Double(value)
        case .double(let value): return value
        default: return nil
        }
    }

    /// The Boolean, if this is `.bool`.
    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }
}

extension JSONClaim: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByFloatLiteral
{
    /// A `.string` literal.
    public init(stringLiteral value: String) { self = .string(value) }
    /// An `.int` literal.
    public init(integerLiteral value: Int64) { self = .int(value) }
    /// A `.bool` literal.
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    /// A `.double` literal.
    public init(floatLiteral value: Double) { self = .double(value) }
}

/// Compact-serialization JWS/JWT signing and verification (RFC 7515, RFC 7519).
public enum JWT {
    /// Signs `claims` and returns `base64url(header).base64url(claims).base64url(signature)`.
    ///
    /// The header is `{"alg":<signer.algorithm>,"typ":"JWT"}` plus `header` (e.g. `kid`); `alg` always comes from
    /// the signer. JSON keys are sorted, so equal input gives equal signing input.
    public static func sign(
        claims: [String: JSONClaim], header: [String: String] = [:], signer: some JWTSigner
    ) throws -> String {
        var fullHeader: [String: JSONClaim] = ["typ": "JWT"]
        for (name, value) in header { fullHeader[name] = .string(value) }
        fullHeader["alg"] = .string(signer.algorithm)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let headerJSON: Data
        let claimsJSON: Data
        do {
            headerJSON = try encoder.encode(fullHeader)
            claimsJSON = try encoder.encode(claims)
        } catch {
            throw CryptoError(.malformedToken, "JWT claims could not be encoded as JSON", details: "\(error)")
        }
        let signingInput = Base64URL.encode(headerJSON) + "." + Base64URL.encode(claimsJSON)
        let signature = try signer.sign(Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Parses `token`, checks that its `alg` is the verifier's, and verifies the signature. Returns the header and
    /// claims. Does not check `exp`, `nbf`, `iat`, `aud` or `iss`; the caller does, with its own clock.
    public static func verify(
        _ token: String, verifier: some JWTVerifier
    ) throws -> (header: [String: JSONClaim], claims: [String: JSONClaim]) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            throw CryptoError(.malformedToken, "a JWT must have three dot-separated parts")
        }
        guard let headerBytes = Base64URL.decode(parts[0]), let header = decodeObject(headerBytes) else {
            throw CryptoError(.malformedToken, "the JWT header is not base64url-encoded JSON object")
        }
        guard case .string(let algorithm)? = header["alg"] else {
            throw CryptoError(.malformedToken, "the JWT header has no alg")
        }
        guard algorithm == verifier.algorithm else {
            throw CryptoError(
                .algorithmMismatch, "expected a JWT signed with \(verifier.algorithm)",
                details: "token alg is \(algorithm.prefix(16))")
        }
        guard let signature = Base64URL.decode(parts[2]) else {
            throw CryptoError(.malformedToken, "the JWT signature is not base64url")
        }
        let signingInput = Array(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard verifier.verify(signature: signature, message: signingInput) else {
            throw CryptoError(.badSignature, "the JWT signature does not verify")
        }
        guard let claimsBytes = Base64URL.decode(parts[1]), let claims = decodeObject(claimsBytes) else {
            throw CryptoError(.malformedToken, "the JWT claims are not a base64url-encoded JSON object")
        }
        return (header, claims)
    }

    private static func decodeObject(_ bytes: [UInt8]) -> [String: JSONClaim]? { JSONClaim.object(bytes) }
}
