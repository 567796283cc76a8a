import Foundation

/// What to do with a delivery after one attempt. Every provider answer maps to exactly one of these, on purpose.
public enum DeliveryDecision: Sendable, Equatable {
    /// Accepted by the provider.
    case sent(providerID: String?)
    /// The token is dead: mark the delivery `undeliverable` and retire the token (if it was not re-registered after
    /// `unregisteredAt`). Never retried.
    case retireToken(reason: String, unregisteredAt: Date?)
    /// A passing problem: try again later (after `retryAfter` when the provider said so).
    case retry(reason: String, retryAfter: Duration?)
    /// The tenant's credential is rejected: pause that tenant's sends for this provider until it is replaced.
    case credentialBroken(reason: String)
    /// The provider token expired: refresh it once and retry at once.
    case refreshProviderToken(reason: String)
    /// A permanent problem with this push: `failed`, never retried.
    case fail(reason: String)
}

/// One send's decision and the provider's HTTP status, when it answered (nil when no answer came: a connection or
/// transport failure). The status is recorded with the delivery, for attribution.
public struct SendOutcome: Sendable, Equatable {
    public var decision: DeliveryDecision
    public var httpStatus: Int?

    public init(_ decision: DeliveryDecision, httpStatus: Int? = nil) {
        self.decision = decision
        self.httpStatus = httpStatus
    }
}

/// APNs error reasons (the `reason` of a non-200 response body), each classified.
public enum APNsReason: Sendable, Equatable, CustomStringConvertible {
    case badDeviceToken
    case deviceTokenNotForTopic
    case unregistered
    case expiredToken
    case expiredProviderToken
    case invalidProviderToken
    case missingProviderToken
    case badCertificate
    case badCertificateEnvironment
    case forbidden
    case tooManyProviderTokenUpdates
    case tooManyRequests
    case internalServerError
    case serviceUnavailable
    case shutdown
    case payloadTooLarge
    case badTopic
    case topicDisallowed
    case missingTopic
    case badPriority
    case badExpirationDate
    case badMessageID
    case badPath
    case methodNotAllowed
    case invalidPushType
    case payloadEmpty
    /// Broadcasts: Apple does not know the channel.
    case channelNotRegistered
    /// Broadcasts: the `apns-channel-id` is not a channel ID.
    case badChannelID
    case unknown(String)

    public init(_ text: String) {
        switch text {
        case "BadDeviceToken": self = .badDeviceToken
        case "DeviceTokenNotForTopic": self = .deviceTokenNotForTopic
        case "Unregistered": self = .unregistered
        case "ExpiredToken": self = .expiredToken
        case "ExpiredProviderToken": self = .expiredProviderToken
        case "InvalidProviderToken": self = .invalidProviderToken
        case "MissingProviderToken": self = .missingProviderToken
        case "BadCertificate": self = .badCertificate
        case "BadCertificateEnvironment": self = .badCertificateEnvironment
        case "Forbidden": self = .forbidden
        case "TooManyProviderTokenUpdates": self = .tooManyProviderTokenUpdates
        case "TooManyRequests": self = .tooManyRequests
        case "InternalServerError": self = .internalServerError
        case "ServiceUnavailable": self = .serviceUnavailable
        case "Shutdown": self = .shutdown
        case "PayloadTooLarge": self = .payloadTooLarge
        case "BadTopic": self = .badTopic
        case "TopicDisallowed": self = .topicDisallowed
        case "MissingTopic": self = .missingTopic
        case "BadPriority": self = .badPriority
        case "BadExpirationDate": self = .badExpirationDate
        case "BadMessageId": self = .badMessageID
        case "BadPath": self = .badPath
        case "MethodNotAllowed": self = .methodNotAllowed
        case "InvalidPushType": self = .invalidPushType
        case "PayloadEmpty": self = .payloadEmpty
        case "ChannelNotRegistered": self = .channelNotRegistered
        case "BadChannelId": self = .badChannelID
        default: self = .unknown(text)
        }
    }

    public var description: String {
        switch self {
        case .badDeviceToken: "BadDeviceToken"
        case .deviceTokenNotForTopic: "DeviceTokenNotForTopic"
        case .unregistered: "Unregistered"
        case .expiredToken: "ExpiredToken"
        case .expiredProviderToken: "ExpiredProviderToken"
        case .invalidProviderToken: "InvalidProviderToken"
        case .missingProviderToken: "MissingProviderToken"
        case .badCertificate: "BadCertificate"
        case .badCertificateEnvironment: "BadCertificateEnvironment"
        case .forbidden: "Forbidden"
        case .tooManyProviderTokenUpdates: "TooManyProviderTokenUpdates"
        case .tooManyRequests: "TooManyRequests"
        case .internalServerError: "InternalServerError"
        case .serviceUnavailable: "ServiceUnavailable"
        case .shutdown: "Shutdown"
        case .payloadTooLarge: "PayloadTooLarge"
        case .badTopic: "BadTopic"
        case .topicDisallowed: "TopicDisallowed"
        case .missingTopic: "MissingTopic"
        case .badPriority: "BadPriority"
        case .badExpirationDate: "BadExpirationDate"
        case .badMessageID: "BadMessageId"
        case .badPath: "BadPath"
        case .methodNotAllowed: "MethodNotAllowed"
        case .invalidPushType: "InvalidPushType"
        case .payloadEmpty: "PayloadEmpty"
        case .channelNotRegistered: "ChannelNotRegistered"
        case .badChannelID: "BadChannelId"
        case .unknown(let s): s
        }
    }

    /// Classifies a raw APNs answer: `body` is the response body (JSON for errors), `retryAfter` the `Retry-After`
    /// header, `date` the `Date` header (APNs' clock). Every number in it goes through `ProviderNumbers` (clamped or
    /// ignored, never trapping).
    public static func decide(
        status: Int, body: [UInt8], apnsID: String?, retryAfter header: String?, date: String? = nil,
        now: Date = Date()
    ) -> DeliveryDecision {
        var reason: APNsReason?
        var unregisteredAt: Date?
        if status != 200, body.count <= 65_536, let json = try? JSONValue.parse(body, wideIntegers: .nearestDouble) {
            reason = json["reason"]?.stringValue.map {
                ProviderNumbers.reasonText($0).map(APNsReason.init) ?? .unknown("unreadable")
            }
            unregisteredAt = ProviderNumbers.timestamp(milliseconds: json["timestamp"], now: now)
        }
        return decide(
            status: status, reason: reason, unregisteredAt: unregisteredAt,
            apnsID: ProviderNumbers.identifier(apnsID),
            retryAfter: ProviderNumbers.retryAfter(header, now: now),
            clocksDisagree: ProviderNumbers.clockSkew(date: date, now: now) != nil)
    }

    /// Classifies an APNs answer. `status` is the HTTP status; `timestamp` is a 410's `timestamp` (ms since 1970),
    /// ignored when outside `ProviderNumbers`' sane range.
    public static func decide(
        status: Int, reason: APNsReason?, timestamp: Int64?, apnsID: String?, retryAfter: Duration?
    )
        -> DeliveryDecision
    {
        decide(
            status: status, reason: reason,
            unregisteredAt: ProviderNumbers.timestamp(milliseconds: timestamp.map(JSONValue.int)),
            apnsID: ProviderNumbers.identifier(apnsID), retryAfter: retryAfter)
    }

    /// `clocksDisagree`: APNs' `Date` is more than `ProviderNumbers.clockTolerance` from this host's clock. Then a
    /// provider token refused as expired or invalid (signed with this host's clock) is the clock's fault, retried as
    /// `clock_skew`: it neither breaks the credential nor spends a token update on a replacement Apple would refuse
    /// too.
    static func decide(
        status: Int, reason: APNsReason?, unregisteredAt: Date?, apnsID: String?, retryAfter: Duration?,
        clocksDisagree: Bool = false
    )
        -> DeliveryDecision
    {
        if status == 200 { return .sent(providerID: apnsID) }
        let text = reason?.description ?? "HTTP \(status)"
        switch (status, reason) {
        case (403, .expiredProviderToken?) where clocksDisagree, (403, .invalidProviderToken?) where clocksDisagree:
            return DeliveryReason.clockSkewed
        case (400..<500, .channelNotRegistered?), (400..<500, .badChannelID?):
            // A broadcast's channel is gone: like a dead token, never retried; the channel is marked gone.
            return .retireToken(reason: text, unregisteredAt: nil)
        case (400, .badDeviceToken?), (400, .deviceTokenNotForTopic?):
            return .retireToken(reason: text, unregisteredAt: nil)
        case (410, _):
            return .retireToken(reason: text, unregisteredAt: unregisteredAt)
        case (403, .expiredProviderToken?):
            return .refreshProviderToken(reason: text)
        case (403, _):
            return .credentialBroken(reason: text)
        case (429, _), (500...599, _):
            return .retry(reason: text, retryAfter: retryAfter)
        default:
            return .fail(reason: text)
        }
    }
}

/// When to try a delivery again: exponential backoff with full jitter, capped, over about an hour.
public struct RetryPolicy: Sendable, Equatable {
    /// Attempts in all, the first included, of those that spend the budget (`spendsBudget`). Default 10.
    public var maxAttempts: Int
    /// The first retry's ceiling. Default 8 s (ten attempts then span about 40 minutes on average, 54 at most).
    public var initialDelay: Duration
    /// No retry waits longer than this. Default 20 minutes.
    public var maximumDelay: Duration

    /// Reasons of attempts the worker ended itself, before any answer: its shutdown (a rolling deploy must not fail a
    /// push on its last attempt that the provider never refused), and a credential it could not load (nothing was
    /// sent). Such a delivery still ends with its instance's expiry.
    public static let uncounted: Set<String> = [DeliveryReason.shutdown, "credential_load"]

    /// Whether an attempt that ended `status` with `reason` spends the budget: not a retry for a reason the worker
    /// gave itself (`uncounted`), nor a park (the provider refused the tenant's credential, not the push). The
    /// queue counts the others apart (`delivery_queue.uncounted_attempts`, migration 0106).
    public static func spendsBudget(_ status: DeliveryStatus, reason: String?) -> Bool {
        switch status {
        case .parked: false
        case .queued: !(reason.map(uncounted.contains) ?? false)
        default: true
        }
    }

    public init(maxAttempts: Int = 10, initialDelay: Duration = .seconds(8), maximumDelay: Duration = .seconds(1200)) {
        self.maxAttempts = maxAttempts
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
    }

    /// The delay before attempt `attempts + 1`, or nil when `counted` attempts were the last allowed.
    /// `counted`: of `attempts`, those that spend the budget (`spendsBudget`), this one included; all of them when
    /// nil. `retryAfter` (the provider's word) is honoured as a floor. `random` yields values in 0...1. An attempt
    /// the worker ended itself (`Self.uncounted`) says nothing of the push and never spends the last one; it backs off
    /// by every attempt (a credential that cannot be loaded is not asked again every few seconds), the others by
    /// those counted (ten of those before a provider's first 503 do not make its retry wait 20 minutes).
    public func delay(
        afterAttempts attempts: Int, counted: Int? = nil, retryAfter: Duration?, reason: String? = nil,
        random: () -> Double = { Double.random(in: 0...1) }
    )
        -> Duration?
    {
        let uncounted = reason.map(Self.uncounted.contains) == true
        let spent = counted ?? attempts
        guard spent < maxAttempts || uncounted else { return nil }
        let exponent = min(max((uncounted ? attempts : spent) - 1, 0), 30)
        let ceiling = min(initialDelay.inSeconds * pow(2, Double(exponent)), maximumDelay.inSeconds)
        // Half fixed, half jitter: spreads retries without letting them collapse to zero.
        var seconds = ceiling / 2 + random() * ceiling / 2
        if let retryAfter {
            // Clamped again here, so no caller can make the conversion below trap.
            let limit = ProviderNumbers.maximumRetryAfter.inSeconds
            let floor = retryAfter.inSeconds
            seconds = max(seconds, floor.isFinite ? min(max(floor, 0), limit) : 0)
        }
        guard seconds.isFinite else { return maximumDelay }
        return .milliseconds(Int64(min(max(seconds, 0), 1e9) * 1000))
    }
}

/// The one home for which delivery reasons may label metrics. A reason is stored in full (already made safe by
/// `ProviderNumbers.reasonText`), but a tenant chooses the endpoint that words it, so as a metric label only a fixed
/// vocabulary is kept: the reasons APNs and FCM document, the worker's own, `HTTP 4xx`-style status classes; anything
/// else is `other`.
public enum DeliveryReason {
    /// A time-based rejection (a provider token or JWT assertion called expired or not yet valid) while this host's
    /// clock disagrees with the provider's (`ProviderNumbers.clockSkew`), or on a token signed moments ago: the
    /// operator's clock is wrong, not the tenant's credential. Retried (and counted: a provider answered), never
    /// breaking the credential; the worker logs it as an error.
    public static let clockSkew = "clock_skew"

    /// The decision for a time-based rejection that is the clocks' doing (`clockSkew`).
    public static let clockSkewed = DeliveryDecision.retry(reason: clockSkew, retryAfter: nil)

    /// The send deadline passed before the provider answered (or before the request was sent).
    public static let deadline = "deadline"
    /// The worker's shutdown ended the attempt (`RetryPolicy.uncounted`).
    public static let shutdown = "shutdown"
    /// The provider could not be reached, or its answer not read (an oversized body, a reset stream, every pool busy).
    public static let transportError = "transport_error"
    /// The TLS handshake with the provider failed (certificate, ALPN).
    public static let tlsError = "tls_error"
    /// The provider did not answer within the request's timeout.
    public static let timeout = "timeout"
    /// The credential's endpoint (or token URI) is outside `MARQUEE_PROVIDER_HOSTS`.
    public static let endpointNotAllowed = "endpoint_not_allowed"

    /// Reasons the worker gives itself (not a provider's words): the only home of their spelling as metric labels,
    /// and what `ProviderNumbers.reasonText` never takes from a provider.
    public static let workerReasons = Set([
        clockSkew, deadline, shutdown, transportError, tlsError, timeout, endpointNotAllowed, "instance_expired",
        "instance_ended", "credential_load", "no_apns_credentials", "no_fcm_credentials", "channel_gone",
        "provider token refresh loop", "token refresh loop", "unreadable", "oauth_rejected", "oauth_unavailable",
    ]).union(ChannelReach.allCases.compactMap(\.failureReason))

    /// The label for any reason: nil gives "" (no reason).
    public static func metricLabel(_ reason: String?) -> String {
        guard let reason else { return "" }
        if reason.hasPrefix(gaveUpPrefix), let colon = reason.range(of: ": ") {
            return "gave up: " + metricLabel(String(reason[colon.upperBound...]))
        }
        if reason.hasSuffix(" twice") {
            let label = metricLabel(String(reason.dropLast(" twice".count)))
            return label == "other" ? label : label + " twice"
        }
        if reason.hasPrefix("signing failed") { return "signing failed" }
        if workerReasons.contains(reason) { return reason }
        if reason.hasPrefix("oauth_"), OAuthTokenAnswer.rejections.contains(String(reason.dropFirst(6))) {
            return reason
        }
        let apns = APNsReason(reason)
        if apns != .unknown(reason) { return apns.description }
        let fcm = FCMErrorCode(reason)
        if fcm != .unknown(reason) { return fcm.description }
        let digits = reason.utf8.dropFirst(5)
        if reason.hasPrefix("HTTP "), digits.count == 3, let first = digits.first, (0x31...0x35).contains(first),
            digits.allSatisfy({ (0x30...0x39).contains($0) })
        {
            return "HTTP \(Character(Unicode.Scalar(first)))xx"
        }
        return "other"
    }

    static let gaveUpPrefix = "gave up after "

    /// The stored reason of a delivery that used up its attempts, the last attempt's `reason` in it.
    public static func gaveUp(after attempts: Int, _ reason: String) -> String {
        gaveUpPrefix + "\(attempts) attempts: \(reason)"
    }
}
