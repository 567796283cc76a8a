import Foundation
import MarqueeCore
import MarqueeSimulators
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
}
