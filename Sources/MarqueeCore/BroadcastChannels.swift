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
        /// Apple refuses more channels for this app and environment (`CannotCreateChannelConfig`).
        case limitReached
        /// Apple does not know the channel (`ChannelNotRegistered`, `BadChannelId`).
        case channelNotFound
        /// Apple answered with an error (or an unusable success); `reason` is Apple's reason or `HTTP <status>`.
        case refused(status: Int, reason: String)
        /// Apple could not be reached: `timeout`, `tls_error`, `transport_error` or `endpoint_not_allowed`.
        case unreachable(reason: String)
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
        case .limitReached: "CannotCreateChannelConfig"
        case .channelNotFound: "channel not registered at APNs"
        case .refused(let status, let reason): "APNs refused (\(status)): \(reason)"
        case .unreachable(let reason): "APNs unreachable: \(reason)"
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

/// Creates and deletes a tenant's broadcast channels at Apple (implemented over HTTP/2 by `MarqueeDelivery`).
public protocol BroadcastChannelManaging: Sendable {
    /// Creates a channel for the tenant's app in its credential's environment.
    func create(tenant: UUID, storagePolicy: ChannelStoragePolicy) async throws(ChannelManagementError)
        -> ChannelAddress
    /// Deletes a channel at Apple; `channelNotFound` when Apple no longer knows it.
    func delete(tenant: UUID, _ channel: ChannelAddress) async throws(ChannelManagementError)
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
