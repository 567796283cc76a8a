import Foundation

/// The three pushes of a live activity's life, as APNs spells them in `aps.event`.
public enum LiveActivityEvent: String, Sendable, CaseIterable, Codable {
    case start
    case update
    case end
}

/// An alert shown with a push: a banner on iOS (and the Dynamic Island expanding), a re-notification on Android.
public struct LiveActivityAlert: Sendable, Equatable, Hashable {
    public var title: String
    public var body: String
    /// A sound file name in the app bundle, or `default`. nil: the profile decides (see ``APNsPayload``).
    public var sound: String?

    public init(title: String, body: String, sound: String? = nil) {
        self.title = title
        self.body = body
        self.sound = sound
    }
}

/// Everything sent to devices for one lifecycle event of one activity instance, already validated.
///
/// The composers (``APNsPayload``, ``FCMData``) read only this and a ``DeliveryAttribution``; they do no validation
/// of their own, so the API must have checked identifiers, the content-state schema and dates
/// (``DateFields/normalize(_:fields:field:)``, ``StaleDateRule``) before building one.
public struct ActivityContent: Sendable, Equatable {
    /// Start, update or end.
    public var event: LiveActivityEvent
    /// Marquee's instance ID (`[A-Za-z0-9._:-]`, chosen by the product team).
    public var instanceID: String
    /// The activity type's reverse-DNS identifier, e.g. `com.example.delivery`.
    public var activityType: String
    /// The Swift type name ActivityKit matches in `attributes-type`, e.g. `DeliveryAttributes`.
    public var attributesType: String
    /// Which device library the payload is shaped for.
    public var profile: PayloadProfile
    /// Static attributes (an object). Sent to APNs on start only; to FCM with every event.
    public var attributes: JSONValue
    /// The full content state after merging (an object), with date fields already encoded.
    public var contentState: JSONValue
    /// An alert to show with this push.
    public var alert: LiveActivityAlert?
    /// Where a tap on the activity leads.
    public var deepLink: String?
    /// When the activity turns stale. Must already have passed through ``StaleDateRule`` (never in the past).
    public var staleDate: Date?
    /// When an ended activity leaves the Lock Screen. Only used with `.end`.
    public var dismissalDate: Date?
    /// Which of several activities the system shows first, 0…1 (ActivityKit accepts any Double).
    public var relevanceScore: Double?
    /// Epoch seconds of this event; strictly increasing per instance (the caller ensures it), because ActivityKit
    /// drops a push whose timestamp is not newer than the last one it applied.
    public var timestamp: Int64
    /// The activity type's date fields (JSON pointer → encoding), already applied to ``contentState``. A profile whose
    /// other platform reads dates in another unit re-encodes them from this (Customer.io Android: milliseconds).
    public var dateFields: [String: DateEncoding]
    /// For a start on a broadcast channel: Apple's channel ID, so the started activity subscribes to it instead of
    /// reporting an update token (APNs only; see ``BroadcastSupport``).
    public var inputPushChannel: String?

    public init(
        event: LiveActivityEvent, instanceID: String, activityType: String, attributesType: String,
        profile: PayloadProfile, attributes: JSONValue = .object([:]), contentState: JSONValue,
        alert: LiveActivityAlert? = nil, deepLink: String? = nil, staleDate: Date? = nil, dismissalDate: Date? = nil,
        relevanceScore: Double? = nil, timestamp: Int64, dateFields: [String: DateEncoding] = [:],
        inputPushChannel: String? = nil
    ) {
        self.inputPushChannel = inputPushChannel
        self.event = event
        self.instanceID = instanceID
        self.activityType = activityType
        self.attributesType = attributesType
        self.profile = profile
        self.attributes = attributes
        self.contentState = contentState
        self.alert = alert
        self.deepLink = deepLink
        self.staleDate = staleDate
        self.dismissalDate = dismissalDate
        self.relevanceScore = relevanceScore
        self.timestamp = timestamp
        self.dateFields = dateFields
    }
}

/// Which delivery a push belongs to, so the device SDK can report `delivered` / `opened` against it.
public struct DeliveryAttribution: Sendable, Equatable {
    /// The delivery's ID (a 26-character ULID).
    public var deliveryID: String
    /// A per-delivery secret (43 characters of base64url) the SDK presents when reporting metrics.
    public var deliveryToken: String

    public init(deliveryID: String, deliveryToken: String) {
        self.deliveryID = deliveryID
        self.deliveryToken = deliveryToken
    }

    /// Length of a delivery ID (ULID).
    public static let deliveryIDLength = 26
    /// Length of a delivery token (32 random bytes, base64url without padding).
    public static let deliveryTokenLength = 43

    /// The largest attribution a real send can carry: used to size payloads at request time, before delivery IDs
    /// exist. Its characters need no JSON escaping, like those of real IDs and tokens.
    public static let worstCase = DeliveryAttribution(
        deliveryID: String(repeating: "0", count: deliveryIDLength),
        deliveryToken: String(repeating: "A", count: deliveryTokenLength))
}

/// Seconds since 1970, whole (fractions dropped): how APNs and FCM payloads carry instants.
func epochSeconds(_ date: Date) -> Int64 {
    Int64(date.timeIntervalSince1970.rounded(.down))
}

/// Milliseconds since 1970, whole (fractions dropped): how Customer.io's Android SDK reads instants.
func epochMilliseconds(_ date: Date) -> Int64 {
    DateFields.epochMilliseconds(date.timeIntervalSince1970)
}
