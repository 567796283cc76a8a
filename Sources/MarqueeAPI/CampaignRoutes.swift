import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/v1/campaigns` (app key): one start for a whole audience, campaign-wide updates and ends, schedules, funnels.
///
/// The API validates and records; the worker pool's scheduler runs starts and changes at their due time (at once when
/// none is given), each exactly once, in set-based statements. Hence 202: the answer names what will run and when;
/// `GET /v1/campaigns/{id}` shows what it did.
struct CampaignRoutes: Sendable {
    let authenticator: Authenticator
    let store: CampaignStore
    let registry: RegistryStore
    let segments: SegmentStore
    let channels: ChannelStore
    /// Creates a new channel for a campaign that asks for one (`"channel": {"storage_policy": …}`).
    let channelRoutes: ChannelRoutes
    let now: @Sendable () -> Date

    static let maximumPeople = 10_000

    func register(in router: inout Router) {
        router.add(.POST, "/v1/campaigns", authenticator.app(create))
        router.add(.GET, "/v1/campaigns", authenticator.app(list))
        router.add(.GET, "/v1/campaigns/{campaign_id}", authenticator.app(get))
        router.add(.GET, "/v1/campaigns/{campaign_id}/people", authenticator.app(people))
        router.add(.POST, "/v1/campaigns/{campaign_id}/update", authenticator.app(update))
        router.add(.POST, "/v1/campaigns/{campaign_id}/end", authenticator.app(end))
        router.add(.POST, "/v1/campaigns/{campaign_id}/cancel", authenticator.app(cancel))
    }

    // MARK: Create

    func create(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let tenant = principal.tenantID
        let idempotency = try Self.idempotency(request)
        if let answered = try await earlierAnswer(tenant: tenant, idempotency) { return answered }
        let body = try JSONBody.parse(request)
        try body.rejectUnknown([
            "campaign_id", "name", "notification_type", "audience", "attributes", "content_state", "push_payload",
            "expiration", "start_at", "platform", "rate_limit_per_second", "deep_link", "stale_date",
            "relevance_score", "priority", "channel_id", "channel",
        ])
        let id =
            try body.string("campaign_id", maxLength: 64).map { text throws(ValidationError) in
                try Self.campaignID(text, field: "campaign_id")
            } ?? ULIDGenerator.shared.next().description
        let name = try body.requiredString("name", maxLength: 200)
        guard !name.isEmpty else { throw ValidationError(field: "name", reason: "must not be empty") }
        let activityType = try Identifiers.activityType(
            body.requiredString("notification_type", maxLength: 255), field: "notification_type")
        let audience = try Self.audience(body)
        let attributes = try LifecycleRoutes.nonEmptyObject(body, "attributes")
        let template = try PersonTemplate(attributes)
        let requestedState = try LifecycleRoutes.nonEmptyObject(body, "content_state")
        let platform = try body.enumValue("platform", Platform.self)
        let rate = try body.integer("rate_limit_per_second", range: 1...1_000_000).map(Int.init)
        var newChannelPolicy: ChannelStoragePolicy?
        if let channel = try body.nested("channel") {
            try channel.rejectUnknown(["storage_policy"])
            newChannelPolicy = try channel.requiredEnum("storage_policy", ChannelStoragePolicy.self)
            if body.has("channel_id") {
                throw ValidationError(
                    field: "channel", reason: "cannot be combined with channel_id: name one or ask for one")
            }
        }
        let channelID = try body.string("channel_id", maxLength: 64).map { text throws(ValidationError) in
            guard let ulid = ULID(string: text) else {
                throw ValidationError(
                    field: "channel_id", reason: "is not a channel ID (a ULID from POST /v1/channels)")
            }
            return ulid.uuid
        }
        let now = self.now()
        let startAt = try body.timestamp("start_at")
        if let startAt, startAt < now {
            throw ValidationError(field: "start_at", reason: "is in the past: omit it to start now")
        }
        let start = startAt ?? now
        let expiration = try body.timestamp("expiration")
        if let expiration {
            try Lifetime.validateExpiration(expiration, now: start, field: "expiration")
        }
        var options = try LifecycleRoutes.optionChanges(body).applied(to: StoredOptions())
        options.alert = try LifecycleRoutes.alert(body)
        // Apple shows an alert when a live activity starts on iOS.
        if options.alert == nil && platform != .android {
            throw ValidationError(
                .missingField, field: "push_payload.alert",
                reason: "is required unless platform is android: Apple shows an alert when a live activity starts")
        }
        let stale = StaleDateRule.apply(options.staleDate, now: start)
        options.staleDate = stale.staleDate

        let type: ActivityType
        do {
            type = try await registry.activityType(tenant: tenant, identifier: activityType)
        } catch is NotFound {
            throw ValidationError(
                field: "notification_type",
                reason: "is not a known activity type: define it with PUT /v1/activity_types/{identifier}")
        }
        if case .segment(let segmentID) = audience {
            do {
                _ = try await segments.get(tenant: tenant, id: segmentID)
            } catch is NotFound {
                throw ValidationError(field: "audience.segment", reason: "is not a segment of this tenant")
            }
        }
        var channelRecord: ChannelRecord?
        if let channelID {
            let channel: ChannelRecord
            do {
                channel = try await channels.get(tenant: tenant, id: channelID)
            } catch is NotFound {
                throw ValidationError(field: "channel_id", reason: "is not a channel of this tenant")
            }
            try channel.checkUsable(for: activityType)
            channelRecord = channel
        }
        let contentState = try ContentChange.replace(requestedState).apply(
            to: .null, schema: type.contentStateSchema, dateFields: type.dateFields, profile: type.payloadProfile)
        // The size check measures the template with each $person node at its default (or ""); what a person's values
        // add beyond that may use the headroom left, and a person who would exceed it is skipped at start.
        var content = DeliverySnapshot(
            attributes: template.sample, contentState: contentState, options: options,
            timestamp: Int64(start.timeIntervalSince1970)
        ).content(
            event: .start, instanceID: CampaignSizing.longestInstanceID(id),
            activityType: activityType, attributesType: type.attributesType, profile: type.payloadProfile,
            dateFields: type.dateFields, now: start)
        content.inputPushChannel = channelRecord?.apnsChannelID
        let platforms = LifecyclePlanner.startPlatforms(platform)
        try LifecyclePlanner.checkSize(content, platforms: platforms)

        let warnings = JSONValue.array(stale.warnings.map { .string($0) })
        // A new channel for the campaign: made at Apple now (a replay of this request, answered above, makes none),
        // and deleted again if the campaign is not created after all.
        var newChannel: ChannelRecord?
        if let policy = newChannelPolicy {
            newChannel = try await channelRoutes.open(tenant: tenant, activityType: activityType, policy: policy)
        }
        let opened = newChannel
        let outcome: CampaignStore.CreateOutcome
        do {
            if let opened {
                // A new channel's ID is known only now: its starts carry it, so it counts too.
                content.inputPushChannel = opened.apnsChannelID
                try LifecyclePlanner.checkSize(content, platforms: platforms)
            }
            outcome = try await store.create(
                tenant: tenant,
                CampaignCreate(
                    id: id, name: name, activityType: activityType, audience: audience, template: template,
                    contentState: contentState, options: options.json, platform: platform, expiresAt: expiration,
                    rateLimitPerSecond: rate, startAt: start,
                    headroom: PayloadLimits.headroom(content, platforms: platforms), channelID: opened?.id ?? channelID),
                response: { state in Self.accepted(id, state, start, warnings, opened) }, idempotency: idempotency)
        } catch {
            if let opened { await channelRoutes.close(tenant: tenant, opened) }
            throw error
        }
        switch outcome {
        case .created(let state):
            return .json(Self.accepted(id, state, start, warnings, opened), status: 202)
        case .replay(let stored):
            if let opened { await channelRoutes.close(tenant: tenant, opened) }
            return try LifecycleRoutes.replay(stored, hash: idempotency?.hash ?? [])
        case .idTaken:
            if let opened { await channelRoutes.close(tenant: tenant, opened) }
            throw Problems.conflict(field: "campaign_id", reason: "is already used by another campaign")
        }
    }

    /// The 202 answer to a create (and its stored replay): with the new channel's IDs when one was made for it.
    static func accepted(
        _ id: String, _ state: CampaignState, _ start: Date, _ warnings: JSONValue, _ channel: ChannelRecord?
    ) -> JSONValue {
        var o: [String: JSONValue] = [
            "campaign_id": .string(id), "state": .string(state.rawValue), "start_at": .from(start),
            "warnings": warnings,
        ]
        if let channel {
            o["channel_id"] = .string(ULID(uuid: channel.id).description)
            o["apns_channel_id"] = .string(channel.apnsChannelID)
        }
        return .object(o)
    }

    static func audience(_ body: JSONBody) throws(ValidationError) -> CampaignAudience {
        guard let audience = try body.nested("audience") else { throw ValidationError.missing("audience") }
        try audience.rejectUnknown(["segment", "people", "all"])
        let given = ["segment", "people", "all"].filter { audience.has($0) }
        guard given.count == 1 else {
            throw ValidationError(field: "audience", reason: "must hold exactly one of segment, people or all")
        }
        switch given[0] {
        case "segment":
            let id = try audience.requiredString("segment", maxLength: 128)
            return .segment(try Identifiers.instanceID(id, field: "audience.segment"))
        case "people":
            guard let items = audience.value("people")?.arrayValue else {
                throw ValidationError(field: "audience.people", reason: "must be an array of person IDs")
            }
            guard (1...maximumPeople).contains(items.count) else {
                throw ValidationError(
                    field: "audience.people", reason: "must list 1 to \(maximumPeople) people: use a segment for more")
            }
            var ids: [String] = []
            var seen = Set<[UInt8]>()
            for (index, item) in items.enumerated() {
                guard let text = item.stringValue else {
                    throw ValidationError(field: "audience.people[\(index)]", reason: "must be a person ID string")
                }
                let id = try Identifiers.personID(text, field: "audience.people[\(index)]")
                if seen.insert(Identifiers.personKey(id)).inserted { ids.append(id) }
            }
            return .people(ids)
        default:
            guard try audience.bool("all") == true else {
                throw ValidationError(field: "audience.all", reason: "must be true")
            }
            return .all
        }
    }

    /// The request's Idempotency-Key with the hash of what it asks.
    static func idempotency(_ request: HTTPRequest) throws(ValidationError) -> (key: String, hash: [UInt8])? {
        try LifecycleRoutes.idempotencyKey(request).map { (key: $0, hash: LifecycleRoutes.requestHash(request)) }
    }

    /// The answer an earlier request with this Idempotency-Key got, if there was one (422 if it asked something else).
    /// Looked up before anything that depends on the time or on other records: a retry of an accepted request whose
    /// `start_at` or `at` has passed since, or whose segment or activity type has changed, is answered as the first
    /// one was, not refused as a request that was never accepted. (The write claims the key again, for two requests
    /// that race.)
    func earlierAnswer(tenant: UUID, _ idempotency: (key: String, hash: [UInt8])?) async throws -> HTTPResponse? {
        guard let idempotency, let stored = try await store.idempotentResponse(tenant: tenant, key: idempotency.key)
        else { return nil }
        return try LifecycleRoutes.replay(stored, hash: idempotency.hash)
    }

    // MARK: Campaign-wide changes

    func update(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .update)
    }

    func end(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await change(request, principal, operation: .end)
    }

    func change(_ request: HTTPRequest, _ principal: Principal, operation: CampaignChange.Operation) async throws
        -> HTTPResponse
    {
        let tenant = principal.tenantID
        let campaignID = try Self.pathID(request)
        let idempotency = try Self.idempotency(request)
        if let answered = try await earlierAnswer(tenant: tenant, idempotency) { return answered }
        let body = try JSONBody.parse(request)
        var allowed: Set<String> = [
            "content_state", "content_state_patch", "push_payload", "deep_link", "stale_date", "relevance_score",
            "priority", "at",
        ]
        if operation == .end { allowed.formUnion(["dismissal_date", "dismissal_policy"]) }
        try body.rejectUnknown(allowed)
        let content = try LifecycleRoutes.contentChange(body, operation: operation)
        let now = self.now()
        let at = try body.timestamp("at")
        if let at, at < now {
            throw ValidationError(field: "at", reason: "is in the past: omit it to apply the change now")
        }
        var stored = try LifecycleRoutes.optionChanges(body).applied(to: StoredOptions())
        stored.alert = try LifecycleRoutes.alert(body)
        // As an instance's end takes them; `immediate` is the time the change is due, past when it is sent.
        if operation == .end {
            stored.dismissalDate = try LifecycleRoutes.dismissal(body, endsAt: at).date(sentAt: at ?? now)
        }
        // A stale date is checked as a single change's is, at the time the change is sent: one already past is dropped
        // (and reported), and the instances keep none.
        let stale = StaleDateRule.apply(stored.staleDate, now: at ?? now)
        stored.staleDate = stale.staleDate
        let warnings = JSONValue.array(stale.warnings.map { .string($0) })
        var options = stored.json.objectValue ?? [:]
        // A sticky option sent as null is cleared on every instance.
        for key in ["deep_link", "stale_date", "relevance_score", "priority"] where body.object[key]?.isNull == true {
            options[key] = .null
        }
        if !stale.warnings.isEmpty { options["stale_date"] = .null }
        if case .replace = content {
            // A whole new state is checked now against the activity type, and its pushes for size as the campaign's
            // start was (a patch is checked per instance at run time, against each one's own state, and so is the
            // size of every new state).
            guard let facts = try await store.changeFacts(tenant: tenant, campaignID: campaignID) else {
                throw NotFound("campaign")
            }
            let type = facts.type
            let state = try content.apply(
                to: .null, schema: type.contentStateSchema, dateFields: type.dateFields, profile: type.payloadProfile)
            try facts.sizing.check(
                state, options: CampaignSizing.options(facts.options, changed: options), operation: operation,
                type: type, now: at ?? now)
        }
        let outcome: CampaignStore.ScheduleOutcome
        do {
            outcome = try await store.schedule(
                tenant: tenant, campaignID: campaignID,
                CampaignChange(operation: operation, content: content, options: options), at: at,
                response: { id, due in Self.scheduled(campaignID, operation, id, due, later: at != nil, warnings) },
                idempotency: idempotency)
        } catch CampaignScheduleRefusal.closed(let state) {
            throw Problems.conflict(
                field: "campaign_id", reason: "is \(state.rawValue): it takes no more campaign-wide changes")
        }
        switch outcome {
        case .scheduled(let id, let due):
            return .json(Self.scheduled(campaignID, operation, id, due, later: at != nil, warnings), status: 202)
        case .replay(let stored):
            return try LifecycleRoutes.replay(stored, hash: idempotency?.hash ?? [])
        }
    }

    static func scheduled(
        _ campaignID: String, _ operation: CampaignChange.Operation, _ id: UUID, _ due: Date, later: Bool,
        _ warnings: JSONValue
    ) -> JSONValue {
        .object([
            "campaign_id": .string(campaignID), "change_id": .string(ULID(uuid: id).description),
            "operation": .string(operation.rawValue), "due_at": .from(due),
            "state": .string(later ? "scheduled" : "pending"), "warnings": warnings,
        ])
    }

    func cancel(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let campaignID = try Self.pathID(request)
        let idempotency = try Self.idempotency(request)
        if let answered = try await earlierAnswer(tenant: principal.tenantID, idempotency) { return answered }
        @Sendable func answer(_ campaign: Bool, _ schedules: Int) -> JSONValue {
            .object([
                "campaign_id": .string(campaignID), "campaign_cancelled": .bool(campaign),
                "schedules_cancelled": .int(Int64(schedules)),
            ])
        }
        switch try await store.cancel(
            tenant: principal.tenantID, campaignID: campaignID, response: answer, idempotency: idempotency)
        {
        case .cancelled(let campaign, let schedules):
            return .json(answer(campaign, schedules))
        case .replay(let stored):
            return try LifecycleRoutes.replay(stored, hash: idempotency?.hash ?? [])
        }
    }

    // MARK: Reads

    func get(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let detail = try await store.get(tenant: principal.tenantID, id: try Self.pathID(request))
        var body = Self.render(detail.campaign).objectValue ?? [:]
        body["instances"] = .object(detail.instances.mapValues { .int(Int64($0)) })
        body["skipped"] = .object(detail.skipped.mapValues { .int(Int64($0)) })
        body["funnel"] = .array(
            detail.funnel.map { row in
                .object([
                    "platform": .string(row.platform.rawValue), "operation": .string(row.operation),
                    "via": .string(row.via),
                    "targeted": .int(Int64(row.targeted)), "queued": .int(Int64(row.queued)),
                    "sent": .int(Int64(row.sent)), "failed": .int(Int64(row.failed)),
                    "undeliverable": .int(Int64(row.undeliverable)), "superseded": .int(Int64(row.superseded)),
                    "delivered": .int(Int64(row.delivered)), "opened": .int(Int64(row.opened)),
                ])
            })
        body["schedules"] = .array(
            detail.schedules.map { s in
                .object([
                    "change_id": .string(ULID(uuid: s.id).description), "operation": .string(s.operation),
                    "due_at": .from(s.dueAt), "state": .string(s.state), "result": s.result ?? .null,
                    "created_at": .from(s.createdAt), "executed_at": .from(s.executedAt),
                ])
            })
        return .json(.object(body))
    }

    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        let after = try TimeCursor.decode(request.query["cursor"])
        let page = try await store.list(tenant: principal.tenantID, after: after, limit: limit + 1)
        let (items, next) = Paging.page(page, limit: limit) { TimeCursor.encode($0.createdAt, $0.id) }
        return .json(.object(["data": .array(items.map(Self.render)), "next_cursor": next]))
    }

    func people(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        let after = try request.query["cursor"].map { text throws(ValidationError) in
            try Identifiers.personReference(text, field: "cursor")
        }
        guard
            let page = try await store.members(
                tenant: principal.tenantID, campaignID: try Self.pathID(request), after: after, limit: limit + 1)
        else { throw NotFound("campaign") }
        let (items, next) = Paging.page(page, limit: limit) { .string($0.personID) }
        return .json(
            .object([
                "data": .array(
                    items.map { m in
                        .object([
                            "person_id": .string(m.personID), "instance_id": .string(m.instanceID),
                            "skipped_reason": .from(m.skippedReason),
                        ])
                    }), "next_cursor": next,
            ]))
    }

    static func render(_ c: CampaignRecord) -> JSONValue {
        .object([
            "campaign_id": .string(c.id), "name": .string(c.name), "notification_type": .string(c.activityType),
            "audience": c.audience, "attributes": c.attributes, "content_state": c.contentState,
            "platform": .from(c.platform?.rawValue), "expiration": .from(c.expiresAt),
            "rate_limit_per_second": c.rateLimitPerSecond.map { .int(Int64($0)) } ?? .null,
            "channel_id": c.channelID.map { .string(ULID(uuid: $0).description) } ?? .null,
            "state": .string(c.state.rawValue), "failure_reason": .from(c.failureReason), "start_at": .from(c.startAt),
            "audience_size": c.audienceSize.map { .int(Int64($0)) } ?? .null, "started_at": .from(c.startedAt),
            "ended_at": .from(c.endedAt), "cancelled_at": .from(c.cancelledAt), "created_at": .from(c.createdAt),
            "updated_at": .from(c.updatedAt),
        ])
    }

    /// A campaign ID: 1–64 characters of `[A-Za-z0-9._:-]` (so that `<campaign_id>.<person_id>` makes an instance ID).
    static func campaignID(_ text: String, field: String) throws(ValidationError) -> String {
        guard text.utf8.count <= 64, (try? Identifiers.instanceID(text, field: field)) != nil else {
            throw ValidationError(field: field, reason: "must be 1 to 64 characters of A-Z a-z 0-9 . _ : -")
        }
        return text
    }

    /// The `{campaign_id}` path parameter; one that could never have been created is a campaign that does not exist.
    static func pathID(_ request: HTTPRequest) throws(HTTPProblem) -> String {
        guard let id = try? campaignID(request.pathParameters["campaign_id"] ?? "", field: "campaign_id") else {
            throw Problems.notFound("campaign")
        }
        return id
    }
}
