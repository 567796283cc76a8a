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
}
