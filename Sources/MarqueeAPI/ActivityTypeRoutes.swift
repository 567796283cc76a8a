import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/v1/activity_types` (app key).
struct ActivityTypeRoutes: Sendable {
    let authenticator: Authenticator
    let registry: RegistryStore

    func register(in router: inout Router) {
        router.add(.PUT, "/v1/activity_types/{identifier}", authenticator.app(put))
        router.add(.GET, "/v1/activity_types", authenticator.app(list))
        router.add(.GET, "/v1/activity_types/{identifier}", authenticator.app(get))
    }

    func put(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let identifier = try Identifiers.activityType(request.pathParameters["identifier"] ?? "")
        let body = try JSONBody.parse(request)
        try body.rejectUnknown([
            "attributes_type", "content_state_schema", "date_fields", "payload_profile", "frequent_updates",
            "min_update_interval_ms",
        ])
        let attributesType = try Identifiers.attributesType(body.requiredString("attributes_type"))
        var schema: JSONValue?
        if let value = body.value("content_state_schema") {
            _ = try ContentSchema(value)
            schema = value
        }
        var dateFields: [String: DateEncoding] = [:]
        if let fields = try body.objectValue("date_fields")?.objectValue {
            for (pointer, value) in fields {
                let field = "date_fields." + pointer
                guard JSONPointer(pointer) != nil, !pointer.isEmpty else {
                    throw ValidationError(field: field, reason: "keys must be JSON pointers such as /eta")
                }
                guard let encoding = value.stringValue.flatMap(DateEncoding.init(rawValue:)) else {
                    throw ValidationError(
                        field: field,
                        reason: "must be one of " + DateEncoding.allCases.map(\.rawValue).joined(separator: ", "))
                }
                dateFields[pointer] = encoding
            }
        }
        let profile = try body.enumValue("payload_profile", PayloadProfile.self) ?? .marquee
        let frequentUpdates = try body.bool("frequent_updates") ?? false
        let interval = try body.integer("min_update_interval_ms", range: 0...3_600_000) ?? 0
        let (type, created) = try await registry.putActivityType(
            tenant: principal.tenantID,
            ActivityType(
                identifier: identifier, attributesType: attributesType, contentStateSchema: schema,
                dateFields: dateFields, payloadProfile: profile, frequentUpdates: frequentUpdates,
                minUpdateIntervalMilliseconds: Int(interval)))
        return .json(Render.activityType(type), status: created ? 201 : 200)
    }

    /// A page of activity types by identifier: an sdk key creates types with its push-to-start registrations, so
    /// there may be any number of them.
    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        let after = try request.query["cursor"].map { text throws(ValidationError) in
            try Identifiers.activityType(text, field: "cursor")
        }
        let page = try await registry.activityTypes(tenant: principal.tenantID, after: after, limit: limit + 1)
        let (items, next) = Paging.page(page, limit: limit) { .string($0.identifier) }
        return .json(.object(["activity_types": .array(items.map(Render.activityType)), "next_cursor": next]))
    }

    func get(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard let identifier = try? Identifiers.activityType(request.pathParameters["identifier"] ?? "") else {
            throw Problems.notFound("activity_type")
        }
        return .json(
            Render.activityType(try await registry.activityType(tenant: principal.tenantID, identifier: identifier)))
    }
}
