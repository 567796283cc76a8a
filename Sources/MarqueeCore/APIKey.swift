/// API key kinds: the product team's server (`app`) or devices (`sdk`).
public enum APIKeyKind: String, Sendable, CaseIterable, Codable {
    /// Full access for the product team's server.
    case app
    /// Devices: may register and report, may not read data or trigger sends.
    case sdk
}

/// The text form of an API key: `mq_<kind>_<tenant>_<secret>`.
///
/// The tenant ID (32 hex digits) is part of the key so that a key is looked up by (tenant, hash) — every index
/// keyed by tenant first — and the secret is 43 base64url characters (256 bits). Only the SHA-256 of the whole text
/// is stored.
public struct APIKeyText: Sendable, Equatable {
    public var kind: APIKeyKind
    /// The tenant, as 32 lowercase hex digits (a UUID without dashes).
    public var tenantHex: String
    public var secret: String

    public init(kind: APIKeyKind, tenantHex: String, secret: String) {
        self.kind = kind
        self.tenantHex = tenantHex
        self.secret = secret
    }

    /// The whole key as shown to its owner once.
    public var text: String { "mq_\(kind.rawValue)_\(tenantHex)_\(secret)" }

    /// The first characters of the secret, safe to list.
    public var hint: String { "mq_\(kind.rawValue)_…\(secret.prefix(6))" }

    /// Parses a presented key; nil when it is not of this form (the caller answers 401 either way).
    public init?(parsing text: String) {
        let parts = text.split(separator: "_", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "mq", let kind = APIKeyKind(rawValue: String(parts[1])),
            parts[2].utf8.count == 32, parts[2].utf8.allSatisfy(Identifiers.isHexDigit),
            (20...128).contains(parts[3].utf8.count),
            parts[3].utf8.allSatisfy({ Identifiers.isAlphanumeric($0) || $0 == 0x2D || $0 == 0x5F })
        else { return nil }
        self.kind = kind
        self.tenantHex = parts[2].lowercased()
        self.secret = String(parts[3])
    }

    /// The tenant as a UUID string (8-4-4-4-12).
    public var tenantUUIDString: String {
        let h = Array(tenantHex)
        return String(h[0..<8]) + "-" + String(h[8..<12]) + "-" + String(h[12..<16]) + "-" + String(h[16..<20]) + "-"
            + String(h[20..<32])
    }
}
