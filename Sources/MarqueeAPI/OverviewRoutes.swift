import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `GET /v1/overview` and `GET /v1/delivery_failures` (app key): the aggregates the operator console shows that no
/// other endpoint has. Each read is bounded in time and rows (see `OverviewStore`).
struct OverviewRoutes: Sendable {
    let authenticator: Authenticator
    let store: OverviewStore
    let now: @Sendable () -> Date

    /// The failures window's default and largest length, in hours.
    static let defaultHours = 24
    static let maximumHours = 168

    func register(in router: inout Router) {
        router.add(.GET, "/v1/overview", authenticator.app(overview))
        router.add(.GET, "/v1/delivery_failures", authenticator.app(failures))
    }

    func overview(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let now = self.now()
        let o = try await store.overview(tenant: principal.tenantID, now: now)
        var states: [String: JSONValue] = [:]
        for (state, n) in o.instancesByState { states[state.rawValue] = .int(Int64(n)) }
        return .json(
            .object([
                "generated_at": .from(now),
                "instances": .object([
                    "since": .from(o.instancesSince), "by_state": .object(states),
                    "total": .int(Int64(o.instancesByState.values.reduce(0, +))),
                ]),
                "deliveries": .object([
                    "since": .from(o.deliveriesSince), "bucket_seconds": .int(60), "buckets": .int(Int64(o.minutes)),
                    "series": .array(
                        o.series.map { s in
                            .object([
                                "provider": .string(s.provider), "status": .string(s.status),
                                "counts": .array(s.counts.map { .int(Int64($0)) }),
                                "total": .int(Int64(s.counts.reduce(0, +))),
                            ])
                        }),
                ]),
                "queue": .object([
                    "due": .int(Int64(o.queueDue)), "later": .int(Int64(o.queueLater)),
                    "by_provider": .object(o.queueByProvider.mapValues { .int(Int64($0)) }),
                    "oldest_due_at": .from(o.oldestDueAt), "capped": .bool(o.queueCapped),
                ]),
            ]))
    }

    func failures(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        var hours = Self.defaultHours
        if let text = request.query["hours"] {
            guard let n = Int(text), (1...Self.maximumHours).contains(n) else {
                throw ValidationError(field: "hours", reason: "must be an integer in 1...\(Self.maximumHours)")
            }
            hours = n
        }
        let since = now().addingTimeInterval(-Double(hours) * 3600)
        let f = try await store.failures(tenant: principal.tenantID, since: since)
        return .json(
            .object([
                "since": .from(f.since), "total": .int(Int64(f.total)), "truncated": .bool(f.truncated),
                "groups_total": .int(Int64(f.groupsTotal)),
                "groups": .array(
                    f.groups.map { g in
                        .object([
                            "provider": .string(g.provider), "status": .string(g.status), "reason": .from(g.reason),
                            "count": .int(Int64(g.count)), "last_at": .from(g.lastAt),
                            "recent": .array(
                                g.recent.map { d in
                                    .object([
                                        "delivery_id": .string(ULID(uuid: d.id).description),
                                        "instance_id": .string(d.instanceID), "operation": .string(d.operation),
                                        "http_status": d.httpStatus.map { .int(Int64($0)) } ?? .null,
                                        "at": .from(d.at),
                                    ])
                                }),
                        ])
                    }),
            ]))
    }
}
