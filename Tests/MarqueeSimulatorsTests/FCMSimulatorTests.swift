import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeSimulators

@Suite("FCM simulator over HTTP/2 + TLS")
struct FCMSimulatorTests {
    @Test("a good assertion is exchanged for a bearer token and counted")
    func tokenExchange() async throws {
        try await withFCM(tokenLifetime: 1800) { fcm in
            let response = try await fcm.exchange(fcm.assertion())
            #expect(response.status == 200)
            let body = try json(response)
            #expect(body["access_token"]?.stringValue?.isEmpty == false)
            #expect(body["expires_in"]?.intValue == 1800)
            #expect(body["token_type"]?.stringValue == "Bearer")
            #expect(fcm.simulator.tokensIssued == 1)
            #expect(try await fcm.get("/_sim/stats")["tokens_issued"]?.intValue == 1)
        }
    }

    @Test("bad assertions and requests get OAuth errors with status 400")
    func badAssertions() async throws {
        try await withFCM { fcm in
            let cases: [(String, String, String)] = [
                ("wrong aud", fcm.assertion(audience: "https://example.com/token"), "invalid_grant"),
                (
                    "wrong scope", fcm.assertion(scope: "https://www.googleapis.com/auth/cloud-platform"),
                    "invalid_scope"
                ),
                ("exp beyond an hour", fcm.assertion(lifetime: 7200), "invalid_grant"),
                ("expired", fcm.assertion(issuedAt: fcm.clock.now - 4000), "invalid_grant"),
                ("future iat", fcm.assertion(issuedAt: fcm.clock.now + 600), "invalid_grant"),
                ("bad signature", fcm.assertion(signer: TestKeys.otherFCM), "invalid_grant"),
                ("unknown issuer", fcm.assertion(issuer: "who@else.iam.gserviceaccount.com"), "invalid_grant"),
                ("not a JWT", "abc.def", "invalid_grant"),
            ]
            for (name, assertion, error) in cases {
                let response = try await fcm.exchange(assertion)
                #expect(response.status == 400, "\(name)")
                #expect(try json(response)["error"]?.stringValue == error, "\(name)")
                #expect(try json(response)["error_description"]?.stringValue != nil, "\(name)")
            }
            let grant = try await fcm.exchange(fcm.assertion(), grantType: "client_credentials")
            #expect(try json(grant)["error"]?.stringValue == "unsupported_grant_type")
            let form = try await fcm.exchange(fcm.assertion(), contentType: "application/json")
            #expect(form.status == 400)
            #expect(try json(form)["error"]?.stringValue == "invalid_request")
            #expect(fcm.simulator.tokensIssued == 0)
        }
    }

    @Test("a message with data is accepted and recorded")
    func sendAccepted() async throws {
        try await withFCM { fcm in
            let bearer = try await fcm.accessToken()
            let response = try await fcm.send(bearer: bearer)
            #expect(response.status == 200)
            let name = try #require(try json(response)["name"]?.stringValue)
            #expect(name.hasPrefix("projects/\(FCMHarness.project)/messages/"))

            let messages = try await fcm.get("/_sim/messages?token=fcm-token-1")["messages"]?.arrayValue ?? []
            #expect(messages.count == 1)
            #expect(messages.first?["name"]?.stringValue == name)
            #expect(messages.first?["message"]?["data"]?["score"]?.stringValue == "2-0")
            #expect(messages.first?["message"]?["android"]?["ttl"]?.stringValue == "3600s")
            #expect(try await fcm.get("/_sim/stats")["accepted"]?.intValue == 1)

            let lines = try String(contentsOfFile: fcm.directory + "/fcm.jsonl", encoding: .utf8).split(separator: "\n")
            #expect(lines.count == 1)
            #expect(try JSONValue.parse(String(lines[0]))["client_email"]?.stringValue == FCMHarness.email)
        }
    }

    @Test("validate_only answers without recording")
    func validateOnly() async throws {
        try await withFCM { fcm in
            let bearer = try await fcm.accessToken()
            let body = #"{"validate_only":true,"message":{"token":"t1","data":{"a":"b"}}}"#
            #expect(try await fcm.send(body, bearer: bearer).status == 200)
            #expect(fcm.simulator.messages().isEmpty)
        }
    }

    @Test("invalid messages get 400 INVALID_ARGUMENT in FCM's error format")
    func invalidMessages() async throws {
        let big = String(repeating: "x", count: 4096 - 4 + 1)  // "blob" + value = 4097 bytes
        let cases: [(String, String)] = [
            ("non-string data value", FCMHarness.message(data: #"{"score":2}"#)),
            ("oversize data", FCMHarness.message(data: #"{"blob":"\#(big)"}"#)),
            ("reserved from", FCMHarness.message(data: #"{"from":"x"}"#)),
            ("reserved google prefix", FCMHarness.message(data: #"{"google.sent_time":"1"}"#)),
            ("reserved gcm prefix", FCMHarness.message(data: #"{"gcm.n.e":"1"}"#)),
            ("reserved collapse_key", FCMHarness.message(data: #"{"collapse_key":"1"}"#)),
            ("reserved message_type", FCMHarness.message(data: #"{"message_type":"1"}"#)),
            ("bad ttl", FCMHarness.message(android: #"{"ttl":"1 hour"}"#)),
            ("bad priority", FCMHarness.message(android: #"{"priority":"urgent"}"#)),
            ("unknown android field", FCMHarness.message(android: #"{"colour":"red"}"#)),
            ("bad token", FCMHarness.message(token: "has space")),
            ("no token", #"{"message":{"data":{"a":"b"}}}"#),
            ("no message", #"{"msg":{}}"#),
            ("not JSON", "{"),
        ]
        try await withFCM { fcm in
            let bearer = try await fcm.accessToken()
            for (name, body) in cases {
                let response = try await fcm.send(body, bearer: bearer)
                let (status, canonical, code) = try fcmError(response)
                #expect(status == 400, "\(name)")
                #expect(canonical == "INVALID_ARGUMENT", "\(name)")
                #expect(code == "INVALID_ARGUMENT", "\(name)")
                #expect(try json(response)["error"]?["code"]?.intValue == 400, "\(name)")
            }
            #expect(fcm.simulator.messages().count == 0)
            #expect(
                try await fcm.get("/_sim/stats")["rejected"]?["INVALID_ARGUMENT"]?.intValue == Int64(cases.count))
        }
    }

    @Test("data of exactly 4096 bytes (keys plus values) is accepted")
    func dataLimit() async throws {
        try await withFCM { fcm in
            let bearer = try await fcm.accessToken()
            let value = String(repeating: "v", count: 4096 - 4)
            #expect(
                try await fcm.send(FCMHarness.message(data: #"{"blob":"\#(value)"}"#), bearer: bearer).status == 200)
        }
    }

    @Test("wrong project, bad or expired bearer tokens are refused")
    func authorization() async throws {
        try await withFCM { fcm in
            let bearer = try await fcm.accessToken()
            let wrongProject = try fcmError(try await fcm.send(bearer: bearer, project: "other-project"))
            #expect(wrongProject == (403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"))
            let missing = try await fcm.send(bearer: nil)
            #expect(try fcmError(missing) == (401, "UNAUTHENTICATED", nil))
            #expect(try fcmError(try await fcm.send(bearer: "ya29.forged")) == (401, "UNAUTHENTICATED", nil))

            fcm.clock.advance(3601)
            #expect(try fcmError(try await fcm.send(bearer: bearer)) == (401, "UNAUTHENTICATED", nil))

            let fresh = try await fcm.accessToken()
            #expect(try await fcm.send(bearer: fresh).status == 200)
            let expire = try await fcm.client.send(HTTP2Request(path: "/_sim/expire-tokens"))
            #expect(try json(expire)["expired"]?.intValue == 1)
            #expect(try await fcm.send(bearer: fresh).status == 401)
            #expect(fcm.simulator.tokensIssued == 2)
        }
    }

    @Test("fault rules answer UNREGISTERED, UNAVAILABLE with retry-after, QUOTA_EXCEEDED and INTERNAL")
    func faults() async throws {
        let rules = [
            FaultRule(tokenPrefix: "gone", action: .unregistered),
            FaultRule(tokenPrefix: "busy", action: .serviceUnavailable, times: 1, retryAfterSeconds: 3),
            FaultRule(tokenPrefix: "quota", action: .tooManyRequests, retryAfterSeconds: 9),
            FaultRule(tokenPrefix: "boom", action: .internalError),
        ]
        try await withFCM(faults: rules) { fcm in
            let bearer = try await fcm.accessToken()
            let gone = try await fcm.send(FCMHarness.message(token: "gone-1"), bearer: bearer)
            #expect(try fcmError(gone) == (404, "NOT_FOUND", "UNREGISTERED"))

            let busy = try await fcm.send(FCMHarness.message(token: "busy-1"), bearer: bearer)
            #expect(try fcmError(busy) == (503, "UNAVAILABLE", "UNAVAILABLE"))
            #expect(busy.header("retry-after") == "3")
            #expect(try await fcm.send(FCMHarness.message(token: "busy-1"), bearer: bearer).status == 200)

            let quota = try await fcm.send(FCMHarness.message(token: "quota-1"), bearer: bearer)
            #expect(try fcmError(quota) == (429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"))
            #expect(quota.header("retry-after") == "9")

            let boom = try await fcm.send(FCMHarness.message(token: "boom-1"), bearer: bearer)
            #expect(try fcmError(boom) == (500, "INTERNAL", "INTERNAL"))

            #expect(fcm.simulator.messages().count == 1)
            let injected = try await fcm.get("/_sim/stats")["injected"]
            #expect(injected?["unregistered"]?.intValue == 1)
            #expect(injected?["service_unavailable"]?.intValue == 1)
        }
    }

    @Test("an expire_token rule makes the client refresh exactly once")
    func earlyExpiry() async throws {
        try await withFCM(faults: [FaultRule(action: .expireToken, times: 1)]) { fcm in
            var bearer = try await fcm.accessToken()
            var response = try await fcm.send(bearer: bearer)
            #expect(try fcmError(response) == (401, "UNAUTHENTICATED", nil))
            // the old token stays expired
            #expect(try await fcm.send(bearer: bearer).status == 401)
            bearer = try await fcm.accessToken()
            response = try await fcm.send(bearer: bearer)
            #expect(response.status == 200)
            #expect(try await fcm.get("/_sim/stats")["tokens_issued"]?.intValue == 2)
            #expect(fcm.simulator.messages(token: "fcm-token-1").count == 1)
        }
    }

    @Test("unknown routes answer 404 in FCM's format")
    func unknownRoute() async throws {
        try await withFCM { fcm in
            let response = try await fcm.client.send(HTTP2Request(path: "/v1/projects/p/other"))
            #expect(try fcmError(response).0 == 404)
            #expect(try fcmError(response).1 == "NOT_FOUND")
        }
    }
}
