import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization

/// Why APNs refuses a request: Apple's status and reason, plus a human detail for the `x-sim-detail` header.
struct APNsRejection: Error, Equatable, Sendable {
    var status: Int
    var reason: String
    var detail: String

    init(_ status: Int, _ reason: String, _ detail: String) {
        self.status = status
        self.reason = reason
        self.detail = detail
    }
}

/// A request that passed every check.
struct APNsAcceptedPush: Sendable, Equatable {
    var token: String
    var topic: String
    var bundleID: String
    var priority: Int
    var expiration: Int64?
    var apnsID: String
    var collapseID: String?
    var keyID: String
    var teamID: String
    var payload: JSONValue
}

/// The checks Apple makes on a live-activity push, without sockets.
final class APNsValidator: Sendable {
    static let maxPayloadBytes = 4096
    static let pathPrefix = "/3/device/"
    static let topicSuffix = ".push-type.liveactivity"

    let keys: [String: APNsSimulator.SigningKey]
    /// Bundle IDs allowed per team; a team without an entry allows every bundle.
    let bundlesByTeam: [String: Set<String>]
    let maxTokenAge: TimeInterval
    let clockSkew: TimeInterval
    /// Provider tokens whose signature verified, by token text (bounded), with the claims checked on every request:
    /// a cache hit skips decoding the token (base64 and two JSON parses) as well as its signature.
    private let verified = Mutex<[String: VerifiedToken]>([:])
    /// The team and key whose provider token each connection carried first (bounded: forgotten all at once past
    /// `maxBoundConnections`, when a connection may bind again).
    private let bound = Mutex<[Int: (teamID: String, keyID: String)]>([:])
    static let maxBoundConnections = 65_536

    struct VerifiedToken {
        var keyID: String
        var claims: [String: JSONValue]
    }

    init(keys: [APNsSimulator.SigningKey], maxTokenAge: TimeInterval = 3600, clockSkew: TimeInterval = 60) {
        var byID: [String: APNsSimulator.SigningKey] = [:]
        var bundles: [String: Set<String>] = [:]
        for key in keys {
            byID[key.keyID] = key
            if !key.bundleIDs.isEmpty { bundles[key.teamID, default: []].formUnion(key.bundleIDs) }
        }
        self.keys = byID
        bundlesByTeam = bundles
        self.maxTokenAge = maxTokenAge
        self.clockSkew = clockSkew
    }

    /// Runs every check in Apple's order: method, path, token, provider token, headers, payload.
    func validate(_ request: HTTP2ServerRequest, now: Date) -> Result<APNsAcceptedPush, APNsRejection> {
        do {
            guard request.method == "POST" else {
                throw APNsRejection(405, "MethodNotAllowed", "the method must be POST")
            }
            let token = try Self.deviceToken(path: request.path)
            let key = try verifyProviderToken(
                authorization: request.header("authorization"), connection: request.connectionID, now: now)
            guard request.header("apns-push-type") == "liveactivity" else {
                throw APNsRejection(400, "InvalidPushType", "apns-push-type must be liveactivity")
            }
            let bundleID = try Self.bundleID(topic: request.header("apns-topic"))
            if let allowed = bundlesByTeam[key.teamID], !allowed.contains(bundleID) {
                throw APNsRejection(400, "TopicDisallowed", "the bundle is not configured for the key's team")
            }
            let priority = try Self.priority(request.header("apns-priority"))
            let expiration = try Self.expiration(request.header("apns-expiration"))
            let apnsID = try Self.messageID(request.header("apns-id")) ?? SecureRandom.uuid().uppercasedString
            let collapseID = request.header("apns-collapse-id")
            if let collapseID, collapseID.utf8.count > 64 {
                throw APNsRejection(400, "BadCollapseId", "apns-collapse-id is longer than 64 bytes")
            }
            let payload = try Self.payload(request.body)
            return .success(
                APNsAcceptedPush(
                    token: token, topic: request.header("apns-topic")!, bundleID: bundleID, priority: priority,
                    expiration: expiration, apnsID: apnsID, collapseID: collapseID, keyID: key.keyID,
                    teamID: key.teamID, payload: payload))
        } catch let rejection as APNsRejection {
            return .failure(rejection)
        } catch {
            return .failure(APNsRejection(500, "InternalServerError", "\(error)"))
        }
    }

    /// The device token of `/3/device/<token>`: 404 BadPath for another path, 400 BadDeviceToken unless 64–200 hex.
    static func deviceToken(path: String) throws(APNsRejection) -> String {
        // Byte-level (this runs for every push): the path up to any query, after the prefix.
        let utf8 = path.utf8
        let end = utf8.firstIndex(of: UInt8(ascii: "?")) ?? utf8.endIndex
        let target = utf8[utf8.startIndex..<end]
        guard target.starts(with: pathPrefix.utf8) else {
            throw APNsRejection(404, "BadPath", "the path must be /3/device/<token>")
        }
        let token = target.dropFirst(pathPrefix.utf8.count)
        guard (64...200).contains(token.count), token.allSatisfy(\.isHexDigit) else {
            throw APNsRejection(400, "BadDeviceToken", "the device token must be 64 to 200 hexadecimal characters")
        }
        return String(Substring(token))
    }

    /// Checks `authorization: bearer <JWT>` and returns the key that signed it. With `connection`, also Apple's rule
    /// for token connections: the first valid token binds the connection to its team and key; another team's token
    /// on it is refused (403 InvalidProviderToken: "APNs doesn't support authentication tokens from multiple developer
    /// accounts on a single connection"), and another key of the same team counts as a token update (429
    /// TooManyProviderTokenUpdates).
    func verifyProviderToken(
        authorization: String?, connection: Int? = nil, now: Date
    ) throws(APNsRejection) -> APNsSimulator.SigningKey {
        let key = try verifiedKey(authorization: authorization, now: now)
        if let connection { try bind(connection, to: key) }
        return key
    }

    /// Binds `connection` to `key`'s team and key on first use; refuses another one after.
    func bind(_ connection: Int, to key: APNsSimulator.SigningKey) throws(APNsRejection) {
        let first = bound.withLock { bound -> (teamID: String, keyID: String) in
            if let first = bound[connection] { return first }
            if bound.count >= Self.maxBoundConnections { bound.removeAll(keepingCapacity: true) }
            bound[connection] = (key.teamID, key.keyID)
            return (key.teamID, key.keyID)
        }
        if first.teamID != key.teamID {
            throw APNsRejection(
                403, "InvalidProviderToken", "this connection carries another team's provider tokens")
        }
        if first.keyID != key.keyID {
            throw APNsRejection(
                429, "TooManyProviderTokenUpdates", "this connection carries provider tokens of another key")
        }
    }

    private func verifiedKey(authorization: String?, now: Date) throws(APNsRejection) -> APNsSimulator.SigningKey {
        guard let authorization, !HTTPText.trimmed(authorization[...]).isEmpty else {
            throw APNsRejection(403, "MissingProviderToken", "no authorization header")
        }
        guard let token = HTTPText.bearerToken(authorization) else {
            throw APNsRejection(403, "InvalidProviderToken", "authorization must be 'bearer <JWT>'")
        }
        if let known = verified.withLock({ $0[token] }), let key = keys[known.keyID] {
            try Self.checkClaims(known.claims, teamID: key.teamID, now: now, maxAge: maxTokenAge, skew: clockSkew)
            return key
        }
        guard let jwt = UnverifiedJWT(token) else {
            throw APNsRejection(403, "InvalidProviderToken", "authorization must be 'bearer <JWT>'")
        }
        guard jwt.header["alg"]?.stringValue == "ES256" else {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token must be signed with ES256")
        }
        guard let keyID = jwt.header["kid"]?.stringValue, let key = keys[keyID] else {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token's kid is unknown")
        }
        guard (try? JWT.verify(token, verifier: key.publicKey)) != nil else {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token's signature does not verify")
        }
        verified.withLock { cache in
            if cache.count >= 256 { cache.removeAll(keepingCapacity: true) }
            cache[token] = VerifiedToken(keyID: keyID, claims: jwt.claims)
        }
        try Self.checkClaims(jwt.claims, teamID: key.teamID, now: now, maxAge: maxTokenAge, skew: clockSkew)
        return key
    }

    /// `iss` must be the team, `iat` an integer at most `maxAge` old and not more than `skew` ahead.
    static func checkClaims(
        _ claims: [String: JSONValue], teamID: String, now: Date, maxAge: TimeInterval, skew: TimeInterval
    ) throws(APNsRejection) {
        guard claims["iss"]?.stringValue == teamID else {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token's iss is not the key's team")
        }
        guard case .int(let issuedAt)? = claims["iat"] else {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token has no integer iat")
        }
        let age = now.timeIntervalSince1970 - Double(issuedAt)
        if age > maxAge {
            throw APNsRejection(403, "ExpiredProviderToken", "the provider token is older than an hour")
        }
        if age < -skew {
            throw APNsRejection(403, "InvalidProviderToken", "the provider token's iat is in the future")
        }
    }

    /// The bundle ID of `<bundle>.push-type.liveactivity`.
    static func bundleID(topic: String?) throws(APNsRejection) -> String {
        guard let topic, !topic.isEmpty else {
            throw APNsRejection(400, "MissingTopic", "apns-topic is required for live activities")
        }
        guard topic.hasSuffix(topicSuffix), topic.count > topicSuffix.count else {
            throw APNsRejection(400, "TopicDisallowed", "apns-topic must be <bundle>.push-type.liveactivity")
        }
        return String(topic.dropLast(topicSuffix.count))
    }

    /// `apns-priority`: 5 or 10 (10 when absent).
    static func priority(_ header: String?) throws(APNsRejection) -> Int {
        guard let header else { return 10 }
        guard header == "5" || header == "10" else {
            throw APNsRejection(400, "BadPriority", "apns-priority must be 5 or 10")
        }
        return Int(header)!
    }

    /// `apns-expiration`: a UNIX time in seconds (0 = do not store), when present.
    static func expiration(_ header: String?) throws(APNsRejection) -> Int64? {
        guard let header else { return nil }
        guard !header.isEmpty, header.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let value = Int64(header) else {
            throw APNsRejection(400, "BadExpirationDate", "apns-expiration must be a UNIX time in seconds")
        }
        return value
    }

    /// `apns-id`: a canonical UUID, when present.
    static func messageID(_ header: String?) throws(APNsRejection) -> String? {
        guard let header else { return nil }
        guard UUID(text: header) != nil else {
            throw APNsRejection(400, "BadMessageId", "apns-id must be a UUID")
        }
        return header
    }

    /// Size, JSON and the `aps` shape of a live-activity payload.
    static func payload(_ body: [UInt8]) throws(APNsRejection) -> JSONValue {
        guard !body.isEmpty else { throw APNsRejection(400, "PayloadEmpty", "the payload is empty") }
        guard body.count <= maxPayloadBytes else {
            throw APNsRejection(413, "PayloadTooLarge", "the payload is larger than 4096 bytes")
        }
        guard let document = try? JSONValue.parse(body), document.objectValue != nil else {
            throw APNsRejection(400, "BadPayload", "the payload is not a JSON object")
        }
        try checkAPS(document["aps"])
        return document
    }

    /// The live-activity `aps` dictionary: `event`, integer `timestamp`, `content-state`; `start` also needs
    /// `attributes-type`, `attributes` and `alert`.
    static func checkAPS(_ aps: JSONValue?) throws(APNsRejection) {
        func bad(_ detail: String) -> APNsRejection { APNsRejection(400, "BadPayload", detail) }
        guard let aps = aps?.objectValue else { throw bad("the payload has no aps object") }
        guard let event = aps["event"]?.stringValue, ["start", "update", "end"].contains(event) else {
            throw bad("aps.event must be start, update or end")
        }
        guard case .int? = aps["timestamp"] else { throw bad("aps.timestamp must be an integer") }
        guard aps["content-state"]?.objectValue != nil else { throw bad("aps.content-state must be an object") }
        for field in ["dismissal-date", "stale-date"] {
            if let value = aps[field], case .int = value {
            } else if aps[field] != nil {
                throw bad("aps.\(field) must be an integer")
            }
        }
        if let score = aps["relevance-score"], score.doubleValue == nil {
            throw bad("aps.relevance-score must be a number")
        }
        if event == "start" {
            guard let type = aps["attributes-type"]?.stringValue, !type.isEmpty else {
                throw bad("a start needs aps.attributes-type")
            }
            guard aps["attributes"]?.objectValue != nil else { throw bad("a start needs an aps.attributes object") }
            guard let alert = aps["alert"], alert.objectValue != nil || alert.stringValue != nil else {
                throw bad("a start needs an aps.alert")
            }
            // The started activity either reports an update token or subscribes to a channel (the simulator's
            // reading of ActivityKit's push types: one or the other).
            if let channel = aps["input-push-channel"] {
                guard let id = channel.stringValue, ChannelLimits.channelID(id) != nil else {
                    throw bad("aps.input-push-channel must be a channel ID")
                }
                guard aps["input-push-token"] == nil else {
                    throw bad("a start carries input-push-token or input-push-channel, not both")
                }
            }
        }
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool {
        (0x30...0x39).contains(self) || (0x41...0x46).contains(self) || (0x61...0x66).contains(self)
    }
}
