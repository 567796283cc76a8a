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
/// Inspection: `GET /_sim/channels` → `{"limit": N, "limits": {...}, "channels": {"<bundle>": N}}`;
/// `POST /_sim/channels` `{"limit": N, "bundle_id"?: "…"}` sets the limit (for one bundle when named).
final class APNsChannelRegistry: Sendable {
    static let managementPrefix = "/1/apps/"

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
    func answer(_ request: HTTP2ServerRequest, validator: APNsValidator, now: Date) -> HTTP2ServerResponse? {
        // Cheap on the push path (`/3/device/…`), which this is called for too.
        guard request.path.hasPrefix(Self.managementPrefix) || request.path.hasPrefix("/_sim/channels") else {
            return nil
        }
        let path = HTTPText.splitTarget(request.path).path
        if path == "/_sim/channels" { return control(request) }
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
        let key = try validator.verifyProviderToken(authorization: request.header("authorization"), now: now)
        if let bundles = validator.bundlesByTeam[key.teamID], !bundles.contains(bundleID) {
            throw APNsRejection(400, "TopicDisallowed", "the bundle is not configured for the key's team")
        }
        if let id = request.header("apns-request-id"), id.utf8.count != 36 || UUID(uuidString: id) == nil {
            throw APNsRejection(400, "BadMessageId", "apns-request-id must be a UUID")
        }
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
        requestID.flatMap { $0.utf8.count == 36 && UUID(uuidString: $0) != nil ? $0 : nil }
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
