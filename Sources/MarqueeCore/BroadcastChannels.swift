import Foundation

/// What Apple keeps of a broadcast channel's messages for devices that subscribe later.
public enum ChannelStoragePolicy: String, Sendable, CaseIterable, Equatable {
    /// Nothing is stored (Apple's `message-storage-policy` 0); broadcasts on it must carry `apns-expiration: 0`.
    case none
    /// The most recent message is stored (Apple's `message-storage-policy` 1).
    case mostRecent = "most_recent"

    /// Apple's `message-storage-policy` number.
    public var appleValue: Int { self == .none ? 0 : 1 }

    /// The policy of Apple's number, or nil for any other value.
    public init?(appleValue: Int) {
        switch appleValue {
        case 0: self = .none
        case 1: self = .mostRecent
        default: return nil
        }
    }
}

/// Apple's limits on broadcast channels.
public enum ChannelLimits {
    /// Channels Apple allows per app and APNs environment (`CannotCreateChannelConfig` beyond it).
    public static let perAppAndEnvironment = 10_000
    /// The longest `apns-channel-id` believed. Apple documents the ID as opaque base64 of no fixed length; real IDs
    /// are a few dozen characters, and this bound keeps a hostile answer out of indexes and logs.
    public static let maxChannelIDLength = 1024

    /// An `apns-channel-id` from a provider if it is 1 to `maxChannelIDLength` characters of base64 (standard or
    /// URL-safe alphabet, `=` padding), otherwise nil.
    public static func channelID(_ text: String?) -> String? {
        guard let text, (1...maxChannelIDLength).contains(text.utf8.count),
            text.utf8.allSatisfy({
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2B
                    || $0 == 0x2F || $0 == 0x3D || $0 == 0x2D || $0 == 0x5F
            })
        else { return nil }
        return text
    }
}

/// Which devices a broadcast channel reaches.
public enum BroadcastSupport {
    /// Whether an iPhone on `osVersion` (as its SDK reported it) can subscribe to a channel: iOS 18 and later. An
    /// unknown version counts as able (the SDK did not say; current iPhones are). One that cannot is started with
    /// `input-push-token` instead, reports an activity token, and gets the instance's updates one push per token.
    public static func supportsChannels(osVersion: String?) -> Bool {
        guard let osVersion, !osVersion.isEmpty else { return true }
        let major = osVersion.drop { !$0.isNumber }.prefix { $0.isNumber }
        guard let number = Int(major.prefix(4)) else { return true }
        return number >= 18
    }
}

/// Why a channel management request did not succeed. Reasons are safe to show (Apple's reason text, sanitized, or a
/// fixed transport code): never an address, a token or an OpenSSL message.
public struct ChannelManagementError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// The tenant has no APNs credential.
        case noCredential
        /// The tenant's APNs credential is stored but its key cannot be used here (it does not open with this
        /// server's key ring, or is not an ES256 key): Apple was not asked.
        case credentialUnusable
        /// Apple refuses more channels for this app and environment (`CannotCreateChannelConfig`).
        case limitReached
        /// Apple does not know the channel (`ChannelNotRegistered`, `BadChannelId`).
        case channelNotFound
        /// Apple answered with an error (or an unusable success); `reason` is Apple's reason or `HTTP <status>`.
        case refused(status: Int, reason: String)
        /// Apple could not be reached: `timeout`, `tls_error`, `transport_error` or `endpoint_not_allowed`.
        case unreachable(reason: String)
        /// Apple refused the credential's key (403, Apple's `reason`) for a channel of another app or environment
        /// than the credential's (`ChannelReach`): the key may be limited to its own. Says nothing of the key.
        case outOfReach(ChannelReach, reason: String)
    }

    public var code: Code
    /// Apple's `Retry-After` (clamped by `ProviderNumbers`), when it sent one.
    public var retryAfter: Duration?

    public init(_ code: Code, retryAfter: Duration? = nil) {
        self.code = code
        self.retryAfter = retryAfter
    }

    public var description: String {
        switch code {
        case .noCredential: "no APNs credential"
        case .credentialUnusable: "the APNs key cannot be used"
        case .limitReached: "CannotCreateChannelConfig"
        case .channelNotFound: "channel not registered at APNs"
        case .refused(let status, let reason): "APNs refused (\(status)): \(reason)"
        case .unreachable(let reason): "APNs unreachable: \(reason)"
        case .outOfReach(let reach, let reason): "APNs refused the key (\(reason)): \(reach.rawValue)"
        }
    }
}

/// Where a channel lives at Apple: what creating it returned, and what deleting it needs.
public struct ChannelAddress: Sendable, Equatable {
    /// Apple's opaque channel ID (`apns-channel-id`).
    public var apnsChannelID: String
    /// The app (bundle ID) the channel belongs to.
    public var bundleID: String
    /// `sandbox` or `production`.
    public var environment: String

    public init(apnsChannelID: String, bundleID: String, environment: String) {
        self.apnsChannelID = apnsChannelID
        self.bundleID = bundleID
        self.environment = environment
    }
}

/// Creates and deletes a tenant's broadcast channels at Apple (implemented over HTTP/2 by `MarqueeDelivery`). Both
/// throw `ChannelManagementError` for what Apple (or the tenant's credential) made of the request, and the store's own
/// errors as they are (a database outage is not Apple's).
public protocol BroadcastChannelManaging: Sendable {
    /// Creates a channel for the tenant's app in its credential's environment.
    func create(tenant: UUID, storagePolicy: ChannelStoragePolicy) async throws -> ChannelAddress
    /// Deletes a channel at Apple; `channelNotFound` when Apple no longer knows it, `outOfReach` when Apple refused
    /// the credential's key for a channel of another app or environment.
    func delete(tenant: UUID, _ channel: ChannelAddress) async throws
}

/// A broadcast channel as recorded (migration 0030).
public struct ChannelRecord: Sendable, Equatable {
    /// A ULID as a UUID.
    public var id: UUID
    public var activityType: String
    public var storagePolicy: ChannelStoragePolicy
    public var apnsChannelID: String
    public var bundleID: String
    public var environment: String
    /// `active`, or `gone` once Apple no longer knows the channel.
    public var status: String
    public var statusReason: String?
    public var createdAt: Date
    public var updatedAt: Date

    public init(
        id: UUID, activityType: String, storagePolicy: ChannelStoragePolicy, apnsChannelID: String, bundleID: String,
        environment: String, status: String = "active", statusReason: String? = nil, createdAt: Date, updatedAt: Date
    ) {
        self.id = id
        self.activityType = activityType
        self.storagePolicy = storagePolicy
        self.apnsChannelID = apnsChannelID
        self.bundleID = bundleID
        self.environment = environment
        self.status = status
        self.statusReason = statusReason
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// The broadcast channel of a channel-backed instance, as the API plans a change and the worker sends one.
public struct ChannelBinding: Sendable, Equatable {
    public var id: UUID
    /// Apple's channel ID: what start pushes carry as `input-push-channel` and broadcasts as `apns-channel-id`.
    public var apnsChannelID: String
    public var storagePolicy: ChannelStoragePolicy
    /// The app the channel belongs to (the broadcast path names it).
    public var bundleID: String
    /// False once Apple no longer knows the channel: nothing more is broadcast on it.
    public var active: Bool
    /// The APNs environment the channel was created in (`sandbox` or `production`): Apple knows its ID there only.
    public var environment: String
    /// What a broadcast delivery on the channel records as its device (`channel:<channel ID>`), as the store names it.
    public var deliveryDevice: String

    public init(
        id: UUID, apnsChannelID: String, storagePolicy: ChannelStoragePolicy, bundleID: String, active: Bool,
        environment: String, deliveryDevice: String
    ) {
        self.deliveryDevice = deliveryDevice
        self.environment = environment
        self.id = id
        self.apnsChannelID = apnsChannelID
        self.storagePolicy = storagePolicy
        self.bundleID = bundleID
        self.active = active
    }
}

/// Whether a broadcast channel can be used with the tenant's APNs credential as it is now: the one home of that rule,
/// for the worker's starts and broadcasts and the API's channel deletes.
///
/// A channel lives at Apple in the app (bundle ID) and APNs environment of the credential it was created with, and
/// Apple knows its ID there only. Once the credential names another app or environment:
/// - a push-to-start may not subscribe a new activity to it: an activity of another app, or of the other
///   environment's build, could never subscribe, and would start with no update reaching it. The start fails with
///   `failureReason`;
/// - its broadcasts and its delete still go to the channel's own app and environment, signed with the credential's
///   key. A team key signs for every app and both environments; a key limited to one environment or topic is refused
///   there (403), which says nothing of its use for its own app and environment. Such a refusal fails that request
///   alone (`judged`) and never marks the credential broken.
public enum ChannelReach: String, Sendable, Equatable, CaseIterable {
    /// The credential's app and environment are the channel's.
    case reachable
    /// The channel belongs to another app (bundle ID) than the credential's.
    case otherApp = "channel_other_app"
    /// The channel lives in the other APNs environment than the credential's.
    case otherEnvironment = "channel_other_environment"

    /// A channel of `channelBundleID` in `channelEnvironment`, under a credential of `credentialBundleID` in
    /// `credentialEnvironment` (the app is named first when both differ).
    public init(
        channelBundleID: String, channelEnvironment: String, credentialBundleID: String, credentialEnvironment: String
    ) {
        if channelBundleID != credentialBundleID {
            self = .otherApp
        } else if channelEnvironment != credentialEnvironment {
            self = .otherEnvironment
        } else {
            self = .reachable
        }
    }

    /// What a start subscribing to the channel fails with (and a refused broadcast), nil when the channel is
    /// reachable.
    public var failureReason: String? { self == .reachable ? nil : rawValue }

    /// A broadcast's outcome on a channel this far from the credential: Apple's 403 refusing the key (any reason but
    /// `ExpiredProviderToken`, which `APNsOutcome` has the token refreshed for) on a channel out of reach fails the
    /// broadcast with `failureReason` instead of breaking the credential.
    public func judged(_ outcome: SendOutcome) -> SendOutcome {
        guard let failureReason, outcome.httpStatus == 403, case .credentialBroken = outcome.decision else {
            return outcome
        }
        return SendOutcome(.fail(reason: failureReason), httpStatus: 403)
    }

    /// A channel management refusal on a channel this far from the credential: Apple's 403 refusing the key (any
    /// reason but `ExpiredProviderToken`) on a channel out of reach is `outOfReach`.
    public func judged(_ error: ChannelManagementError) -> ChannelManagementError {
        guard self != .reachable, case .refused(403, let reason) = error.code, reason != "ExpiredProviderToken" else {
            return error
        }
        return ChannelManagementError(.outOfReach(self, reason: reason))
    }
}

extension ChannelBinding {
    /// The channel's reach with a credential of `bundleID` in `environment`.
    public func reach(bundleID: String, environment: String) -> ChannelReach {
        ChannelReach(
            channelBundleID: self.bundleID, channelEnvironment: self.environment, credentialBundleID: bundleID,
            credentialEnvironment: environment)
    }
}

extension ChannelAddress {
    /// The channel's reach with a credential of `bundleID` in `environment`.
    public func reach(bundleID: String, environment: String) -> ChannelReach {
        ChannelReach(
            channelBundleID: self.bundleID, channelEnvironment: self.environment, credentialBundleID: bundleID,
            credentialEnvironment: environment)
    }
}

extension ChannelRecord {
    /// A start (or a campaign) may name the channel only while Apple knows it, and only for its own activity type.
    public func checkUsable(for activityType: String) throws(ValidationError) {
        guard status == "active" else {
            throw ValidationError(
                field: "channel_id", reason: "is gone at Apple (\(statusReason ?? "gone")): create another")
        }
        guard self.activityType == activityType else {
            throw ValidationError(
                field: "channel_id", reason: "belongs to activity type \(self.activityType), not \(activityType)")
        }
    }
}
