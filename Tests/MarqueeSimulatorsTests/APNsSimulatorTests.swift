import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeSimulators

@Suite("APNs simulator over HTTP/2 + TLS")
struct APNsSimulatorTests {
    @Test("a correctly signed start is accepted, echoed and recorded")
    func acceptsStart() async throws {
        try await withAPNs { apns in
            let apnsID = UUID().uuidString
            let token = APNsHarness.token("00ff")
            let sentFrom = Date().timeIntervalSince1970
            let response = try await apns.push(
                token: token, payload: APNsHarness.startPayload,
                headers: APNsHarness.headers(["apns-id": apnsID, "apns-expiration": "1700003600"]))
            #expect(response.status == 200)
            #expect(response.header("apns-id") == apnsID)

            let pushes = try await apns.get("/_sim/pushes?token=\(token)")["pushes"]?.arrayValue ?? []
            #expect(pushes.count == 1)
            #expect(pushes.first?["apns_id"]?.stringValue == apnsID)
            #expect(pushes.first?["topic"]?.stringValue == APNsHarness.topic)
            #expect(pushes.first?["expiration"]?.intValue == 1_700_003_600)
            #expect(pushes.first?["payload"]?["aps"]?["event"]?.stringValue == "start")
            let statistics = try await apns.get("/_sim/stats")
            #expect(statistics["accepted"]?.intValue == 1)
            let lastAccepted = try #require(statistics["last_accepted_at"]?.doubleValue)
            #expect(lastAccepted >= sentFrom && lastAccepted <= Date().timeIntervalSince1970)

            let lines = try String(contentsOfFile: apns.recordsPath, encoding: .utf8).split(separator: "\n")
            #expect(lines.count == 1)
            let line = try JSONValue.parse(String(lines[0]))
            #expect(line["token"]?.stringValue == token)
            #expect(line["payload"]?["aps"]?["attributes-type"]?.stringValue == "MatchAttributes")
        }
    }

    @Test("a push without apns-id gets a generated UUID")
    func generatesID() async throws {
        try await withAPNs { apns in
            let response = try await apns.push()
            #expect(response.status == 200)
            let id = try #require(response.header("apns-id"))
            #expect(UUID(uuidString: id) != nil)
            #expect(apns.simulator.pushes().first?["apns_id"]?.stringValue == id)
        }
    }

    @Test("each validation failure answers Apple's status and reason and is counted")
    func validationFailures() async throws {
        struct Case {
            var name: String
            var status: Int
            var reason: String
            var token = APNsHarness.token()
            var payload = APNsHarness.updatePayload
            var headers = APNsHarness.headers()
            var method = "POST"
            var path: String? = nil
        }
        let now = Date()
        let bearer = { (jwt: String) in ["authorization": "bearer " + jwt] as [String: String?] }
        let cases: [Case] = [
            Case(
                name: "bad signature", status: 403, reason: "InvalidProviderToken",
                headers: APNsHarness.headers(bearer(APNsHarness.provider(signer: TestKeys.otherAPNs)))),
            Case(
                name: "unknown kid", status: 403, reason: "InvalidProviderToken",
                headers: APNsHarness.headers(bearer(APNsHarness.provider(keyID: "NOPE000000")))),
            Case(
                name: "wrong iss", status: 403, reason: "InvalidProviderToken",
                headers: APNsHarness.headers(bearer(APNsHarness.provider(teamID: "OTHERTEAM1")))),
            Case(
                name: "old iat", status: 403, reason: "ExpiredProviderToken",
                headers: APNsHarness.headers(bearer(APNsHarness.provider(issuedAt: now - 3700)))),
            Case(
                name: "future iat", status: 403, reason: "InvalidProviderToken",
                headers: APNsHarness.headers(bearer(APNsHarness.provider(issuedAt: now + 600)))),
            Case(
                name: "not a JWT", status: 403, reason: "InvalidProviderToken",
                headers: APNsHarness.headers(["authorization": "bearer abc"])),
            Case(
                name: "missing auth", status: 403, reason: "MissingProviderToken",
                headers: APNsHarness.headers(["authorization": nil])),
            Case(name: "GET", status: 405, reason: "MethodNotAllowed", method: "GET"),
            Case(name: "bad path", status: 404, reason: "BadPath", path: "/3/devices/\(APNsHarness.token())"),
            Case(name: "non-hex token", status: 400, reason: "BadDeviceToken", token: APNsHarness.token(fill: "z")),
            Case(name: "short token", status: 400, reason: "BadDeviceToken", token: "abcd"),
            Case(
                name: "alert push type", status: 400, reason: "InvalidPushType",
                headers: APNsHarness.headers(["apns-push-type": "alert"])),
            Case(
                name: "missing push type", status: 400, reason: "InvalidPushType",
                headers: APNsHarness.headers(["apns-push-type": nil])),
            Case(
                name: "missing topic", status: 400, reason: "MissingTopic",
                headers: APNsHarness.headers(["apns-topic": nil])),
            Case(
                name: "topic without suffix", status: 400, reason: "TopicDisallowed",
                headers: APNsHarness.headers(["apns-topic": APNsHarness.bundleID])),
            Case(
                name: "other bundle", status: 400, reason: "TopicDisallowed",
                headers: APNsHarness.headers(["apns-topic": "com.other.app.push-type.liveactivity"])),
            Case(
                name: "priority 1", status: 400, reason: "BadPriority",
                headers: APNsHarness.headers(["apns-priority": "1"])),
            Case(
                name: "expiration not numeric", status: 400, reason: "BadExpirationDate",
                headers: APNsHarness.headers(["apns-expiration": "soon"])),
            Case(
                name: "apns-id not a UUID", status: 400, reason: "BadMessageId",
                headers: APNsHarness.headers(["apns-id": "not-a-uuid"])),
            Case(
                name: "too large", status: 413, reason: "PayloadTooLarge",
                payload: #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":""#
                    + String(repeating: "y", count: 4100) + #""}}}"#),
            Case(name: "empty payload", status: 400, reason: "PayloadEmpty", payload: ""),
            Case(name: "not JSON", status: 400, reason: "BadPayload", payload: "{aps"),
            Case(
                name: "start without attributes-type", status: 400, reason: "BadPayload",
                payload: APNsHarness.startPayload.replacingOccurrences(of: "attributes-type", with: "kind")),
            Case(
                name: "start without alert", status: 400, reason: "BadPayload",
                payload: APNsHarness.startPayload.replacingOccurrences(of: "\"alert\"", with: "\"notice\"")),
            Case(
                name: "string timestamp", status: 400, reason: "BadPayload",
                payload: #"{"aps":{"event":"update","timestamp":"1","content-state":{}}}"#),
            Case(
                name: "unknown event", status: 400, reason: "BadPayload",
                payload: #"{"aps":{"event":"pause","timestamp":1,"content-state":{}}}"#),
        ]
        try await withAPNs { apns in
            for test in cases {
                let response = try await apns.push(
                    token: test.token, payload: test.payload, headers: test.headers, method: test.method,
                    path: test.path)
                #expect(response.status == test.status, "\(test.name)")
                #expect(try json(response)["reason"]?.stringValue == test.reason, "\(test.name)")
                #expect(response.header("apns-id") != nil, "\(test.name)")
            }
            let statistics = try await apns.get("/_sim/stats")
            #expect(statistics["accepted"]?.intValue == 0)
            #expect(statistics["last_accepted_at"] == nil)
            #expect(statistics["rejected_total"]?.intValue == Int64(cases.count))
            #expect(statistics["rejected"]?["InvalidProviderToken"]?.intValue == 5)
            #expect(apns.simulator.pushes().isEmpty)
        }
    }

    @Test("an unregistered rule answers 410 with a millisecond timestamp, other tokens pass")
    func unregistered() async throws {
        try await withAPNs(faults: [FaultRule(tokenPrefix: "dead", action: .unregistered)]) { apns in
            let before = Int64(Date().timeIntervalSince1970 * 1000)
            let gone = try await apns.push(token: APNsHarness.token("dead"))
            #expect(gone.status == 410)
            let body = try json(gone)
            #expect(body["reason"]?.stringValue == "Unregistered")
            let timestamp = try #require(body["timestamp"]?.intValue)
            #expect(timestamp >= before - 1000 && timestamp <= before + 60_000)
            #expect(try await apns.push(token: APNsHarness.token("beef")).status == 200)
            #expect(apns.simulator.pushes(token: APNsHarness.token("dead")).isEmpty)
        }
    }

    @Test("503 once, then the same token succeeds")
    func unavailableOnce() async throws {
        try await withAPNs(faults: [FaultRule(action: .serviceUnavailable, times: 1)]) { apns in
            let first = try await apns.push()
            #expect(first.status == 503)
            #expect(try json(first)["reason"]?.stringValue == "ServiceUnavailable")
            #expect(try await apns.push().status == 200)
            #expect(try await apns.push().status == 200)
            // a different token has its own budget
            #expect(try await apns.push(token: APNsHarness.token("01")).status == 503)
        }
    }

    @Test("429 carries retry-after; latency delays the answer")
    func tooManyRequests() async throws {
        let rule = FaultRule(action: .tooManyRequests, latencyMilliseconds: 150, retryAfterSeconds: 7)
        try await withAPNs(faults: [rule]) { apns in
            let start = ContinuousClock.now
            let response = try await apns.push()
            #expect(ContinuousClock.now - start >= .milliseconds(150))
            #expect(response.status == 429)
            #expect(response.header("retry-after") == "7")
            #expect(try json(response)["reason"]?.stringValue == "TooManyRequests")
            #expect(try await apns.get("/_sim/stats")["injected"]?["too_many_requests"]?.intValue == 1)
        }
    }

    @Test("a rate rule hits about that share of requests; rules can be replaced over /_sim/faults")
    func rateRule() async throws {
        try await withAPNs(seed: 42) { apns in
            let update = try await apns.client.send(
                HTTP2Request(
                    path: "/_sim/faults",
                    body: Array(#"[{"rate": 0.5, "action": "internal"}]"#.utf8)))
            #expect(update.status == 200)
            var failed = 0
            for index in 0..<200 {
                let response = try await apns.push(token: APNsHarness.token(String(format: "%04x", index)))
                if response.status == 500 {
                    failed += 1
                    #expect(try json(response)["reason"]?.stringValue == "InternalServerError")
                } else {
                    #expect(response.status == 200)
                }
            }
            #expect((60...140).contains(failed))
            #expect(apns.simulator.pushes().count == 200 - failed)
        }
    }

    @Test("a goaway rule drops the connection; the client retries and the push lands once")
    func goAway() async throws {
        try await withAPNs(faults: [FaultRule(action: .goAway, times: 1)]) { apns in
            let token = APNsHarness.token("0a0a")
            let response = try await apns.push(token: token)
            #expect(response.status == 200)
            #expect(apns.client.statistics.goAwaysTotal >= 1)
            #expect(apns.simulator.pushes(token: token).count == 1)
            let statistics = try await apns.get("/_sim/stats")
            #expect(statistics["injected"]?["goaway"]?.intValue == 1)
            #expect(statistics["accepted"]?.intValue == 1)
        }
    }

    @Test("reset forgets records, counters and times budgets")
    func reset() async throws {
        try await withAPNs(faults: [FaultRule(action: .serviceUnavailable, times: 1)]) { apns in
            #expect(try await apns.push().status == 503)
            #expect(try await apns.push().status == 200)
            let reset = try await apns.client.send(HTTP2Request(path: "/_sim/reset"))
            #expect(reset.status == 200)
            let statistics = try await apns.get("/_sim/stats")
            #expect(statistics["accepted"]?.intValue == 0)
            #expect(statistics["rejected_total"]?.intValue == 0)
            #expect(apns.simulator.pushes().isEmpty)
            #expect(try await apns.push().status == 503)
        }
    }

    @Test("the CA file is written and the server certificate is trusted through it only")
    func caFile() async throws {
        try await withAPNs { apns in
            let pem = try String(contentsOfFile: apns.directory + "/ca.pem", encoding: .utf8)
            #expect(pem == apns.simulator.caCertificatePEM)
            #expect(pem.hasPrefix("-----BEGIN CERTIFICATE-----"))
            let untrusting = try HTTP2Client(
                .init(host: "127.0.0.1", port: apns.simulator.port, connectTimeout: .seconds(5), maxRetries: 0))
            await #expect(throws: HTTP2Error.self) {
                _ = try await untrusting.send(HTTP2Request(method: "GET", path: "/_sim/stats"))
            }
            await untrusting.shutdown()
        }
    }
}
