import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// Parked deliveries go out again whenever their credential is usable, however it became so (migration 0104): a
/// deleted credential uploaded again, and an upload that commits while a worker records a park.
extension DeliveryTests {
    /// The fixture's good APNs credential, as `PUT /v1/credentials/apns` takes it.
    static func goodAPNsCredential(_ t: Tenant) -> [String: Any] {
        [
            "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
            "bundle_id": "com.example.app", "environment": "sandbox",
            "endpoint": "https://127.0.0.1:\(t.fixture.simulator.port)",
        ]
    }

    @Test("a broken credential deleted and uploaded again: its parked deliveries are queued again and sent")
    func parkedUntilUploadedAgain() async throws {
        let t = try await Self.tenant()
        let (_, token) = try await t.iphone()
        let pool = t.fixture.pool
        try await pool.execute("UPDATE apns_credentials SET status = 'broken' WHERE tenant_id = \(t.tenant.uuid)")
        let instance = Fake.id("park-deleted")
        #expect(try await t.start(instance).status == 200)
        #expect(try await t.deliveries(instance).map { $0.string("status") } == ["parked"])
        // The tenant deletes the broken credential: its deliveries wait for the next one.
        #expect(try await t.api.call("DELETE", "/v1/credentials/apns", key: t.tenant.app).status == 204)
        #expect(try await t.deliveries(instance).map { $0.string("status") } == ["parked"])
        // A good one uploaded (an INSERT, not an update of a broken row) queues them again in its transaction.
        #expect(
            try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: Self.goodAPNsCredential(t))
                .status == 200)
        #expect(try await t.deliveries(instance).map { $0.string("status") } == ["queued"])
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        #expect(try await t.settled(instance, count: 1)[0].string("status") == "sent")
        #expect(t.fixture.simulator.pushes(token: token).count == 1)
    }

    @Test("a park recorded while an upload commits waits for it: the delivery is queued, not left parked")
    func parkRecordedDuringUpload() async throws {
        let t = try await Self.tenant()
        _ = try await t.iphone()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let instance = Fake.id("park-race")
        #expect(try await t.start(instance).status == 200)
        let claimed = AsyncGate()
        let answered = AsyncGate()
        let recorded = Atomic(false)
        // A worker sends the start and APNs refuses the credential: its result is a park.
        let claiming = Task {
            defer { recorded.store(true, ordering: .sequentiallyConsistent) }
            return try await DeliveryQueue(pool: pool).claim(limit: 10, hold: .seconds(60), tenants: [tenant]) {
                batch in
                claimed.open(batch.count)
                await answered.wait()
                return ClaimResults(
                    results: batch.map {
                        DeliveryResult(
                            tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .parked,
                            httpStatus: 403, reason: "InvalidProviderToken")
                    })
            }
        }
        #expect(try await claimed.value(within: .seconds(30)) == 1)
        // The worker marks the credential broken (the break skips the row the claim holds) ...
        try await pool.execute(
            """
            UPDATE apns_credentials SET status = 'broken', status_reason = 'InvalidProviderToken'
            WHERE tenant_id = \(tenant)
            """)
        // ... and the tenant uploads a good one, which commits while the worker records the park.
        let upload = try await HeldTransaction.open(t.fixture.databaseURL) { c in
            try c.execute(
                "UPDATE apns_credentials SET status = 'ok', status_reason = NULL WHERE tenant_id = \(tenant)")
        }
        answered.open(0)
        try await eventually("the record waits for the upload, or is done", timeout: .seconds(30)) {
            if recorded.load(ordering: .sequentiallyConsistent) { return true }
            return try await upload.waiting(via: pool) > 0
        }
        try await upload.commit()
        #expect(try await claiming.value == 1)
        #expect(try await t.api.call("GET", "/v1/credentials/apns", key: t.tenant.app).json().string("status") == "ok")
        #expect(try await t.deliveries(instance).map { $0.string("status") } == ["queued"])
    }

    @Test("a parked delivery waiting out a Retry-After keeps its due time when the credential is replaced")
    func unparkedKeepTheirWait() async throws {
        let t = try await Self.tenant()
        _ = try await t.iphone()
        _ = try await t.iphone()
        let pool = t.fixture.pool
        let tenant = t.tenant.uuid
        let instance = Fake.id("park-wait")
        #expect(try await t.start(instance).status == 200)
        // Both queued; one was told to wait half an hour (a 429's Retry-After) when the credential broke.
        let rows = try await pool.query(
            "SELECT id FROM delivery_queue WHERE tenant_id = \(tenant) AND instance_id = \(instance) ORDER BY id")
        let ids = try rows.map { try $0.decode(UUID.self, "id") }
        try #require(ids.count == 2)
        let (waiting, due) = (ids[0], ids[1])
        let wait = try await pool.query(
            """
            UPDATE delivery_queue SET next_attempt_at = now() + interval '30 minutes'
            WHERE tenant_id = \(tenant) AND id = \(waiting)
            RETURNING (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS due
            """)[0].decode(Int64.self, "due")
        try await pool.execute("UPDATE apns_credentials SET status = 'broken' WHERE tenant_id = \(tenant)")
        #expect(try await t.deliveries(instance).allSatisfy { $0.string("status") == "parked" })
        #expect(
            try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: Self.goodAPNsCredential(t))
                .status == 200)
        func row(_ id: UUID) async throws -> (status: String, due: Int64, dueNow: Bool) {
            let row = try await pool.query(
                """
                SELECT status, (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS due,
                       next_attempt_at <= now() AS due_now
                FROM delivery_queue WHERE tenant_id = \(tenant) AND id = \(id)
                """)[0]
            return (
                try row.decode(String.self, "status"), try row.decode(Int64.self, "due"),
                try row.decode(Bool.self, "due_now")
            )
        }
        let kept = try await row(waiting)
        #expect(kept.status == "queued")
        #expect(kept.due == wait, "still waits out its Retry-After")
        let other = try await row(due)
        #expect(other.status == "queued")
        #expect(other.dueNow, "one that was due is due at once")
    }
}
