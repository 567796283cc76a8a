import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeSimulators

/// The simulator's broadcast channel management API over HTTP/2 + TLS.
@Suite("APNs simulator: channel management")
struct APNsChannelRegistryTests {
    static let base = "/1/apps/\(APNsHarness.bundleID)"

    static func headers(_ extra: [(String, String)] = [], provider: String = APNsHarness.provider())
        -> [(String, String)]
    {
        [("authorization", "bearer " + provider)] + extra
    }

    static func createBody(policy: JSONValue = .int(1), pushType: JSONValue? = .string("LiveActivity")) -> [UInt8] {
        var object: [String: JSONValue] = ["message-storage-policy": policy]
        if let pushType { object["push-type"] = pushType }
        return JSONValue.object(object).bytes
    }

    func send(
        _ apns: APNsHarness, _ method: String, _ path: String, headers: [(String, String)] = headers(),
        body: [UInt8] = []
    ) async throws -> HTTP2Response {
        try await apns.client.send(HTTP2Request(method: method, path: path, headers: headers, body: body))
    }

    func reason(_ response: HTTP2Response) -> String? { (try? json(response))?["reason"]?.stringValue }

    @Test("create, read, list and delete; the request ID is echoed")
    func lifecycle() async throws {
        try await withAPNs { apns in
            let requestID = UUID().uuidString.lowercased()
            let created = try await send(
                apns, "POST", Self.base + "/channels", headers: Self.headers([("apns-request-id", requestID)]),
                body: Self.createBody(policy: .int(0)))
            #expect(created.status == 201)
            #expect(created.header("apns-request-id") == requestID)
            let id = try #require(created.header("apns-channel-id"))
            #expect(Data(base64Encoded: id) != nil)

            let read = try await send(
                apns, "GET", Self.base + "/channels", headers: Self.headers([("apns-channel-id", id)]))
            #expect(read.status == 200)
            #expect(try json(read)["message-storage-policy"] == .int(0))
            #expect(try json(read)["push-type"] == .string("LiveActivity"))
            #expect(read.header("apns-request-id") != nil)

            let list = try await send(apns, "GET", Self.base + "/all-channels")
            #expect(try json(list)["channels"] == .array([.string(id)]))

            let deleted = try await send(
                apns, "DELETE", Self.base + "/channels", headers: Self.headers([("apns-channel-id", id)]))
            #expect(deleted.status == 204)
            let gone = try await send(
                apns, "GET", Self.base + "/channels", headers: Self.headers([("apns-channel-id", id)]))
            #expect(gone.status == 404)
            #expect(reason(gone) == "ChannelNotRegistered")
            #expect(try json(try await send(apns, "GET", Self.base + "/all-channels"))["channels"] == .array([]))
        }
    }

    @Test("Apple's checks: body, push type, storage policy, channel ID, method, token, bundle")
    func checks() async throws {
        try await withAPNs { apns in
            func create(_ body: [UInt8], headers: [(String, String)] = Self.headers()) async throws -> (Int, String?) {
                let r = try await send(apns, "POST", Self.base + "/channels", headers: headers, body: body)
                return (r.status, reason(r))
            }
            #expect(try await create(Array("{not json".utf8)) == (400, "BadPayload"))
            #expect(try await create(Self.createBody(pushType: nil)) == (400, "MissingPushType"))
            #expect(try await create(Self.createBody(pushType: .string("Alert"))) == (400, "InvalidPushType"))
            #expect(try await create(Self.createBody(policy: .int(2))) == (400, "BadMessageStoragePolicy"))
            #expect(try await create(Self.createBody(policy: .string("1"))) == (400, "BadMessageStoragePolicy"))
            #expect(try await create(Self.createBody(), headers: []) == (403, "MissingProviderToken"))
            let foreign = APNsHarness.provider(signer: TestKeys.otherAPNs)
            #expect(
                try await create(Self.createBody(), headers: Self.headers(provider: foreign)) == (
                    403, "InvalidProviderToken"
                ))
            let stale = APNsHarness.provider(issuedAt: Date().addingTimeInterval(-7200))
            #expect(
                try await create(Self.createBody(), headers: Self.headers(provider: stale)) == (
                    403, "ExpiredProviderToken"
                ))
            #expect(
                try await create(Self.createBody(), headers: Self.headers([("apns-request-id", "nope")]))
                    == (400, "BadMessageId"))

            func read(_ headers: [(String, String)]) async throws -> (Int, String?) {
                let r = try await send(apns, "GET", Self.base + "/channels", headers: headers)
                return (r.status, reason(r))
            }
            #expect(try await read(Self.headers()) == (400, "MissingChannelId"))
            #expect(try await read(Self.headers([("apns-channel-id", "not base64!")])) == (400, "BadChannelId"))
            #expect(try await read(Self.headers([("apns-channel-id", "dHJpcA==")])) == (404, "ChannelNotRegistered"))

            let put = try await send(apns, "PUT", Self.base + "/channels")
            #expect((put.status, reason(put)) == (405, "MethodNotAllowed"))
            let other = try await send(
                apns, "POST", "/1/apps/com.example.other/channels", body: Self.createBody())
            #expect((other.status, reason(other)) == (400, "TopicDisallowed"))
            // Pushes are untouched by the channel routes.
            #expect(try await apns.push().status == 200)
        }
    }

    @Test("a bundle's limit answers CannotCreateChannelConfig, per bundle")
    func limit() async throws {
        try await withAPNs(bundleIDs: []) { apns in
            let control = try await apns.client.send(
                HTTP2Request(
                    method: "POST", path: "/_sim/channels",
                    body: JSONValue.object(["bundle_id": .string(APNsHarness.bundleID), "limit": .int(2)]).bytes))
            #expect(control.status == 200)
            for _ in 0..<2 {
                #expect(try await send(apns, "POST", Self.base + "/channels", body: Self.createBody()).status == 201)
            }
            let refused = try await send(apns, "POST", Self.base + "/channels", body: Self.createBody())
            #expect((refused.status, reason(refused)) == (400, "CannotCreateChannelConfig"))
            // Another app of the team is not limited by this one.
            let other = try await send(apns, "POST", "/1/apps/com.example.other/channels", body: Self.createBody())
            #expect(other.status == 201)
            let stats = try await apns.get("/_sim/channels")
            #expect(stats["channels"]?[APNsHarness.bundleID] == .int(2))
            #expect(stats["limit"] == .int(Int64(ChannelLimits.perAppAndEnvironment)))
        }
    }

    @Test("broadcasts: recorded under the channel with apns-unique-id; Apple's checks and errors")
    func broadcasts() async throws {
        try await withAPNs { apns in
            func channel(_ policy: Int64) async throws -> String {
                let created = try await send(
                    apns, "POST", Self.base + "/channels", body: Self.createBody(policy: .int(policy)))
                return try #require(created.header("apns-channel-id"))
            }
            let stored = try await channel(1)
            let unstored = try await channel(0)
            let path = "/4/broadcasts/apps/\(APNsHarness.bundleID)"
            func broadcast(
                _ id: String?, expiration: String = "0", pushType: String = "liveactivity",
                payload: String = APNsHarness.updatePayload, requestID: String? = nil, to target: String? = nil
            ) async throws -> HTTP2Response {
                var extra = [("apns-push-type", pushType), ("apns-priority", "10"), ("apns-expiration", expiration)]
                if let id { extra.append(("apns-channel-id", id)) }
                if let requestID { extra.append(("apns-request-id", requestID)) }
                return try await send(
                    apns, "POST", target ?? path, headers: Self.headers(extra), body: Array(payload.utf8))
            }
            let requestID = UUID().uuidString.lowercased()
            let accepted = try await broadcast(stored, expiration: "1900000000", requestID: requestID)
            #expect(accepted.status == 200)
            #expect(accepted.header("apns-request-id") == requestID)
            let uniqueID = try #require(accepted.header("apns-unique-id"))
            let records = apns.simulator.pushes(token: stored)
            try #require(records.count == 1)
            #expect(records[0]["broadcast"] == .bool(true))
            #expect(records[0]["unique_id"]?.stringValue == uniqueID)
            #expect(records[0]["expiration"] == .int(1_900_000_000))
            // A channel that stores nothing takes expiration 0 only.
            #expect(try await broadcast(unstored).status == 200)
            let late = try await broadcast(unstored, expiration: "1900000000")
            #expect((late.status, reason(late)) == (400, "BadExpirationDate"))
            let unknown = try await broadcast(Data("nope".utf8).base64EncodedString())
            #expect((unknown.status, reason(unknown)) == (404, "ChannelNotRegistered"))
            let malformed = try await broadcast("not base64!")
            #expect((malformed.status, reason(malformed)) == (400, "BadChannelId"))
            let missing = try await broadcast(nil)
            #expect((missing.status, reason(missing)) == (400, "MissingChannelId"))
            let alert = try await broadcast(stored, pushType: "alert")
            #expect((alert.status, reason(alert)) == (400, "InvalidPushType"))
            let started = try await broadcast(stored, payload: APNsHarness.startPayload)
            #expect((started.status, reason(started)) == (400, "BadPayload"))
            let otherApp = try await broadcast(stored, to: "/4/broadcasts/apps/com.example.other")
            #expect(otherApp.status == 404 || otherApp.status == 400)
            // Forgotten by Apple: the next broadcast is ChannelNotRegistered.
            #expect(apns.simulator.forgetChannel(bundleID: APNsHarness.bundleID, channelID: stored))
            let gone = try await broadcast(stored)
            #expect((gone.status, reason(gone)) == (404, "ChannelNotRegistered"))
            #expect(apns.simulator.pushes(token: stored).count == 1)
        }
    }
}
