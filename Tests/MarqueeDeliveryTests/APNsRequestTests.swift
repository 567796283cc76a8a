import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeDelivery

/// How a push and a broadcast are put on the wire, without sockets.
@Suite("APNs push and broadcast requests")
struct APNsRequestTests {
    static let id = UUID(uuidString: "0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B")!

    func header(_ request: HTTP2Request, _ name: String) -> String? {
        request.headers.first { $0.0 == name }?.1
    }

    @Test("a push goes to /3/device/<token> with its topic and apns-id")
    func push() {
        let provider = APNsProvider(configuration: .init())
        let request = provider.request(
            APNsPush(
                token: "ab12", topic: "com.example.app.push-type.liveactivity", priority: 10, expiration: 99,
                apnsID: Self.id, payload: Array("{}".utf8)),
            providerToken: "jwt")
        #expect(request.path == "/3/device/ab12")
        #expect(header(request, "apns-topic") == "com.example.app.push-type.liveactivity")
        #expect(header(request, "apns-id") == Self.id.uuidString.lowercased())
        #expect(header(request, "apns-channel-id") == nil)
    }

    @Test("a broadcast goes to /4/broadcasts/apps/<bundle> with apns-channel-id and apns-request-id, no topic")
    func broadcast() {
        let provider = APNsProvider(configuration: .init())
        let request = provider.request(
            APNsPush(
                token: "", topic: "", priority: 5, expiration: 0, apnsID: Self.id, payload: Array("{}".utf8),
                broadcast: .init(bundleID: "com.example.app", channelID: "dGVzdA==")),
            providerToken: "jwt")
        #expect(request.method == "POST")
        #expect(request.path == "/4/broadcasts/apps/com.example.app")
        #expect(header(request, "apns-channel-id") == "dGVzdA==")
        #expect(header(request, "apns-push-type") == "liveactivity")
        #expect(header(request, "apns-priority") == "5")
        #expect(header(request, "apns-expiration") == "0")
        #expect(header(request, "apns-request-id") == Self.id.uuidString.lowercased())
        #expect(header(request, "authorization") == "bearer jwt")
        #expect(header(request, "apns-topic") == nil && header(request, "apns-id") == nil)
    }

    @Test("a broadcast's answer is named by apns-unique-id; a push's by apns-id")
    func answerIDs() {
        let response = HTTP2Response(
            status: 200, headers: [("apns-id", "push-id"), ("apns-unique-id", "unique-id")], body: [])
        #expect(APNsProvider.decide(response, broadcast: true) == .sent(providerID: "unique-id"))
        #expect(APNsProvider.decide(response) == .sent(providerID: "push-id"))
    }
}
