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

    /// An instance in this state becomes `active` once one of its pushes reaches a device: a start that was waiting
    /// for it, or one whose latest change found no target (the push of an earlier change got through). The worker
    /// settles only instances its claim found in such a state: one it found `active` is left as it is when the push
    /// is recorded (a change that failed meanwhile keeps it `failed`).
    public var isActivatedByDelivery: Bool { self == .pending || self == .failed }
}

/// Where a delivery stands (`deliveries.status`).
public enum DeliveryStatus: String, Sendable, CaseIterable {
    /// Waiting to be sent (a retry waits here too).
    case queued
    case sent
    /// The provider refused it for good, or it could not be sent before its instance closed.
    case failed
    /// The provider said the token is dead.
    case undeliverable
    /// Waits for the tenant to replace a broken credential.
    case parked
    /// Not sent: its instance ended, or a newer version for its token exists.
    case superseded
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

/// An instance row.
public struct InstanceRecord: Sendable, Equatable {
    public var id: String
    public var activityType: String
    public var personID: String?
    public var personEmail: String?
    public var state: InstanceState
    public var failureReason: String?
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var options: JSONValue
    public var version: Int
    public var contentTimestamp: Int64
    public var targetPlatform: Platform?
    public var targetDevice: String?
    public var expiresAt: Date
    public var startedAt: Date
    public var endedAt: Date?
    public var updatedAt: Date
    /// The broadcast channel of a channel-backed instance (nil once the channel is deleted).
    public var channelID: UUID?
    /// The campaign that started it, if any.
    public var campaignID: String?

    public init(
        id: String, activityType: String, personID: String?, personEmail: String?, state: InstanceState,
        failureReason: String?, attributes: JSONValue, contentState: JSONValue, options: JSONValue, version: Int,
        contentTimestamp: Int64, targetPlatform: Platform?, targetDevice: String?, expiresAt: Date, startedAt: Date,
        endedAt: Date?, updatedAt: Date, channelID: UUID?, campaignID: String? = nil
    ) {
        self.id = id
        self.activityType = activityType
        self.personID = personID
        self.personEmail = personEmail
        self.state = state
        self.failureReason = failureReason
        self.attributes = attributes
        self.contentState = contentState
        self.options = options
        self.version = version
        self.contentTimestamp = contentTimestamp
        self.targetPlatform = targetPlatform
        self.targetDevice = targetDevice
        self.expiresAt = expiresAt
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.updatedAt = updatedAt
        self.channelID = channelID
        self.campaignID = campaignID
    }

    /// The state as clients see it: an open instance past its expiration is `expired` even before a write says so.
    public func effectiveState(now: Date) -> InstanceState {
        if !state.isClosed && expiresAt <= now { return .expired }
        return state
    }
}

/// A device a start could go to.
public struct StartCandidate: Sendable, Equatable {
    public var deviceToken: String
    public var platform: Platform
    /// The active push-to-start token for the activity type (iOS); nil when the device has none.
    public var pushToStartToken: String?

    public init(deviceToken: String, platform: Platform, pushToStartToken: String?) {
        self.deviceToken = deviceToken
        self.platform = platform
        self.pushToStartToken = pushToStartToken
    }
}
