import Crypto
import Foundation
import HTTP2
import MarqueeCore
import MarqueeStore
import Observability
import Synchronization

/// Where and as whom to manage channels: one app of one tenant on a management host.
public struct APNsChannelTarget: Sendable {
    public var host: String
    public var port: Int
    public var bundleID: String
    public var tokens: ProviderTokenCache

    public init(host: String, port: Int, bundleID: String, tokens: ProviderTokenCache) {
        self.host = host
        self.port = port
        self.bundleID = bundleID
        self.tokens = tokens
    }

    /// `api-manage-broadcast.sandbox.push.apple.com:2195` / `api-manage-broadcast.push.apple.com:2196`, or the
    /// credential's `management_endpoint` (`https://host:port`, parsed like the push `endpoint`).
    public static func endpoint(environment: String, override: String?) -> (host: String, port: Int)? {
        if let override { return APNsTarget.endpoint(environment: environment, override: override) }
        return environment == "production"
            ? ("api-manage-broadcast.push.apple.com", 2196) : ("api-manage-broadcast.sandbox.push.apple.com", 2195)
    }
}

/// A channel as Apple reads it back.
public struct APNsChannelInfo: Sendable, Equatable {
    public var apnsChannelID: String
    /// nil when Apple's answer carries no readable policy.
    public var storagePolicy: ChannelStoragePolicy?
}

/// Apple's broadcast channel management API ("Sending channel management requests to APNs"): create, read, delete
/// and list a bundle's channels over pooled HTTP/2 with the tenant's provider token.
///
/// Every request carries a fresh `apns-request-id`, logged with the answer. Whatever the host answers is hostile (a
/// tenant may point `management_endpoint` at any allowed host): bodies are capped by the client, reasons and channel
/// IDs pass `ProviderNumbers.reasonText` / `ChannelLimits.channelID`, `Retry-After` is clamped, lists are bounded.
public final class APNsChannelClient: Sendable {
    public typealias Configuration = ProviderClientConfiguration

    /// The most channel IDs read from one list answer (twice Apple's per-app limit).
    static let maxListedChannels = 2 * ChannelLimits.perAppAndEnvironment

    private let configuration: Configuration
    private let connections: ProviderConnections
    private let logger: Logger?
    /// One provider-token cache per APNs key, for every tenant managing channels through this client.
    public let tokenCaches = ProviderTokenCaches()

    public init(configuration: Configuration, logger: Logger? = nil) {
        self.configuration = configuration
        self.connections = ProviderConnections(configuration, name: "apns-channels")
        self.logger = logger
    }

    /// How `marquee serve` manages channels: one connection per pool (a create is one small request), 10 s per
    /// request (the API's caller waits for it), answers up to 1 MiB (a list of 10,000 IDs), and as many pools as a
    /// worker keeps (`ProviderClientConfiguration`'s default): one per management host and tenant key, and a pool with
    /// a request in flight is never evicted, so a cap near the number of tenants managing channels at once would
    /// answer the next tenant `apns-unreachable` (transport_error) until one finished.
    public static func serving(caFile: String?, allowedHosts: ProviderHosts) -> Configuration {
        Configuration(
            caFile: caFile, connectionsPerHost: 1, requestTimeout: .seconds(10), allowedHosts: allowedHosts,
            maxResponseBodySize: 1 << 20)
    }

    /// Creates a live-activity channel; returns Apple's channel ID. A channel created with an ID that fails
    /// `ChannelLimits.channelID` is deleted again when its ID can be sent back (`strayChannelID`), as nothing records
    /// it.
    public func create(_ target: APNsChannelTarget, storagePolicy: ChannelStoragePolicy)
        async throws(ChannelManagementError) -> String
    {
        let response = try await perform("create", target) { token, requestID in
            Self.createRequest(
                bundleID: target.bundleID, storagePolicy: storagePolicy, providerToken: token, requestID: requestID)
        }
        do {
            return try Self.created(response)
        } catch {
            if let stray = Self.strayChannelID(response) {
                do {
                    try await delete(target, channelID: stray)
                } catch let failure {
                    logger?.warning(
                        "a channel created at APNs with an unusable ID could not be deleted there",
                        metadata: [
                            "apns.bundle_id": .string(target.bundleID), "apns.channel_id": .string(stray),
                            "error": .string(failure.description),
                        ])
                }
            }
            throw error
        }
    }

    /// Reads one channel.
    public func read(_ target: APNsChannelTarget, channelID: String) async throws(ChannelManagementError)
        -> APNsChannelInfo
    {
        let response = try await perform("read", target) { token, requestID in
            Self.channelRequest(
                "GET", bundleID: target.bundleID, channelID: channelID, providerToken: token, requestID: requestID)
        }
        return try Self.read(response, channelID: channelID)
    }

    /// Deletes one channel; `channelNotFound` when Apple does not know it.
    public func delete(_ target: APNsChannelTarget, channelID: String) async throws(ChannelManagementError) {
        let response = try await perform("delete", target) { token, requestID in
            Self.channelRequest(
                "DELETE", bundleID: target.bundleID, channelID: channelID, providerToken: token, requestID: requestID)
        }
        try Self.deleted(response)
    }

    /// Lists the bundle's channel IDs (at most `maxListedChannels`; unreadable entries are left out).
    public func list(_ target: APNsChannelTarget) async throws(ChannelManagementError) -> [String] {
        let response = try await perform("list", target) { token, requestID in
            Self.listRequest(bundleID: target.bundleID, providerToken: token, requestID: requestID)
        }
        return try Self.listed(response)
    }

    /// Closes every connection after in-flight requests finish.
    public func shutdown() async { await connections.shutdown() }

    // MARK: Sending

    /// Sends one request built with the current provider token; an `ExpiredProviderToken` refreshes it once.
    private func perform(
        _ operation: String, _ target: APNsChannelTarget, _ build: (String, UUID) -> HTTP2Request
    ) async throws(ChannelManagementError) -> HTTP2Response {
        do {
            var token = try target.tokens.token()
            var attempt = 0
            while true {
                let requestID = UUID()
                let request = build(token, requestID)
                let response = try await connections.send(
                    request, host: target.host, port: target.port, identity: target.tokens.connectionIdentity)
                log(operation, target, request: request, requestID: requestID, response: response)
                if response.status == 403, Self.reason(response) == "ExpiredProviderToken", attempt == 0,
                    let replacement = try target.tokens.refresh(rejected: token)
                {
                    // Without a replacement (the token is too young to be replaced) Apple's answer stands.
                    attempt += 1
                    token = replacement
                    continue
                }
                return response
            }
        } catch let error as CryptoError {
            logger?.warning("provider token signing failed", metadata: ["error": .string(error.description)])
            throw ChannelManagementError(.refused(status: 0, reason: "signing_failed"))
        } catch {
            let decision = TransportFailure.decision(
                error, provider: "apns", host: target.host, port: target.port, logger: logger)
            switch decision {
            case .retry(let reason, _), .credentialBroken(let reason), .fail(let reason):
                throw ChannelManagementError(.unreachable(reason: reason))
            default:
                throw ChannelManagementError(.unreachable(reason: "transport_error"))
            }
        }
    }

    private func log(
        _ operation: String, _ target: APNsChannelTarget, request: HTTP2Request, requestID: UUID,
        response: HTTP2Response
    ) {
        var metadata: LogMetadata = [
            "apns.operation": .string("channel." + operation), "apns.request_id": .string(requestID.lowercasedString),
            "apns.bundle_id": .string(target.bundleID), "http.status": .int(response.status),
        ]
        // The channel: the one asked about, or the one a create made (only when it is an ID: it is the host's text).
        // Not a secret (broadcasts on it need the app's key), and what an operator needs to find a channel left at
        // Apple.
        if let channelID = request.headers.first(where: { $0.0 == "apns-channel-id" })?.1
            ?? ChannelLimits.channelID(response.header("apns-channel-id"))
        {
            metadata["apns.channel_id"] = .string(channelID)
        }
        // The echoed ID only when it is a UUID (it is the host's text).
        if let echoed = response.header("apns-request-id"), UUID(text: echoed) != nil,
            echoed.lowercased() != requestID.lowercasedString
        {
            metadata["apns.request_id_echoed"] = .string(echoed.lowercased())
        }
        if let reason = Self.reason(response) { metadata["apns.reason"] = .string(reason) }
        if (200..<300).contains(response.status) {
            logger?.info("apns channel request", metadata: metadata)
        } else {
            logger?.warning("apns channel request refused", metadata: metadata)
        }
    }

    // MARK: Requests (no I/O)

    static func basePath(_ bundleID: String) -> String { "/1/apps/" + bundleID }

    static func headers(providerToken: String, requestID: UUID) -> [(String, String)] {
        [("authorization", "bearer " + providerToken), ("apns-request-id", requestID.lowercasedString)]
    }

    static func createRequest(
        bundleID: String, storagePolicy: ChannelStoragePolicy, providerToken: String, requestID: UUID
    ) -> HTTP2Request {
        let body = JSONValue.object([
            "message-storage-policy": .int(Int64(storagePolicy.appleValue)), "push-type": .string("LiveActivity"),
        ])
        return HTTP2Request(
            method: "POST", path: basePath(bundleID) + "/channels",
            headers: headers(providerToken: providerToken, requestID: requestID)
                + [("content-type", "application/json")],
            body: body.bytes)
    }

    static func channelRequest(
        _ method: String, bundleID: String, channelID: String, providerToken: String, requestID: UUID
    ) -> HTTP2Request {
        HTTP2Request(
            method: method, path: basePath(bundleID) + "/channels",
            headers: headers(providerToken: providerToken, requestID: requestID) + [("apns-channel-id", channelID)])
    }

    static func listRequest(bundleID: String, providerToken: String, requestID: UUID) -> HTTP2Request {
        HTTP2Request(
            method: "GET", path: basePath(bundleID) + "/all-channels",
            headers: headers(providerToken: providerToken, requestID: requestID))
    }

    // MARK: Answers (no I/O)

    /// Apple's reason of an error answer, sanitized; `unreadable` when the body has a reason that is not safe text.
    static func reason(_ response: HTTP2Response) -> String? {
        guard !(200..<300).contains(response.status), response.body.count <= 65_536,
            let json = try? JSONValue.parse(response.body, wideIntegers: .nearestDouble),
            let text = json["reason"]?.stringValue
        else { return nil }
        return ProviderNumbers.reasonText(text) ?? "unreadable"
    }

    /// The error an unsuccessful answer means.
    static func failure(_ response: HTTP2Response) -> ChannelManagementError {
        let reason = reason(response)
        let retryAfter = ProviderNumbers.retryAfter(response.header("retry-after"))
        switch (response.status, reason) {
        case (_, "CannotCreateChannelConfig"?):
            return ChannelManagementError(.limitReached)
        case (_, "ChannelNotRegistered"?), (_, "BadChannelId"?):
            return ChannelManagementError(.channelNotFound)
        default:
            return ChannelManagementError(
                .refused(status: response.status, reason: reason ?? "HTTP \(response.status)"),
                retryAfter: response.status == 429 || response.status >= 500 ? retryAfter : nil)
        }
    }

    /// A create answer: 201 with a usable `apns-channel-id`.
    static func created(_ response: HTTP2Response) throws(ChannelManagementError) -> String {
        guard response.status == 201 || response.status == 200 else { throw failure(response) }
        guard let id = ChannelLimits.channelID(response.header("apns-channel-id")) else {
            throw ChannelManagementError(.refused(status: response.status, reason: "invalid_channel_id"))
        }
        return id
    }

    /// The `apns-channel-id` of a successful create answer that `created` refused but that can be sent back in a
    /// delete (1 to 8,192 visible ASCII characters); nil otherwise.
    static func strayChannelID(_ response: HTTP2Response) -> String? {
        guard response.status == 201 || response.status == 200, let id = response.header("apns-channel-id"),
            ChannelLimits.channelID(id) == nil, (1...8192).contains(id.utf8.count),
            id.utf8.allSatisfy({ (0x21...0x7E).contains($0) })
        else { return nil }
        return id
    }

    /// A read answer: 200 with the policy in the body.
    static func read(_ response: HTTP2Response, channelID: String) throws(ChannelManagementError)
        -> APNsChannelInfo
    {
        guard response.status == 200 else { throw failure(response) }
        var policy: ChannelStoragePolicy?
        if response.body.count <= 65_536, let json = try? JSONValue.parse(response.body, wideIntegers: .nearestDouble),
            case .int(let value)? = json["message-storage-policy"], let small = Int(exactly: value)
        {
            policy = ChannelStoragePolicy(appleValue: small)
        }
        return APNsChannelInfo(
            apnsChannelID: ChannelLimits.channelID(response.header("apns-channel-id")) ?? channelID,
            storagePolicy: policy)
    }

    /// A delete answer: any 2xx.
    static func deleted(_ response: HTTP2Response) throws(ChannelManagementError) {
        guard (200..<300).contains(response.status) else { throw failure(response) }
    }

    /// A list answer: `{"channels": ["<id>", …]}`, bounded, unreadable entries left out.
    static func listed(_ response: HTTP2Response) throws(ChannelManagementError) -> [String] {
        guard response.status == 200 else { throw failure(response) }
        guard let json = try? JSONValue.parse(response.body, wideIntegers: .nearestDouble),
            let entries = json["channels"]?.arrayValue
        else {
            throw ChannelManagementError(.refused(status: response.status, reason: "invalid_channel_list"))
        }
        return Array(entries.lazy.compactMap { ChannelLimits.channelID($0.stringValue) }.prefix(maxListedChannels))
    }
}

/// `BroadcastChannelManaging` over `APNsChannelClient`, for `marquee serve`: reads the tenant's APNs credential,
/// keeps one provider token cache per tenant (replaced when the credential changes), and creates or deletes at the
/// management host of the channel's environment.
public final class APNsChannelManager: BroadcastChannelManaging {
    private struct Entry {
        var updatedAt: Date
        var tokens: ProviderTokenCache
    }

    private let client: APNsChannelClient
    private let credentials: CredentialStore
    private let keyRing: SealingKeyRing
    private let logger: Logger?
    private let caches = Mutex<[UUID: Entry]>([:])

    public init(client: APNsChannelClient, credentials: CredentialStore, keyRing: SealingKeyRing, logger: Logger?) {
        self.client = client
        self.credentials = credentials
        self.keyRing = keyRing
        self.logger = logger
    }

    public func create(tenant: UUID, storagePolicy: ChannelStoragePolicy) async throws -> ChannelAddress {
        let (info, tokens) = try await credential(tenant)
        let target = Self.target(environment: info.environment, info: info, bundleID: info.bundleID, tokens: tokens)
        let id = try await client.create(target, storagePolicy: storagePolicy)
        return ChannelAddress(apnsChannelID: id, bundleID: info.bundleID, environment: info.environment)
    }

    /// Deletes at the channel's own app and environment with the credential's key; a refusal of that key for a
    /// channel out of the credential's reach is `outOfReach` (`ChannelReach.judged`).
    public func delete(tenant: UUID, _ channel: ChannelAddress) async throws {
        let (info, tokens) = try await credential(tenant)
        let target = Self.target(
            environment: channel.environment, info: info, bundleID: channel.bundleID, tokens: tokens)
        do {
            try await client.delete(target, channelID: channel.apnsChannelID)
        } catch {
            throw channel.reach(bundleID: info.bundleID, environment: info.environment).judged(error)
        }
    }

    /// The management target for a channel of `environment` and `bundleID`. An override written around the API
    /// that does not parse gets no host: the connection layer refuses it as `endpoint_not_allowed`.
    static func target(
        environment: String, info: APNsCredentialInfo, bundleID: String, tokens: ProviderTokenCache
    ) -> APNsChannelTarget {
        let endpoint =
            APNsChannelTarget.endpoint(environment: environment, override: info.managementEndpoint)
            ?? (host: "", port: 0)
        return APNsChannelTarget(host: endpoint.host, port: endpoint.port, bundleID: bundleID, tokens: tokens)
    }

    /// The tenant's credential and its token cache (kept while the credential's `updated_at` stays the same). The
    /// store's errors are thrown as they are (the API answers a database outage as such, not as Apple's).
    private func credential(_ tenant: UUID) async throws -> (APNsCredentialInfo, ProviderTokenCache) {
        guard let (info, sealed) = try await credentials.apnsCredential(tenant: tenant) else {
            throw ChannelManagementError(.noCredential)
        }
        if let cached = caches.withLock({ $0[tenant] }), cached.updatedAt == info.updatedAt {
            return (info, cached.tokens)
        }
        do {
            let pem = try keyRing.open(sealed, associatedData: CredentialStore.context(tenant, "apns"))
            let tokens = try client.tokenCaches.cache(teamID: info.teamID, keyID: info.keyID, pem: pem)
            caches.withLock { $0[tenant] = Entry(updatedAt: info.updatedAt, tokens: tokens) }
            return (info, tokens)
        } catch {
            logger?.error(
                "the APNs key cannot be used",
                metadata: ["tenant.id": .string(tenant.lowercasedString), "error": .string(String(describing: error))])
            throw ChannelManagementError(.credentialUnusable)
        }
    }
}
