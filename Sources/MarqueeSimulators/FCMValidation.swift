import Crypto
import Foundation
import MarqueeCore

/// An OAuth 2.0 token-endpoint error: `{"error": …, "error_description": …}` with status 400.
struct OAuthRejection: Error, Equatable, Sendable {
    var error: String
    var description: String

    init(_ error: String, _ description: String) {
        self.error = error
        self.description = description
    }
}

/// An FCM v1 error: HTTP status, canonical `status`, optional `FcmError` code, message.
struct FCMRejection: Error, Equatable, Sendable {
    var httpStatus: Int
    var status: String
    var errorCode: String?
    var message: String

    init(_ httpStatus: Int, _ status: String, errorCode: String?, _ message: String) {
        self.httpStatus = httpStatus
        self.status = status
        self.errorCode = errorCode
        self.message = message
    }

    static func invalidArgument(_ message: String) -> FCMRejection {
        FCMRejection(400, "INVALID_ARGUMENT", errorCode: "INVALID_ARGUMENT", message)
    }

    static func unauthenticated(_ message: String) -> FCMRejection {
        FCMRejection(401, "UNAUTHENTICATED", errorCode: nil, message)
    }

    /// The reason under which `/_sim/stats` counts it.
    var reason: String { errorCode ?? status }

    /// `{"error":{"code","message","status","details"?}}`.
    var json: JSONValue {
        var error: [String: JSONValue] = [
            "code": .int(Int64(httpStatus)), "message": .string(message), "status": .string(status),
        ]
        if let errorCode {
            error["details"] = .array([
                .object([
                    "@type": .string("type.googleapis.com/google.firebase.fcm.v1.FcmError"),
                    "errorCode": .string(errorCode),
                ])
            ])
        }
        return .object(["error": .object(error)])
    }
}

/// A message that passed validation.
struct FCMAcceptedMessage: Sendable, Equatable {
    var token: String
    var data: [String: String]
    var priority: String?
    var ttl: String?
    var collapseKey: String?
    var validateOnly: Bool
    /// The `message` object as sent.
    var message: JSONValue
}

/// The checks Google makes on the token endpoint and on `messages:send`, without sockets.
enum FCMValidator {
    static let grantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    static let messagingScope = "https://www.googleapis.com/auth/firebase.messaging"
    static let maxDataBytes = 4096
    static let maxAssertionLifetime: TimeInterval = 3600

    /// Checks a token request and returns the service account whose key signed the assertion.
    static func verifyTokenRequest(
        body: [UInt8], contentType: String?, accounts: [String: FCMSimulator.ServiceAccount], audiences: [String],
        now: Date, skew: TimeInterval
    ) throws(OAuthRejection) -> FCMSimulator.ServiceAccount {
        guard let contentType, contentType.lowercased().hasPrefix("application/x-www-form-urlencoded") else {
            throw OAuthRejection("invalid_request", "the body must be application/x-www-form-urlencoded")
        }
        let form = HTTPText.parseForm(String(decoding: body, as: UTF8.self))
        guard let grant = form["grant_type"] else { throw OAuthRejection("invalid_request", "grant_type is missing") }
        guard grant == grantType else {
            throw OAuthRejection("unsupported_grant_type", "only the JWT bearer grant is supported")
        }
        guard let assertion = form["assertion"], !assertion.isEmpty else {
            throw OAuthRejection("invalid_request", "assertion is missing")
        }
        guard let jwt = UnverifiedJWT(assertion) else {
            throw OAuthRejection("invalid_grant", "the assertion is not a compact JWT")
        }
        guard jwt.header["alg"]?.stringValue == "RS256" else {
            throw OAuthRejection("invalid_grant", "the assertion must be signed with RS256")
        }
        guard let issuer = jwt.claims["iss"]?.stringValue, let account = accounts[issuer] else {
            throw OAuthRejection("invalid_grant", "the assertion's issuer is not a known service account")
        }
        guard (try? JWT.verify(assertion, verifier: account.publicKey)) != nil else {
            throw OAuthRejection("invalid_grant", "the assertion's signature does not verify")
        }
        try checkAssertionClaims(jwt.claims, audiences: audiences, now: now, skew: skew)
        return account
    }

    /// `aud` one of `audiences`, `scope` containing the messaging scope, `iat`/`exp` integers with
    /// `iat < exp <= iat + 3600`, `iat` not in the future beyond `skew`, `exp` not past.
    static func checkAssertionClaims(
        _ claims: [String: JSONValue], audiences: [String], now: Date, skew: TimeInterval
    ) throws(OAuthRejection) {
        guard let audience = claims["aud"]?.stringValue, audiences.contains(audience) else {
            throw OAuthRejection("invalid_grant", "the assertion's aud is not this token endpoint")
        }
        let scopes = (claims["scope"]?.stringValue ?? "").split(separator: " ").map(String.init)
        guard scopes.contains(messagingScope) else {
            throw OAuthRejection("invalid_scope", "the assertion's scope does not include firebase.messaging")
        }
        guard case .int(let issuedAt)? = claims["iat"], case .int(let expires)? = claims["exp"] else {
            throw OAuthRejection("invalid_grant", "the assertion needs integer iat and exp claims")
        }
        let current = now.timeIntervalSince1970
        guard expires > issuedAt, Double(expires - issuedAt) <= maxAssertionLifetime else {
            throw OAuthRejection("invalid_grant", "the assertion must live at most one hour (exp - iat)")
        }
        guard Double(issuedAt) <= current + skew else {
            throw OAuthRejection("invalid_grant", "the assertion's iat is in the future")
        }
        guard Double(expires) > current - skew else {
            throw OAuthRejection("invalid_grant", "the assertion has expired")
        }
    }

    /// The project of `/v1/projects/{project}/messages:send`, or `nil` for another path.
    static func projectID(path: String) -> String? {
        let target = HTTPText.splitTarget(path).path
        let prefix = "/v1/projects/"
        let suffix = "/messages:send"
        guard target.hasPrefix(prefix), target.hasSuffix(suffix), target.count > prefix.count + suffix.count else {
            return nil
        }
        let project = target.dropFirst(prefix.count).dropLast(suffix.count)
        return project.contains("/") ? nil : String(project)
    }

    private static let messageFields: Set = [
        "name", "token", "topic", "condition", "data", "notification", "android", "apns", "webpush", "fcm_options",
    ]
    private static let androidFields: Set = [
        "collapse_key", "priority", "ttl", "restricted_package_name", "data", "notification", "fcm_options",
        "direct_boot_ok",
    ]

    /// Validates a `messages:send` body.
    static func message(_ body: [UInt8]) throws(FCMRejection) -> FCMAcceptedMessage {
        guard let document = try? JSONValue.parse(body), let top = document.objectValue else {
            throw .invalidArgument("the body is not a JSON object")
        }
        if let unknown = top.keys.sorted().first(where: { $0 != "message" && $0 != "validate_only" }) {
            throw .invalidArgument("unknown field '\(unknown)' in the request")
        }
        guard let messageValue = top["message"], let message = messageValue.objectValue else {
            throw .invalidArgument("the request needs a message object")
        }
        var validateOnly = false
        if let flag = top["validate_only"] {
            guard let value = flag.boolValue else { throw .invalidArgument("validate_only must be a boolean") }
            validateOnly = value
        }
        if let unknown = message.keys.sorted().first(where: { !messageFields.contains($0) }) {
            throw .invalidArgument("unknown field '\(unknown)' in message")
        }
        guard message["topic"] == nil, message["condition"] == nil else {
            throw .invalidArgument("the simulator only accepts token targets")
        }
        guard let token = message["token"]?.stringValue else {
            throw .invalidArgument("message.token is required")
        }
        try checkRegistrationToken(token)
        let data = try self.data(message["data"])
        var accepted = FCMAcceptedMessage(
            token: token, data: data, validateOnly: validateOnly, message: messageValue)
        if let androidValue = message["android"] {
            guard let android = androidValue.objectValue else {
                throw .invalidArgument("message.android must be an object")
            }
            if let unknown = android.keys.sorted().first(where: { !androidFields.contains($0) }) {
                throw .invalidArgument("unknown field '\(unknown)' in message.android")
            }
            if let value = android["priority"] {
                guard let priority = value.stringValue, ["normal", "high"].contains(priority.lowercased()) else {
                    throw .invalidArgument("message.android.priority must be NORMAL or HIGH")
                }
                accepted.priority = priority.uppercased()
            }
            if let value = android["ttl"] {
                guard let ttl = value.stringValue, isDuration(ttl) else {
                    throw .invalidArgument("message.android.ttl must be a duration like \"3600s\"")
                }
                guard let seconds = Double(ttl.dropLast()), seconds <= 2_419_200 else {
                    throw .invalidArgument("message.android.ttl must be at most 28 days (2419200s)")
                }
                accepted.ttl = ttl
            }
            if let value = android["collapse_key"] {
                guard let key = value.stringValue else {
                    throw .invalidArgument("message.android.collapse_key must be a string")
                }
                accepted.collapseKey = key
            }
            if let nested = android["data"] { _ = try self.data(nested) }
        }
        return accepted
    }

    /// A registration token: 1–4096 characters from `[A-Za-z0-9_:.-]`.
    static func checkRegistrationToken(_ token: String) throws(FCMRejection) {
        let allowed = token.utf8.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ":") || byte == UInt8(ascii: "-")
                || byte == UInt8(ascii: ".")
        }
        guard !token.isEmpty, token.utf8.count <= 4096, allowed else {
            throw .invalidArgument("the registration token is not a valid FCM registration token")
        }
    }

    /// `data`: string values only, no reserved keys, keys plus values at most 4096 bytes.
    static func data(_ value: JSONValue?) throws(FCMRejection) -> [String: String] {
        guard let value else { return [:] }
        guard let object = value.objectValue else { throw .invalidArgument("data must be an object") }
        var result: [String: String] = [:]
        var size = 0
        for key in object.keys.sorted() {
            guard let string = object[key]!.stringValue else {
                throw .invalidArgument("data value of '\(key)' must be a string")
            }
            if FCMData.isReservedKey(key) { throw .invalidArgument("data key '\(key)' is reserved") }
            size += key.utf8.count + string.utf8.count
            result[key] = string
        }
        guard size <= maxDataBytes else {
            throw .invalidArgument("data is \(size) bytes; at most \(maxDataBytes) are allowed")
        }
        return result
    }

    /// A protobuf JSON duration in seconds: digits, up to nine fraction digits, `s`.
    static func isDuration(_ text: String) -> Bool {
        guard text.hasSuffix("s") else { return false }
        let number = text.dropLast().split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        let digits = { (part: Substring) in !part.isEmpty && part.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } }
        guard let whole = number.first, digits(whole), whole.count <= 12 else { return false }
        if number.count == 2 { return digits(number[1]) && number[1].count <= 9 }
        return true
    }
}
