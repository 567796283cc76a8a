import Foundation

/// FCM v1 error codes (`error.details[].errorCode`, else `error.status`), each classified on purpose.
public enum FCMErrorCode: Sendable, Equatable, CustomStringConvertible {
    case unregistered
    case senderIDMismatch
    case invalidArgument
    case quotaExceeded
    case unavailable
    case internalError
    case thirdPartyAuthError
    case unauthenticated
    case permissionDenied
    case notFound
    case unknown(String)

    public init(_ text: String) {
        switch text {
        case "UNREGISTERED": self = .unregistered
        case "SENDER_ID_MISMATCH": self = .senderIDMismatch
        case "INVALID_ARGUMENT": self = .invalidArgument
        case "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED": self = .quotaExceeded
        case "UNAVAILABLE": self = .unavailable
        case "INTERNAL": self = .internalError
        case "THIRD_PARTY_AUTH_ERROR": self = .thirdPartyAuthError
        case "UNAUTHENTICATED": self = .unauthenticated
        case "PERMISSION_DENIED": self = .permissionDenied
        case "NOT_FOUND": self = .notFound
        default: self = .unknown(text)
        }
    }

    /// Whether the code blames the credential only until FCM has accepted a push sent with it, and the token after
    /// (migration 0095): SENDER_ID_MISMATCH. `decide` asks it with the worker's copy of the proof; the database's has
    /// the last word when the credential is to be marked broken (`DeliveryQueue.markCredentialBroken`).
    public var blamesCredentialUntilProven: Bool { self == .senderIDMismatch }

    public var description: String {
        switch self {
        case .unregistered: "UNREGISTERED"
        case .senderIDMismatch: "SENDER_ID_MISMATCH"
        case .invalidArgument: "INVALID_ARGUMENT"
        case .quotaExceeded: "QUOTA_EXCEEDED"
        case .unavailable: "UNAVAILABLE"
        case .internalError: "INTERNAL"
        case .thirdPartyAuthError: "THIRD_PARTY_AUTH_ERROR"
        case .unauthenticated: "UNAUTHENTICATED"
        case .permissionDenied: "PERMISSION_DENIED"
        case .notFound: "NOT_FOUND"
        case .unknown(let s): s
        }
    }

    /// Classifies a raw FCM `messages:send` answer: `body` is the response body, `retryAfter` the `Retry-After`
    /// header (clamped by `ProviderNumbers`).
    public static func decide(
        status: Int, body: [UInt8], retryAfter header: String?, credentialProven: Bool = false, now: Date = Date()
    ) -> DeliveryDecision {
        decide(
            status: status, body: body.count <= 65_536 ? try? JSONValue.parse(body, wideIntegers: .nearestDouble) : nil,
            retryAfter: ProviderNumbers.retryAfter(header, now: now), credentialProven: credentialProven)
    }

    /// Classifies an FCM `messages:send` answer. `body` is the response JSON (for errors: `{"error": {…}}`).
    /// A 401 asks for a refreshed access token; the caller turns a second 401 into a broken credential.
    /// `credentialProven`: FCM has accepted a push sent with the credential as it is now (migration 0095).
    public static func decide(status: Int, body: JSONValue?, retryAfter: Duration?, credentialProven: Bool = false)
        -> DeliveryDecision
    {
        if status == 200 {
            return .sent(providerID: ProviderNumbers.identifier(body?["name"]?.stringValue))
        }
        let error = body?["error"]
        let statusText = error?["status"]?.stringValue
        let detailCode = error?["details"]?.arrayValue?.lazy.compactMap { $0["errorCode"]?.stringValue }.first
        let code = FCMErrorCode(
            ProviderNumbers.reasonText(detailCode ?? statusText) ?? (detailCode ?? statusText).map { _ in "unreadable" }
                ?? "HTTP \(status)")
        let reason = code.description
        switch code {
        case .unregistered:
            return .retireToken(reason: reason, unregisteredAt: nil)
        case _ where code.blamesCredentialUntilProven:
            // The token is of another Firebase project than the service account's. Before the credential has worked,
            // almost always the tenant uploaded the wrong project's account, and retiring would delete every Android
            // device: the credential is at fault. Once it has worked, the token is (one registered with the public
            // sdk key must not pause the tenant's other devices).
            return credentialProven
                ? .retireToken(reason: reason, unregisteredAt: nil) : .credentialBroken(reason: reason)
        case .invalidArgument where namesToken(error):
            return .retireToken(reason: reason, unregisteredAt: nil)
        case .quotaExceeded, .unavailable, .internalError:
            return .retry(reason: reason, retryAfter: retryAfter)
        case .unauthenticated:
            return .refreshProviderToken(reason: reason)
        case .permissionDenied:
            return .credentialBroken(reason: reason)
        case .thirdPartyAuthError:
            // About the APNs or web-push credentials held in Firebase, not this service account: the push fails.
            return .fail(reason: reason)
        default:
            if status == 401 { return .refreshProviderToken(reason: reason) }
            if status == 429 || status >= 500 { return .retry(reason: reason, retryAfter: retryAfter) }
            return .fail(reason: reason)
        }
    }

    /// Whether an INVALID_ARGUMENT is about the registration token (then the token is dead), not the message.
    static func namesToken(_ error: JSONValue?) -> Bool {
        if let message = error?["message"]?.stringValue?.lowercased(), message.contains("registration token") {
            return true
        }
        for detail in error?["details"]?.arrayValue ?? [] {
            for violation in detail["fieldViolations"]?.arrayValue ?? [] {
                if violation["field"]?.stringValue == "message.token" { return true }
            }
        }
        return false
    }
}

/// What Google's OAuth2 token endpoint (or the tenant's allowed `token_uri`) answered to a JWT-bearer exchange.
public enum OAuthTokenAnswer: Sendable, Equatable {
    /// An access token and its lifetime in seconds (clamped by `ProviderNumbers.tokenLifetime`).
    case token(String, lifetime: TimeInterval)
    /// No token: what to do with the delivery that needed it.
    case failed(DeliveryDecision)

    /// OAuth2 error codes that reject the service account itself (RFC 6749 §5.2).
    static let rejections: Set<String> = [
        "invalid_grant", "invalid_client", "unauthorized_client", "invalid_scope", "invalid_request",
        "unsupported_grant_type", "access_denied",
    ]

    /// Whether an `invalid_grant`'s description is about the assertion's `iat` or `exp` (Google: "Invalid JWT: Token
    /// must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the
    /// JWT claim."). The worker signs `iat` with its own clock the moment it asks, so such a refusal means the clocks
    /// disagree.
    static func isAboutTime(_ description: String?) -> Bool {
        guard let description, description.utf8.count <= 1024 else { return false }
        let words = description.lowercased().split { !$0.isLetter }
        return words.contains("iat") || words.contains("exp")
    }

    /// Whether `token` can go into `authorization: Bearer …` as it is: 1 to 8,192 bytes of RFC 6750's `b64token`
    /// (letters, digits, `-._~+/`, then any `=`). Anything else from the endpoint (a CR or LF splitting the header, a
    /// space, a control character) is an unreadable answer, never sent on.
    static func isBearerToken(_ token: String) -> Bool {
        let bytes = Array(token.utf8)
        guard (1...8192).contains(bytes.count) else { return false }
        let body = bytes.prefix { $0 != UInt8(ascii: "=") }
        guard !body.isEmpty, bytes.dropFirst(body.count).allSatisfy({ $0 == UInt8(ascii: "=") }) else { return false }
        return body.allSatisfy { b in
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"):
                return true
            default:
                return "-._~+/".utf8.contains(b)
            }
        }
    }

    /// Classifies a token-endpoint answer. Only a definite rejection (a 400/401/403, or another 4xx naming an OAuth2
    /// error) breaks the credential; 408, 429, 5xx and anything unreadable are passing and retried, honouring a
    /// clamped `Retry-After`. An `invalid_grant` that is about time (`isAboutTime`) or comes while the endpoint's
    /// `date` disagrees with this host's clock is the clock's doing, not the credential's: retried as `clock_skew`.
    public static func decide(
        status: Int, body: [UInt8], retryAfter header: String?, date: String? = nil, now: Date = Date()
    )
        -> OAuthTokenAnswer
    {
        let json = body.count <= 65_536 ? try? JSONValue.parse(body, wideIntegers: .nearestDouble) : nil
        if status == 200, let token = json?["access_token"]?.stringValue, isBearerToken(token) {
            return .token(token, lifetime: ProviderNumbers.tokenLifetime(json?["expires_in"]))
        }
        let code = json?["error"]?.stringValue.flatMap { rejections.contains($0) ? $0 : nil }
        if (400..<500).contains(status), code == "invalid_grant",
            isAboutTime(json?["error_description"]?.stringValue)
                || ProviderNumbers.clockSkew(date: date, now: now) != nil
        {
            return .failed(DeliveryReason.clockSkewed)
        }
        switch status {
        case 400, 401, 403:
            return .failed(.credentialBroken(reason: "oauth_" + (code ?? "rejected")))
        case 400..<500 where status != 408 && status != 429 && code != nil:
            return .failed(.credentialBroken(reason: "oauth_" + code!))
        default:
            return .failed(
                .retry(reason: "oauth_unavailable", retryAfter: ProviderNumbers.retryAfter(header, now: now)))
        }
    }
}
