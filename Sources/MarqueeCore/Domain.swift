import Foundation

// The lifecycle's domain types: what an instance's state is, what a delivery targets, what an activity type declares.
// They live here, beside the rules that use them, so that the API and the worker name them without the store.

/// The lifecycle state of an instance.
public enum InstanceState: String, Sendable, CaseIterable, Codable {
    case pending
    case active
    case ended
    case expired
    case failed

    /// No further update or end is accepted.
    public var isClosed: Bool { self == .ended || self == .expired }
}

/// One delivery row to queue.
public struct PlannedDelivery: Sendable, Equatable {
    public enum Provider: String, Sendable, CaseIterable { case apns, fcm }
    public enum TokenKind: String, Sendable {
        case pushToStart = "push_to_start"
        case activity, fcm
        /// One broadcast on the instance's channel; the token is Apple's channel ID.
        case channel
    }
    public var id: UUID
    public var deviceToken: String
    public var provider: Provider
    public var tokenKind: TokenKind
    public var token: String

    public init(id: UUID, deviceToken: String, provider: Provider, tokenKind: TokenKind, token: String) {
        self.id = id
        self.deviceToken = deviceToken
        self.provider = provider
        self.tokenKind = tokenKind
        self.token = token
    }
}

/// An activity type: how instances of it are validated and shaped for the device.
public struct ActivityType: Sendable, Equatable {
    public var identifier: String
    public var attributesType: String
    public var contentStateSchema: JSONValue?
    /// JSON pointers into the content state, each with its encoding.
    public var dateFields: [String: DateEncoding]
    public var payloadProfile: PayloadProfile
    /// The app declares `NSSupportsLiveActivitiesFrequentUpdates`: updates without an alert may go at priority 10.
    public var frequentUpdates: Bool
    /// Updates of one instance are sent at most once per this many milliseconds (latest wins); 0 is off.
    public var minUpdateIntervalMilliseconds: Int
    public var autoCreated: Bool
    public var createdAt: Date
    public var updatedAt: Date

    public init(
        identifier: String, attributesType: String, contentStateSchema: JSONValue? = nil,
        dateFields: [String: DateEncoding] = [:], payloadProfile: PayloadProfile = .marquee,
        frequentUpdates: Bool = false, minUpdateIntervalMilliseconds: Int = 0,
        autoCreated: Bool = false, createdAt: Date = Date(), updatedAt: Date = Date()
    ) {
        self.frequentUpdates = frequentUpdates
        self.minUpdateIntervalMilliseconds = minUpdateIntervalMilliseconds
        self.identifier = identifier
        self.attributesType = attributesType
        self.contentStateSchema = contentStateSchema
        self.dateFields = dateFields
        self.payloadProfile = payloadProfile
        self.autoCreated = autoCreated
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// A token a send would go to for an instance (update and end targets).
public struct ActivityTarget: Sendable, Equatable {
    public var deviceToken: String
    public var platform: Platform
    /// The per-activity APNs token, or the FCM token for Android.
    public var token: String

    public init(deviceToken: String, platform: Platform, token: String) {
        self.deviceToken = deviceToken
        self.platform = platform
        self.token = token
    }
}
