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

    /// Classifies an FCM `messages:send` answer. `body` is the response JSON (for errors: `{"error": {…}}`).
    /// A 401 asks for a refreshed access token; the caller turns a second 401 into a broken credential.
    public static func decide(status: Int, body: JSONValue?, retryAfter: Duration?) -> DeliveryDecision {
        if status == 200 { return .sent(providerID: body?["name"]?.stringValue) }
        let error = body?["error"]
        let statusText = error?["status"]?.stringValue
        let detailCode = error?["details"]?.arrayValue?.lazy.compactMap { $0["errorCode"]?.stringValue }.first
        let code = FCMErrorCode(detailCode ?? statusText ?? "HTTP \(status)")
        let reason = code.description
        switch code {
        case .unregistered, .senderIDMismatch:
            return .retireToken(reason: reason, unregisteredAt: nil)
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
