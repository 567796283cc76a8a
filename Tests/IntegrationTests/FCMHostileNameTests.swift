import Foundation
import MarqueeCore
import MarqueeSimulators
import Testing

extension FCMDeliveryTests {
    @Test("an FCM name holding a NUL is not stored: the push is recorded sent once, and another tenant's goes out")
    func hostileMessageName() async throws {
        let hostile = try await Self.tenant()
        let other = try await Self.tenant()
        let fcm = hostile.fcm
        let poison = "projects/p/messages/1\u{0}x"
        fcm.setFaults([.init(tokenPrefix: "nul0", action: .delay, latencyMilliseconds: 0, messageName: poison)])
        defer { fcm.setFaults([]) }
        let worker = try hostile.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let token = try await hostile.android(tokenPrefix: "nul0")
        let otherToken = try await other.android()
        let instance = Fake.id("nul")
        let otherInstance = Fake.id("bystander")
        _ = try await hostile.start(instance)
        _ = try await other.start(otherInstance)

        // Recorded: libpq cut the NUL's text[] parameter, so the record failed and rolled the claim back, the
        // whole batch was sent again, and this row never left the queue.
        let settled = try await hostile.settled(instance, count: 1)
        #expect(settled[0].string("status") == "sent")
        let providerID = settled[0].string("provider_id")
        #expect(providerID != nil && providerID?.contains("\u{0}") == false, "\(settled[0])")
        #expect(providerID?.hasPrefix("projects/p/messages/1") == false)
        #expect(fcm.messages(token: token).count == 1, "sent once")
        #expect(try await other.settled(otherInstance, count: 1)[0].string("status") == "sent")
        #expect(fcm.messages(token: otherToken).count == 1)
        #expect(worker.process.isRunning)
    }
}
