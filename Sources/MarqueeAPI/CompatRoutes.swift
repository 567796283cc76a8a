import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability

/// Drop-in ingest for the Customer.io mobile SDK: Segment-style batches and single calls, authenticated with the
/// sdk key (Basic, key as user name), mapped onto the registry. One bad event never drops the others.
struct CompatRoutes: Sendable {
    let authenticator: Authenticator
    let registry: RegistryStore
    let tenants: TenantStore
    /// Identity verification of sdk-key writes about a person.
    let identity: IdentityGuard
    let events: Counter
    let logger: Logger

    init(
        authenticator: Authenticator, registry: RegistryStore, tenants: TenantStore, identity: IdentityGuard,
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.authenticator = authenticator
        self.registry = registry
        self.tenants = tenants
        self.identity = identity
        self.events = metrics.counter(
            "marquee_ingest_events_total", help: "Customer.io-compatible events received, by type and outcome.",
            labels: ["type", "outcome"])
        self.logger = logger
    }

    func register(in router: inout Router) {
        router.add(.POST, "/v1/b", guarded(batch))
        router.add(.POST, "/v1/batch", guarded(batch))
        router.add(.POST, "/v1/track", guarded(single))
        router.add(.POST, "/v1/identify", guarded(single))
        router.add(.GET, "/v1/projects/{write_key}/settings", guarded(settings))
    }

    /// What happened to one event.
    enum Outcome: Equatable {
        case applied
        /// Accepted and counted, but nothing in the registry corresponds to it.
        case ignored
    }

    /// Who sent the events: what the identity check of each event needs.
    struct Caller {
        let request: HTTPRequest
        let principal: Principal
        var tenant: UUID { principal.tenantID }
    }

    func batch(_ request: HTTPRequest) async throws -> HTTPResponse {
        // A key in the Authorization header is checked before the body is parsed, so that an unauthenticated caller
        // costs no parsing; only a request without one needs its body read for `writeKey`.
        // NUL is checked per event below, so that one such event does not drop the batch.
        let principal: Principal
        let body: JSONBody
        if Authenticator.presentedKey(request, scheme: .bearerOrBasic) != nil {
            principal = try await authenticator.require(request, kinds: [.sdk], scheme: .bearerOrBasic)
            body = try JSONBody.parse(request, allowNUL: true)
        } else {
            body = try JSONBody.parse(request, allowNUL: true)
            principal = try await authenticator.require(
                request, kinds: [.sdk], scheme: .bearerOrBasic, fallbackKey: try? body.string("writeKey"))
        }
        guard let list = body.value("batch")?.arrayValue else {
            throw ValidationError(
                body.has("batch") ? .invalidField : .missingField, field: "batch", reason: "must be an array of events")
        }
        guard list.count <= 1000 else { throw ValidationError(field: "batch", reason: "must hold at most 1000 events") }
        var applied = 0
        var ignored = 0
        var rejected: [JSONValue] = []
        for (index, event) in list.enumerated() {
            do {
                switch try await apply(event, caller: Caller(request: request, principal: principal)) {
                case .applied: applied += 1
                case .ignored: ignored += 1
                }
            } catch {
                guard let problem = problem(for: error), problem.status < 500 || problem.status == 503 else {
                    throw error
                }
                if problem.status == 503 { throw problem }
                events.inc(1, [Self.typeLabel(event), "rejected"])
                var entry: [String: JSONValue] = [
                    "index": .int(Int64(index)), "type": .string(problem.type), "status": .int(Int64(problem.status)),
                    "detail": .from(problem.detail),
                    "field": .string("batch[\(index)]" + (problem.field.map { "." + $0 } ?? "")),
                ]
                if let id = event["messageId"]?.stringValue { entry["messageId"] = .string(id) }
                rejected.append(.object(entry))
            }
        }
        return .json(
            .object([
                "success": .bool(rejected.isEmpty), "applied": .int(Int64(applied)), "ignored": .int(Int64(ignored)),
                "rejected": .array(rejected),
            ]))
    }

    func single(_ request: HTTPRequest) async throws -> HTTPResponse {
        let body = try JSONBody.parse(request)
        let principal = try await authenticator.require(
            request, kinds: [.sdk], scheme: .bearerOrBasic, fallbackKey: try? body.string("writeKey"))
        var event = body.object
        if event["type"] == nil {
            event["type"] = .string(request.path.hasSuffix("/identify") ? "identify" : "track")
        }
        let outcome = try await apply(.object(event), caller: Caller(request: request, principal: principal))
        return .json(.object(["success": .bool(true), "applied": .int(outcome == .applied ? 1 : 0)]))
    }

    /// A minimal settings document, enough for the SDK to start and send to this host.
    func settings(_ request: HTTPRequest) async throws -> HTTPResponse {
        let key = request.pathParameters["write_key"] ?? ""
        guard let principal = try await tenants.authenticate(key), principal.kind == .sdk else {
            throw Problems.notFound("project")
        }
        _ = principal
        return .json(
            .object([
                "integrations": .object([
                    "Customer.io Data Pipelines": .object(["apiKey": .string(key), "versionSettings": .object([:])])
                ]),
                "plan": .object(["track": .object([:]), "identify": .object([:])]),
                "edgeFunction": .object([:]), "analyticsNext": .object([:]), "middlewareSettings": .object([:]),
                "metrics": .object(["sampleRate": .int(0)]),
            ]))
    }

    static func typeLabel(_ event: JSONValue) -> String {
        switch event["type"]?.stringValue {
        case "identify": "identify"
        case "track": "track"
        case "screen", "page", "group", "alias": event["type"]!.stringValue!
        default: "other"
        }
    }

    // MARK: Event mapping

    func apply(_ value: JSONValue, caller: Caller) async throws -> Outcome {
        guard let object = value.objectValue else {
            throw ValidationError(field: "", reason: "each event must be a JSON object")
        }
        if let field = JSONBody.nulField(in: value) {
            throw ValidationError(field: field, reason: JSONBody.nulReason)
        }
        let event = JSONBody(object: object)
        let type = try event.requiredString("type")
        let outcome: Outcome
        switch type {
        case "identify":
            outcome = try await identify(event, caller: caller)
        case "track":
            outcome = try await track(event, caller: caller)
        default:
            outcome = .ignored
        }
        events.inc(1, [Self.typeLabel(value), outcome == .applied ? "applied" : "ignored"])
        return outcome
    }

    func identify(_ event: JSONBody, caller: Caller) async throws -> Outcome {
        let tenant = caller.tenant
        let userID = try Identifiers.personID(event.requiredString("userId", maxLength: 256), field: "userId")
        try await identity.check(caller.request, caller.principal, about: [userID])
        let traits = try event.objectValue("traits")
        let email = try traits.flatMap {
            try JSONBody(object: $0.objectValue!, path: "traits").string("email", maxLength: 320)
        }
        _ = try await registry.upsertPerson(
            tenant: tenant, id: userID, email: try RegistryRoutes.email(email), attributes: traits)
        return .applied
    }

    func track(_ event: JSONBody, caller: Caller) async throws -> Outcome {
        let tenant = caller.tenant
        let name = try event.requiredString("event", maxLength: 200)
        let properties = try event.nested("properties") ?? JSONBody(object: [:], path: "properties")
        switch name {
        case "Device Created or Updated":
            let context = try event.nested("context")
            guard let device = try context?.nested("device") else { throw ValidationError.missing("context.device") }
            let platform = try Self.platform(device.requiredString("type"), field: "context.device.type")
            let token = try Identifiers.deviceToken(
                device.requiredString("token", maxLength: 4096), platform: platform, field: "context.device.token")
            let userID = try Identifiers.personID(event.requiredString("userId", maxLength: 256), field: "userId")
            try await identity.check(caller.request, caller.principal, about: [userID])
            _ = try await registry.upsertDevice(
                tenant: tenant,
                DeviceRegistration(
                    personID: userID, token: token, platform: platform,
                    appID: try (context?.nested("app"))?.string("namespace", maxLength: 255),
                    osVersion: try Self.loose(properties, "device_os") ?? (try device.string("version", maxLength: 64)),
                    appVersion: try Self.loose(properties, "app_version"),
                    attributes: .object(properties.object)))
            return .applied

        case "Device Deleted":
            let context = try event.nested("context")
            guard let device = try context?.nested("device") else { throw ValidationError.missing("context.device") }
            let token = try Identifiers.anyDeviceToken(
                device.requiredString("token", maxLength: 4096), field: "context.device.token")
            // Only the owner may delete a device: without a userId anyone holding the public sdk key could.
            let userID = try Identifiers.personID(event.requiredString("userId", maxLength: 256), field: "userId")
            try await identity.check(caller.request, caller.principal, about: [userID])
            do {
                try await registry.deleteDevice(tenant: tenant, personID: userID, token: token)
            } catch is NotFound {
                return .ignored  // already gone: deleting twice is not an error for the SDK
            }
            return .applied

        case "Live Notification Token":
            return try await liveNotificationToken(event, properties, caller: caller)

        case "Live Notification Event":
            let instanceID = try Identifiers.instanceID(
                properties.requiredString("cioInstanceId", maxLength: 128), field: "properties.cioInstanceId")
            let kind = try properties.requiredString("eventType")
            let lifecycle: LifecycleEvent
            switch kind {
            case "start", "started": lifecycle = .started
            case "update", "updated": lifecycle = .updated
            case "end", "ended": lifecycle = .ended
            case "dismiss", "dismissed": lifecycle = .dismissed
            case "stale": lifecycle = .stale
            default:
                throw ValidationError(field: "properties.eventType", reason: "must be start, update or end")
            }
            let deviceToken = try Identifiers.anyDeviceToken(
                properties.requiredString("deviceId", maxLength: 4096), field: "properties.deviceId")
            try await identity.check(caller.request, caller.principal) {
                [try await registry.deviceOwner(tenant: tenant, token: deviceToken)]
            }
            let at = try event.timestamp("timestamp") ?? Date()
            try await registry.recordEvent(
                tenant: tenant, instanceID: instanceID, event: lifecycle, deviceToken: deviceToken, at: at,
                contentState: try RegistryRoutes.eventContentState(
                    properties.objectValue("contentState"), field: "properties.contentState"))
            return .applied

        case "Report Delivery Event":
            let metric = try properties.requiredEnum("metric", DeliveryMetric.self)
            let deliveryID =
                try properties.string("deliveryId", maxLength: 128) ?? event.string("anonymousId", maxLength: 128)
            guard let deliveryID else { throw ValidationError.missing("properties.deliveryId") }
            try await RegistryRoutes.verifyDeliveryToken(
                properties.requiredString("deliveryToken", maxLength: 256), deliveryID: deliveryID,
                field: "properties.deliveryToken", tenant: tenant, tenants: tenants)
            _ = try await registry.recordMetric(
                tenant: tenant, deliveryID: deliveryID, metric: metric,
                recipient: try properties.string("recipient", maxLength: Identifiers.maxRecipientLength),
                at: try event.timestamp("timestamp"))
            return .applied

        default:
            return .ignored
        }
    }

    func liveNotificationToken(_ event: JSONBody, _ properties: JSONBody, caller: Caller) async throws -> Outcome {
        let tenant = caller.tenant
        let registrationType = try properties.requiredString("registrationType")
        let platform = try Self.platform(properties.string("platform") ?? "ios", field: "properties.platform")
        let deviceToken = try Identifiers.deviceToken(
            properties.requiredString("deviceId", maxLength: 4096), platform: platform, field: "properties.deviceId")
        let userID = try event.string("userId", maxLength: 256).map { s throws(ValidationError) in
            try Identifiers.personID(s, field: "userId")
        }
        // The event is about its userId and about the device's owner, if the device is registered.
        try await identity.check(caller.request, caller.principal) {
            [userID, try await registry.deviceOwner(tenant: tenant, token: deviceToken)]
        }
        // A token can arrive before the device event; register the device then, if we know its owner.
        if try await registry.devicePlatform(tenant: tenant, token: deviceToken) == nil, let userID {
            _ = try await registry.upsertDevice(
                tenant: tenant, DeviceRegistration(personID: userID, token: deviceToken, platform: platform))
        }
        switch registrationType {
        case "push_to_start":
            let activityType = try Identifiers.activityType(
                properties.requiredString("notificationType", maxLength: 255), field: "properties.notificationType")
            let token = try Identifiers.apnsToken(
                properties.requiredString("pushToStartToken", maxLength: 4096), field: "properties.pushToStartToken")
            let attributesType = try properties.string("attributesType").map { s throws(ValidationError) in
                try Identifiers.attributesType(s, field: "properties.attributesType")
            }
            guard let owner = userID else { throw ValidationError.missing("userId") }
            _ = try await registry.registerPushToStart(
                tenant: tenant, personID: owner, deviceToken: deviceToken, activityType: activityType, token: token,
                attributesType: attributesType, profile: .customerio)
            return .applied
        case "instance":
            let instanceID = try Identifiers.instanceID(
                properties.requiredString("cioInstanceId", maxLength: 128), field: "properties.cioInstanceId")
            let raw = try properties.requiredString("instanceToken", maxLength: 4096)
            let token =
                platform == .ios
                ? try Identifiers.apnsToken(raw, field: "properties.instanceToken")
                : try Identifiers.fcmToken(raw, field: "properties.instanceToken")
            guard
                try await registry.deviceBelongsToInstance(
                    tenant: tenant, instanceID: instanceID, deviceToken: deviceToken)
            else { throw NotFound("instance") }
            _ = try await registry.registerActivityToken(
                tenant: tenant, instanceID: instanceID, deviceToken: deviceToken, token: token)
            return .applied
        default:
            throw ValidationError(field: "properties.registrationType", reason: "must be push_to_start or instance")
        }
    }

    static func platform(_ text: String, field: String) throws(ValidationError) -> Platform {
        switch text.lowercased() {
        case "ios", "iphone", "ipados": return .ios
        case "android": return .android
        default: throw ValidationError(field: field, reason: "must be ios or android")
        }
    }

    /// A property the SDK may send as a string or a number.
    static func loose(_ body: JSONBody, _ key: String) throws(ValidationError) -> String? {
        guard let v = body.value(key) else { return nil }
        if let s = v.stringValue { return String(s.prefix(64)) }
        if v.doubleValue != nil { return v.serialized() }
        throw ValidationError(field: body.name(key), reason: "must be a string")
    }
}
