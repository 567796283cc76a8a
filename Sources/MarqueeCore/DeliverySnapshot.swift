import Foundation

/// What one delivery sends, as stored on its row when it is queued (migration 0006): the instance's validated
/// attributes and content state, the options of the change (alert included) and the push timestamp of its version.
///
/// The one place that turns those into a push's content: the API checks the size of exactly this, and the worker
/// sends exactly this.
public struct DeliverySnapshot: Sendable, Equatable {
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var options: StoredOptions
    public var timestamp: Int64

    public init(attributes: JSONValue, contentState: JSONValue, options: StoredOptions, timestamp: Int64) {
        self.attributes = attributes
        self.contentState = contentState
        self.options = options
        self.timestamp = timestamp
    }

    /// The content of the push for `event`. A stale date that has passed by `now` is not sent; a dismissal date is
    /// sent with an end only. `dateFields` are the activity type's, for profiles that re-encode dates per platform.
    public func content(
        event: LiveActivityEvent, instanceID: String, activityType: String, attributesType: String,
        profile: PayloadProfile, dateFields: [String: DateEncoding] = [:], now: Date
    ) -> ActivityContent {
        ActivityContent(
            event: event, instanceID: instanceID, activityType: activityType, attributesType: attributesType,
            profile: profile, attributes: attributes, contentState: contentState, alert: options.alert,
            deepLink: options.deepLink, staleDate: options.staleDate.flatMap { $0 > now ? $0 : nil },
            dismissalDate: event == .end ? options.dismissalDate : nil, relevanceScore: options.relevanceScore,
            timestamp: timestamp, dateFields: dateFields)
    }
}

/// Whether a claimed delivery is still sent, from its instance as it is at claim time.
public enum DeliveryGate: Equatable, Sendable {
    /// Send it.
    case send
    /// Not sent: the instance has ended and this is not its end (no push after `end`).
    case instanceEnded
    /// Not sent: the instance is past its expiration (Apple ends activities after 8 hours, and so does Marquee).
    case instanceExpired

    public static func decide(event: LiveActivityEvent, instanceEnded: Bool, expiresAt: Date, now: Date) -> Self {
        if expiresAt <= now { return .instanceExpired }
        if instanceEnded && event != .end { return .instanceEnded }
        return .send
    }
}
