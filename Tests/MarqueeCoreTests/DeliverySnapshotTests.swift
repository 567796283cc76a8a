import Foundation
import Testing

@testable import MarqueeCore

@Suite("Delivery snapshot and gate")
struct DeliverySnapshotTests {
    let now = Date(timeIntervalSince1970: 1_740_000_000)

    @Test("the content is the snapshot's alert and timestamp; no passed stale date, no dismissal but on an end")
    func content() {
        var options = StoredOptions()
        options.alert = LiveActivityAlert(title: "Order 42", body: "Preparing")
        options.staleDate = now.addingTimeInterval(-1)
        options.dismissalDate = now.addingTimeInterval(60)
        let snapshot = DeliverySnapshot(
            attributes: .object(["order": .string("42")]), contentState: .object(["s": .string("a")]),
            options: options, timestamp: 1234)
        let start = snapshot.content(
            event: .start, instanceID: "i", activityType: "t", attributesType: "A", profile: .marquee, now: now)
        #expect(start.alert?.title == "Order 42")
        #expect(start.timestamp == 1234)
        #expect(start.staleDate == nil)
        #expect(start.dismissalDate == nil)
        let end = snapshot.content(
            event: .end, instanceID: "i", activityType: "t", attributesType: "A", profile: .marquee, now: now)
        #expect(end.dismissalDate == now.addingTimeInterval(60))
    }

    @Test("after an end only the end is sent; past the expiration nothing is")
    func gate() {
        let later = now.addingTimeInterval(60)
        #expect(DeliveryGate.decide(event: .update, instanceEnded: true, expiresAt: later, now: now) == .instanceEnded)
        #expect(DeliveryGate.decide(event: .start, instanceEnded: true, expiresAt: later, now: now) == .instanceEnded)
        #expect(DeliveryGate.decide(event: .end, instanceEnded: true, expiresAt: later, now: now) == .send)
        #expect(DeliveryGate.decide(event: .update, instanceEnded: false, expiresAt: later, now: now) == .send)
        #expect(DeliveryGate.decide(event: .end, instanceEnded: true, expiresAt: now, now: now) == .instanceExpired)
    }
}
