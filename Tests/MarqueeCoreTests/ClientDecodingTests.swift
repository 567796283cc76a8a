import ClientMirrors
import Foundation
import Testing

@testable import MarqueeCore

/// The golden payloads decoded the way the device libraries decode them (see `ClientMirrors`), and the Customer.io
/// Android data keys checked against what its SDK reads.
@Suite("Client decoding")
struct ClientDecodingTests {
    static func aps(_ profile: PayloadProfile, _ event: LiveActivityEvent) throws -> JSONValue {
        try #require(try PayloadFixtures.goldenJSON("apns", profile, event)["aps"])
    }

    @Test(
        "Capacitor plugin: every golden APNs payload decodes as its LiveActivityAttributes and ContentState",
        arguments: LiveActivityEvent.allCases)
    func capacitor(_ event: LiveActivityEvent) throws {
        let aps = try Self.aps(.capacitor, event)
        let state = try decodeLikeActivityKit(
            Capacitor.LiveActivityAttributes.ContentState.self, from: try #require(aps["content-state"]).bytes)
        #expect(!state.title.isEmpty)
        #expect(state.extras["marqueeDeliveryId"]?.string == PayloadFixtures.attribution.deliveryID)
        #expect(state.extras["marqueeDeliveryToken"]?.string == PayloadFixtures.attribution.deliveryToken)
        #expect(state.progress != nil)
        if event == .start {
            let attributes = try decodeLikeActivityKit(
                Capacitor.LiveActivityAttributes.self, from: try #require(aps["attributes"]).bytes)
            #expect(attributes.activityType == "order-1234")
            #expect(attributes.staticData["orderNumber"]?.string == "CIO-1234")
            #expect(attributes.staticData["restaurant"]?.string == "Pizza Place")
        }
    }

    @Test("Capacitor plugin: timerCountsDown, progressBarHeight and progressBarRadius are its own top-level fields")
    func capacitorStyleFields() throws {
        var content = PayloadFixtures.content(.capacitor, .update)
        let state: JSONValue = .object([
            "title": .string("On the way"), "timerCountsDown": .bool(false), "progressBarHeight": .int(8),
            "progressBarRadius": .double(2.5), "status": .string("late"),
        ])
        try PayloadProfile.capacitor.checkContentState(state)
        content.contentState = state
        let aps = try #require(APNsPayload.compose(content, attribution: PayloadFixtures.attribution)["aps"])
        let sent = try #require(aps["content-state"])
        #expect(sent["progressBarHeight"] == .int(8))
        #expect(sent["extras"]?["progressBarHeight"] == nil)
        let decoded = try decodeLikeActivityKit(
            Capacitor.LiveActivityAttributes.ContentState.self, from: sent.bytes)
        #expect(decoded.timerCountsDown == false)
        #expect(decoded.progressBarHeight == 8)
        #expect(decoded.progressBarRadius == 2.5)
        #expect(decoded.extras["status"]?.string == "late")
        // A wrong type would make the whole state undecodable on the device: refused.
        for (key, value) in [("timerCountsDown", JSONValue.string("no")), ("progressBarHeight", .string("8"))] {
            let error = #expect(throws: ValidationError.self) {
                try PayloadProfile.capacitor.checkContentState(.object(["title": .string("x"), key: value]))
            }
            #expect(error?.field == "content_state/\(key)")
        }
    }

    /// Customer.io's content state as its SDK decodes the parts Marquee controls: the metadata, and a date field.
    struct CustomerIOState: Decodable {
        var cioMetadata: CustomerIO.CIOLiveActivityMetadata
        var eta: CustomerIO.EpochSecondsDate?
    }

    @Test(
        "Customer.io iOS: cioMetadata decodes, and epoch-second dates are integers EpochSecondsDate accepts",
        arguments: LiveActivityEvent.allCases)
    func customerIOiOS(_ event: LiveActivityEvent) throws {
        let aps = try Self.aps(.customerio, event)
        let state = try decodeLikeActivityKit(CustomerIOState.self, from: try #require(aps["content-state"]).bytes)
        #expect(state.cioMetadata.deliveryId == PayloadFixtures.attribution.deliveryID)
        #expect(state.cioMetadata.deliveryToken == PayloadFixtures.attribution.deliveryToken)
        if event != .end { #expect(state.eta != nil) }
        if event == .start { #expect(aps["attributes"]?["cioInstanceId"] == .string("order-1234")) }
    }

    @Test("an epoch_seconds date with a fraction is sent whole (rounded down), so EpochSecondsDate decodes it")
    func fractionalSeconds() throws {
        let encoded = DateFields.encode(1_740_000_000.75, as: .epochSeconds)
        #expect(encoded == .int(1_740_000_000))
        let date = try decodeLikeActivityKit(CustomerIO.EpochSecondsDate.self, from: encoded.bytes)
        #expect(date.date == Date(timeIntervalSince1970: 1_740_000_000))
        #expect(throws: (any Error).self) {
            try decodeLikeActivityKit(CustomerIO.EpochSecondsDate.self, from: JSONValue.double(1_740_000_000.5).bytes)
        }
    }

    @Test("Customer.io Android: the keys, types and units its live-notification handler reads, for every event")
    func customerIOAndroid() throws {
        var previous: Int64 = 0
        for event in LiveActivityEvent.allCases {
            let data = try #require(try PayloadFixtures.goldenJSON("fcm", .customerio, event).objectValue)
            let text = data.mapValues { $0.stringValue ?? "" }
            // Routing: only a push with activity_id reaches the live handler.
            #expect(text["activity_id"] == "order-1234", "\(event)")
            #expect(data["cioInstanceId"] == nil)
            // Required, or the SDK ignores the push.
            #expect(text["CIO-Delivery-ID"] == PayloadFixtures.attribution.deliveryID)
            #expect(text["CIO-Delivery-Token"] == PayloadFixtures.attribution.deliveryToken)
            #expect(text["event"] == event.rawValue)
            #expect(text["notification_type"] == "com.example.delivery")
            // Milliseconds, strictly increasing per instance (the SDK's staleness guard compares them).
            let timestamp = try #require(Int64(text["timestamp"] ?? ""))
            #expect(timestamp >= 1_000_000_000_000, "milliseconds, not seconds: \(timestamp)")
            #expect(timestamp > previous)
            previous = timestamp
            // The payload is JSON text; its date fields in milliseconds, as the built-in templates read them.
            let payload = try JSONValue.parse(text["payload"] ?? "")
            #expect(payload.objectValue != nil)
            if event != .end { #expect(payload["eta"] == .int(1_740_003_600_000)) }
            #expect(payload["orderNumber"] == .string("CIO-1234"), "attributes and state in one object")
            // title and body at the top level for the app's callback.
            #expect(text["title"]?.isEmpty == false)
            #expect(text["body"]?.isEmpty == false)
            // An end keeps its notification until the dismissal date (milliseconds); without one the SDK removes it.
            if event == .end {
                #expect(text["dismissal_date"] == String((PayloadFixtures.timestamp + 900) * 1000))
            } else {
                #expect(data["dismissal_date"] == nil)
            }
        }
    }
}
