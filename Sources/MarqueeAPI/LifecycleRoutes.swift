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
    /// Changes of one instance queue here and are applied together (hot instances).
    let lines = InstanceLines<LineKey, PendingChange, HTTPResponse> { leader, next in
        leader.idempotencyKey == nil && next.idempotencyKey == nil
    }

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
        let idempotencyKey = try Self.idempotencyKey(request)
        let requestHash = Self.requestHash(request)
        let identity: (personID: String?, email: String?)
        let start: LifecyclePlanner.StartRequest
        do {
            (identity, start) = try parseStart(JSONBody.parse(request))
        } catch let error as ValidationError {
            // A retry of an accepted start whose `expiration` has passed since is answered as the first one was, not
            // refused as a request never accepted (asked only then: the usual start reads its key with its context).
            if let key = idempotencyKey, let stored = try await store.idempotentResponse(tenant: tenant, key: key) {
                return try Self.replay(stored, hash: requestHash)
            }
            throw error
        }
        // Planned from a read, written after: a device planned for that went meanwhile makes the write fail, and the
        // start is planned again from a fresh read (its answer names what it queued).
        for _ in 0..<Self.writeAttempts {
            let context = try await store.startContext(
                tenant: tenant, activityType: start.activityType, personID: identity.personID, email: identity.email,
                instanceID: start.instanceID, idempotencyKey: idempotencyKey, channelID: start.channelID)
            if let stored = context.idempotent { return try Self.replay(stored, hash: requestHash) }
            if let existing = context.existingStart { return .json(existing.body, status: existing.status) }
            let decision = try LifecyclePlanner.planStart(
                start,
                facts: .init(
                    activityType: context.activityType, candidates: context.candidates,
                    instanceIDTaken: context.existingInstance, channel: context.channel),
                now: now(), newID: { ULIDGenerator.shared.next().uuid })
            guard case .write(let plan) = decision else {
                throw Problems.conflict(field: "instance_id", reason: "is already used by another instance")
            }
            let response = Self.render(start, plan)
            let outcome = try await store.start(
                tenant: tenant,
                StartWrite(
                    request: start, plan: plan, personID: context.personID ?? identity.personID,
                    personEmail: identity.email, response: response,
                    idempotency: idempotencyKey.map {
                        IdempotencyRecord(key: $0, requestHash: requestHash, status: 200, response: response)
                    }))
            switch outcome {
            case .written: return .json(response)
            // Planned again from a fresh read: a device it planned for went; or a concurrent request with the same
            // instance ID or key won, or this start committed and its answer was lost with the database connection,
            // and the read answers with what was stored (or 409 for an ID another instance has).
            case .versionConflict, .alreadyExists: continue
            }
        }
        throw Problems.contention(instanceID: start.instanceID)
    }

    /// How many times a start or change is planned and written before it is answered 503 (its instance, or its
    /// person's devices, kept changing under it).
    static let writeAttempts = 8

    /// The person a start addresses (by ID or by email) and the start itself.
    func parseStart(_ body: JSONBody) throws(ValidationError) -> (
        identity: (personID: String?, email: String?), start: LifecyclePlanner.StartRequest
    ) {
        try body.rejectUnknown([
            "identifiers", "notification_type", "attributes", "content_state", "instance_id", "platform", "device_id",
            "push_payload", "deep_link", "expiration", "stale_date", "relevance_score", "priority", "channel_id",
        ])
        guard let identifiers = try body.nested("identifiers") else { throw ValidationError.missing("identifiers") }
        try identifiers.rejectUnknown(["id", "email"])
        let personID = try identifiers.string("id", maxLength: 256).map { s throws(ValidationError) in
            try Identifiers.personID(s, field: "identifiers.id")
        }
        let email = try RegistryRoutes.email(
            identifiers.string("email", maxLength: RegistryRoutes.maxEmailBytes), field: "identifiers.email")
        guard (personID == nil) != (email == nil) else {
            throw ValidationError(field: "identifiers", reason: "must hold exactly one of id or email")
        }
        let channelID = try body.string("channel_id", maxLength: 64).map { text throws(ValidationError) in
            guard let ulid = ULID(string: text) else {
                throw ValidationError(
                    field: "channel_id", reason: "is not a channel ID (a ULID from POST /v1/channels)")
            }
            return ulid.uuid
        }
        var options = try Self.optionChanges(body).applied(to: StoredOptions())
        options.alert = try Self.alert(body)
        let start = LifecyclePlanner.StartRequest(
            instanceID: try body.string("instance_id", maxLength: 128).map { s throws(ValidationError) in
                try Identifiers.instanceID(s)
            } ?? ULIDGenerator.shared.next().description,
            activityType: try Identifiers.activityType(
                body.requiredString("notification_type", maxLength: 255), field: "notification_type"),
            attributes: try Self.nonEmptyObject(body, "attributes"),
            contentState: try Self.nonEmptyObject(body, "content_state"),
            platform: try body.enumValue("platform", Platform.self),
            deviceID: try body.string("device_id", maxLength: 4096).map { s throws(ValidationError) in
                try Identifiers.anyDeviceToken(s, field: "device_id")
            }, options: options,
            expiresAt: try Lifetime.expiration(
                requested: body.timestamp("expiration"), now: now(), field: "expiration"),
            channelID: channelID)
        return ((personID, email), start)
    }

    // MARK: Update and end

    func update(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .update)
    }

    func end(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .end)
    }

    func change(_ request: HTTPRequest, _ principal: Principal, operation: LifecyclePlanner.Operation) async throws
        -> HTTPResponse
    {
        let (instanceID, change) = try Self.parseChange(JSONBody.parse(request), operation: operation)
        let pending = PendingChange(
            change: change, idempotencyKey: try Self.idempotencyKey(request), requestHash: Self.requestHash(request))
        let tenant = principal.tenantID
        return try await lines.submit(LineKey(tenant: tenant, instanceID: instanceID), pending) { batch in
            await apply(batch, tenant: tenant, instanceID: instanceID)
        }
    }

    /// A parsed change waiting in its instance's line.
    struct PendingChange: Sendable {
        var change: LifecyclePlanner.ChangeRequest
        var idempotencyKey: String?
        var requestHash: [UInt8]
    }

    struct LineKey: Hashable, Sendable {
        var tenant: UUID
        var instanceID: String
    }

    /// Changes of one instance, in arrival order, read once, planned one on top of the other and written in one
    /// statement: the newest state and the newest change's deliveries (each earlier one is answered `coalesced`: a
    /// newer change replaced its pushes, as it would have replaced them in the queue). A change with an
    /// Idempotency-Key always runs alone. One answer per change.
    func apply(_ batch: [PendingChange], tenant: UUID, instanceID: String) async -> [Result<HTTPResponse, any Error>] {
        let key = batch.count == 1 ? batch[0].idempotencyKey : nil
        do {
            for _ in 0..<Self.writeAttempts {
                let context = try await store.changeContext(tenant: tenant, instanceID: instanceID, idempotencyKey: key)
                if let stored = context.idempotent {
                    return [Result { try Self.replay(stored, hash: batch[0].requestHash) }]
                }
                guard var instance = context.instance, let type = context.activityType else {
                    return batch.map { _ in .failure(Problems.notFound("live_notification")) }
                }
                let now = self.now()
                var answers: [Result<JSONValue, any Error>] = []
                var written: [(index: Int, plan: LifecyclePlanner.ChangePlan)] = []
                var markExpired = false
                for pending in batch {
                    do {
                        let decision = try LifecyclePlanner.planChange(
                            pending.change,
                            facts: .init(
                                instance: instance, activityType: type, targets: context.targets,
                                channel: context.channel),
                            now: now, newID: { ULIDGenerator.shared.next().uuid })
                        switch decision {
                        case .closed(let state, let expired):
                            markExpired = markExpired || expired
                            answers.append(.failure(Problems.closedInstance(instanceID: instanceID, state: state)))
                        case .noop(let state, let version, let warnings):
                            answers.append(.success(Self.renderNoop(instanceID, state, version, warnings)))
                        case .write(let plan):
                            written.append((answers.count, plan))
                            instance.apply(plan, operation: pending.change.operation, now: now)
                            // Replaced by the newer change it is written with: nothing of its own is queued.
                            var replaced = plan
                            replaced.deliveries = []
                            answers.append(.success(Self.render(instanceID, replaced, coalesced: true)))
                        }
                    } catch {
                        answers.append(.failure(error))
                    }
                }
                if markExpired { try? await store.markExpired(tenant: tenant, instanceID: instanceID) }
                let record: (JSONValue) -> IdempotencyRecord? = { response in
                    key.map {
                        IdempotencyRecord(key: $0, requestHash: batch[0].requestHash, status: 200, response: response)
                    }
                }
                guard let last = written.last else {
                    if case .success(let response) = answers[0], let record = record(response),
                        try await !store.recordIdempotent(tenant: tenant, record)
                    {
                        continue  // a concurrent request with the key won: read again, and answer with its record
                    }
                    return answers.map { $0.map { HTTPResponse.json($0) } }
                }
                var plan = last.plan
                plan.expectedVersion = written[0].plan.expectedVersion
                let response = Self.render(instanceID, last.plan, coalesced: false)
                let outcome = try await store.change(
                    tenant: tenant,
                    ChangeWrite(
                        instanceID: instanceID, operation: batch[last.index].change.operation, plan: plan,
                        idempotency: record(response)))
                switch outcome {
                case .written(_, _, let coalesced):
                    // Paced (the activity type's min_update_interval_ms): queued for later, replaced by a newer one.
                    answers[last.index] = .success(Self.render(instanceID, last.plan, coalesced: coalesced))
                    return answers.map { $0.map { HTTPResponse.json($0) } }
                // Read again: another process (or this key) won, or this change's answer was lost with the connection
                // after it committed (its key's record answers).
                case .versionConflict, .alreadyExists: continue
                }
            }
            return batch.map { _ in .failure(Problems.contention(instanceID: instanceID)) }
        } catch {
            return batch.map { _ in .failure(error) }
        }
    }

    static func parseChange(_ body: JSONBody, operation: LifecyclePlanner.Operation) throws(ValidationError) -> (
        instanceID: String, change: LifecyclePlanner.ChangeRequest
    ) {
        var allowed: Set<String> = [
            "instance_id", "content_state", "content_state_patch", "attributes", "push_payload", "deep_link",
            "stale_date", "relevance_score", "priority",
        ]
        if operation == .end { allowed.formUnion(["dismissal_date", "dismissal_policy"]) }
        try body.rejectUnknown(allowed)
        let instanceID = try Identifiers.instanceID(body.requiredString("instance_id", maxLength: 128))
        let content = try contentChange(body, operation: operation)
        let dismissal = operation == .end ? try Self.dismissal(body) : .default
        return (
            instanceID,
            LifecyclePlanner.ChangeRequest(
                operation: operation, content: content,
                attributes: try nonEmptyObject(body, "attributes", required: false),
                options: try optionChanges(body), alert: try alert(body), dismissal: dismissal)
        )
    }

    /// An end's `dismissal_policy` and `dismissal_date`, by the rule of `LifecyclePlanner.Dismissal`; `endsAt` is the
    /// time a scheduled end is sent (a campaign's `at`).
    static func dismissal(_ body: JSONBody, endsAt: Date? = nil) throws(ValidationError) -> LifecyclePlanner.Dismissal {
        try LifecyclePlanner.Dismissal(
            policy: try body.string("dismissal_policy"), date: try body.timestamp("dismissal_date"), endsAt: endsAt)
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
                    "id": .string(ULID(uuid: d.id).description), "operation": .string(d.operation.rawValue),
                    "status": .string(d.status.rawValue), "created_at": .from(d.createdAt),
                ])
            } ?? .null
        o["high_priority_pushes_last_hour"] = .int(Int64(highPriority))
        return .json(.object(o))
    }

    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        var state: InstanceState?
        if let text = request.query["state"] {
            guard let parsed = InstanceState(rawValue: text) else {
                throw ValidationError(
                    field: "state",
                    reason: "must be one of " + InstanceState.allCases.map(\.rawValue).joined(separator: ", "))
            }
            state = parsed
        }
        // Each filter by the rule of what it names, so that nothing unchecked reaches SQL.
        let person = try request.query["person"].map { text throws(ValidationError) in
            try Identifiers.personReference(text, field: "person")
        }
        let activityType = try request.query["notification_type"].map { text throws(ValidationError) in
            try Identifiers.activityType(text, field: "notification_type")
        }
        let campaign = try request.query["campaign"].map { text throws(ValidationError) in
            try Identifiers.instanceReference(text, field: "campaign")
        }
        let after = try TimeCursor.decode(request.query["cursor"])
        let page = try await store.instances(
            tenant: principal.tenantID, person: person, activityType: activityType, campaign: campaign, state: state,
            after: after, limit: limit + 1)
        let (items, next) = Paging.page(page, limit: limit) { TimeCursor.encode($0.startedAt, $0.id) }
        let now = self.now()
        return .json(.object(["data": .array(items.map { Self.render($0, now: now) }), "next_cursor": next]))
    }

    func deliveries(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let id = try? Identifiers.instanceID(request.pathParameters["instance_id"] ?? "") else {
            throw Problems.notFound("live_notification")
        }
        let limit = try Paging.limit(request)
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
        let (items, next) = Paging.page(page, limit: limit) { .string(ULID(uuid: $0.id).description) }
        return .json(.object(["data": .array(items.map(Self.render)), "next_cursor": next]))
    }

    // MARK: Rendering

    static func render(_ start: LifecyclePlanner.StartRequest, _ plan: LifecyclePlanner.StartPlan) -> JSONValue {
        var response: [String: JSONValue] = [
            "instance_id": .string(start.instanceID), "state": .string(plan.state.rawValue),
            "targets": .int(Int64(plan.deliveries.count)), "warnings": .array(plan.warnings.map { .string($0) }),
        ]
        if let channelID = start.channelID { response["channel_id"] = .string(ULID(uuid: channelID).description) }
        if let reason = plan.failureReason { response["failure_reason"] = .string(reason) }
        return .object(response)
    }

    static func renderNoop(_ instanceID: String, _ state: InstanceState, _ version: Int, _ warnings: [String])
        -> JSONValue
    {
        .object([
            "instance_id": .string(instanceID), "state": .string(state.rawValue), "version": .int(Int64(version)),
            "targets": .int(0), "suppressed": .bool(true), "warnings": .array(warnings.map { .string($0) }),
        ])
    }

    /// A written change; a `coalesced` one queued nothing now (paced, or replaced by a newer change of the batch).
    static func render(_ instanceID: String, _ plan: LifecyclePlanner.ChangePlan, coalesced: Bool) -> JSONValue {
        var response: [String: JSONValue] = [
            "instance_id": .string(instanceID), "state": .string(plan.state.rawValue),
            "version": .int(Int64(plan.version)), "targets": .int(Int64(plan.deliveries.count)),
            "suppressed": .bool(false), "coalesced": .bool(coalesced),
            "warnings": .array(plan.warnings.map { .string($0) }),
        ]
        if let reason = plan.failureReason { response["failure_reason"] = .string(reason) }
        return .object(response)
    }

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
            "device_token": .string(maskToken(d.deviceToken)), "provider": .string(d.provider.rawValue),
            "token_kind": .string(d.tokenKind.rawValue), "operation": .string(d.operation.rawValue),
            "instance_version": .int(Int64(d.instanceVersion)), "status": .string(d.status.rawValue),
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

    /// `content_state` (a whole new state) or `content_state_patch`, one of them for an update, either or none for an
    /// end.
    static func contentChange(_ body: JSONBody, operation: LifecyclePlanner.Operation) throws(ValidationError)
        -> ContentChange
    {
        let fullState = try nonEmptyObject(body, "content_state", required: false)
        let patch = try body.objectValue("content_state_patch")
        switch (fullState, patch) {
        case (.some, .some):
            throw ValidationError(
                field: "content_state_patch", reason: "cannot be combined with content_state: send one or the other")
        case (.some(let state), nil): return .replace(state)
        case (nil, .some(let patch)): return .patch(patch)
        case (nil, nil):
            guard operation == .end else {
                throw ValidationError(
                    .missingField, field: "content_state", reason: "or content_state_patch is required for an update")
            }
            return .none
        }
    }

    /// The sticky options the body sets (what it omits is kept).
    static func optionChanges(_ body: JSONBody) throws(ValidationError) -> LifecyclePlanner.OptionChanges {
        var changes = LifecyclePlanner.OptionChanges()
        if let link = try body.string("deep_link", maxLength: 2048) {
            guard link.contains(":") else {
                throw ValidationError(field: "deep_link", reason: "must be a URL such as myapp://orders/42")
            }
            changes.deepLink = link
        }
        changes.staleDate = try body.timestamp("stale_date")
        if let value = body.value("relevance_score") {
            guard let score = value.doubleValue, score.isFinite else {
                throw ValidationError(field: "relevance_score", reason: "must be a number")
            }
            changes.relevanceScore = score
        }
        if let priority = try body.integer("priority", range: 5...10) {
            guard priority == 5 || priority == 10 else {
                throw ValidationError(field: "priority", reason: "must be 5 or 10")
            }
            changes.priority = Int(priority)
        }
        return changes
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
}
