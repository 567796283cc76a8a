import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/v1/segments` (app key): saved audiences, written in the filter language of `SegmentFilter`.
struct SegmentRoutes: Sendable {
    let authenticator: Authenticator
    let store: SegmentStore

    func register(in router: inout Router) {
        router.add(.PUT, "/v1/segments/{segment_id}", authenticator.app(put))
        router.add(.GET, "/v1/segments", authenticator.app(list))
        router.add(.GET, "/v1/segments/{segment_id}", authenticator.app(get))
        router.add(.DELETE, "/v1/segments/{segment_id}", authenticator.app(delete))
        router.add(.POST, "/v1/segments/{segment_id}/preview", authenticator.app(preview))
    }

    func put(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let id = try Identifiers.instanceID(request.pathParameters["segment_id"] ?? "", field: "segment_id")
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["name", "filter"])
        let name = try body.requiredString("name", maxLength: 200)
        guard !name.isEmpty else { throw ValidationError(field: "name", reason: "must not be empty") }
        guard let filter = body.value("filter") else { throw ValidationError.missing("filter") }
        _ = try SegmentFilter(filter)
        let (segment, created) = try await store.put(tenant: principal.tenantID, id: id, name: name, filter: filter)
        return .json(Self.render(segment), status: created ? 201 : 200)
    }

    func list(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let limit = try Paging.limit(request)
        let after = try request.query["cursor"].map { text throws(ValidationError) in
            try Identifiers.instanceReference(text, field: "cursor")
        }
        let page = try await store.list(tenant: principal.tenantID, after: after, limit: limit + 1)
        let (items, next) = Paging.page(page, limit: limit) { .string($0.id) }
        return .json(.object(["data": .array(items.map(Self.render)), "next_cursor": next]))
    }

    func get(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        return .json(Self.render(try await store.get(tenant: principal.tenantID, id: try Self.segmentID(request))))
    }

    func delete(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        guard try await store.delete(tenant: principal.tenantID, id: try Self.segmentID(request)) else {
            throw NotFound("segment")
        }
        return .noContent()
    }

    /// Who the saved segment matches now: `{count, sample}`. Read-only, so safe to repeat (an Idempotency-Key is
    /// accepted and has nothing to guard).
    func preview(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        _ = try LifecycleRoutes.idempotencyKey(request)
        let segment = try await store.get(tenant: principal.tenantID, id: try Self.segmentID(request))
        let preview = try await store.preview(tenant: principal.tenantID, filter: try SegmentFilter(segment.filter))
        return .json(
            .object([
                "segment_id": .string(segment.id), "count": .int(Int64(preview.count)),
                "sample": .array(preview.sample.map(JSONValue.string)),
            ]))
    }

    /// The `{segment_id}` path parameter; an ID that could never have been saved is a segment that does not exist.
    static func segmentID(_ request: HTTPRequest) throws(HTTPProblem) -> String {
        guard let id = try? Identifiers.instanceID(request.pathParameters["segment_id"] ?? "", field: "segment_id")
        else { throw Problems.notFound("segment") }
        return id
    }

    static func render(_ s: Segment) -> JSONValue {
        .object([
            "segment_id": .string(s.id), "name": .string(s.name), "filter": s.filter, "created_at": .from(s.createdAt),
            "updated_at": .from(s.updatedAt),
        ])
    }
}
