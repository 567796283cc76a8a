import Foundation
import Testing

@testable import MarqueeCore

@Suite("APNs answers are classified on purpose")
struct DeliveryDecisionTests {
    func decide(_ status: Int, _ reason: String?, timestamp: Int64? = nil, retryAfter: Duration? = nil)
        -> DeliveryDecision
    {
        APNsReason.decide(
            status: status, reason: reason.map(APNsReason.init), timestamp: timestamp, apnsID: "id",
            retryAfter: retryAfter)
    }

    @Test("200 is sent with the apns-id")
    func sent() {
        #expect(decide(200, nil) == .sent(providerID: "id"))
    }

    @Test("dead tokens are retired, never retried; a 410 carries when APNs saw the token die")
    func retire() {
        #expect(decide(400, "BadDeviceToken") == .retireToken(reason: "BadDeviceToken", unregisteredAt: nil))
        #expect(
            decide(400, "DeviceTokenNotForTopic") == .retireToken(reason: "DeviceTokenNotForTopic", unregisteredAt: nil)
        )
        #expect(
            decide(410, "Unregistered", timestamp: 1_700_000_000_000)
                == .retireToken(reason: "Unregistered", unregisteredAt: Date(timeIntervalSince1970: 1_700_000_000)))
        #expect(decide(410, "ExpiredToken") == .retireToken(reason: "ExpiredToken", unregisteredAt: nil))
    }

    @Test("a broadcast's gone channel (ChannelNotRegistered, BadChannelId) is never retried; its 429/5xx are")
    func broadcastChannel() {
        for status in [400, 404, 410] {
            #expect(
                decide(status, "ChannelNotRegistered")
                    == .retireToken(reason: "ChannelNotRegistered", unregisteredAt: nil))
        }
        #expect(decide(400, "BadChannelId") == .retireToken(reason: "BadChannelId", unregisteredAt: nil))
        #expect(decide(429, "TooManyRequests") == .retry(reason: "TooManyRequests", retryAfter: nil))
        #expect(decide(400, "BadExpirationDate") == .fail(reason: "BadExpirationDate"))
    }

    @Test("the broadcast rule: iOS 18 and later subscribe to channels; an unknown version counts as able")
    func broadcastSupport() {
        for version in ["18.0", "18.1.1", "26.0", "iOS 18.2", "", "unknown"] {
            #expect(BroadcastSupport.supportsChannels(osVersion: version), "\(version)")
        }
        #expect(BroadcastSupport.supportsChannels(osVersion: nil))
        for version in ["17.5", "17.2.1", "iOS 17.4", "16"] {
            #expect(!BroadcastSupport.supportsChannels(osVersion: version), "\(version)")
        }
    }

    @Test("429 and 5xx retry, honouring Retry-After")
    func retry() {
        #expect(
            decide(429, "TooManyRequests", retryAfter: .seconds(30))
                == .retry(reason: "TooManyRequests", retryAfter: .seconds(30)))
        #expect(decide(503, "ServiceUnavailable") == .retry(reason: "ServiceUnavailable", retryAfter: nil))
        #expect(decide(500, "InternalServerError") == .retry(reason: "InternalServerError", retryAfter: nil))
        #expect(decide(502, nil) == .retry(reason: "HTTP 502", retryAfter: nil))
    }

    @Test("403: an expired provider token is refreshed; any other 403 breaks the credential")
    func auth() {
        #expect(decide(403, "ExpiredProviderToken") == .refreshProviderToken(reason: "ExpiredProviderToken"))
        #expect(decide(403, "InvalidProviderToken") == .credentialBroken(reason: "InvalidProviderToken"))
        #expect(decide(403, "BadCertificateEnvironment") == .credentialBroken(reason: "BadCertificateEnvironment"))
    }

    @Test(
        "a channel of another app or environment than the credential's: its starts fail, and a 403 on it fails that request alone"
    )
    func channelReach() {
        func reach(_ bundle: String, _ environment: String) -> ChannelReach {
            ChannelReach(
                channelBundleID: bundle, channelEnvironment: environment, credentialBundleID: "com.a",
                credentialEnvironment: "production")
        }
        #expect(reach("com.a", "production") == .reachable)
        #expect(reach("com.a", "sandbox") == .otherEnvironment)
        #expect(reach("com.b", "production") == .otherApp)
        #expect(reach("com.b", "sandbox") == .otherApp, "the app first")
        #expect(ChannelReach.reachable.failureReason == nil)
        #expect(ChannelReach.otherEnvironment.failureReason == "channel_other_environment")
        #expect(ChannelReach.otherApp.failureReason == "channel_other_app")

        let refused = SendOutcome(decide(403, "InvalidProviderToken"), httpStatus: 403)
        #expect(ChannelReach.reachable.judged(refused) == refused, "the credential's own: the key is broken")
        #expect(
            ChannelReach.otherEnvironment.judged(refused)
                == SendOutcome(.fail(reason: "channel_other_environment"), httpStatus: 403))
        #expect(
            ChannelReach.otherApp.judged(refused) == SendOutcome(.fail(reason: "channel_other_app"), httpStatus: 403))
        // Nothing else changes: an expired token is refreshed, a broken endpoint is the credential's.
        for outcome in [
            SendOutcome(decide(403, "ExpiredProviderToken"), httpStatus: 403),
            SendOutcome(.credentialBroken(reason: "endpoint_not_allowed")),
            SendOutcome(decide(404, "ChannelNotRegistered"), httpStatus: 404),
            SendOutcome(decide(200, nil), httpStatus: 200),
        ] {
            #expect(ChannelReach.otherApp.judged(outcome) == outcome)
        }

        // Channel management: the same 403 is outOfReach, on a channel out of reach only.
        let key = ChannelManagementError(.refused(status: 403, reason: "InvalidProviderToken"))
        #expect(ChannelReach.reachable.judged(key) == key)
        #expect(
            ChannelReach.otherEnvironment.judged(key).code
                == .outOfReach(.otherEnvironment, reason: "InvalidProviderToken"))
        for error in [
            ChannelManagementError(.refused(status: 403, reason: "ExpiredProviderToken")),
            ChannelManagementError(.refused(status: 400, reason: "TopicDisallowed")),
            ChannelManagementError(.unreachable(reason: "timeout")), ChannelManagementError(.channelNotFound),
        ] {
            #expect(ChannelReach.otherApp.judged(error) == error)
        }
        #expect(DeliveryReason.metricLabel("channel_other_app") == "channel_other_app")
        #expect(DeliveryReason.metricLabel("channel_other_environment") == "channel_other_environment")
    }

    @Test("other 4xx fail with the reason, including unknown reasons")
    func fail() {
        #expect(decide(400, "BadTopic") == .fail(reason: "BadTopic"))
        #expect(decide(413, "PayloadTooLarge") == .fail(reason: "PayloadTooLarge"))
        #expect(decide(400, "SomethingNew") == .fail(reason: "SomethingNew"))
        #expect(APNsReason("SomethingNew") == .unknown("SomethingNew"))
        #expect(APNsReason("BadMessageId").description == "BadMessageId")
    }
}

@Suite("Retry policy")
struct RetryPolicyTests {
    @Test("delays grow exponentially within [ceiling/2, ceiling], capped, and stop after the last attempt")
    func growth() throws {
        let policy = RetryPolicy(maxAttempts: 10, initialDelay: .seconds(8), maximumDelay: .seconds(1200))
        let low = try #require(policy.delay(afterAttempts: 1, retryAfter: nil, random: { 0 }))
        let high = try #require(policy.delay(afterAttempts: 1, retryAfter: nil, random: { 1 }))
        #expect(low == .seconds(4))
        #expect(high == .seconds(8))
        #expect(policy.delay(afterAttempts: 4, retryAfter: nil, random: { 1 }) == .seconds(64))
        #expect(policy.delay(afterAttempts: 9, retryAfter: nil, random: { 1 }) == .seconds(1200))
        #expect(policy.delay(afterAttempts: 10, retryAfter: nil) == nil)
        // The worker's own shutdown never spends the last attempt; a provider's answer does.
        #expect(policy.delay(afterAttempts: 10, retryAfter: nil, reason: "shutdown", random: { 1 }) == .seconds(1200))
        #expect(policy.delay(afterAttempts: 10, retryAfter: nil, reason: "ServiceUnavailable") == nil)
        var total = 0.0
        for attempt in 1..<10 {
            let d = policy.delay(afterAttempts: attempt, retryAfter: nil, random: { 1 })!
            total += Double(d.components.seconds)
        }
        #expect(total > 2400 && total < 3600, "about an hour at most: \(total) s")
    }

    @Test("the worker's own retries and parks spend no attempt: the budget and backoff go by the counted ones")
    func uncountedAttempts() {
        let policy = RetryPolicy(maxAttempts: 10, initialDelay: .seconds(8), maximumDelay: .seconds(1200))
        #expect(!RetryPolicy.spendsBudget(.queued, reason: "credential_load"))
        #expect(!RetryPolicy.spendsBudget(.queued, reason: "shutdown"))
        #expect(!RetryPolicy.spendsBudget(.parked, reason: "InvalidProviderToken"))
        #expect(RetryPolicy.spendsBudget(.queued, reason: "ServiceUnavailable"))
        #expect(RetryPolicy.spendsBudget(.queued, reason: nil))
        #expect(RetryPolicy.spendsBudget(.failed, reason: "BadTopic"))
        // The 11th attempt, the first 503 after ten credential loads: retried, backed off as a first retry.
        #expect(
            policy.delay(afterAttempts: 11, counted: 1, retryAfter: nil, reason: "ServiceUnavailable", random: { 1 })
                == .seconds(8))
        #expect(policy.delay(afterAttempts: 20, counted: 10, retryAfter: nil, reason: "ServiceUnavailable") == nil)
        // An uncounted retry backs off by every attempt.
        #expect(
            policy.delay(afterAttempts: 5, counted: 1, retryAfter: nil, reason: "credential_load", random: { 1 })
                == .seconds(128))
    }

    @Test("a provider cannot word its answer as the worker's own reason: a 503 'shutdown' still gives up")
    func providerCannotSpendNoAttempt() {
        let policy = RetryPolicy(maxAttempts: 10)
        for own in ["shutdown", "credential_load", "deadline", "clock_skew", "oauth_unavailable"] {
            let apns = APNsReason.decide(
                status: 503, body: Array(#"{"reason":"\#(own)"}"#.utf8), apnsID: nil, retryAfter: nil)
            #expect(apns == .retry(reason: "unreadable", retryAfter: nil), "\(own)")
            let fcm = FCMErrorCode.decide(
                status: 503, body: Array(#"{"error":{"status":"\#(own)"}}"#.utf8), retryAfter: nil)
            #expect(fcm == .retry(reason: "unreadable", retryAfter: nil), "\(own)")
            guard case .retry(let reason, let after) = apns else { continue }
            #expect(policy.delay(afterAttempts: 10, retryAfter: after, reason: reason) == nil, "\(own): gives up")
        }
        // Apple's own "Shutdown" (a server going down) is Apple's reason, retried and counted.
        #expect(
            APNsReason.decide(status: 503, body: Array(#"{"reason":"Shutdown"}"#.utf8), apnsID: nil, retryAfter: nil)
                == .retry(reason: "Shutdown", retryAfter: nil))
        #expect(policy.delay(afterAttempts: 10, retryAfter: nil, reason: "Shutdown") == nil)
    }

    @Test("Retry-After is a floor")
    func retryAfter() {
        let policy = RetryPolicy(initialDelay: .seconds(1))
        #expect(policy.delay(afterAttempts: 1, retryAfter: .seconds(120), random: { 1 }) == .seconds(120))
        #expect(policy.delay(afterAttempts: 1, retryAfter: .milliseconds(10), random: { 1 }) == .seconds(1))
    }
}

@Suite("Reasons as metric labels")
struct DeliveryReasonLabelTests {
    @Test("provider-chosen reasons label metrics only from a fixed vocabulary; anything else is other")
    func metricLabels() {
        let label = DeliveryReason.metricLabel
        #expect(label(nil) == "")
        for known in [
            "BadDeviceToken", "TooManyRequests", "UNREGISTERED", "QUOTA_EXCEEDED", "deadline", "transport_error",
        ] {
            #expect(label(known) == known)
        }
        #expect(label("RESOURCE_EXHAUSTED") == "QUOTA_EXCEEDED")
        #expect(label("oauth_invalid_grant") == "oauth_invalid_grant")
        #expect(label("oauth_unavailable") == "oauth_unavailable")
        // What a tenant's endpoint makes up (already safe text, but unbounded in number) is other.
        for made in ["SomethingNew", "x1", "Zz-9.a", "oauth_whatever", "HTTP 999", "HTTP 4000", "HTTP 04x"] {
            #expect(label(made) == "other", "\(made)")
        }
        #expect(label("HTTP 418") == "HTTP 4xx")
        #expect(label("HTTP 503") == "HTTP 5xx")
        #expect(label("UNAUTHENTICATED twice") == "UNAUTHENTICATED twice")
        #expect(label("Made-Up twice") == "other")
        #expect(label("signing failed: badKey") == "signing failed")
        // The transport failures' reasons are the worker's own (`TransportFailure`), labelled as themselves.
        for transport in ["timeout", "tls_error", "transport_error", "endpoint_not_allowed", "clock_skew", "shutdown"] {
            #expect(label(transport) == transport)
        }
        #expect(label(DeliveryReason.gaveUp(after: 10, "TooManyRequests")) == "gave up: TooManyRequests")
        #expect(label(DeliveryReason.gaveUp(after: 7, "Made-Up")) == "gave up: other")
        #expect(DeliveryReason.gaveUp(after: 10, "deadline") == "gave up after 10 attempts: deadline")
    }
}
