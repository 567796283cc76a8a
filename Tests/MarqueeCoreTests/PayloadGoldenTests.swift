import Foundation
import Testing

@testable import MarqueeCore

/// Shared fixtures: one delivery instance seen through every profile and event.
enum PayloadFixtures {
    static let timestamp: Int64 = 1_740_000_000
    static let attribution = DeliveryAttribution(
        deliveryID: "01JMQ4ZB5S7V3K8X2N6P9R0T1W", deliveryToken: "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE")

    static let attributes = try! JSONValue.parse(#"{"orderNumber":"CIO-1234","restaurant":"Pizza Place"}"#)

    static func state(_ event: LiveActivityEvent) -> JSONValue {
        switch event {
        case .start:
            try! JSONValue.parse(
                #"{"title":"Order received","subtitle":"Preparing","progress":0.1,"eta":1740003600,"late":false}"#)
        case .update:
            try! JSONValue.parse(
                #"{"title":"On the way","subtitle":"3 stops away","progress":0.6,"eta":1740003600,"late":false,"#
                    + #""driver":{"name":"Ana \"A\" Li"},"stops":[3,2,1]}"#)
        case .end:
            try! JSONValue.parse(#"{"title":"Delivered","subtitle":"Enjoy!","progress":1,"late":true}"#)
        }
    }

    static func content(_ profile: PayloadProfile, _ event: LiveActivityEvent) -> ActivityContent {
        let base = Date(timeIntervalSince1970: TimeInterval(timestamp))
        var content = ActivityContent(
            event: event, instanceID: "order-1234", activityType: "com.example.delivery",
            // The Capacitor plugin's attributes type is always its own `LiveActivityAttributes`.
            attributesType: profile == .capacitor ? "LiveActivityAttributes" : "DeliveryAttributes", profile: profile,
            attributes: attributes,
            contentState: state(event), timestamp: timestamp + Int64(LiveActivityEvent.allCases.firstIndex(of: event)!),
            // Customer.io's iOS SDK reads dates as EpochSecondsDate; its Android SDK gets them in milliseconds.
            dateFields: profile == .customerio ? ["/eta": .epochSeconds] : [:])
        switch event {
        case .start:
            content.alert = LiveActivityAlert(title: "Order received", body: "We're preparing your food")
            content.deepLink = "example://orders/1234"
            content.staleDate = base.addingTimeInterval(3600)
            content.relevanceScore = 0.5
        case .update:
            content.alert = LiveActivityAlert(title: "On the way", body: "Ana is 3 stops away")
            content.deepLink = "example://orders/1234/track"
            content.staleDate = base.addingTimeInterval(1800.75)
            content.relevanceScore = 1
            // Ignored outside end.
            content.dismissalDate = base.addingTimeInterval(99)
        case .end:
            content.alert = LiveActivityAlert(title: "Delivered", body: "Enjoy your meal", sound: "chime.caf")
            content.dismissalDate = base.addingTimeInterval(900)
            content.relevanceScore = 0.25
        }
        return content
    }

    static var cases: [(PayloadProfile, LiveActivityEvent)] {
        PayloadProfile.allCases.flatMap { profile in LiveActivityEvent.allCases.map { (profile, $0) } }
    }

    static let goldenDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Golden")

    /// Set `MARQUEE_UPDATE_GOLDEN=1` to rewrite the files from the current code (then review the diff).
    static let updating = ProcessInfo.processInfo.environment["MARQUEE_UPDATE_GOLDEN"] == "1"

    /// The client code whose decoding each golden file satisfies, written as the file's first line.
    static func client(_ provider: String, _ profile: PayloadProfile) -> String {
        switch (provider, profile) {
        case ("apns", .marquee), ("fcm", .marquee):
            "Marquee's own SDK contract (marqueeMetadata, marqueeInstanceId; README, Payload profiles)"
        case ("apns", .customerio):
            "customerio/customerio-ios Sources/LiveActivities_Attributes/CIOActivityAttribute.swift, "
                + "CIOLiveActivityMetadata.swift, EpochSecondsDate.swift"
        case ("fcm", .customerio):
            "customerio/customerio-android (live-notifications-ios-parity) messagingpush/src/main/java/io/customer/"
                + "messagingpush/CustomerIOPushNotificationHandler.kt, LiveNotificationHandler.kt, "
                + "livenotification/LiveNotificationStore.kt, livenotification/template/DeliveryTrackingTemplate.kt"
        case ("apns", .capacitor):
            "ciabosoftwaresolutions/capacitor-live-activities ios/Plugin/LiveActivityManager.swift "
                + "(LiveActivityAttributes, LiveActivityAttributes.ContentState)"
        default:
            "ciabosoftwaresolutions/capacitor-live-activities README, Android FCM data message "
                + "(the app's onMessageReceived reads liveActivityId; the plugin has no push receiver)"
        }
    }

    /// A golden file: `// client: …` on its first line, then the payload on one line.
    static func golden(_ provider: String, _ profile: PayloadProfile, _ event: LiveActivityEvent, actual: String)
        throws -> (client: String, payload: String)
    {
        let url = goldenDirectory.appendingPathComponent("\(provider)-\(profile.rawValue)-\(event.rawValue).json")
        if updating {
            try Data(("// client: \(client(provider, profile))\n" + actual + "\n").utf8).write(to: url)
        }
        let lines = String(decoding: try Data(contentsOf: url), as: UTF8.self).split(separator: "\n")
        let header = lines.first.map(String.init) ?? ""
        return (header, lines.dropFirst().joined(separator: "\n"))
    }

    /// The payload of a golden file, parsed.
    static func goldenJSON(_ provider: String, _ profile: PayloadProfile, _ event: LiveActivityEvent) throws
        -> JSONValue
    {
        let url = goldenDirectory.appendingPathComponent("\(provider)-\(profile.rawValue)-\(event.rawValue).json")
        let lines = String(decoding: try Data(contentsOf: url), as: UTF8.self).split(separator: "\n")
        return try JSONValue.parse(Array(lines.dropFirst().joined(separator: "\n").utf8))
    }
}

@Suite("Payload golden files")
struct PayloadGoldenTests {
    @Test("APNs payload, byte for byte", arguments: PayloadFixtures.cases)
    func apns(_ profile: PayloadProfile, _ event: LiveActivityEvent) throws {
        let content = PayloadFixtures.content(profile, event)
        let bytes = APNsPayload.bytes(content, attribution: PayloadFixtures.attribution)
        let actual = String(decoding: bytes, as: UTF8.self)
        let golden = try PayloadFixtures.golden("apns", profile, event, actual: actual)
        #expect(golden.client == "// client: " + PayloadFixtures.client("apns", profile))
        #expect(actual == golden.payload)
        #expect(APNsPayload.size(content, attribution: PayloadFixtures.attribution) == bytes.count)
    }

    @Test("FCM data map, byte for byte (sorted keys)", arguments: PayloadFixtures.cases)
    func fcm(_ profile: PayloadProfile, _ event: LiveActivityEvent) throws {
        let data = FCMData.compose(PayloadFixtures.content(profile, event), attribution: PayloadFixtures.attribution)
        let actual = FCMData.serialized(data)
        let golden = try PayloadFixtures.golden("fcm", profile, event, actual: actual)
        #expect(golden.client == "// client: " + PayloadFixtures.client("fcm", profile))
        #expect(actual == golden.payload)
    }

    @Test("every value of every FCM golden is a string", arguments: PayloadFixtures.cases)
    func fcmValuesAreStrings(_ profile: PayloadProfile, _ event: LiveActivityEvent) throws {
        let object = try #require(try PayloadFixtures.goldenJSON("fcm", profile, event).objectValue)
        #expect(!object.isEmpty)
        for (key, value) in object {
            #expect(value.stringValue != nil, "\(key) is \(value.typeName)")
        }
    }

    @Test("APNs start carries attributes, the instance ID and input-push-token; update and end do not")
    func startOnlyFields() throws {
        for profile in PayloadProfile.allCases {
            for event in LiveActivityEvent.allCases {
                let payload = APNsPayload.compose(
                    PayloadFixtures.content(profile, event), attribution: PayloadFixtures.attribution)
                let aps = try #require(payload["aps"])
                #expect((aps["attributes"] != nil) == (event == .start))
                #expect((aps["input-push-token"] == .int(1)) == (event == .start))
                #expect((aps["dismissal-date"] != nil) == (event == .end))
                if event == .start {
                    #expect(aps["attributes"]?[profile.instanceIDAttributeKey] == .string("order-1234"))
                    let teamFields = profile == .capacitor ? aps["attributes"]?["staticData"] : aps["attributes"]
                    #expect(teamFields?["orderNumber"] == .string("CIO-1234"), "\(profile)")
                }
            }
        }
    }

    @Test("attribution sits inside content-state under each profile's key")
    func attributionKeys() throws {
        let attribution = PayloadFixtures.attribution
        func state(_ profile: PayloadProfile) throws -> JSONValue {
            let payload = APNsPayload.compose(PayloadFixtures.content(profile, .update), attribution: attribution)
            return try #require(payload["aps"]?["content-state"])
        }
        let marquee = try state(.marquee)["marqueeMetadata"]
        #expect(marquee?["deliveryId"] == .string(attribution.deliveryID))
        #expect(marquee?["deliveryToken"] == .string(attribution.deliveryToken))
        #expect(marquee?["deepLink"] == .string("example://orders/1234/track"))
        let cio = try state(.customerio)["cioMetadata"]
        #expect(cio?["deliveryId"] == .string(attribution.deliveryID))
        #expect(cio?["deliveryToken"] == .string(attribution.deliveryToken))
        let capacitor = try state(.capacitor)["extras"]
        #expect(capacitor?["marqueeDeliveryId"] == .string(attribution.deliveryID))
        #expect(capacitor?["marqueeDeepLink"] == .string("example://orders/1234/track"))
        // Without a deep link, the metadata simply has none.
        var content = PayloadFixtures.content(.customerio, .end)
        content.deepLink = nil
        let end = APNsPayload.compose(content, attribution: attribution)
        #expect(end["aps"]?["content-state"]?["cioMetadata"]?["deepLink"] == nil)
    }

    @Test("alert sound: given → sent; absent → \"default\" for marquee and customerio, omitted for capacitor")
    func alertSound() {
        for profile in PayloadProfile.allCases {
            var content = PayloadFixtures.content(profile, .update)
            let alert = APNsPayload.compose(content, attribution: PayloadFixtures.attribution)["aps"]?["alert"]
            #expect(alert?["sound"] == (profile == .capacitor ? nil : .string("default")), "\(profile)")
            content.alert?.sound = "ping.caf"
            let explicit = APNsPayload.compose(content, attribution: PayloadFixtures.attribution)["aps"]?["alert"]
            #expect(explicit?["sound"] == .string("ping.caf"))
            content.alert = nil
            #expect(APNsPayload.compose(content, attribution: PayloadFixtures.attribution)["aps"]?["alert"] == nil)
        }
    }
}
