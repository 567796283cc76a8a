import Foundation
import Testing

@testable import MarqueeCore

@Suite("Payload size limits")
struct PayloadLimitsTests {
    /// A marquee update whose only state field is `pad`, `count` copies of `unit`.
    func content(padding count: Int, unit: String = "x") -> ActivityContent {
        var content = PayloadFixtures.content(.marquee, .update)
        content.contentState = .object(["pad": .string(String(repeating: unit, count: count))])
        return content
    }

    @Test("APNs: exactly 4096 bytes passes, 4097 fails by 1, measured with the worst-case attribution")
    func apns() throws {
        let base = APNsPayload.size(content(padding: 0), attribution: .worstCase)
        let fits = 4096 - base
        #expect(APNsPayload.size(content(padding: fits), attribution: .worstCase) == 4096)
        try PayloadLimits.checkAPNs(content(padding: fits))
        try PayloadLimits.checkAPNs(content(padding: fits - 1))

        let over = #expect(throws: PayloadSizeError.self) { try PayloadLimits.checkAPNs(content(padding: fits + 1)) }
        #expect(over == PayloadSizeError(platform: .ios, size: 4097, limit: 4096))
        #expect(over?.overBy == 1)
        let far = #expect(throws: PayloadSizeError.self) {
            try PayloadLimits.check(content(padding: fits + 100), platform: .ios)
        }
        #expect(far?.overBy == 100)
        #expect(far?.description == "APNs payload is 4196 bytes, 100 over the 4096-byte limit")
    }

    @Test("FCM: exactly 4096 bytes of keys and values passes, 4097 fails by 1, multi-byte characters count in bytes")
    func fcm() throws {
        func fcmSize(_ c: ActivityContent) -> Int { FCMData.size(FCMData.compose(c, attribution: .worstCase)) }
        let base = fcmSize(content(padding: 0))
        let fits = 4096 - base
        #expect(fcmSize(content(padding: fits)) == 4096)
        try PayloadLimits.checkFCM(content(padding: fits))
        let over = #expect(throws: PayloadSizeError.self) { try PayloadLimits.checkFCM(content(padding: fits + 1)) }
        #expect(over == PayloadSizeError(platform: .android, size: 4097, limit: 4096))
        #expect(over?.overBy == 1)

        // "é" is two bytes: half as many fit, and one more is two bytes over.
        let pairs = fits / 2
        let extra = fits % 2
        try PayloadLimits.checkFCM(content(padding: pairs, unit: "é"))
        let twoOver = #expect(throws: PayloadSizeError.self) {
            try PayloadLimits.check(content(padding: pairs + 1, unit: "é"), platform: .android)
        }
        #expect(twoOver?.overBy == 2 - extra)
    }

    @Test("the worst-case attribution is as long as a real one, so a request accepted now cannot fail later")
    func worstCase() throws {
        let real = PayloadFixtures.attribution
        #expect(real.deliveryID.utf8.count == DeliveryAttribution.worstCase.deliveryID.utf8.count)
        #expect(real.deliveryToken.utf8.count == DeliveryAttribution.worstCase.deliveryToken.utf8.count)
        for profile in PayloadProfile.allCases {
            for event in LiveActivityEvent.allCases {
                let c = PayloadFixtures.content(profile, event)
                #expect(APNsPayload.size(c, attribution: real) == APNsPayload.size(c, attribution: .worstCase))
                #expect(
                    FCMData.size(FCMData.compose(c, attribution: real))
                        == FCMData.size(FCMData.compose(c, attribution: .worstCase)))
            }
        }
        // A short attribution would have let this through; the check does not.
        let base = APNsPayload.size(content(padding: 0), attribution: .worstCase)
        let c = content(padding: 4096 - base + 1)
        try PayloadLimits.checkAPNs(c, attribution: DeliveryAttribution(deliveryID: "d", deliveryToken: "t"))
        #expect(throws: PayloadSizeError.self) { try PayloadLimits.checkAPNs(c) }
    }
}
