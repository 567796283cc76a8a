import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeDelivery

/// Channel management requests and answers, without sockets.
@Suite("APNs channel management requests and answers")
struct APNsChannelsTests {
    static let requestID = UUID(uuidString: "6F0C2A4E-5D7B-4B1E-9F3A-2C8D1E0B7A55")!

    func header(_ request: HTTP2Request, _ name: String) -> String? {
        request.headers.first { $0.0 == name }?.1
    }

    @Test("create: POST /1/apps/<bundle>/channels with the policy number, LiveActivity, token and request ID")
    func createRequest() throws {
        for (policy, number) in [(ChannelStoragePolicy.none, 0), (.mostRecent, 1)] {
            let request = APNsChannelClient.createRequest(
                bundleID: "com.example.app", storagePolicy: policy, providerToken: "jwt", requestID: Self.requestID)
            #expect(request.method == "POST")
            #expect(request.path == "/1/apps/com.example.app/channels")
            #expect(header(request, "authorization") == "bearer jwt")
            #expect(header(request, "apns-request-id") == "6f0c2a4e-5d7b-4b1e-9f3a-2c8d1e0b7a55")
            #expect(header(request, "content-type") == "application/json")
            let body = try JSONValue.parse(request.body)
            #expect(body["message-storage-policy"] == .int(Int64(number)))
            #expect(body["push-type"] == .string("LiveActivity"))
            #expect(body.objectValue?.count == 2)
        }
    }

    @Test("read and delete name the channel in apns-channel-id; list is GET all-channels")
    func otherRequests() {
        for method in ["GET", "DELETE"] {
            let request = APNsChannelClient.channelRequest(
                method, bundleID: "com.example.app", channelID: "dHJpcA==", providerToken: "jwt",
                requestID: Self.requestID)
            #expect(request.method == method)
            #expect(request.path == "/1/apps/com.example.app/channels")
            #expect(header(request, "apns-channel-id") == "dHJpcA==")
            #expect(request.body.isEmpty)
        }
        let list = APNsChannelClient.listRequest(
            bundleID: "com.example.app", providerToken: "jwt", requestID: Self.requestID)
        #expect(list.method == "GET")
        #expect(list.path == "/1/apps/com.example.app/all-channels")
        #expect(header(list, "apns-request-id") != nil)
    }

    @Test("management hosts by environment, or the credential's override")
    func hosts() {
        #expect(
            APNsChannelTarget.endpoint(environment: "sandbox", override: nil)! == (
                "api-manage-broadcast.sandbox.push.apple.com", 2195
            ))
        #expect(
            APNsChannelTarget.endpoint(environment: "production", override: nil)! == (
                "api-manage-broadcast.push.apple.com", 2196
            ))
        #expect(
            APNsChannelTarget.endpoint(environment: "sandbox", override: "https://127.0.0.1:9443")! == (
                "127.0.0.1", 9443
            ))
        #expect(APNsChannelTarget.endpoint(environment: "sandbox", override: "http://127.0.0.1:9443") == nil)
        // Apple's management hosts are in the default allowlist, and must resolve to public addresses.
        #expect(ProviderHosts.standard.allows(host: "api-manage-broadcast.push.apple.com", port: 2196))
        #expect(ProviderHosts.standard.allows(host: "api-manage-broadcast.sandbox.push.apple.com", port: 2195))
        #expect(ProviderHosts.standard.requiresPublicAddress(host: "api-manage-broadcast.push.apple.com"))
    }

    func response(_ status: Int, reason: String? = nil, headers: [(String, String)] = [], body: [UInt8]? = nil)
        -> HTTP2Response
    {
        HTTP2Response(
            status: status, headers: headers,
            body: body ?? reason.map { JSONValue.object(["reason": .string($0)]).bytes } ?? [])
    }

    @Test("a create answer is 201 with a base64 apns-channel-id of sane length")
    func createdAnswers() throws {
        #expect(try APNsChannelClient.created(response(201, headers: [("apns-channel-id", "dHJpcA==")])) == "dHJpcA==")
        for hostile in [nil, "", "not base64!", String(repeating: "A", count: 1025), "a\u{0}b"] {
            let headers = hostile.map { [("apns-channel-id", $0)] } ?? []
            #expect(throws: ChannelManagementError(.refused(status: 201, reason: "invalid_channel_id"))) {
                _ = try APNsChannelClient.created(response(201, headers: headers))
            }
        }
        #expect(
            try APNsChannelClient.created(
                response(201, headers: [("apns-channel-id", String(repeating: "A", count: 1024))])
            ).count == 1024)
    }

    @Test("Apple's reasons: the limit, an unknown channel, refusals with clamped Retry-After, unreadable text")
    func failures() {
        #expect(APNsChannelClient.failure(response(400, reason: "CannotCreateChannelConfig")).code == .limitReached)
        #expect(APNsChannelClient.failure(response(404, reason: "ChannelNotRegistered")).code == .channelNotFound)
        #expect(APNsChannelClient.failure(response(400, reason: "BadChannelId")).code == .channelNotFound)
        #expect(
            APNsChannelClient.failure(response(403, reason: "InvalidProviderToken")).code
                == .refused(status: 403, reason: "InvalidProviderToken"))
        #expect(
            APNsChannelClient.failure(response(400, reason: "<script>alert(1)</script>")).code
                == .refused(status: 400, reason: "unreadable"))
        #expect(
            APNsChannelClient.failure(response(500, body: Array("oops".utf8))).code
                == .refused(status: 500, reason: "HTTP 500"))
        let throttled = APNsChannelClient.failure(
            response(429, reason: "TooManyRequests", headers: [("retry-after", "1e16")]))
        #expect(throttled.retryAfter == ProviderNumbers.maximumRetryAfter)
        let nan = APNsChannelClient.failure(
            response(503, reason: "ServiceUnavailable", headers: [("retry-after", "NaN")]))
        #expect(nan.retryAfter == nil)
        // A 1 MiB body is not parsed for a reason.
        let huge = JSONValue.object([
            "reason": .string("BadChannelId"), "pad": .string(String(repeating: "x", count: 1 << 20)),
        ])
        #expect(
            APNsChannelClient.failure(response(400, body: huge.bytes)).code == .refused(status: 400, reason: "HTTP 400")
        )
    }

    @Test("read and list answers: policy numbers checked, list entries bounded and validated")
    func readAndList() throws {
        let read = try APNsChannelClient.read(
            response(
                200, headers: [("apns-channel-id", "dHJpcA==")],
                body: Array(#"{"message-storage-policy":1,"push-type":"LiveActivity"}"#.utf8)),
            channelID: "dHJpcA==")
        #expect(read.storagePolicy == .mostRecent)
        let odd = try APNsChannelClient.read(
            response(200, body: Array(#"{"message-storage-policy":1e300}"#.utf8)), channelID: "dHJpcA==")
        #expect(odd.storagePolicy == nil)
        #expect(odd.apnsChannelID == "dHJpcA==")

        let listed = try APNsChannelClient.listed(
            response(200, body: Array(#"{"channels":["YQ==","bad id!",42,"Yg=="]}"#.utf8)))
        #expect(listed == ["YQ==", "Yg=="])
        let many = JSONValue.object(["channels": .array((0..<25_000).map { _ in .string("YQ==") })])
        #expect(
            try APNsChannelClient.listed(response(200, body: many.bytes)).count == APNsChannelClient.maxListedChannels)
        #expect(throws: ChannelManagementError(.refused(status: 200, reason: "invalid_channel_list"))) {
            _ = try APNsChannelClient.listed(response(200, body: Array("[]".utf8)))
        }
        #expect(throws: ChannelManagementError(.channelNotFound)) {
            try APNsChannelClient.deleted(response(404, reason: "ChannelNotRegistered"))
        }
        try APNsChannelClient.deleted(response(204))
    }
}
