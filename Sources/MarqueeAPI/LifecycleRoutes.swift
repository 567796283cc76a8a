import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import PostgresClient

/// `/v1/live_notifications/…` (app key): start, update and end by instance ID, and the reads behind them.
///
/// Each write reads what it needs in one round trip, applies the rules (schema, dates, merge patch, no-op
/// suppression, lifetime, size) without I/O, then writes the instance and one delivery per target in one statement
/// of a group commit. The response is sent only after that commit.
struct LifecycleRoutes: Sendable {
    let authenticator: Authenticator
    let store: LiveActivityStore
    let now: @Sendable () -> Date

    func register(in router: inout Router) {
        router.add(.POST, "/v1/live_notifications/start", authenticator.app(start))
        router.add(.POST, "/v1/live_notifications/update", authenticator.app(update))
        router.add(.POST, "/v1/live_notifications/end", authenticator.app(end))
        router.add(.GET, "/v1/live_notifications", authenticator.app(list))
        router.add(.GET, "/v1/live_notifications/{instance_id}", authenticator.app(get))
        router.add(.GET, "/v1/live_notifications/{instance_id}/deliveries", authenticator.app(deliveries))
    }

    // MARK: Start

    func start(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let tenant = principal.tenantID
        let body = try JSONBody.parse(request)
        try body.rejectUnknown([
            "identifiers", "notification_type", "attributes", "content_state", "instance_id", "platform", "device_id",
            "push_payload", "deep_link", "expiration", "stale_date", "relevance_score", "priority", "channel_id",
        ])
        guard let identifiers = try body.nested("identifiers") else { throw ValidationError.missing("identifiers") }
        try identifiers.rejectUnknown(["id", "email"])
        let personID = try identifiers.string("id", maxLength: 256).map { s throws(ValidationError) in
            try Identifiers.personID(s, field: "identifiers.id")
        }
        let email = try identifiers.string("email", maxLength: 320)
        guard (personID == nil) != (email == nil) else {
            throw ValidationError(field: "identifiers", reason: "must hold exactly one of id or email")
        }
        let activityType = try Identifiers.activityType(
            body.requiredString("notification_type", maxLength: 255), field: "notification_type")
        let attributes = try Self.nonEmptyObject(body, "attributes")
        let requestedState = try Self.nonEmptyObject(body, "content_state")
        let instanceID =
            try body.string("instance_id", maxLength: 128).map { s throws(ValidationError) in
                try Identifiers.instanceID(s)
            } ?? ULIDGenerator.shared.next().description
        let platform = try body.enumValue("platform", Platform.self)
        let deviceID = try body.string("device_id", maxLength: 4096).map { s throws(ValidationError) in
            try Identifiers.anyDeviceToken(s, field: "device_id")
        }
        let alert = try Self.alert(body)
        let channelID = try body.string("channel_id", maxLength: 64).map { text throws(ValidationError) in
            guard let ulid = ULID(string: text) else {
                throw ValidationError(
                    field: "channel_id", reason: "is not a channel ID (a ULID from POST /v1/channels)")
            }
            return ulid.uuid
        }
        let now = self.now()
        let expiration = try Lifetime.expiration(requested: body.timestamp("expiration"), now: now, field: "expiration")
        var options = try Self.options(body, base: StoredOptions())
        options.alert = alert
        let idempotencyKey = try Self.idempotencyKey(request)
        let requestHash = Self.requestHash(request)

        let context = try await store.startContext(
            tenant: tenant, activityType: activityType, personID: personID, email: email, instanceID: instanceID,
            idempotencyKey: idempotencyKey, channelID: channelID)
        if let stored = context.idempotent { return try Self.replay(stored, hash: requestHash) }
        if let existing = context.existingStart { return .json(existing.body, status: existing.status) }
        if context.existingInstance {
            throw Problems.conflict(field: "instance_id", reason: "is already used by another instance")
        }
        guard let type = context.activityType else {
            throw ValidationError(
                field: "notification_type",
                reason: "is not a known activity type: define it with PUT /v1/activity_types/{identifier}")
        }
        if channelID != nil {
            guard let channel = context.channel else {
                throw ValidationError(field: "channel_id", reason: "is not a channel of this tenant")
            }
            guard channel.status == "active" else {
                throw ValidationError(
                    field: "channel_id", reason: "is gone at Apple (\(channel.statusReason ?? "gone")): create another")
            }
            guard channel.activityType == activityType else {
                throw ValidationError(
                    field: "channel_id", reason: "belongs to activity type \(channel.activityType), not \(activityType)"
                )
            }
        }
        let contentState = try Self.checkedState(requestedState, type: type)
        let stale = StaleDateRule.apply(options.staleDate, now: now)
        options.staleDate = stale.staleDate

        // Targets: push-to-start tokens of the person's iOS devices, FCM tokens of their Android devices.
        var deliveries: [PlannedDelivery] = []
        var androidDevices: [String] = []
        for candidate in context.candidates {
            if let platform, candidate.platform != platform { continue }
            if let deviceID, candidate.deviceToken != deviceID { continue }
            switch candidate.platform {
            case .ios:
                guard let token = candidate.pushToStartToken else { continue }
                deliveries.append(
                    PlannedDelivery(
                        id: ULIDGenerator.shared.next().uuid, deviceToken: candidate.deviceToken, provider: .apns,
                        tokenKind: .pushToStart, token: token))
            case .android:
                deliveries.append(
                    PlannedDelivery(
                        id: ULIDGenerator.shared.next().uuid, deviceToken: candidate.deviceToken, provider: .fcm,
                        tokenKind: .fcm, token: candidate.deviceToken))
                androidDevices.append(candidate.deviceToken)
            }
        }
        // Apple shows an alert when a live activity starts on iOS: a start that reaches an iPhone must carry one.
        if alert == nil && (deliveries.contains { $0.provider == .apns } || (platform == .ios && deliveries.isEmpty)) {
            throw ValidationError(
                .missingField, field: "push_payload.alert",
                reason: "is required to start on iOS: Apple shows an alert when a live activity starts")
        }
        let timestamp = Int64(now.timeIntervalSince1970.rounded(.down))
        // Exactly what each delivery will send (its snapshot), with the worst-case attribution.
        var content = DeliverySnapshot(
            attributes: attributes, contentState: contentState, options: options, timestamp: timestamp
        ).content(
            event: .start, instanceID: instanceID, activityType: activityType, attributesType: type.attributesType,
            profile: type.payloadProfile, dateFields: type.dateFields, now: now)
        content.inputPushChannel = context.channel?.apnsChannelID
        var targeted = Set(deliveries.map { $0.provider == .apns ? Platform.ios : Platform.android })
        if context.channel != nil { targeted.insert(.ios) }
        try Self.checkSize(
            content, platforms: targeted.isEmpty ? (platform.map { [$0] } ?? [.ios, .android]) : Array(targeted))

        // A channel-backed instance lives without push-to-start targets: apps subscribe to its channel themselves.
        let state: InstanceState = deliveries.isEmpty ? (context.channel != nil ? .active : .failed) : .pending
        let failureReason = state == .failed ? "no_push_to_start_token" : nil
        var response: [String: JSONValue] = [
            "instance_id": .string(instanceID), "state": .string(state.rawValue),
            "targets": .int(Int64(deliveries.count)), "warnings": .array(stale.warnings.map { .string($0) }),
        ]
        if let channelID { response["channel_id"] = .string(ULID(uuid: channelID).description) }
        if let failureReason { response["failure_reason"] = .string(failureReason) }
        let responseBody = JSONValue.object(response)
        let outcome = try await store.start(
            tenant: tenant,
            StartWrite(
                instanceID: instanceID, activityType: activityType, personID: context.personID ?? personID,
                personEmail: email, state: state, failureReason: failureReason, attributes: attributes,
                contentState: contentState, options: options.json, contentTimestamp: timestamp,
                targetPlatform: platform, targetDevice: deviceID, expiresAt: expiration, response: responseBody,
                deliveries: deliveries, androidDevices: androidDevices,
                idempotency: idempotencyKey.map {
                    IdempotencyRecord(key: $0, requestHash: requestHash, status: 200, response: responseBody)
                }, channelID: channelID))
        if case .alreadyExists = outcome {
            // A concurrent request with the same instance ID or key won: answer with what it stored.
            let again = try await store.startContext(
                tenant: tenant, activityType: activityType, personID: personID, email: email, instanceID: instanceID,
                idempotencyKey: idempotencyKey)
            if let stored = again.idempotent { return try Self.replay(stored, hash: requestHash) }
            if let existing = again.existingStart { return .json(existing.body, status: existing.status) }
            throw Problems.conflict(field: "instance_id", reason: "is already used by another instance")
        }
        return .json(responseBody)
    }

    // MARK: Update and end

    func update(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .update)
    }

    func end(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .end)
    }

    func change(_ request: HTTPRequest, _ principal: Principal, operation: ChangeWrite.Operation) async throws
        -> HTTPResponse
    {
        let tenant = principal.tenantID
        let body = try JSONBody.parse(request)
        var allowed: Set<String> = [
            "instance_id", "content_state", "content_state_patch", "attributes", "push_payload", "deep_link",
            "stale_date", "relevance_score", "priority",
        ]
        if operation == .end { allowed.formUnion(["dismissal_date", "dismissal_policy"]) }
        try body.rejectUnknown(allowed)
        let instanceID = try Identifiers.instanceID(body.requiredString("instance_id", maxLength: 128))
        let fullState = try Self.nonEmptyObject(body, "content_state", required: false)
        let patch = try body.objectValue("content_state_patch")
        if fullState != nil && patch != nil {
            throw ValidationError(
                field: "content_state_patch", reason: "cannot be combined with content_state: send one or the other")
        }
        if operation == .update && fullState == nil && patch == nil {
            throw ValidationError(
                .missingField, field: "content_state", reason: "or content_state_patch is required for an update")
        }
        let newAttributes = try Self.nonEmptyObject(body, "attributes", required: false)
        let alert = try Self.alert(body)
        var dismissalDate: Date?
        if operation == .end {
            let policy = try body.string("dismissal_policy")
            if let policy, policy != "immediate", policy != "default" {
                throw ValidationError(field: "dismissal_policy", reason: "must be immediate or default")
            }
            dismissalDate = try body.timestamp("dismissal_date")
            if dismissalDate != nil && policy != nil {
                throw ValidationError(field: "dismissal_policy", reason: "cannot be combined with dismissal_date")
            }
            if policy == "immediate" { dismissalDate = now() }
        }
        let idempotencyKey = try Self.idempotencyKey(request)
        let requestHash = Self.requestHash(request)

        for _ in 0..<8 {
            let context = try await store.changeContext(
                tenant: tenant, instanceID: instanceID, idempotencyKey: idempotencyKey)
            if let stored = context.idempotent { return try Self.replay(stored, hash: requestHash) }
            guard let instance = context.instance, let type = context.activityType else {
                throw Problems.notFound("live_notification")
            }
            let now = self.now()
            let effective = instance.effectiveState(now: now)
            if effective.isClosed {
                if effective == .expired && instance.state != .expired {
                    try? await store.markExpired(tenant: tenant, instanceID: instanceID)
                }
                throw Problems.closedInstance(instanceID: instanceID, state: effective)
            }
            let current = StoredOptions(json: instance.options)
            var options = try Self.options(body, base: current)
            options.alert = alert
            options.dismissalDate = dismissalDate
            // A stale date this request sets is checked (and reported); a stored one that has passed since is
            // simply no longer sent.
            var stale = StaleDateRule.Outcome(staleDate: options.staleDate.flatMap { $0 > now ? $0 : nil })
            if body.has("stale_date") { stale = StaleDateRule.apply(options.staleDate, now: now) }
            options.staleDate = stale.staleDate

            var contentState = instance.contentState
            if let fullState {
                contentState = try Self.checkedState(fullState, type: type)
            } else if let patch {
                // The stored state is already in device encoding: encode only what the patch brings, then merge.
                let encodedPatch = try DateFields.normalize(
                    patch, fields: type.dateFields, field: "content_state_patch")
                contentState = try Self.validated(MergePatch.apply(encodedPatch, to: instance.contentState), type: type)
            }
            let attributes = newAttributes ?? instance.attributes

            if operation == .update,
                NoOp.isNoOp(
                    current: ActivitySnapshot(
                        contentState: instance.contentState, attributes: instance.attributes,
                        options: current.activityOptions),
                    next: ActivitySnapshot(
                        contentState: contentState, attributes: attributes, options: options.activityOptions),
                    alert: alert)
            {
                let response = JSONValue.object([
                    "instance_id": .string(instanceID), "state": .string(effective.rawValue),
                    "version": .int(Int64(instance.version)), "targets": .int(0), "suppressed": .bool(true),
                    "warnings": .array(stale.warnings.map { .string($0) }),
                ])
                if let idempotencyKey {
                    try await store.recordIdempotent(
                        tenant: tenant,
                        IdempotencyRecord(
                            key: idempotencyKey, requestHash: requestHash, status: 200, response: response))
                }
                return .json(response)
            }

            let timestamp = max(Int64(now.timeIntervalSince1970.rounded(.down)), instance.contentTimestamp + 1)
            // Exactly what each delivery will send (its snapshot), with the worst-case attribution.
            let content = DeliverySnapshot(
                attributes: attributes, contentState: contentState, options: options, timestamp: timestamp
            ).content(
                event: operation == .end ? .end : .update, instanceID: instanceID, activityType: instance.activityType,
                attributesType: type.attributesType, profile: type.payloadProfile, dateFields: type.dateFields,
                now: now)
            var platforms = Set(context.targets.map(\.platform))
            let channel = context.channel.flatMap { $0.active ? $0 : nil }
            if channel != nil { platforms.insert(.ios) }
            try Self.checkSize(content, platforms: platforms.isEmpty ? [.ios, .android] : Array(platforms))

            var deliveries = context.targets.map { target in
                PlannedDelivery(
                    id: ULIDGenerator.shared.next().uuid, deviceToken: target.deviceToken,
                    provider: target.platform == .ios ? .apns : .fcm,
                    tokenKind: target.platform == .ios ? .activity : .fcm, token: target.token)
            }
            // A channel-backed instance: one broadcast for every device subscribed to the channel, beside the
            // per-token pushes of devices that could not subscribe (they registered an activity token instead).
            if let channel {
                deliveries.append(
                    PlannedDelivery(
                        id: ULIDGenerator.shared.next().uuid,
                        deviceToken: "channel:" + ULID(uuid: channel.id).description, provider: .apns,
                        tokenKind: .channel, token: channel.apnsChannelID))
            }
            let state: InstanceState
            var failureReason: String?
            if operation == .end {
                // Ended even with no activity token yet: the store keeps the end for a token that registers later.
                state = .ended
            } else if deliveries.isEmpty {
                state = .failed
                failureReason = context.channel != nil ? "channel_gone" : "no_activity_token"
            } else {
                state = instance.state == .failed ? .pending : instance.state
            }
            var response: [String: JSONValue] = [
                "instance_id": .string(instanceID), "state": .string(state.rawValue),
                "version": .int(Int64(instance.version + 1)), "targets": .int(Int64(deliveries.count)),
                "suppressed": .bool(false), "coalesced": .bool(false),
                "warnings": .array(stale.warnings.map { .string($0) }),
            ]
            if let failureReason { response["failure_reason"] = .string(failureReason) }
            let responseBody = JSONValue.object(response)
            let outcome = try await store.change(
                tenant: tenant,
                ChangeWrite(
                    instanceID: instanceID, operation: operation, expectedVersion: instance.version, state: state,
                    failureReason: failureReason, attributes: attributes, contentState: contentState,
                    options: options.json, contentTimestamp: timestamp, deliveries: deliveries,
                    idempotency: idempotencyKey.map {
                        IdempotencyRecord(key: $0, requestHash: requestHash, status: 200, response: responseBody)
                    }))
            switch outcome {
            case .written(_, _, let coalesced):
                // Paced (the activity type's min_update_interval_ms): queued for later, replaced by a newer update.
                if coalesced { response["coalesced"] = .bool(true) }
                return .json(.object(response))
            case .versionConflict, .alreadyExists: continue  // read again: another change (or this key) won
            }
        }
        throw Problems.contention(instanceID: instanceID)
    }

    // MARK: Reads

    func get(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let id = try? Identifiers.instanceID(request.pathParameters["instance_id"] ?? ""),
            let found = try await store.instance(tenant: principal.tenantID, id: id)
        else { throw Problems.notFound("live_notification") }
        let (instance, targets, last, highPriority) = found
        guard case .object(var o) = Self.render(instance, now: now()) else { return .json(.null) }
        o["targets"] = .array(
            targets.map { t in
                .object([
                    "device_token": .string(maskToken(t.deviceToken)), "platform": .string(t.platform.rawValue),
                    "token_kind": .string(t.platform == .ios ? "activity" : "fcm"),
                    "token": .string(maskToken(t.token)),
                    "status": .string("active"),
                ])
            })
        o["last_delivery"] =
            last.map { d in
                .object([
                    "id": .string(ULID(uuid: d.id).description), "operation": .string(d.operation),
                    "status": .string(d.status), "created_at": .from(d.createdAt),
                ])
            } ?? .null
        o["high_priority_pushes_last_hour"] = .int(Int64(highPriority))
        return .json(.object(o))
    }

    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Self.limit(request)
        var state: InstanceState?
        if let text = request.query["state"] {
            guard let parsed = InstanceState(rawValue: text) else {
                throw ValidationError(
                    field: "state",
                    reason: "must be one of " + InstanceState.allCases.map(\.rawValue).joined(separator: ", "))
            }
            state = parsed
        }
        let after = try TimeCursor.decode(request.query["cursor"])
        let page = try await store.instances(
            tenant: principal.tenantID, person: request.query["person"],
            activityType: request.query["notification_type"], campaign: request.query["campaign"], state: state,
            after: after, limit: limit + 1)
        let items = page.prefix(limit)
        var next: JSONValue = .null
        if page.count > limit, let last = items.last {
            next = TimeCursor.encode(last.startedAt, last.id)
        }
        let now = self.now()
        return .json(.object(["data": .array(items.map { Self.render($0, now: now) }), "next_cursor": next]))
    }

    func deliveries(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let id = try? Identifiers.instanceID(request.pathParameters["instance_id"] ?? "") else {
            throw Problems.notFound("live_notification")
        }
        let limit = try Self.limit(request)
        var before: UUID?
        if let cursor = request.query["cursor"] {
            guard let ulid = ULID(string: cursor) else {
                throw ValidationError(field: "cursor", reason: "is not a cursor this API returned")
            }
            before = ulid.uuid
        }
        guard
            let page = try await store.deliveries(
                tenant: principal.tenantID, instanceID: id, before: before, limit: limit + 1)
        else { throw Problems.notFound("live_notification") }
        let items = page.prefix(limit)
        let next: JSONValue =
            page.count > limit ? items.last.map { .string(ULID(uuid: $0.id).description) } ?? .null : .null
        return .json(.object(["data": .array(items.map(Self.render)), "next_cursor": next]))
    }

    // MARK: Rendering

    static func render(_ i: InstanceRecord, now: Date) -> JSONValue {
        var person: [String: JSONValue] = [:]
        if let id = i.personID { person["id"] = .string(id) }
        if let email = i.personEmail { person["email"] = .string(email) }
        let state = i.effectiveState(now: now)
        return .object([
            "instance_id": .string(i.id), "state": .string(state.rawValue), "failure_reason": .from(i.failureReason),
            "notification_type": .string(i.activityType), "person": .object(person),
            "attributes": i.attributes, "content_state": i.contentState, "version": .int(Int64(i.version)),
            "started_at": .from(i.startedAt), "ended_at": .from(i.endedAt), "expires_at": .from(i.expiresAt),
            "updated_at": .from(i.updatedAt),
            "channel_id": i.channelID.map { .string(ULID(uuid: $0).description) } ?? .null,
            "campaign_id": .from(i.campaignID),
        ])
    }

    static func render(_ d: DeliveryRecord) -> JSONValue {
        .object([
            "id": .string(ULID(uuid: d.id).description), "instance_id": .string(d.instanceID),
            "device_token": .string(maskToken(d.deviceToken)), "provider": .string(d.provider),
            "token_kind": .string(d.tokenKind), "operation": .string(d.operation),
            "instance_version": .int(Int64(d.instanceVersion)), "status": .string(d.status),
            "attempts": .int(Int64(d.attempts)), "next_attempt_at": .from(d.nextAttemptAt),
            "provider_id": .from(d.providerID), "http_status": d.httpStatus.map { .int(Int64($0)) } ?? .null,
            "reason": .from(d.reason), "created_at": .from(d.createdAt), "updated_at": .from(d.updatedAt),
            "sent_at": .from(d.sentAt),
        ])
    }

    // MARK: Field rules

    static func nonEmptyObject(_ body: JSONBody, _ key: String, required: Bool = true) throws(ValidationError)
        -> JSONValue?
    {
        guard let value = try body.objectValue(key) else {
            if required { throw ValidationError.missing(key) }
            return nil
        }
        guard let object = value.objectValue, !object.isEmpty else {
            throw ValidationError(field: key, reason: "must be a non-empty JSON object")
        }
        return value
    }

    static func nonEmptyObject(_ body: JSONBody, _ key: String) throws(ValidationError) -> JSONValue {
        try nonEmptyObject(body, key, required: true)!
    }

    /// Date fields encoded as the activity type declares, then the schema check. The schema describes the state
    /// as devices receive it, so it sees dates in their declared encoding.
    static func checkedState(_ state: JSONValue, type: ActivityType) throws(ValidationError) -> JSONValue {
        try ContentStateRules.checked(
            state, schema: type.contentStateSchema, dateFields: type.dateFields, profile: type.payloadProfile)
    }

    static func validated(_ state: JSONValue, type: ActivityType) throws(ValidationError) -> JSONValue {
        try ContentStateRules.validated(state, schema: type.contentStateSchema, profile: type.payloadProfile)
    }

    static func alert(_ body: JSONBody) throws(ValidationError) -> LiveActivityAlert? {
        guard let payload = try body.nested("push_payload") else { return nil }
        try payload.rejectUnknown(["alert"])
        guard let alert = try payload.nested("alert") else { return nil }
        try alert.rejectUnknown(["title", "body", "sound"])
        return LiveActivityAlert(
            title: try alert.requiredString("title", maxLength: 256),
            body: try alert.requiredString("body", maxLength: 1024),
            sound: try alert.string("sound", maxLength: 256))
    }

    /// Sticky options: what the body gives replaces, what it omits is kept from `base`.
    static func options(_ body: JSONBody, base: StoredOptions) throws(ValidationError) -> StoredOptions {
        var options = base
        options.alert = nil
        options.dismissalDate = nil
        if let link = try body.string("deep_link", maxLength: 2048) {
            guard link.contains(":") else {
                throw ValidationError(field: "deep_link", reason: "must be a URL such as myapp://orders/42")
            }
            options.deepLink = link
        }
        if body.has("stale_date") { options.staleDate = try body.timestamp("stale_date") }
        if let value = body.value("relevance_score") {
            guard let score = value.doubleValue, score.isFinite else {
                throw ValidationError(field: "relevance_score", reason: "must be a number")
            }
            options.relevanceScore = score
        }
        if let priority = try body.integer("priority", range: 5...10) {
            guard priority == 5 || priority == 10 else {
                throw ValidationError(field: "priority", reason: "must be 5 or 10")
            }
            options.priority = Int(priority)
        }
        return options
    }

    static func checkSize(_ content: ActivityContent, platforms: [Platform]) throws {
        for platform in Set(platforms).sorted(by: { $0.rawValue > $1.rawValue }) {
            do {
                try PayloadLimits.check(content, platform: platform)
            } catch {
                throw Problems.payloadTooLarge(error)
            }
        }
    }

    static func idempotencyKey(_ request: HTTPRequest) throws(ValidationError) -> String? {
        guard let key = request.headers["Idempotency-Key"] else { return nil }
        guard (1...255).contains(key.utf8.count), key.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw ValidationError(field: "Idempotency-Key", reason: "must be 1 to 255 printable ASCII characters")
        }
        return key
    }

    static func requestHash(_ request: HTTPRequest) -> [UInt8] {
        SHA256.hash(Array((request.method.rawValue + " " + request.path + "\n").utf8) + request.body)
    }

    static func replay(_ stored: StoredResponse, hash: [UInt8]) throws -> HTTPResponse {
        guard stored.requestHash.isEmpty || ConstantTime.equals(stored.requestHash, hash) else {
            throw ValidationError(
                field: "Idempotency-Key", reason: "was already used for a different request in the last 24 hours")
        }
        var response = HTTPResponse.json(stored.body, status: stored.status)
        response.headers["Idempotent-Replayed"] = "true"
        return response
    }

    static func limit(_ request: HTTPRequest) throws(ValidationError) -> Int {
        guard let text = request.query["limit"] else { return 50 }
        guard let n = Int(text), (1...200).contains(n) else {
            throw ValidationError(field: "limit", reason: "must be an integer in 1...200")
        }
        return n
    }
}
