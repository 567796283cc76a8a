import Foundation
import Testing

@testable import MarqueeCore

/// A tenant picks the endpoint, so every number in a provider's answer is hostile. None may trap the worker.
@Suite("Numbers from providers are clamped or ignored, never trusted")
struct ProviderNumbersTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func apns(_ status: Int, _ body: String, retryAfter: String? = nil) -> DeliveryDecision {
        APNsReason.decide(status: status, body: Array(body.utf8), apnsID: "id", retryAfter: retryAfter, now: now)
    }

    @Test(
        "Retry-After: hostile values never trap; at most an hour; unreadable ones are ignored",
        arguments: [
            ("1e16", Duration.seconds(3600)), ("1e308", .seconds(3600)), ("9223372036854775807", .seconds(3600)),
            ("99999999999999999999999999", .seconds(3600)), ("3600.5", .seconds(3600)), ("30", .seconds(30)),
            ("0.25", .milliseconds(250)), ("-5", .zero), ("-1e300", .zero), ("0", .zero),
        ] as [(String, Duration)])
    func retryAfterClamped(header: String, expected: Duration) {
        #expect(ProviderNumbers.retryAfter(header, now: now) == expected)
        #expect(
            apns(429, #"{"reason":"TooManyRequests"}"#, retryAfter: header)
                == .retry(reason: "TooManyRequests", retryAfter: expected))
        #expect(
            FCMErrorCode.decide(status: 503, body: [], retryAfter: header, now: now)
                == .retry(reason: "HTTP 503", retryAfter: expected))
    }

    @Test(
        "Retry-After: NaN, infinity, garbage and overlong headers are ignored",
        arguments: ["NaN", "nan", "inf", "-inf", "infinity", "1e16s", "soon", "", String(repeating: "9", count: 400)])
    func retryAfterIgnored(header: String) {
        #expect(ProviderNumbers.retryAfter(header, now: now) == nil)
        #expect(apns(503, "{}", retryAfter: header) == .retry(reason: "HTTP 503", retryAfter: nil))
    }

    @Test("Retry-After as an HTTP-date: relative to now, clamped, past dates are zero")
    func retryAfterHTTPDate() {
        // now is 2027-01-15T08:00:00Z.
        #expect(ProviderNumbers.retryAfter("Fri, 15 Jan 2027 08:00:30 GMT", now: now) == .seconds(30))
        #expect(ProviderNumbers.retryAfter("Fri, 31 Dec 9999 23:59:59 GMT", now: now) == .seconds(3600))
        #expect(ProviderNumbers.retryAfter("Thu, 01 Jan 1970 00:00:00 GMT", now: now) == .zero)
        #expect(ProviderNumbers.retryAfter("Fri, 15 Jan 2027 08:00:30 PST", now: now) == nil)
    }

    @Test("the retry policy never traps whatever floor it is handed")
    func retryPolicyFloor() {
        let policy = RetryPolicy()
        let huge = policy.delay(afterAttempts: 1, retryAfter: .seconds(Int64.max), random: { 0 })
        #expect(huge == .seconds(3600))
        let negative = policy.delay(afterAttempts: 1, retryAfter: .seconds(-100), random: { 0 })
        #expect(negative == .seconds(4))
    }

    @Test(
        "a 410's timestamp outside a sane range is ignored; the token is still retired",
        arguments: [
            "1e17", "-1", "-1e300", "1e308", "9223372036854775807", "99999999999999999999999", "0", "1.5",
            "\"1700000000000\"", "null", "[]", "{}", "true", "1800000000000000",
        ])
    func hostileTimestamp(value: String) {
        #expect(
            apns(410, #"{"reason":"Unregistered","timestamp":\#(value)}"#)
                == .retireToken(reason: "Unregistered", unregisteredAt: nil))
    }

    @Test("a 410's timestamp in range is kept, fractions included")
    func saneTimestamp() {
        #expect(
            apns(410, #"{"reason":"Unregistered","timestamp":1700000000000}"#)
                == .retireToken(reason: "Unregistered", unregisteredAt: Date(timeIntervalSince1970: 1_700_000_000)))
        #expect(
            apns(410, #"{"reason":"Unregistered","timestamp":1700000000500.5}"#)
                == .retireToken(reason: "Unregistered", unregisteredAt: Date(timeIntervalSince1970: 1_700_000_000.5005))
        )
        // The Int64 entry point goes through the same range check.
        #expect(
            APNsReason.decide(status: 410, reason: .unregistered, timestamp: .max, apnsID: nil, retryAfter: nil)
                == .retireToken(reason: "Unregistered", unregisteredAt: nil))
    }

    @Test("reasons from a body are stored only when short and plain; apns-id only when short")
    func reasonText() {
        #expect(apns(400, #"{"reason":"\#(String(repeating: "A", count: 500))"}"#) == .fail(reason: "unreadable"))
        #expect(apns(400, #"{"reason":"10.0.0.1:22 refused"}"#) == .fail(reason: "unreadable"))
        #expect(apns(400, #"{"reason":"SomethingNew"}"#) == .fail(reason: "SomethingNew"))
        #expect(apns(400, "not json") == .fail(reason: "HTTP 400"))
        let long = APNsReason.decide(
            status: 200, body: [], apnsID: String(repeating: "x", count: 1000), retryAfter: nil, now: now)
        #expect(long == .sent(providerID: nil))
        let fcm = FCMErrorCode.decide(
            status: 400, body: Array(#"{"error":{"status":"<script>"}}"#.utf8), retryAfter: nil, now: now)
        #expect(fcm == .fail(reason: "unreadable"))
    }

    @Test("identifiers of sent pushes (FCM name, apns-id, apns-unique-id) are stored only when short and visible ASCII")
    func identifiers() {
        let name = "projects/p-1/messages/0:1500415314455276%31bd1c9631bd1c96"
        func fcm(_ json: String) -> DeliveryDecision {
            FCMErrorCode.decide(status: 200, body: Array(json.utf8), retryAfter: nil, now: now)
        }
        #expect(fcm(#"{"name":"\#(name)"}"#) == .sent(providerID: name))
        // JSON decodes \u0000 to a NUL, which would cut the text[] parameter the record statement binds it in.
        #expect(fcm(#"{"name":"projects/p/messages/1\u0000x"}"#) == .sent(providerID: nil))
        #expect(fcm(#"{"name":"a\nb"}"#) == .sent(providerID: nil))
        #expect(fcm(#"{"name":"caf\u00e9"}"#) == .sent(providerID: nil))
        #expect(fcm(#"{"name":"with space"}"#) == .sent(providerID: nil))
        #expect(fcm(#"{"name":""}"#) == .sent(providerID: nil))
        #expect(fcm(#"{"name":"\#(String(repeating: "x", count: 257))"}"#) == .sent(providerID: nil))
        let longest = String(repeating: "x", count: 256)
        #expect(fcm(#"{"name":"\#(longest)"}"#) == .sent(providerID: longest))
        func apns(id: String?) -> DeliveryDecision {
            APNsReason.decide(status: 200, body: [], apnsID: id, retryAfter: nil, now: now)
        }
        let uuid = "8c1b8d1e-7f5e-4d5a-9c55-0b1a2b3c4d5e"
        #expect(apns(id: uuid) == .sent(providerID: uuid))
        #expect(apns(id: uuid + "\u{0}") == .sent(providerID: nil))
        #expect(apns(id: "a\r\nb") == .sent(providerID: nil))
        #expect(
            APNsReason.decide(status: 200, reason: nil, timestamp: nil, apnsID: "x\u{0}", retryAfter: nil)
                == .sent(providerID: nil))
    }

    @Test(
        "expires_in: clamped to 10 minutes … a day; missing or odd values mean an hour",
        arguments: [
            ("1e17", 86_400.0), ("-5", 600), ("0", 600), ("3599", 3599), ("\"3600\"", 3600), ("null", 3600),
            ("1e308", 86_400), ("-1e308", 600),
        ] as [(String, Double)])
    func tokenLifetime(value: String, expected: Double) throws {
        let body = Array(#"{"access_token":"ya29.x","expires_in":\#(value)}"#.utf8)
        #expect(
            OAuthTokenAnswer.decide(status: 200, body: body, retryAfter: nil, now: now)
                == .token("ya29.x", lifetime: expected))
    }

    @Test("token endpoint: 429, 5xx and 408 are retried (with a clamped Retry-After), never a broken credential")
    func tokenEndpointPassing() {
        for status in [429, 500, 502, 503, 504, 408] {
            let answer = OAuthTokenAnswer.decide(
                status: status, body: Array(#"{"error":"rate_limited"}"#.utf8), retryAfter: "1e16", now: now)
            #expect(answer == .failed(.retry(reason: "oauth_unavailable", retryAfter: .seconds(3600))))
        }
        // A 200 without a token is not a rejection of the account either.
        #expect(
            OAuthTokenAnswer.decide(status: 200, body: Array("{}".utf8), retryAfter: nil, now: now)
                == .failed(.retry(reason: "oauth_unavailable", retryAfter: nil)))
    }

    @Test(
        "token endpoint: only an RFC 6750 b64token is used as a bearer token (no CR/LF into a header, no spaces)",
        arguments: [
            ("ya29.a0AfB_byC-x~y+z/w==", true), ("abc", true), ("abc\r\nx-injected: 1", false), ("a b", false),
            ("=", false), ("abc=def", false), ("tok\u{0}en", false), ("ünï", false), ("", false),
        ] as [(String, Bool)])
    func bearerTokenCharacters(token: String, usable: Bool) {
        // Escaped as JSON: what arrives is a well-formed answer carrying these characters.
        let body = Array(
            JSONValue.object(["access_token": .string(token), "expires_in": .int(3600)]).serialized().utf8)
        let answer = OAuthTokenAnswer.decide(status: 200, body: body, retryAfter: nil, now: now)
        if usable {
            #expect(answer == .token(token, lifetime: 3600))
        } else {
            #expect(answer == .failed(.retry(reason: "oauth_unavailable", retryAfter: nil)))
        }
    }

    @Test("token endpoint: a definite rejection breaks the credential, with a fixed reason")
    func tokenEndpointRejected() {
        func decide(_ status: Int, _ body: String) -> OAuthTokenAnswer {
            OAuthTokenAnswer.decide(status: status, body: Array(body.utf8), retryAfter: nil, now: now)
        }
        #expect(decide(400, #"{"error":"invalid_grant"}"#) == .failed(.credentialBroken(reason: "oauth_invalid_grant")))
        #expect(
            decide(401, #"{"error":"invalid_client"}"#) == .failed(.credentialBroken(reason: "oauth_invalid_client")))
        #expect(decide(400, #"{"error":"<b>anything</b>"}"#) == .failed(.credentialBroken(reason: "oauth_rejected")))
        #expect(decide(403, "") == .failed(.credentialBroken(reason: "oauth_rejected")))
    }
}

@Suite("A wrong clock is the operator's, never the tenant's credential")
struct ClockSkewTests {
    /// `now` is Fri, 15 Jan 2027 08:00:00 GMT.
    let now = Date(timeIntervalSince1970: 1_800_000_000)
    let tenMinutesAhead = "Fri, 15 Jan 2027 08:10:00 GMT"
    /// Google's answer to an assertion whose `iat` is off by more than its leeway.
    let google = #"""
        {"error":"invalid_grant","error_description":"Invalid JWT: Token must be a short-lived token (60 minutes) \#
        and in a reasonable timeframe. Check your iat and exp values in the JWT claim."}
        """#

    @Test("the provider's Date header against this host's clock: a skew only past a minute; garbage is ignored")
    func skew() {
        #expect(ProviderNumbers.clockSkew(date: tenMinutesAhead, now: now) == 600)
        #expect(ProviderNumbers.clockSkew(date: "Fri, 15 Jan 2027 07:50:00 GMT", now: now) == -600)
        #expect(ProviderNumbers.clockSkew(date: "Fri, 15 Jan 2027 08:00:30 GMT", now: now) == nil)
        #expect(ProviderNumbers.clockSkew(date: "Fri, 15 Jan 2027 07:59:30 GMT", now: now) == nil)
        for garbage in [nil, "", "yesterday", "1800000600", String(repeating: "Fri, ", count: 40)] {
            #expect(ProviderNumbers.clockSkew(date: garbage, now: now) == nil)
        }
    }

    @Test("token endpoint: 400 invalid_grant about iat/exp, or while its Date is 10 minutes off, is retried")
    func tokenEndpoint() {
        func decide(_ body: String, date: String?, status: Int = 400) -> OAuthTokenAnswer {
            OAuthTokenAnswer.decide(status: status, body: Array(body.utf8), retryAfter: nil, date: date, now: now)
        }
        let clock = OAuthTokenAnswer.failed(.retry(reason: "clock_skew", retryAfter: nil))
        #expect(decide(google, date: tenMinutesAhead) == clock)
        #expect(decide(google, date: nil) == clock, "the wording alone: this host signs iat with its own clock")
        #expect(decide(google, date: tenMinutesAhead, status: 401) == clock)
        let signature = #"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#
        #expect(decide(signature, date: tenMinutesAhead) == clock, "while the clocks disagree, nothing is blamed")
        // Clocks that agree (or say nothing): a rejection is the credential's.
        let broken = OAuthTokenAnswer.failed(.credentialBroken(reason: "oauth_invalid_grant"))
        #expect(decide(signature, date: "Fri, 15 Jan 2027 08:00:05 GMT") == broken)
        #expect(decide(signature, date: nil) == broken)
        #expect(
            decide(#"{"error":"invalid_grant","error_description":"associated account deleted"}"#, date: nil) == broken)
        #expect(
            decide(#"{"error":"invalid_client"}"#, date: tenMinutesAhead)
                == .failed(.credentialBroken(reason: "oauth_invalid_client")))
    }

    @Test("APNs: a provider token refused while APNs' Date is 10 minutes off is retried, never a broken credential")
    func apns() {
        func decide(_ reason: String, date: String?) -> DeliveryDecision {
            APNsReason.decide(
                status: 403, body: Array(#"{"reason":"\#(reason)"}"#.utf8), apnsID: nil, retryAfter: nil, date: date,
                now: now)
        }
        let clock = DeliveryDecision.retry(reason: "clock_skew", retryAfter: nil)
        #expect(decide("ExpiredProviderToken", date: tenMinutesAhead) == clock)
        #expect(decide("InvalidProviderToken", date: tenMinutesAhead) == clock)
        #expect(decide("ExpiredProviderToken", date: nil) == .refreshProviderToken(reason: "ExpiredProviderToken"))
        #expect(decide("InvalidProviderToken", date: nil) == .credentialBroken(reason: "InvalidProviderToken"))
        #expect(
            decide("InvalidProviderToken", date: "Fri, 15 Jan 2027 08:00:05 GMT")
                == .credentialBroken(reason: "InvalidProviderToken"))
        // Not about the token's time: the credential's, whatever the clocks say.
        #expect(decide("BadCertificate", date: tenMinutesAhead) == .credentialBroken(reason: "BadCertificate"))
        #expect(DeliveryReason.metricLabel("clock_skew") == "clock_skew")
    }
}

@Suite("MARQUEE_PROVIDER_HOSTS: where tenants' endpoints may point")
struct ProviderHostsTests {
    @Test("the default is Apple's and Google's hosts, on any port, https only")
    func defaults() {
        let hosts = ProviderHosts.standard
        #expect(hosts.check(url: "https://api.push.apple.com") == nil)
        #expect(hosts.check(url: "https://api.sandbox.push.apple.com:443") == nil)
        #expect(hosts.check(url: "https://fcm.googleapis.com") == nil)
        #expect(hosts.check(url: "https://oauth2.googleapis.com/token") == nil)
        #expect(hosts.check(url: "https://FCM.googleapis.com.") == nil)
        #expect(hosts.check(url: "http://api.push.apple.com") == .notHTTPS)
        #expect(hosts.check(url: "https://127.0.0.1:5432") == .hostNotAllowed)
        #expect(hosts.check(url: "https://169.254.169.254/latest") == .hostNotAllowed)
        #expect(hosts.check(url: "https://api.push.apple.com.evil.test") == .hostNotAllowed)
        #expect(hosts.check(url: "https://user@api.push.apple.com") == .notHTTPS)
        #expect(hosts.requiresPublicAddress(host: "api.push.apple.com"))
    }

    @Test("entries are host or host:port; a port entry allows only that port")
    func parse() throws {
        let hosts = try #require(ProviderHosts(" 127.0.0.1:2197 , push.internal, [::1]:8443,fe80::1"))
        #expect(hosts.allows(host: "127.0.0.1", port: 2197))
        #expect(!hosts.allows(host: "127.0.0.1", port: 2198))
        #expect(hosts.allows(host: "PUSH.internal", port: 1))
        #expect(hosts.allows(host: "::1", port: 8443))
        #expect(hosts.allows(host: "[::1]", port: 8443))
        #expect(hosts.allows(host: "fe80::1", port: 443))
        #expect(!hosts.allows(host: "api.push.apple.com", port: 443))
        #expect(!hosts.requiresPublicAddress(host: "127.0.0.1"))
        #expect(hosts.description == "127.0.0.1:2197,push.internal,[::1]:8443,fe80::1")
        #expect(ProviderHosts("a.test:99999") == nil)
        #expect(ProviderHosts("a test") == nil)
        #expect(ProviderHosts("https://a.test") == nil)
        #expect(ProviderHosts(" , ") == nil)
    }

    @Test("the configuration reads MARQUEE_PROVIDER_HOSTS and names it when malformed")
    func configuration() throws {
        #expect(try MarqueeConfiguration(environment: [:]).providerHosts == .standard)
        let set = try MarqueeConfiguration(environment: ["MARQUEE_PROVIDER_HOSTS": "127.0.0.1:2197"])
        #expect(set.providerHosts.entries == [.init(host: "127.0.0.1", port: 2197)])
        #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_PROVIDER_HOSTS": "bad host"])
        }
    }
}

@Suite("APNs priority")
struct APNsPriorityTests {
    @Test("an alert allows 10 (the default); without one, 5 unless the type declares frequent_updates")
    func rule() {
        let alert = LiveActivityAlert(title: "T", body: "B")
        let cases: [(LiveActivityAlert?, Int?, Bool, Int)] = [
            (alert, nil, false, 10), (alert, 5, false, 5), (alert, 10, false, 10),
            (nil, nil, false, 5), (nil, 10, false, 5), (nil, 5, false, 5),
            (nil, nil, true, 5), (nil, 10, true, 10), (alert, nil, true, 10),
        ]
        for (a, requested, frequent, expected) in cases {
            let options = StoredOptions(alert: a, priority: requested)
            #expect(
                options.apnsPriority(frequentUpdates: frequent) == expected,
                "\(a != nil) \(String(describing: requested)) \(frequent)")
        }
    }
}
