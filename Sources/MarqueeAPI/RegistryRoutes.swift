import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// People, devices, tokens, lifecycle events and delivery metrics: what device SDKs call (sdk or app key).
struct RegistryRoutes: Sendable {
    let authenticator: Authenticator
    let registry: RegistryStore
    let tenants: TenantStore
    /// Identity verification of sdk-key writes about a person.
    let identity: IdentityGuard
    /// What an sdk-key write learns of an email another person has.
    let takenEmails: TakenEmails

    static let anyKey: Set<APIKeyKind> = [.app, .sdk]

    func register(in router: inout Router) {
        router.add(.PUT, "/v1/people/{id}", putPerson)
        router.add(.GET, "/v1/people/{id}", authenticator.app(getPerson))
        router.add(.DELETE, "/v1/people/{id}", authenticator.app(deletePerson))
        router.add(.PUT, "/v1/people/{id}/devices/{device_token}", putDevice)
        router.add(.DELETE, "/v1/people/{id}/devices/{device_token}", deleteDevice)
        router.add(
            .PUT, "/v1/people/{id}/devices/{device_token}/push_to_start/{activity_type}", putPushToStart)
        router.add(.PUT, "/v1/live_notifications/{instance_id}/tokens/{device_token}", putActivityToken)
        router.add(.POST, "/v1/live_notifications/{instance_id}/events", postEvent)
        router.add(.POST, "/v1/deliveries/{delivery_id}/metrics", postMetric)
    }

    // MARK: People

    func putPerson(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        let id = try Identifiers.personID(request.pathParameters["id"] ?? "")
        let verdict = try await identity.verdict(request, principal)
        try verdict.check([id])
        let body = try JSONBody.parse(request, allowEmpty: true)
        try body.rejectUnknown(["email", "attributes"])
        let email = try Self.email(body.string("email", maxLength: 320))
        try verdict.check(email: email)
        let attributes = try Self.attributes(body.objectValue("attributes"), field: "attributes")
        let written = try await registry.upsertPerson(
            tenant: principal.tenantID, id: id, email: email, attributes: attributes,
            takenEmail: TakenEmails.policy(principal.kind, verdict))
        if written.emailKept {
            takenEmails.kept(tenant: principal.tenantID, person: id, route: "people", requestID: request.requestID)
        }
        // The sdk key is public: it may write a person, never read one (absent members keep what is stored, so the
        // whole record would answer an empty body).
        return .json(
            principal.kind == .sdk ? .object(["id": .string(written.person.id)]) : Render.person(written.person))
    }

    func getPerson(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let id = try? Identifiers.personReference(request.pathParameters["id"] ?? "") else {
            throw Problems.notFound("person")
        }
        return .json(Render.personDetail(try await registry.person(tenant: principal.tenantID, id: id)))
    }

    func deletePerson(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let id = try? Identifiers.personReference(request.pathParameters["id"] ?? "") else {
            throw Problems.notFound("person")
        }
        try await registry.deletePerson(tenant: principal.tenantID, id: id)
        return .noContent()
    }

    // MARK: Devices

    func putDevice(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        let personID = try Identifiers.personID(request.pathParameters["id"] ?? "")
        let verdict = try await identity.verdict(request, principal)
        try verdict.check([personID])
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["platform", "app_id", "os_version", "app_version", "attributes"])
        let platform = try body.requiredEnum("platform", Platform.self)
        let token = try Identifiers.deviceToken(
            request.pathParameters["device_token"] ?? "", platform: platform, field: "device_token")
        // Registering a device another person owns moves it: a write about its owner too, as for token events.
        if verdict.needsPeople {
            try verdict.check([try await registry.registeredDevice(tenant: principal.tenantID, token: token)?.personID])
        }
        let device = try await registry.upsertDevice(
            tenant: principal.tenantID,
            DeviceRegistration(
                personID: personID, token: token, platform: platform, appID: body.string("app_id", maxLength: 255),
                osVersion: body.string("os_version", maxLength: 64),
                appVersion: body.string("app_version", maxLength: 64),
                attributes: Self.attributes(body.objectValue("attributes"), field: "attributes")))
        // The sdk key is public: it may write a device, never read one. A token registered before keeps its stored
        // fields where the body leaves them out, so the whole device would show them, whoever registered it first.
        return .json(principal.kind == .sdk ? Render.deviceWritten(device) : Render.device(device))
    }

    func deleteDevice(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        guard let personID = try? Identifiers.personReference(request.pathParameters["id"] ?? ""),
            let token = try? Identifiers.anyDeviceToken(
                request.pathParameters["device_token"] ?? "", field: "device_token")
        else { throw Problems.notFound("device") }
        try await identity.check(request, principal, about: [personID])
        try await registry.deleteDevice(tenant: principal.tenantID, personID: personID, token: token)
        return .noContent()
    }

    // MARK: Tokens

    func putPushToStart(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        let personID = try Identifiers.personID(request.pathParameters["id"] ?? "")
        try await identity.check(request, principal, about: [personID])
        let deviceToken = try Identifiers.apnsToken(request.pathParameters["device_token"] ?? "", field: "device_token")
        let activityType = try Identifiers.activityType(
            request.pathParameters["activity_type"] ?? "", field: "activity_type")
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["token", "attributes_type"])
        let token = try Identifiers.apnsToken(body.requiredString("token", maxLength: 4096), field: "token")
        let attributesType = try body.string("attributes_type").map { s throws(ValidationError) in
            try Identifiers.attributesType(s)
        }
        let result = try await registry.registerPushToStart(
            tenant: principal.tenantID, personID: personID, deviceToken: deviceToken, activityType: activityType,
            token: token, attributesType: attributesType)
        return .json(Self.registration(result, kind: "push_to_start", token: token))
    }

    func putActivityToken(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        let instanceID = try Identifiers.instanceID(request.pathParameters["instance_id"] ?? "")
        let deviceToken = try Identifiers.anyDeviceToken(
            request.pathParameters["device_token"] ?? "", field: "device_token")
        // Two round trips: the device (its owner for identity verification, its platform for the token's format),
        // then the registration, which checks that the device is the instance's person's under the device's lock.
        let device = try await registry.registeredDevice(tenant: principal.tenantID, token: deviceToken)
        try await identity.check(request, principal, about: [device?.personID])
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["token"])
        let raw = try body.requiredString("token", maxLength: 4096)
        guard let platform = device?.platform else { throw Problems.notFound("device") }
        let token =
            platform == .ios
            ? try Identifiers.apnsToken(raw, field: "token") : try Identifiers.fcmToken(raw, field: "token")
        let result = try await registry.registerActivityToken(
            tenant: principal.tenantID, instanceID: instanceID, deviceToken: deviceToken, token: token)
        return .json(Self.registration(result, kind: "activity", token: token))
    }

    static func registration(_ result: TokenRegistration, kind: String, token: String) -> JSONValue {
        .object([
            "kind": .string(kind), "token": .string(maskToken(token)), "status": .string("active"),
            "rotated": .bool(result.rotated), "unchanged": .bool(result.unchanged),
        ])
    }

    // MARK: Events and metrics

    func postEvent(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        let instanceID = try Identifiers.instanceID(request.pathParameters["instance_id"] ?? "")
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["event", "device_token", "at", "content_state"])
        let event = try body.requiredEnum("event", LifecycleEvent.self)
        let deviceToken = try Identifiers.anyDeviceToken(
            body.requiredString("device_token", maxLength: 4096), field: "device_token")
        try await identity.check(request, principal) {
            [try await registry.registeredDevice(tenant: principal.tenantID, token: deviceToken)?.personID]
        }
        guard let at = try body.timestamp("at") else { throw ValidationError.missing("at") }
        let contentState = try Self.eventContentState(body.objectValue("content_state"), field: "content_state")
        try await registry.recordEvent(
            tenant: principal.tenantID, instanceID: instanceID, event: event, deviceToken: deviceToken, at: at,
            contentState: contentState)
        return .json(.object(["recorded": .bool(true)]), status: 202)
    }

    /// Metrics name no person: the delivery's token authorizes them, so identity verification does not apply.
    func postMetric(_ request: HTTPRequest) async throws -> HTTPResponse {
        let principal = try await authenticator.require(request, kinds: Self.anyKey)
        guard let deliveryID = request.pathParameters["delivery_id"], (1...128).contains(deliveryID.utf8.count),
            deliveryID.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
        else { throw ValidationError(field: "delivery_id", reason: "must be 1 to 128 printable characters") }
        let (metric, recipient, at, token) = try Self.metricReport(request)
        try await Self.verifyDeliveryToken(
            token, deliveryID: deliveryID, field: "delivery_token", tenant: principal.tenantID, tenants: tenants)
        let recorded = try await registry.recordMetric(
            tenant: principal.tenantID, deliveryID: deliveryID, metric: metric, recipient: recipient, at: at)
        return .json(.object(["recorded": .bool(recorded), "duplicate": .bool(!recorded)]), status: 202)
    }

    /// The body of a metric report: metric, recipient, time and delivery token.
    /// Synchronous and not inlined: Swift 6.3's optimiser crashed (signal 11 while splitting the coroutine) with these
    /// typed-throws calls inlined into the async handler, in release builds.
    @inline(never)
    static func metricReport(_ request: HTTPRequest) throws -> (DeliveryMetric, String?, Date?, String) {
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["metric", "recipient", "delivery_token", "at"])
        return (
            try body.requiredEnum("metric", DeliveryMetric.self),
            try Identifiers.recipient(
                body.string("recipient", maxLength: Identifiers.maxRecipientLength), field: "recipient"),
            try body.timestamp("at"),
            try body.requiredString("delivery_token", maxLength: 256)
        )
    }

    /// Metrics are accepted only with the delivery's token (what the push carried), so that a holder of the public
    /// sdk key cannot forge delivered or opened counts. The one home of this rule, for this route and the compat one.
    @inline(never)
    static func verifyDeliveryToken(
        _ presented: String, deliveryID: String, field: String, tenant: UUID, tenants: TenantStore
    ) async throws {
        try verifyDeliveryToken(
            presented, deliveryID: deliveryID, field: field, secret: try await tenants.deliverySecret(tenant: tenant))
    }

    /// As above, with the tenant's delivery secret already at hand (a batch reads it once).
    static func verifyDeliveryToken(_ presented: String, deliveryID: String, field: String, secret: [UInt8])
        throws(ValidationError)
    {
        guard DeliveryTokens.verify(presented, deliveryID: deliveryID, secret: secret) else {
            throw ValidationError(field: field, reason: "does not match this delivery")
        }
    }

    // MARK: Field rules

    /// The largest `content_state` a lifecycle event may carry, serialized (devices report it; it is stored as is).
    static let maxEventContentStateBytes = 4096

    /// An event's reported content state, refused when larger than `maxEventContentStateBytes`.
    static func eventContentState(_ value: JSONValue?, field: String) throws(ValidationError) -> JSONValue? {
        guard let value else { return nil }
        guard value.serialized().utf8.count <= maxEventContentStateBytes else {
            throw ValidationError(field: field, reason: "must be at most \(maxEventContentStateBytes) bytes of JSON")
        }
        return value
    }

    /// The largest `attributes` object of a person or a device, serialized. Stored as is and read back by every
    /// segment evaluation and person read; 1 MiB bodies made 1 MiB rows.
    static let maxAttributesBytes = 16 * 1024

    /// A person's or a device's attributes, refused when larger than `maxAttributesBytes`. The one home of this rule,
    /// for people, devices, the compat `identify` traits and device properties, and the import.
    static func attributes(_ value: JSONValue?, field: String) throws(ValidationError) -> JSONValue? {
        _ = try serializedAttributes(value, field: field)
        return value
    }

    /// `attributes(_:field:)`, answering the serialized object (in an array of its own size), for a write that keeps
    /// only the text: the import holds up to 100,000 of them, where a parsed tree takes 24 bytes and more a value from
    /// as little as two bytes of text.
    static func serializedAttributes(_ value: JSONValue?, field: String) throws(ValidationError) -> [UInt8]? {
        guard let value else { return nil }
        let bytes = value.bytes
        guard bytes.count <= maxAttributesBytes else {
            throw ValidationError(field: field, reason: "must be at most \(maxAttributesBytes) bytes of JSON")
        }
        // `bytes` grew by doubling: up to twice its size reserved.
        return [UInt8](unsafeUninitializedCapacity: bytes.count) { buffer, count in
            count = buffer.initialize(fromContentsOf: bytes)
        }
    }

    /// The longest email accepted, in UTF-8 bytes (RFC 5321's 320 octets).
    static let maxEmailBytes = 320

    /// An email address: one `@`, a non-empty local part, a dot after the `@`, no spaces, at most 320 bytes. The one
    /// home of this rule, for people, the compat `identify`, the import and a start's `identifiers.email`; `field`
    /// names it in the error.
    static func email(_ text: String?, field: String = "email") throws(ValidationError) -> String? {
        guard let text else { return nil }
        // Bytes, not characters: `lower(email)` is a B-tree key (people_email), which holds at most 2704 bytes.
        guard text.utf8.count <= maxEmailBytes else {
            throw ValidationError(field: field, reason: "must be at most \(maxEmailBytes) bytes")
        }
        let parts = text.split(separator: "@", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, parts[1].contains("."), !text.contains(" ") else {
            throw ValidationError(field: field, reason: "must be an email address")
        }
        return text
    }
}
