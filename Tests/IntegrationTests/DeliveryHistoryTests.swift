import Foundation
import PostgresClient
import Testing

/// The queue and the history (migration 0057): a delivery waits in `delivery_queue` and, with its outcome, moves to
/// the append-only `delivery_history`; `deliveries` (and the API's listing) show both.
extension DeliveryTests {
    @Test("an outcome moves a delivery from the queue to the append-only history; the listing shows both")
    func queueThenHistory() async throws {
        let t = try await Self.tenant()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let (device, _) = try await t.iphone()
        let instance = Fake.id("history")
        #expect(try await t.start(instance).status == 200)
        let activityToken = Fake.hex()
        _ = try await t.api.call(
            "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: t.tenant.sdk,
            json: ["token": activityToken])
        func update(_ step: Int) async throws {
            let r = try await t.api.call(
                "POST", "/v1/live_notifications/update", key: t.tenant.app,
                json: ["instance_id": instance, "content_state_patch": ["status": "step \(step)"]])
            #expect(r.status == 200, "\(r.text)")
        }
        func rows(_ table: String) async throws -> [String: String] {
            let rows = try await pool.query(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT operation || ':' || instance_version AS k, status FROM \(table)
                        WHERE tenant_id = '\(tenant.uuidString)' AND instance_id = '\(instance)'
                        """))
            return Dictionary(
                try rows.map { (try $0.decode(String.self, "k"), try $0.decode(String.self, "status")) },
                uniquingKeysWith: { a, _ in a })
        }

        // No worker yet: the start and the first update wait in the queue; the second update supersedes the first,
        // which leaves the queue for the history at once.
        try await update(1)
        #expect(try await rows("delivery_queue") == ["start:1": "queued", "update:2": "queued"])
        try await update(2)
        #expect(try await rows("delivery_queue") == ["start:1": "queued", "update:3": "queued"])
        #expect(try await rows("delivery_history") == ["update:2": "superseded"])

        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let settled = try await t.settled(instance, count: 3)
        #expect(try await rows("delivery_queue").isEmpty, "nothing with an outcome stays in the queue")
        #expect(
            try await rows("delivery_history") == ["start:1": "sent", "update:2": "superseded", "update:3": "sent"])
        #expect(
            Set(settled.compactMap { $0.string("status") }) == ["sent", "superseded"]
                && settled.filter { $0.string("status") == "sent" }.allSatisfy { $0.string("provider_id") != nil },
            "\(settled)")

        // Append-only: neither the API's nor the workers' role may change a recorded outcome.
        for role in ["marquee_api", "marquee_system"] {
            let refused = await #expect(throws: PostgresError.self) {
                try await pool.transaction { c in
                    try c.execute(PostgresQuery(unsafeSQL: "SET LOCAL ROLE \(role)"))
                    try c.execute("SELECT marquee_enter_tenant(\(tenant))")
                    try c.execute("UPDATE delivery_history SET status = 'failed' WHERE tenant_id = \(tenant)")
                }
            }
            #expect(refused?.sqlState == "42501", "\(role): \(String(describing: refused))")
        }
    }
}
