import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Observability
import Synchronization

/// One push to APNs.
public struct APNsPush: Sendable {
    public var token: String
    public var topic: String
    public var priority: Int
    /// Epoch seconds after which APNs should not try to deliver (0: once only).
    public var expiration: Int64
    /// The delivery ID in UUID form.
    public var apnsID: UUID
    public var payload: [UInt8]
    /// Set for a broadcast: one request on a channel (`POST /4/broadcasts/apps/<bundle>`), not to a device; `token`
    /// and `topic` are then unused.
    public var broadcast: Broadcast?

    /// Where a broadcast goes: the app and Apple's channel ID.
    public struct Broadcast: Sendable, Equatable {
        public var bundleID: String
        public var channelID: String

        public init(bundleID: String, channelID: String) {
            self.bundleID = bundleID
            self.channelID = channelID
        }
    }

    public init(
        token: String, topic: String, priority: Int, expiration: Int64, apnsID: UUID, payload: [UInt8],
        broadcast: Broadcast? = nil
    ) {
        self.broadcast = broadcast
        self.token = token
        self.topic = topic
        self.priority = priority
        self.expiration = expiration
        self.apnsID = apnsID
        self.payload = payload
    }
}

/// Where and as whom to send: one APNs key of one tenant.
public struct APNsTarget: Sendable {
    public var host: String
    public var port: Int
    public var tokens: ProviderTokenCache

    public init(host: String, port: Int, tokens: ProviderTokenCache) {
        self.host = host
        self.port = port
        self.tokens = tokens
    }

    /// `api.sandbox.push.apple.com` / `api.push.apple.com` on 443, or the credential's `https://host:port` override.
    public static func endpoint(environment: String, override: String?) -> (host: String, port: Int)? {
        if let override {
            guard let url = URLComponents(string: override), url.scheme == "https", let host = url.host else {
                return nil
            }
            return (host, url.port ?? 443)
        }
        return (environment == "production" ? "api.push.apple.com" : "api.sandbox.push.apple.com", 443)
    }
}

/// Sends live-activity pushes to APNs over pooled HTTP/2 connections (one pool per host and key), with token auth.
public final class APNsProvider: Sendable {
    public typealias Configuration = ProviderClientConfiguration

    private let configuration: Configuration
    private let connections: ProviderConnections
    private let logger: Logger?
    /// One provider-token cache per APNs key, for every tenant sending through this provider.
    public let tokenCaches = ProviderTokenCaches()

    public init(configuration: Configuration, logger: Logger? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.connections = ProviderConnections(configuration, name: "apns")
    }

    /// Open connections and streams across all hosts, for metrics.
    public var statistics: (connections: Int, streams: Int) { connections.statistics }

    /// Sends one push and classifies the answer. An `ExpiredProviderToken` refreshes the token once and retries, or
    /// leaves the delivery to be retried later when the token may not be replaced yet (`ProviderTokenCache`). A
    /// second one, on the token signed moments ago, is a clock problem (this host's or Apple's), never the
    /// credential's: retried as `clock_skew`, like a token refused while APNs' `Date` disagrees with this host's clock.
    /// No request outlives `deadline` (the delivery's send deadline), nor is one sent past it.
    public func send(_ push: APNsPush, to target: APNsTarget, by deadline: ContinuousClock.Instant? = nil) async
        -> SendOutcome
    {
        do {
            var token = try target.tokens.token()
            for attempt in 0..<2 {
                let response = try await connections.send(
                    request(push, providerToken: token), host: target.host, port: target.port,
                    identity: target.tokens.connectionIdentity, by: deadline)
                let decision = Self.decide(response, broadcast: push.broadcast != nil)
                if case .refreshProviderToken = decision, attempt == 0 {
                    // No replacement yet (the token is too young to be replaced): the worker retries the delivery.
                    guard let replacement = try target.tokens.refresh(rejected: token) else {
                        return SendOutcome(decision, httpStatus: response.status)
                    }
                    token = replacement
                    continue
                }
                if case .refreshProviderToken = decision {
                    ClockSkew.report(provider: "apns", host: target.host, date: response.header("date"), logger: logger)
                    return SendOutcome(DeliveryReason.clockSkewed, httpStatus: response.status)
                }
                if decision == DeliveryReason.clockSkewed {
                    ClockSkew.report(provider: "apns", host: target.host, date: response.header("date"), logger: logger)
                }
                return SendOutcome(decision, httpStatus: response.status)
            }
            return SendOutcome(.retry(reason: "provider token refresh loop", retryAfter: nil))
        } catch let error as CryptoError {
            return SendOutcome(.credentialBroken(reason: "signing failed: \(error.code)"))
        } catch {
            return SendOutcome(
                TransportFailure.decision(
                    error, provider: "apns", host: target.host, port: target.port, logger: logger))
        }
    }

    func request(_ push: APNsPush, providerToken: String) -> HTTP2Request {
        if let broadcast = push.broadcast {
            // Apple's broadcast request: the channel in a header, the app in the path, no topic; the request ID is
            // the delivery ID, so Apple's logs and ours meet.
            return HTTP2Request(
                method: "POST", path: "/4/broadcasts/apps/" + broadcast.bundleID,
                headers: [
                    ("authorization", "bearer " + providerToken), ("apns-channel-id", broadcast.channelID),
                    ("apns-push-type", "liveactivity"), ("apns-priority", String(push.priority)),
                    ("apns-expiration", String(push.expiration)),
                    ("apns-request-id", push.apnsID.lowercasedString), ("content-type", "application/json"),
                ], body: push.payload, timeout: configuration.requestTimeout)
        }
        return HTTP2Request(
            method: "POST", path: "/3/device/" + push.token,
            headers: [
                ("authorization", "bearer " + providerToken), ("apns-push-type", "liveactivity"),
                ("apns-topic", push.topic), ("apns-priority", String(push.priority)),
                ("apns-expiration", String(push.expiration)), ("apns-id", push.apnsID.lowercasedString),
                ("content-type", "application/json"),
            ], body: push.payload, timeout: configuration.requestTimeout)
    }

    /// Maps an APNs response to a decision (every provider number clamped in `MarqueeCore`).
    /// A broadcast's answer names it by `apns-unique-id` (the ID Apple's delivery log knows); a push's by `apns-id`.
    static func decide(_ response: HTTP2Response, broadcast: Bool = false) -> DeliveryDecision {
        APNsReason.decide(
            status: response.status, body: response.body,
            apnsID: response.header(broadcast ? "apns-unique-id" : "apns-id"),
            retryAfter: response.header("retry-after"), date: response.header("date"))
    }

    /// Closes every connection after in-flight requests finish; with `deadline`, those still in flight then fail and
    /// their connections close at once.
    public func shutdown(by deadline: ContinuousClock.Instant? = nil) async {
        await connections.shutdown(by: deadline)
    }
}
