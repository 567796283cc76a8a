import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// `GET /v1/overview` and `GET /v1/delivery_failures`: the aggregates the console adds, per tenant, bounded in time.
@Suite("Console endpoints")
struct ConsoleEndpointTests {
    /// A tenant with `count` started instances (an iPhone with a push-to-start token each; no worker sends them).
    static func tenant(_ api: API, instances count: Int) async throws -> (TestTenant, [String]) {
        let tenant = try await api.createTenant()
        let type = Fake.activityType()
        try ok(await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "A"]))
        var ids: [String] = []
        for index in 0..<count {
            let person = Fake.id("p\(index)")
            _ = try await api.iphone(tenant, person: person, type: type)
            let id = Fake.id("i\(index)")
            try ok(
                await api.call(
                    "POST", "/v1/live_notifications/start", key: tenant.app,
                    json: [
                        "identifiers": ["id": person], "notification_type": type, "instance_id": id,
                        "attributes": ["n": index], "content_state": ["step": 1],
                        "push_payload": ["alert": ["title": "T", "body": "B"]],
                    ]))
            ids.append(id)
        }
        return (tenant, ids)
    }

    @Test("the overview counts the tenant's instances by state, its deliveries per minute and its queue, nobody else's")
    func overview() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (a, ids) = try await Self.tenant(api, instances: 4)
        let (b, _) = try await Self.tenant(api, instances: 1)
        try ok(await api.call("POST", "/v1/live_notifications/end", key: a.app, json: ["instance_id": ids[0]]))
        // One instance is past its expiry without a worker having marked it: it counts as expired.
        _ = try await fixture.pool.query(
            "UPDATE instances SET expires_at = now() - interval '1 second' WHERE tenant_id = \(a.uuid) AND id = \(ids[1])"
        )

        let r = try await api.call("GET", "/v1/overview", key: a.app)
        #expect(r.status == 200, "\(r.text)")
        let o = try r.json()
        let instances = try #require(o.object("instances"))
        #expect(instances["total"] as? Int == 4)
        let states = try #require(instances["by_state"] as? [String: Int])
        #expect(states == ["pending": 2, "active": 0, "ended": 1, "expired": 1, "failed": 0], "\(states)")

        // The chart's series agree with the deliveries themselves, all in the current minute's bucket or the one before.
        var statuses: [String: Int] = [:]
        for id in ids {
            for d in try await api.call("GET", "/v1/live_notifications/\(id)/deliveries", key: a.app).json().array(
                "data")
            {
                statuses["apns/" + (d.string("status") ?? "?"), default: 0] += 1
            }
        }
        let deliveries = try #require(o.object("deliveries"))
        #expect(deliveries["buckets"] as? Int == 60)
        #expect(deliveries["bucket_seconds"] as? Int == 60)
        var charted: [String: Int] = [:]
        for line in deliveries["series"] as? [[String: Any]] ?? [] {
            let counts = line["counts"] as? [Int] ?? []
            #expect(counts.count == 60)
            #expect(counts.dropLast(2).allSatisfy { $0 == 0 }, "\(line)")
            #expect(line["total"] as? Int == counts.reduce(0, +))
            charted["\(line["provider"] ?? "")/\(line["status"] ?? "")"] = counts.reduce(0, +)
        }
        #expect(charted == statuses, "\(charted) vs \(statuses)")
        let since = try #require((deliveries["since"] as? String).flatMap { try? Date($0, strategy: .iso8601) })
        #expect(abs(since.timeIntervalSinceNow + 59 * 60) < 120, "\(since)")

        let queue = try #require(o.object("queue"))
        #expect(queue["due"] as? Int == statuses["apns/queued"] ?? 0, "\(queue)")
        #expect(queue["later"] as? Int == 0)
        #expect((queue["by_provider"] as? [String: Int])?["apns"] == statuses["apns/queued"])
        #expect(queue["capped"] as? Bool == false)
        // The oldest due row, wherever it sits in the queue's lanes.
        let oldest = try #require(
            try await fixture.pool.query(
                """
                SELECT extract(epoch FROM min(next_attempt_at))::float8 AS t FROM delivery_queue
                WHERE tenant_id = \(a.uuid) AND status = 'queued' AND next_attempt_at <= now()
                """
            ).first?.decode(Double?.self, "t"))
        let shown = try #require(
            (queue["oldest_due_at"] as? String).flatMap {
                try? Date($0, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true))
            }, "\(queue)")
        #expect(abs(shown.timeIntervalSince1970 - oldest) < 0.002, "\(shown) vs \(oldest)")

        // Tenant B sees only its own.
        let other = try await api.call("GET", "/v1/overview", key: b.app).json()
        #expect(other.object("instances")?["total"] as? Int == 1)
        #expect(other.object("queue")?["due"] as? Int == 1)
    }

    @Test("failures: grouped by provider, status and reason, largest first, the newest few each, within the window")
    func failures() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (a, ids) = try await Self.tenant(api, instances: 4)
        let (b, _) = try await Self.tenant(api, instances: 1)
        func fail(_ id: String, _ status: String, _ reason: String, ago: String = "1 second") async throws {
            try await fixture.pool.recordOutcome(
                tenant: a.uuid, instance: id, status: status, reason: reason, httpStatus: 410, ago: ago)
        }
        try await fail(ids[0], "undeliverable", "Unregistered")
        try await fail(ids[1], "undeliverable", "Unregistered")
        try await fail(ids[2], "failed", "timeout")
        try await fail(ids[3], "failed", "timeout", ago: "3 hours")

        let r = try await api.call("GET", "/v1/delivery_failures?hours=2", key: a.app)
        #expect(r.status == 200, "\(r.text)")
        let f = try r.json()
        #expect(f["total"] as? Int == 3)
        #expect(f["truncated"] as? Bool == false)
        let groups = f.array("groups")
        #expect(groups.count == 2, "\(groups)")
        #expect(groups.first?.string("reason") == "Unregistered")
        #expect(groups.first?["count"] as? Int == 2)
        #expect(groups.first?.string("status") == "undeliverable")
        #expect(groups.first?.string("provider") == "apns")
        #expect(Set(groups.first?.array("recent").compactMap { $0.string("instance_id") } ?? []) == [ids[0], ids[1]])
        #expect(groups.first?.array("recent").first?["http_status"] as? Int == 410)
        #expect(groups.last?.string("reason") == "timeout")
        #expect(groups.last?["count"] as? Int == 1, "the 3-hour-old failure is outside the window")

        let day = try await api.call("GET", "/v1/delivery_failures", key: a.app).json()
        #expect(day["total"] as? Int == 4)
        #expect(day["groups_total"] as? Int == 2)
        #expect(try await api.call("GET", "/v1/delivery_failures", key: b.app).json()["total"] as? Int == 0)
    }

    @Test("failures a provider words each its own way: the 50 largest groups are listed, and how many there are")
    func manyGroups() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (a, ids) = try await Self.tenant(api, instances: 3)
        for id in ids.prefix(2) {
            try await fixture.pool.recordOutcome(
                tenant: a.uuid, instance: id, status: "undeliverable", reason: "Unregistered", httpStatus: 410)
        }
        try await fixture.pool.recordOutcome(
            tenant: a.uuid, instance: ids[2], status: "failed", reason: "hostile-0", httpStatus: 500)
        // The tenant's endpoint answered a new reason for each of 79 more pushes: 80 groups of one.
        _ = try await fixture.pool.query(
            """
            INSERT INTO delivery_history
            SELECT (jsonb_populate_record(h, jsonb_build_object('id', gen_random_uuid(), 'reason', 'hostile-' || g))).*
            FROM delivery_history h, generate_series(1, 79) g
            WHERE h.tenant_id = \(a.uuid) AND h.instance_id = \(ids[2])
            """)
        let r = try await api.call("GET", "/v1/delivery_failures", key: a.app)
        #expect(r.status == 200, "\(r.text)")
        let f = try r.json()
        #expect(f["total"] as? Int == 82)
        #expect(f["groups_total"] as? Int == 81)
        let groups = f.array("groups")
        #expect(groups.count == 50, "at most 50 groups: \(groups.count)")
        #expect(groups.first?.string("reason") == "Unregistered", "the largest first")
        #expect(groups.first?["count"] as? Int == 2)
        #expect(Set(groups.compactMap { $0.string("reason") }).count == 50, "50 different groups")
        #expect(r.body.count < 64 * 1024, "\(r.body.count) bytes")
    }

    /// One row beyond each cap is read to learn that there are more; it is counted nowhere, so what the console shows
    /// adds up (a total of 10,000 whose groups made 10,001).
    @Test("failures and the queue are counted up to their caps and no further: the groups add up to the total")
    func caps() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let (a, ids) = try await Self.tenant(api, instances: 2)
        try await fixture.pool.recordOutcome(
            tenant: a.uuid, instance: ids[0], status: "undeliverable", reason: "Unregistered", httpStatus: 410)
        // One failure more than the cap in all, and one queued delivery more than the cap (ids[1]'s start and copies).
        // Each copy is made once in a subquery: `(jsonb_populate_record(…)).*` calls it once per column (ten times
        // slower, 50 s for the queue's copies on the 2-core test machine).
        _ = try await fixture.pool.query(
            """
            INSERT INTO delivery_history
            SELECT (c).* FROM (
                SELECT jsonb_populate_record(h, jsonb_build_object('id', gen_random_uuid())) AS c
                FROM delivery_history h, generate_series(1, \(OverviewStore.failureCap)) g
                WHERE h.tenant_id = \(a.uuid) AND h.instance_id = \(ids[0]) OFFSET 0) copies
            """)
        _ = try await fixture.pool.query(
            """
            INSERT INTO delivery_queue
            SELECT (c).* FROM (
                SELECT jsonb_populate_record(q, jsonb_build_object('id', gen_random_uuid())) AS c
                FROM delivery_queue q, generate_series(1, \(OverviewStore.queueCap)) g
                WHERE q.tenant_id = \(a.uuid) AND q.instance_id = \(ids[1]) OFFSET 0) copies
            """)

        let f = try await api.call("GET", "/v1/delivery_failures", key: a.app).json()
        #expect(f["total"] as? Int == OverviewStore.failureCap)
        #expect(f["truncated"] as? Bool == true)
        let counted = f.array("groups").reduce(0) { $0 + ($1["count"] as? Int ?? 0) }
        #expect(counted == OverviewStore.failureCap, "the groups add up to the total")

        let queue = try #require(try await api.call("GET", "/v1/overview", key: a.app).json().object("queue"))
        #expect(queue["capped"] as? Bool == true)
        let due = queue["due"] as? Int ?? -1
        let later = queue["later"] as? Int ?? -1
        #expect(due + later == OverviewStore.queueCap, "\(queue)")
        #expect((queue["by_provider"] as? [String: Int])?["apns"] == OverviewStore.queueCap, "\(queue)")
    }

    @Test("client errors are problems: a bad window is 422 for hours, a missing key 401, an sdk key 403")
    func problems() async throws {
        let api = try await RegistryFixture.get().api
        let tenant = try await api.createTenant()
        for hours in ["0", "169", "x", "-1", "1.5", ""] {
            let r = try await api.call("GET", "/v1/delivery_failures?hours=\(hours)", key: tenant.app)
            expectProblem(r, 422, "invalid-field", field: "hours", "hours=\(hours)")
        }
        for path in ["/v1/overview", "/v1/delivery_failures"] {
            expectProblem(try await api.call("GET", path), 401, "unauthorized", path)
            expectProblem(try await api.call("GET", path, key: tenant.sdk), 403, "forbidden", path)
            expectProblem(try await api.call("GET", path, key: "mq_app_nope"), 401, "unauthorized", path)
        }
    }
}
