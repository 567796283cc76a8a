import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeSimulators

@Suite("APNs validator without sockets")
struct APNsValidatorTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func rejection(_ body: () throws -> Void) -> String? {
        do {
            try body()
            return nil
        } catch let error as APNsRejection {
            return error.reason
        } catch {
            return "unexpected \(error)"
        }
    }

    @Test("device tokens come from /3/device/<64–200 hex>")
    func paths() throws {
        let token = String(repeating: "aB", count: 32)
        #expect(try APNsValidator.deviceToken(path: "/3/device/" + token) == token)
        #expect(rejection { _ = try APNsValidator.deviceToken(path: "/2/device/" + token) } == "BadPath")
        #expect(
            rejection { _ = try APNsValidator.deviceToken(path: "/3/device/" + token.dropLast()) } == "BadDeviceToken")
        #expect(
            rejection { _ = try APNsValidator.deviceToken(path: "/3/device/" + String(repeating: "a", count: 201)) }
                == "BadDeviceToken")
        #expect(rejection { _ = try APNsValidator.deviceToken(path: "/3/device/") } == "BadDeviceToken")
        #expect(throws: Never.self) {
            try APNsValidator.deviceToken(path: "/3/device/" + String(repeating: "0", count: 200))
        }
    }

    @Test("topics are <bundle>.push-type.liveactivity")
    func topics() throws {
        #expect(try APNsValidator.bundleID(topic: "com.example.app.push-type.liveactivity") == "com.example.app")
        #expect(rejection { _ = try APNsValidator.bundleID(topic: nil) } == "MissingTopic")
        #expect(rejection { _ = try APNsValidator.bundleID(topic: "com.example.app") } == "TopicDisallowed")
        #expect(rejection { _ = try APNsValidator.bundleID(topic: ".push-type.liveactivity") } == "TopicDisallowed")
    }

    @Test("iss must be the team; iat within an hour and not ahead beyond the skew")
    func claims() {
        func check(iss: String = "TEAM", iat: JSONValue?) -> String? {
            var claims: [String: JSONValue] = ["iss": .string(iss)]
            if let iat { claims["iat"] = iat }
            return rejection {
                try APNsValidator.checkClaims(claims, teamID: "TEAM", now: now, maxAge: 3600, skew: 60)
            }
        }
        let t = Int64(now.timeIntervalSince1970)
        #expect(check(iat: .int(t)) == nil)
        #expect(check(iat: .int(t - 3600)) == nil)
        #expect(check(iat: .int(t - 3601)) == "ExpiredProviderToken")
        #expect(check(iat: .int(t + 60)) == nil)
        #expect(check(iat: .int(t + 61)) == "InvalidProviderToken")
        #expect(check(iat: nil) == "InvalidProviderToken")
        #expect(check(iat: .string("\(t)")) == "InvalidProviderToken")
        #expect(check(iss: "OTHER", iat: .int(t)) == "InvalidProviderToken")
    }

    @Test("provider tokens verify by kid and are refused with the wrong key or algorithm")
    func providerTokens() throws {
        let key = APNsSimulator.SigningKey(keyID: "K1", teamID: "T1", publicKey: TestKeys.apns.publicKey)
        let validator = APNsValidator(keys: [key])
        let iat = JSONClaim.int(Int64(now.timeIntervalSince1970))
        let good = try JWT.sign(claims: ["iss": "T1", "iat": iat], header: ["kid": "K1"], signer: TestKeys.apns)
        #expect(try validator.verifyProviderToken(authorization: "bearer " + good, now: now).keyID == "K1")
        // cached: a second check still applies the claims
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: "bearer " + good, now: now + 7200) }
                == "ExpiredProviderToken")
        let forged = try JWT.sign(claims: ["iss": "T1", "iat": iat], header: ["kid": "K1"], signer: TestKeys.otherAPNs)
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: "bearer " + forged, now: now) }
                == "InvalidProviderToken")
        let rsa = try JWT.sign(claims: ["iss": "T1", "iat": iat], header: ["kid": "K1"], signer: TestKeys.fcm)
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: "bearer " + rsa, now: now) }
                == "InvalidProviderToken")
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: nil, now: now) } == "MissingProviderToken")
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: good, now: now) } == "InvalidProviderToken"
        )
    }

    @Test("a connection carries one team's and one key's provider tokens, as at Apple")
    func oneTeamPerConnection() throws {
        let keys = [
            APNsSimulator.SigningKey(keyID: "K1", teamID: "T1", publicKey: TestKeys.apns.publicKey),
            APNsSimulator.SigningKey(keyID: "K2", teamID: "T1", publicKey: TestKeys.otherAPNs.publicKey),
            APNsSimulator.SigningKey(keyID: "K3", teamID: "T2", publicKey: TestKeys.otherAPNs.publicKey),
        ]
        let validator = APNsValidator(keys: keys)
        let iat = JSONClaim.int(Int64(now.timeIntervalSince1970))
        func token(_ team: String, _ kid: String, _ signer: ES256PrivateKey) throws -> String {
            "bearer "
                + (try JWT.sign(claims: ["iss": .string(team), "iat": iat], header: ["kid": kid], signer: signer))
        }
        let k1 = try token("T1", "K1", TestKeys.apns)
        let k2 = try token("T1", "K2", TestKeys.otherAPNs)
        let k3 = try token("T2", "K3", TestKeys.otherAPNs)
        #expect(try validator.verifyProviderToken(authorization: k1, connection: 1, now: now).keyID == "K1")
        #expect(try validator.verifyProviderToken(authorization: k1, connection: 1, now: now).keyID == "K1")
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: k3, connection: 1, now: now) }
                == "InvalidProviderToken")
        #expect(
            rejection { _ = try validator.verifyProviderToken(authorization: k2, connection: 1, now: now) }
                == "TooManyProviderTokenUpdates")
        // Other connections bind to their own first token; a refused token did not rebind connection 1.
        #expect(try validator.verifyProviderToken(authorization: k3, connection: 2, now: now).keyID == "K3")
        #expect(try validator.verifyProviderToken(authorization: k2, connection: 3, now: now).keyID == "K2")
        #expect(try validator.verifyProviderToken(authorization: k1, connection: 1, now: now).keyID == "K1")
        // Without a connection (unit checks of the token alone) there is nothing to bind.
        #expect(try validator.verifyProviderToken(authorization: k3, now: now).keyID == "K3")
    }

    @Test("priority, expiration and apns-id headers")
    func headers() throws {
        #expect(try APNsValidator.priority(nil) == 10)
        #expect(try APNsValidator.priority("5") == 5)
        #expect(rejection { _ = try APNsValidator.priority("1") } == "BadPriority")
        #expect(try APNsValidator.expiration("0") == 0)
        #expect(rejection { _ = try APNsValidator.expiration("-1") } == "BadExpirationDate")
        #expect(rejection { _ = try APNsValidator.expiration("") } == "BadExpirationDate")
        #expect(try APNsValidator.messageID("123E4567-E89B-12D3-A456-426614174000") != nil)
        #expect(rejection { _ = try APNsValidator.messageID("123E4567E89B12D3A456426614174000") } == "BadMessageId")
    }

    @Test("aps shapes for start, update and end")
    func apsShapes() {
        func check(_ text: String) -> String? {
            rejection { _ = try APNsValidator.payload(Array(text.utf8)) }
        }
        #expect(check(APNsHarness.startPayload) == nil)
        #expect(check(APNsHarness.updatePayload) == nil)
        #expect(check(#"{"aps":{"event":"end","timestamp":1,"content-state":{},"dismissal-date":5}}"#) == nil)
        #expect(
            check(#"{"aps":{"event":"end","timestamp":1,"content-state":{},"dismissal-date":"soon"}}"#)
                == "BadPayload")
        #expect(check(#"{"aps":{"event":"update","timestamp":1.5,"content-state":{}}}"#) == "BadPayload")
        #expect(check(#"{"aps":{"event":"update","timestamp":1,"content-state":[]}}"#) == "BadPayload")
        #expect(
            check(#"{"aps":{"event":"start","timestamp":1,"content-state":{},"attributes-type":"A","alert":"x"}}"#)
                == "BadPayload")
        #expect(check(#"{"other":{}}"#) == "BadPayload")
        #expect(check("[1]") == "BadPayload")
        #expect(check("") == "PayloadEmpty")
    }

    @Test("a team's bundle list limits topics; a team without one allows any bundle")
    func bundles() {
        let restricted = APNsSimulator.SigningKey(
            keyID: "K1", teamID: "T1", publicKey: TestKeys.apns.publicKey, bundleIDs: ["com.a"])
        let open = APNsSimulator.SigningKey(keyID: "K2", teamID: "T2", publicKey: TestKeys.apns.publicKey)
        let validator = APNsValidator(keys: [restricted, open])
        #expect(validator.bundlesByTeam["T1"] == ["com.a"])
        #expect(validator.bundlesByTeam["T2"] == nil)
    }
}

@Suite("FCM validator without sockets")
struct FCMValidatorTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)
    let audience = "https://127.0.0.1:2198/token"

    func claims(aud: String? = nil, scope: String = FCMHarness.scope, iat: Int64? = nil, life: Int64 = 3600)
        -> [String: JSONValue]
    {
        let issued = iat ?? Int64(now.timeIntervalSince1970)
        return [
            "aud": .string(aud ?? audience), "scope": .string(scope), "iat": .int(issued), "exp": .int(issued + life),
        ]
    }

    func error(_ claims: [String: JSONValue]) -> String? {
        do {
            try FCMValidator.checkAssertionClaims(claims, audiences: [audience], now: now, skew: 60)
            return nil
        } catch {
            return error.error
        }
    }

    @Test("assertion claims: aud, scope, lifetime, expiry")
    func assertionClaims() {
        let t = Int64(now.timeIntervalSince1970)
        #expect(error(claims()) == nil)
        #expect(error(claims(scope: "openid " + FCMHarness.scope)) == nil)
        #expect(error(claims(aud: "https://oauth2.googleapis.com/token")) == "invalid_grant")
        #expect(error(claims(scope: "https://www.googleapis.com/auth/firebase")) == "invalid_scope")
        #expect(error(claims(life: 3601)) == "invalid_grant")
        #expect(error(claims(life: 0)) == "invalid_grant")
        #expect(error(claims(iat: t - 3700)) == "invalid_grant")
        #expect(error(claims(iat: t + 120)) == "invalid_grant")
    }

    @Test("the token request needs the form, the grant and a signature by a known account")
    func tokenRequest() throws {
        let account = FCMSimulator.ServiceAccount(clientEmail: "a@b", projectID: "p", publicKey: TestKeys.fcm.publicKey)
        func outcome(_ body: String, contentType: String? = "application/x-www-form-urlencoded") -> String {
            do {
                let found = try FCMValidator.verifyTokenRequest(
                    body: Array(body.utf8), contentType: contentType, accounts: ["a@b": account],
                    audiences: [audience], now: now, skew: 60)
                return found.projectID
            } catch {
                return error.error
            }
        }
        var jwtClaims: [String: JSONClaim] = ["iss": "a@b"]
        for (key, value) in claims() { jwtClaims[key] = value.intValue.map { .int($0) } ?? .string(value.stringValue!) }
        let assertion = try JWT.sign(claims: jwtClaims, signer: TestKeys.fcm)
        let grant = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
        #expect(outcome("grant_type=\(grant)&assertion=\(assertion)") == "p")
        #expect(outcome("assertion=\(assertion)&grant_type=\(grant)") == "p")
        #expect(outcome("grant_type=\(grant)&assertion=\(assertion)", contentType: nil) == "invalid_request")
        #expect(outcome("grant_type=password&assertion=\(assertion)") == "unsupported_grant_type")
        #expect(outcome("grant_type=\(grant)") == "invalid_request")
        let other = try JWT.sign(claims: jwtClaims, signer: TestKeys.otherFCM)
        #expect(outcome("grant_type=\(grant)&assertion=\(other)") == "invalid_grant")
    }

    @Test("messages:send paths name one project")
    func paths() {
        #expect(FCMValidator.projectID(path: "/v1/projects/my-project/messages:send") == "my-project")
        #expect(FCMValidator.projectID(path: "/v1/projects//messages:send") == nil)
        #expect(FCMValidator.projectID(path: "/v1/projects/a/b/messages:send") == nil)
        #expect(FCMValidator.projectID(path: "/v1/projects/a/messages:batch") == nil)
    }

    @Test("data: strings only, reserved keys, 4096 bytes of keys plus values")
    func data() throws {
        func code(_ text: String) -> String? {
            do {
                _ = try FCMValidator.data(try JSONValue.parse(text))
                return nil
            } catch let error as FCMRejection {
                return error.errorCode
            } catch {
                return "parse"
            }
        }
        #expect(code(#"{"a":"b"}"#) == nil)
        #expect(code(#"{"a":1}"#) == "INVALID_ARGUMENT")
        #expect(code(#"{"a":null}"#) == "INVALID_ARGUMENT")
        for key in ["from", "gcm.x", "google.c.a", "GOOGLE", "message_type", "collapse_key", ""] {
            #expect(code(#"{"\#(key)":"v"}"#) == "INVALID_ARGUMENT", "\(key)")
        }
        #expect(code(#"{"fromage":"v"}"#) == nil)
        #expect(code(#"{"k":"\#(String(repeating: "v", count: 4095))"}"#) == nil)
        #expect(code(#"{"k":"\#(String(repeating: "v", count: 4096))"}"#) == "INVALID_ARGUMENT")
    }

    @Test("ttl durations and error JSON")
    func durationsAndErrors() throws {
        for good in ["0s", "3600s", "1.5s", "10.123456789s"] { #expect(FCMValidator.isDuration(good), "\(good)") }
        for bad in ["3600", "s", "1.s", "-1s", "1.1234567890s", "1h"] {
            #expect(!FCMValidator.isDuration(bad), "\(bad)")
        }
        let json = FCMRejection.invalidArgument("nope").json
        #expect(json["error"]?["code"]?.intValue == 400)
        #expect(json["error"]?["status"]?.stringValue == "INVALID_ARGUMENT")
        let detail = json["error"]?["details"]?.arrayValue?.first
        #expect(detail?["@type"]?.stringValue == "type.googleapis.com/google.firebase.fcm.v1.FcmError")
        #expect(detail?["errorCode"]?.stringValue == "INVALID_ARGUMENT")
        #expect(FCMRejection.unauthenticated("x").json["error"]?["details"] == nil)
    }
}

@Suite("Fault rules without sockets")
struct FaultRuleTests {
    @Test("rules parse from JSON with aliases and round-trip")
    func parsing() throws {
        let rules = try FaultRule.parseRules(
            json: """
                [{"token_prefix":"dead","action":"unregistered"},
                 {"action":"unavailable","times":1,"retry_after":2,"latency_ms":5},
                 {"rate":0.25,"action":"quota_exceeded"}]
                """)
        #expect(rules.count == 3)
        #expect(rules[0] == FaultRule(tokenPrefix: "dead", action: .unregistered))
        #expect(
            rules[1] == FaultRule(action: .serviceUnavailable, times: 1, latencyMilliseconds: 5, retryAfterSeconds: 2))
        #expect(rules[2].action == .tooManyRequests && rules[2].rate == 0.25)
        #expect(
            try FaultRule.parseRules(json: JSONValue.object(["rules": .array(rules.map(\.json))]).serialized()) == rules
        )
    }

    @Test("bad rules are refused with the rule's index")
    func badRules() {
        for text in [
            #"[{"action":"explode"}]"#, #"[{"token_prefix":"a"}]"#, #"[{"action":"goaway","rate":2}]"#,
            #"[{"action":"goaway","times":-1}]"#, #"[{"action":"goaway","colour":1}]"#, #"{"action":"goaway"}"#, "[",
        ] {
            #expect(throws: SimulatorError.self, "\(text)") { try FaultRule.parseRules(json: text) }
        }
    }

    @Test("first matching rule wins; prefixes select tokens")
    func order() {
        let injector = FaultInjector(rules: [
            FaultRule(tokenPrefix: "dead", action: .unregistered),
            FaultRule(tokenPrefix: "de", action: .internalError),
        ])
        #expect(injector.decide(token: "deadbeef")?.action == .unregistered)
        #expect(injector.decide(token: "de00")?.action == .internalError)
        #expect(injector.decide(token: "beef") == nil)
    }

    @Test("times counts per token, then later rules or success")
    func times() {
        let injector = FaultInjector(rules: [
            FaultRule(action: .serviceUnavailable, times: 2), FaultRule(tokenPrefix: "x", action: .goAway, times: 1),
        ])
        #expect(injector.decide(token: "a")?.action == .serviceUnavailable)
        #expect(injector.decide(token: "a")?.action == .serviceUnavailable)
        #expect(injector.decide(token: "a") == nil)
        #expect(injector.decide(token: "b")?.action == .serviceUnavailable)
        #expect(injector.decide(token: "x1")?.action == .serviceUnavailable)
        #expect(injector.decide(token: "x1")?.action == .serviceUnavailable)
        #expect(injector.decide(token: "x1")?.action == .goAway)
        #expect(injector.decide(token: "x1") == nil)
        injector.reset()
        #expect(injector.decide(token: "a")?.action == .serviceUnavailable)
    }

    @Test("rates are drawn from a seeded generator: same seed, same hits")
    func rates() {
        func hits(seed: UInt64, rate: Double) -> [Bool] {
            let injector = FaultInjector(rules: [FaultRule(rate: rate, action: .internalError)], seed: seed)
            return (0..<1000).map { injector.decide(token: "t\($0)") != nil }
        }
        let first = hits(seed: 9, rate: 0.3)
        #expect(first == hits(seed: 9, rate: 0.3))
        #expect(first != hits(seed: 10, rate: 0.3))
        #expect((240...360).contains(first.filter { $0 }.count))
        #expect(hits(seed: 1, rate: 0).allSatisfy { !$0 })
        #expect(hits(seed: 1, rate: 1).allSatisfy { $0 })
    }
}

@Suite("HTTP text helpers")
struct HTTPTextTests {
    @Test("forms and queries decode percent escapes and plus")
    func forms() {
        let form = HTTPText.parseForm("a=1&b=x%20y+z&c=%3A%2F&a=2&bad=%zz&empty=")
        #expect(form["a"] == "1")
        #expect(form["b"] == "x y z")
        #expect(form["c"] == ":/")
        #expect(form["bad"] == nil)
        #expect(form["empty"] == "")
        let (path, query) = HTTPText.splitTarget("/_sim/pushes?token=ab%63")
        #expect(path == "/_sim/pushes")
        #expect(query["token"] == "abc")
    }

    @Test("bearer tokens")
    func bearer() {
        #expect(HTTPText.bearerToken("Bearer abc") == "abc")
        #expect(HTTPText.bearerToken("bearer  abc ") == "abc")
        #expect(HTTPText.bearerToken("Basic abc") == nil)
        #expect(HTTPText.bearerToken("Bearer") == nil)
        #expect(HTTPText.bearerToken(nil) == nil)
        #expect(HTTPText.bearerToken("  BEARER\tabc") == nil)
        #expect(HTTPText.bearerToken("  BeArEr abc\t") == "abc")
        #expect(HTTPText.bearerToken("Bearerabc") == nil)
        #expect(HTTPText.bearerToken("Bearer \t ") == nil)
        #expect(HTTPText.bearerToken("Bbarer abc") == nil)
    }
}

@Suite("Recorder")
struct RecorderTests {
    @Test("keeps at most the memory limit, oldest dropped, per-token lookups stay right")
    func memoryLimit() throws {
        let recorder = try Recorder(path: nil, memoryLimit: 3)
        for index in 0..<5 {
            recorder.accept(token: index % 2 == 0 ? "even" : "odd") { .int(Int64(index)) }
        }
        #expect(recorder.records(token: nil) == [.int(2), .int(3), .int(4)])
        #expect(recorder.records(token: "even") == [.int(2), .int(4)])
        #expect(recorder.records(token: "odd") == [.int(3)])
        #expect(recorder.acceptedCount == 5)
    }

    @Test("a record's JSON is built only when read, unless there is a records file (then once, as a line)")
    func lazyRecords() throws {
        let built = Atomic<Int>(0)
        let memory = try Recorder(path: nil, memoryLimit: 10)
        for index in 0..<3 {
            memory.accept(token: "t") {
                built.add(1, ordering: .relaxed)
                return .int(Int64(index))
            }
        }
        #expect(built.load(ordering: .relaxed) == 0, "nothing built on the request path")
        #expect(memory.records(token: "t") == [.int(0), .int(1), .int(2)])
        #expect(built.load(ordering: .relaxed) == 3)

        let path = try temporaryDirectory() + "/records.jsonl"
        let filed = try Recorder(path: path, memoryLimit: 10)
        filed.accept(token: "t") { .object(["n": .int(1)]) }
        filed.accept(token: "u") { .object(["n": .int(2)]) }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "{\"n\":1}\n{\"n\":2}\n")
    }
}
