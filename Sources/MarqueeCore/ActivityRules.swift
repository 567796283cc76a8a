import Foundation

/// A stale date already in the past is dropped, with a warning for the caller.
///
/// ActivityKit creates (or moves) an activity whose stale date has passed straight into the stale state, and a stale
/// activity that was never shown is not presented at all: forwarding such a date would make the push silently
/// invisible. Dropping it loses nothing, since there is nothing on screen to mark stale.
public enum StaleDateRule {
    /// The warning string returned to the API client when a stale date is dropped.
    public static let pastWarning = "stale_date_in_past"

    /// The stale date to send and any warnings.
    public struct Outcome: Sendable, Equatable {
        /// The stale date to use: the requested one when it is in the future, else nil.
        public var staleDate: Date?
        /// `[pastWarning]` when the requested date was dropped, else empty.
        public var warnings: [String]

        public init(staleDate: Date?, warnings: [String] = []) {
            self.staleDate = staleDate
            self.warnings = warnings
        }
    }

    /// Keeps `staleDate` when it is after `now`; drops it with ``pastWarning`` when it is at or before `now`.
    public static func apply(_ staleDate: Date?, now: Date) -> Outcome {
        guard let staleDate else { return Outcome(staleDate: nil) }
        if staleDate <= now { return Outcome(staleDate: nil, warnings: [pastWarning]) }
        return Outcome(staleDate: staleDate)
    }
}

/// The live-activity lifetime: iOS ends an activity about 8 hours after it starts, so Marquee never plans beyond that.
public enum Lifetime {
    /// Eight hours, in seconds.
    public static let maximum: TimeInterval = 8 * 3600

    /// The expiration used when the request names none: `now` + `maximum`.
    public static func defaultExpiration(now: Date, maximum: TimeInterval = Lifetime.maximum) -> Date {
        now.addingTimeInterval(maximum)
    }

    /// Checks a requested expiration: after `now` and at most `maximum` ahead.
    ///
    /// - Throws: ``ValidationError`` (`invalid-field`) naming `field`.
    public static func validateExpiration(
        _ expiration: Date, now: Date, maximum: TimeInterval = Lifetime.maximum, field: String = "expires_at"
    ) throws(ValidationError) {
        if expiration <= now {
            throw ValidationError(field: field, reason: "must be in the future")
        }
        if expiration.timeIntervalSince(now) > maximum {
            throw ValidationError(
                field: field,
                reason: "must be at most \(Int(maximum / 3600)) hours ahead: iOS ends live activities then")
        }
    }

    /// The expiration to use: the requested one once validated, else the default.
    public static func expiration(
        requested: Date?, now: Date, maximum: TimeInterval = Lifetime.maximum, field: String = "expires_at"
    ) throws(ValidationError) -> Date {
        guard let requested else { return defaultExpiration(now: now, maximum: maximum) }
        try validateExpiration(requested, now: now, maximum: maximum, field: field)
        return requested
    }
}

/// APNs delivery priority of a push (`apns-priority`); FCM data messages are always sent high.
public enum PushPriority: String, Sendable, CaseIterable, Codable {
    /// `apns-priority: 5`: delivered when convenient, not counted against the high-priority budget.
    case normal
    /// `apns-priority: 10`: delivered immediately.
    case high

    /// The `apns-priority` header value.
    public var apnsValue: Int { self == .high ? 10 : 5 }
}

/// Per-push options that change what the device shows or how it is delivered, besides state and attributes.
public struct ActivityOptions: Sendable, Equatable {
    public var staleDate: Date?
    public var relevanceScore: Double?
    public var priority: PushPriority?
    public var deepLink: String?

    public init(
        staleDate: Date? = nil, relevanceScore: Double? = nil, priority: PushPriority? = nil, deepLink: String? = nil
    ) {
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.priority = priority
        self.deepLink = deepLink
    }

    /// Equal as sent: stale dates compare in whole seconds, the precision of the payload.
    func sameAsSent(_ other: ActivityOptions) -> Bool {
        staleDate.map(epochSeconds) == other.staleDate.map(epochSeconds) && relevanceScore == other.relevanceScore
            && priority == other.priority && deepLink == other.deepLink
    }
}

/// What the device currently shows for an instance (as Marquee last sent it).
public struct ActivitySnapshot: Sendable, Equatable {
    public var contentState: JSONValue
    public var attributes: JSONValue
    public var options: ActivityOptions

    public init(contentState: JSONValue, attributes: JSONValue = .object([:]), options: ActivityOptions = .init()) {
        self.contentState = contentState
        self.attributes = attributes
        self.options = options
    }
}

/// Detects updates that would change nothing on the device, so they are not sent: both systems budget live-activity
/// updates, and a push that redraws the same content spends that budget for nothing.
public enum NoOp {
    /// True when `next` shows exactly what `current` shows and there is no alert to raise.
    ///
    /// JSON numbers compare by value (`1` equals `1.0`); an alert always makes an update worth sending.
    public static func isNoOp(current: ActivitySnapshot, next: ActivitySnapshot, alert: LiveActivityAlert?) -> Bool {
        alert == nil && current.contentState == next.contentState && current.attributes == next.attributes
            && current.options.sameAsSent(next.options)
    }

    /// True when merging `patch` (RFC 7396) into the current state, with `attributes` (nil: unchanged) and the
    /// resulting `options`, changes nothing and there is no alert.
    public static func isNoOp(
        current: ActivitySnapshot, patch: JSONValue, attributes: JSONValue? = nil, options: ActivityOptions,
        alert: LiveActivityAlert?
    ) -> Bool {
        let next = ActivitySnapshot(
            contentState: MergePatch.apply(patch, to: current.contentState),
            attributes: attributes ?? current.attributes, options: options)
        return isNoOp(current: current, next: next, alert: alert)
    }
}
