import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization

/// Apple's broadcast channel management API ("Sending channel management requests to APNs") as the APNs simulator
/// serves it, with channels kept in memory per bundle ID:
///
/// - `POST /1/apps/<bundle>/channels` `{"message-storage-policy": 0|1, "push-type": "LiveActivity"}` → 201 with
///   `apns-channel-id`;
/// - `GET` / `DELETE /1/apps/<bundle>/channels` with `apns-channel-id` → 200 `{"message-storage-policy",
///   "push-type"}` / 204;
/// - `GET /1/apps/<bundle>/all-channels` → 200 `{"channels": [...]}`.
///
/// Checks in Apple's order: path, method, provider token (the same JWT checks as pushes), bundle of the key's team,
/// `apns-request-id`, then the operation's own. Errors are Apple's status and `{"reason"}`; every answer echoes
/// `apns-request-id` (or a new one). A bundle holds at most `limit` channels (Apple: 10,000) —
/// `CannotCreateChannelConfig` beyond.
///
/// Broadcasts ("Sending broadcast push notification requests to APNs"): `POST /4/broadcasts/apps/<bundle>` with
/// `apns-channel-id`, `apns-push-type: liveactivity`, `apns-priority`, `apns-expiration` (0 on a channel that stores
/// nothing, or 400 BadExpirationDate) and an update or end payload → 200 with `apns-request-id` and
/// `apns-unique-id`; an unknown channel → 404 ChannelNotRegistered. Accepted broadcasts are recorded under their
/// channel ID (`/_sim/pushes?token=<channel ID>`), with `"broadcast": true`. Fault rules match a broadcast with its
/// channel ID as the token (after Apple's checks), answering the action's status and reason.
///
/// Inspection: `GET /_sim/channels` → `{"limit": N, "limits": {...}, "channels": {"<bundle>": N}}`;
/// `POST /_sim/channels` `{"limit": N, "bundle_id"?: "…"}` sets the limit (for one bundle when named).
final class APNsChannelRegistry: Sendable {
    static let managementPrefix = "/1/apps/"
    static let broadcastPrefix = "/4/broadcasts/apps/"

    private struct Channel {
        var storagePolicy: Int
        var createdAt: Date
    }

    private struct State {
        var channels: [String: [String: Channel]] = [:]
        var limit = ChannelLimits.perAppAndEnvironment
        var limits: [String: Int] = [:]
    }

    private let state = Mutex(State())

    /// The answer for a channel management or `/_sim/channels` request; nil for any other path.
    func answer(
        _ request: HTTP2ServerRequest, validator: APNsValidator, recorder: Recorder, faults: FaultInjector, now: Date
    ) -> HTTP2ServerResponse? {
        // Cheap on the push path (`/3/device/…`), which this is called for too.
        guard
            request.path.hasPrefix(Self.managementPrefix) || request.path.hasPrefix(Self.broadcastPrefix)
                || request.path.hasPrefix("/_sim/channels")
        else {
            return nil
        }
        let path = HTTPText.splitTarget(request.path).path
        if path == "/_sim/channels" { return control(request) }
        if path.hasPrefix(Self.broadcastPrefix) {
            let requestID = request.header("apns-request-id")
            do throws(APNsRejection) {
                let bundleID = String(path.dropFirst(Self.broadcastPrefix.count))
                guard !bundleID.isEmpty, !bundleID.contains("/") else {
                    throw APNsRejection(404, "BadPath", "the path must be /4/broadcasts/apps/<bundle ID>")
                }
                let uniqueID = try broadcast(
                    request, bundleID: bundleID, validator: validator, recorder: recorder, faults: faults, now: now)
                return HTTP2ServerResponse(
                    status: 200, headers: [("apns-request-id", Self.echo(requestID)), ("apns-unique-id", uniqueID)])
            } catch {
                recorder.reject(reason: error.reason)
                return HTTPText.json(
                    error.status, .object(["reason": .string(error.reason)]),
                    headers: [("apns-request-id", Self.echo(requestID)), ("x-sim-detail", error.detail)])
            }
        }
        guard let (bundleID, resource) = Self.route(path) else { return nil }
        let requestID = request.header("apns-request-id")
        do {
            let answer = try handle(request, bundleID: bundleID, resource: resource, validator: validator, now: now)
            return HTTP2ServerResponse(
                status: answer.status, headers: answer.headers + [("apns-request-id", Self.echo(requestID))],
                body: answer.body)
        } catch {
            return HTTPText.json(
                error.status, .object(["reason": .string(error.reason)]),
                headers: [("apns-request-id", Self.echo(requestID)), ("x-sim-detail", error.detail)])
        }
    }

    /// `(bundle, "channels" | "all-channels")` of a management path; nil when it is not one.
    static func route(_ path: String) -> (String, String)? {
        guard path.hasPrefix(managementPrefix) else { return nil }
        let parts = path.dropFirst(managementPrefix.count).split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, parts[1] == "channels" || parts[1] == "all-channels" else {
            return nil
        }
        return (String(parts[0]), String(parts[1]))
    }

    private struct Answer {
        var status: Int
        var headers: [(String, String)] = []
        var body: [UInt8] = []
    }

    private func handle(
        _ request: HTTP2ServerRequest, bundleID: String, resource: String, validator: APNsValidator, now: Date
    ) throws(APNsRejection) -> Answer {
        let allowed: Set<String> = resource == "channels" ? ["POST", "GET", "DELETE"] : ["GET"]
        guard allowed.contains(request.method) else {
            throw APNsRejection(405, "MethodNotAllowed", "\(request.method) is not allowed on \(resource)")
        }
        _ = try Self.authorize(request, bundleID: bundleID, validator: validator, now: now)
        switch (request.method, resource) {
        case ("POST", _): return try create(request.body, bundleID: bundleID, now: now)
        case ("GET", "all-channels"): return list(bundleID: bundleID)
        default:
            let channelID = try Self.channelID(request.header("apns-channel-id"))
            return try state.withLock { state throws(APNsRejection) -> Answer in
                guard let channel = state.channels[bundleID]?[channelID] else {
                    throw APNsRejection(404, "ChannelNotRegistered", "no such channel for this bundle")
                }
                if request.method == "DELETE" {
                    state.channels[bundleID]?[channelID] = nil
                    return Answer(status: 204)
                }
                let body = JSONValue.object([
                    "message-storage-policy": .int(Int64(channel.storagePolicy)), "push-type": .string("LiveActivity"),
                ])
                return Answer(
                    status: 200, headers: [("content-type", "application/json"), ("apns-channel-id", channelID)],
                    body: body.bytes)
            }
        }
    }

    private func create(_ body: [UInt8], bundleID: String, now: Date) throws(APNsRejection) -> Answer {
        guard !body.isEmpty, body.count <= 4096, let document = try? JSONValue.parse(body),
            let object = document.objectValue
        else { throw APNsRejection(400, "BadPayload", "the body must be a JSON object") }
        guard let pushType = object["push-type"] else {
            throw APNsRejection(400, "MissingPushType", "push-type is required")
        }
        guard pushType.stringValue == "LiveActivity" else {
            throw APNsRejection(400, "InvalidPushType", "push-type must be LiveActivity")
        }
        // Apple's documentation names no reason of its own for a bad storage policy; this one is the simulator's.
        guard case .int(let policy)? = object["message-storage-policy"], policy == 0 || policy == 1 else {
            throw APNsRejection(400, "BadMessageStoragePolicy", "message-storage-policy must be 0 or 1")
        }
        let id = Data(SecureRandom.bytes(24)).base64EncodedString()
        try state.withLock { state throws(APNsRejection) in
            let limit = state.limits[bundleID] ?? state.limit
            guard state.channels[bundleID, default: [:]].count < limit else {
                throw APNsRejection(
                    400, "CannotCreateChannelConfig", "the bundle has reached its limit of \(limit) channels")
            }
            state.channels[bundleID, default: [:]][id] = Channel(storagePolicy: Int(policy), createdAt: now)
        }
        return Answer(status: 201, headers: [("apns-channel-id", id)])
    }

    /// The checks every channel request passes first: the provider token, the bundle of the key's team, the
    /// request ID's form. Returns the verified key.
    static func authorize(_ request: HTTP2ServerRequest, bundleID: String, validator: APNsValidator, now: Date)
        throws(APNsRejection) -> APNsSimulator.SigningKey
    {
        let key = try validator.verifyProviderToken(
            authorization: request.header("authorization"), connection: request.connectionID, now: now)
        if let bundles = validator.bundlesByTeam[key.teamID], !bundles.contains(bundleID) {
            throw APNsRejection(400, "TopicDisallowed", "the bundle is not configured for the key's team")
        }
        if let id = request.header("apns-request-id"), UUID(text: id) == nil {
            throw APNsRejection(400, "BadMessageId", "apns-request-id must be a UUID")
        }
        return key
    }

    /// Checks a broadcast in Apple's order and records it; returns its `apns-unique-id`.
    private func broadcast(
        _ request: HTTP2ServerRequest, bundleID: String, validator: APNsValidator, recorder: Recorder,
        faults: FaultInjector, now: Date
    ) throws(APNsRejection) -> String {
        guard request.method == "POST" else {
            throw APNsRejection(405, "MethodNotAllowed", "the method must be POST")
        }
        let key = try Self.authorize(request, bundleID: bundleID, validator: validator, now: now)
        guard request.header("apns-push-type") == "liveactivity" else {
            throw APNsRejection(400, "InvalidPushType", "apns-push-type must be liveactivity")
        }
        let channelID = try Self.channelID(request.header("apns-channel-id"))
        guard let channel = state.withLock({ $0.channels[bundleID]?[channelID] }) else {
            throw APNsRejection(404, "ChannelNotRegistered", "no such channel for this bundle")
        }
        let priority = try APNsValidator.priority(request.header("apns-priority"))
        let expiration = try APNsValidator.expiration(request.header("apns-expiration"))
        if channel.storagePolicy == 0, let expiration, expiration != 0 {
            throw APNsRejection(
                400, "BadExpirationDate", "a channel that stores no messages takes apns-expiration 0")
        }
        let payload = try APNsValidator.payload(request.body)
        guard let event = payload["aps"]?["event"]?.stringValue, event != "start" else {
            throw APNsRejection(400, "BadPayload", "a broadcast updates or ends activities: aps.event start")
        }
        // Fault rules match a broadcast by its channel ID, and answer at once.
        if let rule = faults.decide(token: channelID), let (status, reason) = rule.action.apnsAnswer {
            recorder.inject(rule.action)
            throw APNsRejection(status, reason, "fault rule")
        }
        let uniqueID = SecureRandom.uuid().uuidString.lowercased()
        let requestID = request.header("apns-request-id")
        recorder.accept(token: channelID) {
            var record: [String: JSONValue] = [
                "time": .string(HTTPText.timestamp(now)), "broadcast": .bool(true), "channel_id": .string(channelID),
                "bundle_id": .string(bundleID), "priority": .int(Int64(priority)), "unique_id": .string(uniqueID),
                "key_id": .string(key.keyID), "team_id": .string(key.teamID), "payload": payload,
            ]
            if let expiration { record["expiration"] = .int(expiration) }
            if let requestID { record["request_id"] = .string(requestID) }
            return .object(record)
        }
        return uniqueID
    }

    /// Makes Apple forget a channel (as if deleted elsewhere): the next broadcast on it is ChannelNotRegistered.
    func forget(bundleID: String, channelID: String) -> Bool {
        state.withLock { $0.channels[bundleID]?.removeValue(forKey: channelID) != nil }
    }

    private func list(bundleID: String) -> Answer {
        let ids = state.withLock { state in
            (state.channels[bundleID] ?? [:]).sorted { $0.value.createdAt < $1.value.createdAt }.map(\.key)
        }
        return Answer(
            status: 200, headers: [("content-type", "application/json")],
            body: JSONValue.object(["channels": .array(ids.map { .string($0) })]).bytes)
    }

    /// `apns-channel-id`: 400 MissingChannelId without it, 400 BadChannelId unless it is base64 of a sane length.
    static func channelID(_ header: String?) throws(APNsRejection) -> String {
        guard let header, !header.isEmpty else {
            throw APNsRejection(400, "MissingChannelId", "apns-channel-id is required")
        }
        guard ChannelLimits.channelID(header) != nil, Data(base64Encoded: header) != nil else {
            throw APNsRejection(400, "BadChannelId", "apns-channel-id must be base64")
        }
        return header
    }

    static func echo(_ requestID: String?) -> String {
        requestID.flatMap { UUID(text: $0) != nil ? $0 : nil }
            ?? SecureRandom.uuid().uuidString.lowercased()
    }

    private func control(_ request: HTTP2ServerRequest) -> HTTP2ServerResponse {
        switch request.method {
        case "GET":
            let (limit, limits, counts) = state.withLock { state in
                (state.limit, state.limits, state.channels.mapValues(\.count))
            }
            return HTTPText.json(
                200,
                .object([
                    "limit": .int(Int64(limit)), "limits": .object(limits.mapValues { .int(Int64($0)) }),
                    "channels": .object(counts.mapValues { .int(Int64($0)) }),
                ]))
        case "POST":
            guard let document = try? JSONValue.parse(request.body), case .int(let limit)? = document["limit"],
                limit >= 0, limit <= 1_000_000
            else {
                return HTTPText.json(400, .object(["error": .string("expected {\"limit\": N, \"bundle_id\"?: …}")]))
            }
            let bundleID = document["bundle_id"]?.stringValue
            state.withLock { state in
                if let bundleID { state.limits[bundleID] = Int(limit) } else { state.limit = Int(limit) }
            }
            return HTTPText.json(200, .object(["limit": .int(limit)]))
        default:
            return HTTPText.json(405, .object(["error": .string("GET or POST")]))
        }
    }
}
