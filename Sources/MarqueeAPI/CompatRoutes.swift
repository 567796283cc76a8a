import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// Drop-in ingest for the Customer.io mobile SDK: Segment-style batches and single calls, authenticated with the
/// sdk key (Basic, key as user name), mapped onto the registry.
///
/// A batch is all or nothing: every event is validated first (what needs no database), then all are written in one
/// transaction. An event that fails (invalid, refused by identity verification or ownership, or a conflict) fails
/// the whole batch with that event's problem, naming its index, and nothing of the batch is kept.
struct CompatRoutes: Sendable {
    let authenticator: Authenticator
    let registry: RegistryStore
    let tenants: TenantStore
    /// Identity verification of sdk-key writes about a person.
    let identity: IdentityGuard
    /// What an `identify` learns of an email another person has.
    let takenEmails: TakenEmails
    let events: Counter
    let logger: Logger

    init(
        authenticator: Authenticator, registry: RegistryStore, tenants: TenantStore, identity: IdentityGuard,
        takenEmails: TakenEmails, metrics: MetricsRegistry, logger: Logger
    ) {
        self.authenticator = authenticator
        self.registry = registry
        self.tenants = tenants
        self.identity = identity
        self.takenEmails = takenEmails
        self.events = metrics.counter(
            "marquee_ingest_events_total", help: "Customer.io-compatible events received, by type and outcome.",
            labels: ["type", "outcome"])
        self.logger = logger
    }

    func register(in router: inout Router) {
        router.add(.POST, "/v1/b", batch)
        router.add(.POST, "/v1/batch", batch)
        router.add(.POST, "/v1/track", single)
        router.add(.POST, "/v1/identify", single)
        router.add(.GET, "/v1/projects/{write_key}/settings", settings)
    }

    /// What happened to one event.
    enum Outcome: Equatable, Sendable {
        case applied
        /// Accepted and counted, but nothing in the registry corresponds to it.
        case ignored
    }

    /// The most events one batch may hold: they are written in one transaction.
    static let maxBatchEvents = 1000

    /// The caller (an sdk key) and the request's body, for every ingest route. A key in the Authorization header is
    /// checked before the body is parsed, so that an unauthenticated caller costs no parsing; only a request without
    /// one needs its body read for `writeKey`. `spend`: the request's rate token is taken with the key's check (else
    /// the caller takes what it counts once the body is read; a body refused takes one).
    func authenticate(_ request: HTTPRequest, spend: Bool, allowNUL: Bool) async throws -> (Principal, JSONBody) {
        guard Authenticator.presentedKey(request, scheme: .bearerOrBasic) != nil else {
            let body = try JSONBody.parse(request, allowNUL: allowNUL)
            let principal = try await authenticator.require(
                request, kinds: [.sdk], scheme: .bearerOrBasic, fallbackKey: try? body.string("writeKey"),
                spend: spend)
            return (principal, body)
        }
        let principal = try await authenticator.require(request, kinds: [.sdk], scheme: .bearerOrBasic, spend: spend)
        do {
            return (principal, try JSONBody.parse(request, allowNUL: allowNUL))
        } catch {
            if !spend { try authenticator.limit(principal, request) }  // a body refused takes its request's token
            throw error
        }
    }

    func batch(_ request: HTTPRequest) async throws -> HTTPResponse {
        // NUL is checked per event below, so that the answer names the event that holds it. The rate is only looked
        // at until the events are counted: a batch takes a token per event (at most the bucket's burst), as many
        // requests of one event each would.
        let (principal, body) = try await authenticate(request, spend: false, allowNUL: true)
        let events = body.value("batch")?.arrayValue
        try authenticator.limit(principal, request, count: events?.count ?? 1)
        guard let list = events else {
            throw ValidationError(
                body.has("batch") ? .invalidField : .missingField, field: "batch", reason: "must be an array of events")
        }
        guard list.count <= Self.maxBatchEvents else {
            throw ValidationError(field: "batch", reason: "must hold at most \(Self.maxBatchEvents) events")
        }
        let outcomes: [Outcome]
        do {
            outcomes = try await ingest(list, request: request, principal: principal)
        } catch let failure as EventFailure {
            guard let problem = problem(for: failure.error), problem.status < 500 else { throw failure.error }
            count(list, failed: failure.index)
            throw Self.batchProblem(problem, index: failure.index, event: list[failure.index])
        }
        count(list, outcomes)
        return .json(
            .object([
                "success": .bool(true), "applied": .int(Int64(outcomes.count { $0 == .applied })),
                "ignored": .int(Int64(outcomes.count { $0 == .ignored })), "rejected": .array([]),
            ]))
    }

    func single(_ request: HTTPRequest) async throws -> HTTPResponse {
        let (principal, body) = try await authenticate(request, spend: true, allowNUL: false)
        var event = body.object
        if event["type"] == nil {
            event["type"] = .string(request.path.hasSuffix("/identify") ? "identify" : "track")
        }
        let list: [JSONValue] = [.object(event)]
        let outcomes: [Outcome]
        do {
            outcomes = try await ingest(list, request: request, principal: principal)
        } catch let failure as EventFailure {
            if let problem = problem(for: failure.error), problem.status < 500 { count(list, failed: 0) }
            throw failure.error
        }
        count(list, outcomes)
        return .json(.object(["success": .bool(true), "applied": .int(outcomes.first == .applied ? 1 : 0)]))
    }

    /// A minimal settings document, enough for the SDK to start and send to this host.
    func settings(_ request: HTTPRequest) async throws -> HTTPResponse {
        let key = request.pathParameters["write_key"] ?? ""
        // Through the key cache, as every key: an app starting (or a flood of made-up keys) costs no lookup each.
        guard let principal = try await authenticator.principal(key, request), principal.kind == .sdk else {
            throw Problems.notFound("project")
        }
        try authenticator.limit(principal, request)
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

    // MARK: Ingest

    /// The event at `index` failed with `error` (a client problem); nothing of its request was kept.
    struct EventFailure: Error {
        let index: Int
        let error: any Error
    }

    /// Validates every event (what needs no database), then writes them all in one transaction, in order. Throws
    /// `EventFailure` for the first event found at fault; database errors pass through as they are (a deadlock or a
    /// racing token registration re-runs the transaction; an outage is a 503).
    func ingest(_ list: [JSONValue], request: HTTPRequest, principal: Principal) async throws -> [Outcome] {
        var changes: [Change] = []
        changes.reserveCapacity(list.count)
        for (index, event) in list.enumerated() {
            do {
                changes.append(try Self.change(event))
            } catch {
                throw EventFailure(index: index, error: error)
            }
        }
        // The tenant's identity setting and delivery secret are read once, before the transaction.
        let verdict = try await identity.verdict(request, principal)
        var secret: [UInt8]?
        for (index, change) in changes.enumerated() {
            guard case .metric(let metric) = change else { continue }
            let key: [UInt8]
            if let secret { key = secret } else { key = try await tenants.deliverySecret(tenant: principal.tenantID) }
            secret = key
            do {
                try RegistryRoutes.verifyDeliveryToken(
                    metric.deliveryToken, deliveryID: metric.deliveryID, field: "properties.deliveryToken", secret: key)
            } catch {
                throw EventFailure(index: index, error: error)
            }
        }
        let validated = changes
        let takenEmail = TakenEmails.policy(principal.kind, verdict)
        let (outcomes, keptEmails) = try await registry.transaction(tenant: principal.tenantID) { registry in
            var outcomes: [Outcome] = []
            outcomes.reserveCapacity(validated.count)
            var keptEmails: [String] = []
            for (index, change) in validated.enumerated() {
                do {
                    outcomes.append(try Self.write(change, registry, verdict, takenEmail, keptEmails: &keptEmails))
                } catch let error as PostgresError {
                    throw error
                } catch {
                    throw EventFailure(index: index, error: error)
                }
            }
            return (outcomes, keptEmails)
        }
        // Once committed (a transaction run again counts once).
        for person in keptEmails {
            takenEmails.kept(
                tenant: principal.tenantID, person: person, route: "customerio", requestID: request.requestID)
        }
        return outcomes
    }

    /// The problem a batch answers when its event `index` fails with `item`: that event's status and type, its field
    /// prefixed with `batch[<index>].` (a user-token problem keeps naming the header, which is what to fix), and the
    /// index (and the event's `messageId`) as members of their own.
    static func batchProblem(_ item: HTTPProblem, index: Int, event: JSONValue) -> HTTPProblem {
        var problem = item
        if item.field != IdentityGuard.header {
            problem.field = "batch[\(index)]" + (item.field.map { "." + $0 } ?? "")
        }
        problem.detail =
            "Event \(index) of the batch: \(item.detail ?? item.title) Nothing in the batch was applied."
        problem.extensions["index"] = String(index)
        if let id = event["messageId"]?.stringValue, id.utf8.count <= 128, !id.contains("\u{0}") {
            problem.extensions["messageId"] = id
        }
        return problem
    }

    /// Counts the events of a request that was applied, by type and outcome.
    func count(_ list: [JSONValue], _ outcomes: [Outcome]) {
        for (event, outcome) in zip(list, outcomes) {
            events.inc(1, [Self.typeLabel(event), outcome == .applied ? "applied" : "ignored"])
        }
    }

    /// Counts the events of a request that failed: the event at fault `rejected`, the others `discarded`.
    func count(_ list: [JSONValue], failed: Int) {
        for (index, event) in list.enumerated() {
            events.inc(1, [Self.typeLabel(event), index == failed ? "rejected" : "discarded"])
        }
    }

    // MARK: Event mapping

    /// One validated event: what it asks of the registry.
    enum Change: Sendable {
        case identify(person: String, email: String?, traits: JSONValue?)
        case device(DeviceRegistration)
        case deleteDevice(person: String, token: String)
        case token(TokenChange)
        case lifecycle(
            instanceID: String, event: LifecycleEvent, deviceToken: String, at: Date, contentState: JSONValue?)
        case metric(MetricChange)
        /// Accepted and counted, nothing to write.
        case ignored
    }

    /// A `Live Notification Token` event.
    struct TokenChange: Sendable {
        enum Registration: Sendable {
            case pushToStart(person: String, activityType: String, token: String, attributesType: String?)
            case instance(instanceID: String, token: String)
        }
        /// The event's `userId`, if any.
        var person: String?
        var deviceToken: String
        var platform: Platform
        var registration: Registration
    }

    /// A `Report Delivery Event`.
    struct MetricChange: Sendable {
        var deliveryID: String
        var metric: DeliveryMetric
        var recipient: String?
        var at: Date?
        var deliveryToken: String
    }

    /// Validates one event and maps it onto the registry, without I/O.
    static func change(_ value: JSONValue) throws -> Change {
        guard let object = value.objectValue else {
            throw ValidationError(field: "", reason: "each event must be a JSON object")
        }
        if let field = JSONBody.nulField(in: value) {
            throw ValidationError(field: field, reason: JSONBody.nulReason)
        }
        let event = JSONBody(object: object)
        switch try event.requiredString("type") {
        case "identify":
            let userID = try Identifiers.personID(event.requiredString("userId", maxLength: 256), field: "userId")
            let traits = try RegistryRoutes.attributes(event.objectValue("traits"), field: "traits")
            let email = try traits.flatMap {
                try JSONBody(object: $0.objectValue!, path: "traits").string("email", maxLength: 320)
            }
            return .identify(person: userID, email: try RegistryRoutes.email(email), traits: traits)
        case "track":
            return try track(event)
        default:
            return .ignored
        }
    }

    static func track(_ event: JSONBody) throws -> Change {
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
            return .device(
                DeviceRegistration(
                    personID: userID, token: token, platform: platform,
                    appID: try (context?.nested("app"))?.string("namespace", maxLength: 255),
                    osVersion: try Self.loose(properties, "device_os") ?? (try device.string("version", maxLength: 64)),
                    appVersion: try Self.loose(properties, "app_version"),
                    attributes: try RegistryRoutes.attributes(.object(properties.object), field: "properties")))

        case "Device Deleted":
            let context = try event.nested("context")
            guard let device = try context?.nested("device") else { throw ValidationError.missing("context.device") }
            let token = try Identifiers.anyDeviceToken(
                device.requiredString("token", maxLength: 4096), field: "context.device.token")
            // Only the owner may delete a device: without a userId anyone holding the public sdk key could. A delete
            // names its person (one created before the rule on new IDs too).
            let userID = try Identifiers.personReference(
                event.requiredString("userId", maxLength: 256), field: "userId")
            return .deleteDevice(person: userID, token: token)

        case "Live Notification Token":
            return .token(try liveNotificationToken(event, properties))

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
            return .lifecycle(
                instanceID: instanceID, event: lifecycle, deviceToken: deviceToken,
                at: try event.timestamp("timestamp") ?? Date(),
                contentState: try RegistryRoutes.eventContentState(
                    properties.objectValue("contentState"), field: "properties.contentState"))

        case "Report Delivery Event":
            let metric = try properties.requiredEnum("metric", DeliveryMetric.self)
            let deliveryID =
                try properties.string("deliveryId", maxLength: 128) ?? event.string("anonymousId", maxLength: 128)
            guard let deliveryID else { throw ValidationError.missing("properties.deliveryId") }
            return .metric(
                MetricChange(
                    deliveryID: deliveryID, metric: metric,
                    recipient: try Identifiers.recipient(
                        properties.string("recipient", maxLength: Identifiers.maxRecipientLength),
                        field: "properties.recipient"),
                    at: try event.timestamp("timestamp"),
                    deliveryToken: try properties.requiredString("deliveryToken", maxLength: 256)))

        default:
            return .ignored
        }
    }

    static func liveNotificationToken(_ event: JSONBody, _ properties: JSONBody) throws -> TokenChange {
        let registrationType = try properties.requiredString("registrationType")
        let platform = try Self.platform(properties.string("platform") ?? "ios", field: "properties.platform")
        let deviceToken = try Identifiers.deviceToken(
            properties.requiredString("deviceId", maxLength: 4096), platform: platform, field: "properties.deviceId")
        let userID = try event.string("userId", maxLength: 256).map { s throws(ValidationError) in
            try Identifiers.personID(s, field: "userId")
        }
        let registration: TokenChange.Registration
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
            registration = .pushToStart(
                person: owner, activityType: activityType, token: token, attributesType: attributesType)
        case "instance":
            let instanceID = try Identifiers.instanceID(
                properties.requiredString("cioInstanceId", maxLength: 128), field: "properties.cioInstanceId")
            let raw = try properties.requiredString("instanceToken", maxLength: 4096)
            let token =
                platform == .ios
                ? try Identifiers.apnsToken(raw, field: "properties.instanceToken")
                : try Identifiers.fcmToken(raw, field: "properties.instanceToken")
            registration = .instance(instanceID: instanceID, token: token)
        default:
            throw ValidationError(field: "properties.registrationType", reason: "must be push_to_start or instance")
        }
        return TokenChange(person: userID, deviceToken: deviceToken, platform: platform, registration: registration)
    }

    /// Writes one validated event inside the request's transaction, after its identity check. An `identify` whose
    /// email belongs to another person is refused or, as `takenEmail` says, written without it: its person is added
    /// to `keptEmails`.
    static func write(
        _ change: Change, _ registry: RegistryTransaction, _ identity: IdentityGuard.Verdict,
        _ takenEmail: TakenEmail, keptEmails: inout [String]
    ) throws -> Outcome {
        switch change {
        case .ignored:
            return .ignored
        case .identify(let person, let email, let traits):
            try identity.check([person])
            try identity.check(email: email, field: "traits.email")
            if try registry.upsertPerson(id: person, email: email, attributes: traits, takenEmail: takenEmail)
                .emailKept
            {
                keptEmails.append(person)
            }
        case .device(let registration):
            // Registering a device another person owns moves it: a write about its owner too, as for token events.
            try identity.check {
                [registration.personID, try registry.registeredDevice(token: registration.token)?.personID]
            }
            _ = try registry.upsertDevice(registration)
        case .deleteDevice(let person, let token):
            try identity.check([person])
            do {
                try registry.deleteDevice(personID: person, token: token)
            } catch is NotFound {
                return .ignored  // already gone, or not this person's: deleting twice is not an error for the SDK
            }
        case .token(let change):
            // The event is about its userId and about the device's owner, if the device is registered.
            let device = try registry.registeredDevice(token: change.deviceToken)
            try identity.check([change.person, device?.personID])
            // The token's format was checked for the event's platform: it must be the registered device's (an
            // iPhone's activity token checked as an FCM token replaced its real one with one APNs refuses).
            if let device, device.platform != change.platform {
                throw ValidationError(
                    field: "properties.platform",
                    reason:
                        "is \(change.platform.rawValue), but the device is registered as \(device.platform.rawValue)")
            }
            // A token can arrive before the device event; register the device then, if we know its owner.
            if device == nil, let person = change.person {
                _ = try registry.upsertDevice(
                    DeviceRegistration(personID: person, token: change.deviceToken, platform: change.platform))
            }
            switch change.registration {
            case .pushToStart(let person, let activityType, let token, let attributesType):
                do {
                    _ = try registry.registerPushToStart(
                        personID: person, deviceToken: change.deviceToken, activityType: activityType, token: token,
                        attributesType: attributesType, profile: .customerio)
                } catch var error as ValidationError where error.code == .activityTypeLimit {
                    error.field = "properties.notificationType"  // where the event names the type
                    throw error
                }
            case .instance(let instanceID, let token):
                // Only from a device of the instance's person (checked by the registration itself).
                _ = try registry.registerActivityToken(
                    instanceID: instanceID, deviceToken: change.deviceToken, token: token)
            }
        case .lifecycle(let instanceID, let event, let deviceToken, let at, let contentState):
            try identity.check { [try registry.registeredDevice(token: deviceToken)?.personID] }
            try registry.recordEvent(
                instanceID: instanceID, event: event, deviceToken: deviceToken, at: at, contentState: contentState)
        case .metric(let metric):
            // Its delivery token was verified before the transaction.
            do {
                _ = try registry.recordMetric(
                    deliveryID: metric.deliveryID, metric: metric.metric, recipient: metric.recipient, at: metric.at)
            } catch is NotFound {
                return .ignored  // its delivery is gone (erased, or past retention): nothing to count it against
            }
        }
        return .applied
    }

    static func platform(_ text: String, field: String) throws(ValidationError) -> Platform {
        switch text.lowercased() {
        case "ios", "iphone", "ipados": return .ios
        case "android": return .android
        default: throw ValidationError(field: field, reason: "must be ios or android")
        }
    }

    /// The longest `os_version` or `app_version` kept from a property, in UTF-8 bytes.
    static let maxLooseBytes = 64

    /// A property the SDK may send as a string or a number; a longer string is cut to its first characters within
    /// `maxLooseBytes` UTF-8 bytes (characters, not bytes, are never split; nil when not even one fits).
    static func loose(_ body: JSONBody, _ key: String) throws(ValidationError) -> String? {
        guard let v = body.value(key) else { return nil }
        if let s = v.stringValue { return Self.prefix(s, maxBytes: maxLooseBytes) }
        if v.doubleValue != nil { return Self.prefix(v.serialized(), maxBytes: maxLooseBytes) }
        throw ValidationError(field: body.name(key), reason: "must be a string")
    }

    /// The longest prefix of whole characters of `text` that fits in `maxBytes` UTF-8 bytes; nil when empty.
    static func prefix(_ text: String, maxBytes: Int) -> String? {
        var bytes = 0
        var end = text.startIndex
        for index in text.indices {
            bytes += text[index].utf8.count
            if bytes > maxBytes { break }
            end = text.index(after: index)
        }
        return end == text.startIndex ? nil : String(text[..<end])
    }
}
