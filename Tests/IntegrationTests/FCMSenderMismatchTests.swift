import Foundation
import MarqueeCore
import MarqueeSimulators
import MarqueeStore
import PostgresClient
import Testing

extension FCMDeliveryTests {
    @Test("SENDER_ID_MISMATCH (a service account of another project) breaks the credential and keeps the devices")
    func senderIDMismatch() async throws {
        let t = try await Self.tenant()
        // The tenant uploads a service account whose project is not the one its apps' tokens belong to.
        var credentials = t.fixture.fcmCredentials
        var account = try #require(credentials["service_account"] as? [String: Any])
        account["project_id"] = "another-project"
        credentials["service_account"] = account
        let put = try await t.api.call("PUT", "/v1/credentials/fcm", key: t.tenant.app, json: credentials)
        #expect(put.status == 200, "\(put.text)")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let token = try await t.android()
        let instance = Fake.id("mismatch")
        _ = try await t.start(instance)

        try await eventually("the credential is broken", timeout: .seconds(20)) {
            try await t.fcmCredential().string("status") == "broken"
        }
        #expect(try await t.fcmCredential().string("status_reason") == "SENDER_ID_MISMATCH")
        try await eventually("the delivery is parked", timeout: .seconds(20)) {
            try await t.deliveries(instance).allSatisfy { $0.string("status") == "parked" }
        }
        // Not a dead token: the device (and with it its tokens) is kept.
        #expect(try await t.deviceCount(token) == 1)
        #expect(t.fcm.messages(token: token).isEmpty)

        // The right service account resumes the tenant's sends to the same device.
        try await t.uploadFCMCredentials()
        #expect(try await t.settled(instance, count: 1)[0].string("status") == "sent")
        #expect(t.fcm.messages(token: token).count == 1)
    }

    @Test("once the credential has delivered, SENDER_ID_MISMATCH blames the token: its device goes, the others go on")
    func senderIDMismatchAfterProof() async throws {
        let t = try await Self.tenant()
        // A token of another Firebase project, as anyone holding the public sdk key can register.
        t.fcm.setFaults([.init(tokenPrefix: "frgn", action: .foreignToken)])
        defer { t.fcm.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        // The tenant's own device first: FCM accepts the push, which proves the credential.
        let own = try await t.android()
        let first = Fake.id("proof")
        _ = try await t.start(first)
        #expect(try await t.settled(first, count: 1)[0].string("status") == "sent")
        try await eventually("the proof is recorded", timeout: .seconds(20)) {
            try await t.fixture.pool.count(
                "SELECT count(*)::int AS n FROM fcm_credential_checks WHERE tenant_id = \(t.tenant.uuid)") == 1
        }
        // Another person's device with a foreign token.
        let stranger = Fake.id("stranger")
        let foreign = try await t.android(person: stranger, tokenPrefix: "frgn")
        let second = Fake.id("foreign")
        _ = try await t.start(second, person: stranger)
        let refused = try await t.settled(second, count: 1)[0]
        #expect(refused.string("status") == "undeliverable", "\(refused)")
        #expect(refused.string("reason") == "SENDER_ID_MISMATCH", "\(refused)")
        try await eventually("the foreign device is gone", timeout: .seconds(20)) {
            try await t.deviceCount(foreign) == 0
        }
        // The credential stays usable: the tenant's own device gets its next push.
        #expect(try await t.fcmCredential().string("status") == "ok")
        let third = Fake.id("after")
        _ = try await t.start(third)
        #expect(try await t.settled(third, count: 1)[0].string("status") == "sent")
        #expect(t.fcm.messages(token: own).count == 2)

        // A new upload makes the credential unproven again: a mismatch then blames it (the tenant may have uploaded
        // the wrong project's account), and the devices are kept. (A new worker: a running one keeps the credential
        // it loaded for up to 30 s, and with it what that one proved.)
        try await t.uploadFCMCredentials()
        worker.signal(SIGKILL)
        let fresh = try t.fixture.worker()
        defer { fresh.signal(SIGKILL) }
        let again = try await t.android(person: stranger, tokenPrefix: "frgn")
        let fourth = Fake.id("unproven")
        _ = try await t.start(fourth, person: stranger)
        try await eventually("the credential is broken", timeout: .seconds(20)) {
            try await t.fcmCredential().string("status") == "broken"
        }
        #expect(try await t.deviceCount(again) == 1)
    }

    @Test("a worker whose copy of the credential predates its proof: SENDER_ID_MISMATCH still blames the token")
    func senderIDMismatchAfterProofElsewhere() async throws {
        let t = try await Self.tenant()
        t.fcm.setFaults([
            .init(tokenPrefix: "frgn", action: .foreignToken), .init(tokenPrefix: "dead", action: .unregistered),
        ])
        defer { t.fcm.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        // The worker loads the credential, unproven, for a push FCM does not accept (the device is gone): it keeps
        // that copy for 30 s.
        let gone = Fake.id("gone")
        _ = try await t.android(tokenPrefix: "dead")
        _ = try await t.start(gone)
        #expect(try await t.settled(gone, count: 1)[0].string("status") == "undeliverable")
        // Meanwhile another worker's push got through with the same credential, and recorded the proof.
        let queue = DeliveryQueue(pool: t.fixture.pool)
        let loaded = try #require(try await queue.fcmCredential(tenant: t.tenant.uuid))
        #expect(!loaded.proven)
        try await queue.markFCMCredentialProven(tenant: t.tenant.uuid, credentialUpdatedAt: loaded.0.updatedAt)
        // A device with another project's token, registered with the public sdk key, gets a push from this worker.
        let stranger = Fake.id("stranger")
        let foreign = try await t.android(person: stranger, tokenPrefix: "frgn")
        let mismatch = Fake.id("foreign")
        _ = try await t.start(mismatch, person: stranger)
        let refused = try await t.settled(mismatch, count: 1)[0]
        #expect(refused.string("status") == "undeliverable", "\(refused)")
        #expect(refused.string("reason") == "SENDER_ID_MISMATCH", "\(refused)")
        #expect(try await t.fcmCredential().string("status") == "ok", "the proven credential is not broken")
        try await eventually("the foreign device is gone", timeout: .seconds(20)) {
            try await t.deviceCount(foreign) == 0
        }
    }
}
