import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability

/// `/v1/channels` (app key): iOS 18 broadcast channels, created and deleted at Apple synchronously.
///
/// A create asks Apple first and records the channel after; if recording fails (or a concurrent request with the same
/// Idempotency-Key won), the channel just created at Apple is deleted again (logged with its ID when that fails). A
/// delete asks Apple first; a channel Apple no longer knows, or one of another app or environment than the
/// credential's that Apple refuses the credential's key for (`ChannelReach`), is still deleted here.
struct ChannelRoutes: Sendable {
    let authenticator: Authenticator
    let store: ChannelStore
    /// nil when this process cannot reach Apple (then creates and deletes answer 503).
    let manager: (any BroadcastChannelManaging)?
    let logger: Logger
    let now: @Sendable () -> Date

    func register(in router: inout Router) {
        router.add(.POST, "/v1/channels", authenticator.app(create))
        router.add(.GET, "/v1/channels", authenticator.app(list))
        router.add(.GET, "/v1/channels/{channel_id}", authenticator.app(get))
        router.add(.DELETE, "/v1/channels/{channel_id}", authenticator.app(delete))
    }

    func create(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let tenant = principal.tenantID
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["activity_type", "storage_policy"])
        let activityType = try Identifiers.activityType(
            body.requiredString("activity_type", maxLength: 255), field: "activity_type")
        let policy = try body.requiredEnum("storage_policy", ChannelStoragePolicy.self)
        let idempotencyKey = try LifecycleRoutes.idempotencyKey(request)
        let requestHash = LifecycleRoutes.requestHash(request)

        let context = try await store.createContext(
            tenant: tenant, activityType: activityType, idempotencyKey: idempotencyKey)
        if let stored = context.idempotent { return try LifecycleRoutes.replay(stored, hash: requestHash) }
        guard context.activityTypeExists else {
            throw ValidationError(
                field: "activity_type",
                reason: "is not a known activity type: define it with PUT /v1/activity_types/{identifier}")
        }
        let manager = try requireManager()
        let created = try await manager.create(tenant: tenant, storagePolicy: policy)
        let now = self.now()
        let channel = ChannelRecord(
            id: ULIDGenerator.shared.next().uuid, activityType: activityType, storagePolicy: policy,
            apnsChannelID: created.apnsChannelID, bundleID: created.bundleID, environment: created.environment,
            createdAt: now, updatedAt: now)
        let response = Self.render(channel)
        let outcome = try await record(
            tenant, channel,
            idempotency: idempotencyKey.map {
                IdempotencyRecord(key: $0, requestHash: requestHash, status: 201, response: response)
            })
        if outcome == .idempotencyKeyTaken {
            await undo(tenant, channel)
            let again = try await store.createContext(
                tenant: tenant, activityType: activityType, idempotencyKey: idempotencyKey)
            if let stored = again.idempotent { return try LifecycleRoutes.replay(stored, hash: requestHash) }
            throw Problems.conflict(field: "Idempotency-Key", reason: "is in use by a concurrent request")
        }
        return .json(response, status: 201)
    }

    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        var before: UUID?
        if let cursor = request.query["cursor"] {
            guard let ulid = ULID(string: cursor) else {
                throw ValidationError(field: "cursor", reason: "is not a cursor this API returned")
            }
            before = ulid.uuid
        }
        let activityType = try request.query["activity_type"].map { text throws(ValidationError) in
            try Identifiers.activityType(text, field: "activity_type")
        }
        let page = try await store.list(
            tenant: principal.tenantID, activityType: activityType, before: before, limit: limit + 1)
        let (items, next) = Paging.page(page, limit: limit) { .string(ULID(uuid: $0.id).description) }
        return .json(.object(["data": .array(items.map(Self.render)), "next_cursor": next]))
    }

    func get(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let id = try Self.channelID(request)
        return .json(Self.render(try await store.get(tenant: principal.tenantID, id: id)))
    }

    func delete(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let tenant = principal.tenantID
        let channel = try await store.get(tenant: tenant, id: try Self.channelID(request))
        let manager = try requireManager()
        do {
            try await manager.delete(tenant: tenant, Self.address(channel))
        } catch let error as ChannelManagementError where error.code == .channelNotFound {
            // Apple no longer knows it (deleted there, or expired): nothing left to delete but the record.
        } catch let error as ChannelManagementError {
            // Apple refused the credential's key for a channel of another app or environment: only a key of the
            // channel's own could delete it there. The record goes; the channel's ID is logged for whoever has one.
            guard case .outOfReach(let reach, let reason) = error.code else { throw error }
            logger.warning(
                "channel deleted here only: APNs refused the credential's key for it",
                metadata: Self.metadata(tenant, channel).merging([
                    "channel.reach": .string(reach.rawValue), "apns.reason": .string(reason),
                ]) { _, new in new })
        }
        guard try await store.delete(tenant: tenant, id: channel.id) else { throw NotFound("channel") }
        return .noContent()
    }

    // MARK: Helpers

    /// Creates a channel at Apple and records it (for a campaign that asks for a new one). A channel Apple created but
    /// that could not be recorded is deleted at Apple again.
    func open(tenant: UUID, activityType: String, policy: ChannelStoragePolicy) async throws -> ChannelRecord {
        let created = try await requireManager().create(tenant: tenant, storagePolicy: policy)
        let now = self.now()
        let channel = ChannelRecord(
            id: ULIDGenerator.shared.next().uuid, activityType: activityType, storagePolicy: policy,
            apnsChannelID: created.apnsChannelID, bundleID: created.bundleID, environment: created.environment,
            createdAt: now, updatedAt: now)
        _ = try await record(tenant, channel, idempotency: nil)
        return channel
    }

    /// Records a channel just created at Apple. One that could not be recorded is deleted at Apple again, unless the
    /// host answered the ID of a channel recorded already (then that channel is left alone, and the answer is 502
    /// `invalid_channel_id`).
    private func record(_ tenant: UUID, _ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws
        -> ChannelInsertOutcome
    {
        let outcome: ChannelInsertOutcome
        do {
            outcome = try await store.insert(tenant: tenant, channel, idempotency: idempotency)
        } catch {
            await undo(tenant, channel)
            throw error
        }
        if outcome == .channelIDTaken {
            logger.warning(
                "APNs answered the ID of a channel recorded already", metadata: Self.metadata(tenant, channel))
            throw ChannelManagementError(.refused(status: 0, reason: "invalid_channel_id"))
        }
        return outcome
    }

    /// Deletes a channel `open` made, here and at Apple, when what it was made for did not happen.
    func close(tenant: UUID, _ channel: ChannelRecord) async {
        _ = try? await store.delete(tenant: tenant, id: channel.id)
        await undo(tenant, channel)
    }

    private func requireManager() throws(HTTPProblem) -> any BroadcastChannelManaging {
        guard let manager else {
            throw HTTPProblem(
                status: 503, type: Problems.typeBase + "channels-unavailable", title: "Channels unavailable",
                detail: "This server cannot reach APNs channel management.")
        }
        return manager
    }

    /// Deletes a channel that was created at Apple but not recorded (best effort). One left at Apple is logged with
    /// its ID, so that it can be deleted by hand (Apple keeps at most 10,000 per app and environment).
    private func undo(_ tenant: UUID, _ channel: ChannelRecord) async {
        do {
            try await manager?.delete(tenant: tenant, Self.address(channel))
        } catch {
            logger.warning(
                "a channel created at APNs but not recorded could not be deleted there",
                metadata: Self.metadata(tenant, channel).merging(["error": .string(String(describing: error))]) {
                    _, new in new
                })
        }
    }

    /// What a log line about a channel names: its tenant, Apple's channel ID (not a secret: it only addresses
    /// broadcasts signed with the app's key), app and environment.
    static func metadata(_ tenant: UUID, _ channel: ChannelRecord) -> LogMetadata {
        [
            "tenant.id": .string(tenant.lowercasedString), "apns.channel_id": .string(channel.apnsChannelID),
            "apns.bundle_id": .string(channel.bundleID), "apns.environment": .string(channel.environment),
        ]
    }

    static func address(_ channel: ChannelRecord) -> ChannelAddress {
        ChannelAddress(
            apnsChannelID: channel.apnsChannelID, bundleID: channel.bundleID, environment: channel.environment)
    }

    /// The `{channel_id}` path parameter; anything that is not a ULID is a channel that does not exist.
    static func channelID(_ request: HTTPRequest) throws(HTTPProblem) -> UUID {
        guard let text = request.pathParameters["channel_id"], let ulid = ULID(string: text) else {
            throw Problems.notFound("channel")
        }
        return ulid.uuid
    }

    static func render(_ c: ChannelRecord) -> JSONValue {
        .object([
            "channel_id": .string(ULID(uuid: c.id).description), "apns_channel_id": .string(c.apnsChannelID),
            "activity_type": .string(c.activityType), "storage_policy": .string(c.storagePolicy.rawValue),
            "bundle_id": .string(c.bundleID), "environment": .string(c.environment), "status": .string(c.status),
            "status_reason": .from(c.statusReason), "created_at": .from(c.createdAt), "updated_at": .from(c.updatedAt),
        ])
    }
}

extension Problems {
    /// The problem a channel management failure is, for the client.
    static func channel(_ error: ChannelManagementError) -> HTTPProblem {
        switch error.code {
        case .noCredential:
            return HTTPProblem(
                status: 409, type: typeBase + "apns-credential-required", title: "APNs credential required",
                detail: "Broadcast channels are managed at Apple with the tenant's APNs key: PUT /v1/credentials/apns.")
        case .credentialUnusable:
            return HTTPProblem(
                status: 409, type: typeBase + "apns-credential-unusable", title: "APNs credential unusable",
                detail:
                    "The tenant's APNs key cannot be used by this server (APNs was not asked): upload it again with "
                    + "PUT /v1/credentials/apns.")
        case .limitReached:
            return HTTPProblem(
                status: 422, type: typeBase + "channel-limit-reached", title: "Channel limit reached",
                detail:
                    "Apple allows \(ChannelLimits.perAppAndEnvironment) broadcast channels per app and environment "
                    + "(CannotCreateChannelConfig): delete channels that are no longer needed.",
                extensions: [
                    "apns_reason": "CannotCreateChannelConfig", "limit": String(ChannelLimits.perAppAndEnvironment),
                ])
        case .channelNotFound:
            return HTTPProblem(
                status: 502, type: typeBase + "apns-refused", title: "APNs refused the request",
                detail: "APNs does not know the channel.", extensions: ["apns_reason": "ChannelNotRegistered"])
        case .refused(let status, let reason):
            var problem = HTTPProblem(
                status: 502, type: typeBase + "apns-refused", title: "APNs refused the request",
                detail: "APNs answered \(reason)" + (status > 0 ? " (HTTP \(status))." : "."),
                extensions: ["apns_reason": reason])
            if status > 0 { problem.extensions["apns_status"] = String(status) }
            if let retryAfter = error.retryAfter {
                problem.headers["Retry-After"] = String(max(1, retryAfter.components.seconds))
            }
            return problem
        case .outOfReach(let reach, let reason):
            return HTTPProblem(
                status: 502, type: typeBase + "apns-refused", title: "APNs refused the request",
                detail: "APNs refused the credential's key (\(reason), HTTP 403) for a channel out of its reach "
                    + "(\(reach.rawValue)).",
                extensions: ["apns_reason": reason, "apns_status": "403"])
        case .unreachable(let reason):
            return HTTPProblem(
                status: 502, type: typeBase + "apns-unreachable", title: "APNs unreachable",
                detail: "APNs channel management could not be reached: \(reason).", extensions: ["reason": reason],
                headers: ["Retry-After": "1"])
        }
    }
}
