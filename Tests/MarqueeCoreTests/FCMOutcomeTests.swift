import Foundation
import Testing

@testable import MarqueeCore

@Suite("FCM answers are classified on purpose")
struct FCMOutcomeTests {
    /// An FCM v1 error body: `{"error": {"code", "message", "status", "details": [{"@type", "errorCode"}, …]}}`.
    static func error(
        _ code: Int, status: String?, errorCode: String? = nil, message: String = "an error",
        fieldViolations: [String] = []
    ) -> JSONValue {
        var error: [String: JSONValue] = ["code": .int(Int64(code)), "message": .string(message)]
        if let status { error["status"] = .string(status) }
        var details: [JSONValue] = []
        if let errorCode {
            details.append(
                .object([
                    "@type": .string("type.googleapis.com/google.firebase.fcm.v1.FcmError"),
                    "errorCode": .string(errorCode),
                ]))
        }
        if !fieldViolations.isEmpty {
            details.append(
                .object([
                    "@type": .string("type.googleapis.com/google.rpc.BadRequest"),
                    "fieldViolations": .array(
                        fieldViolations.map { .object(["field": .string($0), "description": .string("bad")]) }),
                ]))
        }
        if !details.isEmpty { error["details"] = .array(details) }
        return .object(["error": .object(error)])
    }

    func decide(_ status: Int, _ body: JSONValue?, retryAfter: Duration? = nil) -> DeliveryDecision {
        FCMErrorCode.decide(status: status, body: body, retryAfter: retryAfter)
    }

    @Test("200 is sent with the message name")
    func sent() {
        let name = "projects/p/messages/0:1700000000000%abc"
        #expect(decide(200, .object(["name": .string(name)])) == .sent(providerID: name))
        #expect(decide(200, nil) == .sent(providerID: nil))
    }

    @Test(
        "UNREGISTERED retires the token; SENDER_ID_MISMATCH breaks the credential; the FcmError code wins over error.status"
    )
    func retire() {
        #expect(
            decide(404, Self.error(404, status: "NOT_FOUND", errorCode: "UNREGISTERED"))
                == .retireToken(reason: "UNREGISTERED", unregisteredAt: nil))
        // A service account of another Firebase project: the credential is wrong, not every device's token.
        #expect(
            decide(403, Self.error(403, status: "PERMISSION_DENIED", errorCode: "SENDER_ID_MISMATCH"))
                == .credentialBroken(reason: "SENDER_ID_MISMATCH"))
        // Once the credential has delivered, the token is another project's (one registered with the public sdk key).
        #expect(
            FCMErrorCode.decide(
                status: 403, body: Self.error(403, status: "PERMISSION_DENIED", errorCode: "SENDER_ID_MISMATCH"),
                retryAfter: nil, credentialProven: true)
                == .retireToken(reason: "SENDER_ID_MISMATCH", unregisteredAt: nil))
        // Without the detail, the same 403 is about the credential, not the token.
        #expect(
            decide(403, Self.error(403, status: "PERMISSION_DENIED")) == .credentialBroken(reason: "PERMISSION_DENIED"))
    }

    @Test("INVALID_ARGUMENT retires the token only when it names the registration token")
    func invalidArgument() {
        let byMessage = Self.error(
            400, status: "INVALID_ARGUMENT", errorCode: "INVALID_ARGUMENT",
            message: "The registration token is not a valid FCM registration token")
        #expect(decide(400, byMessage) == .retireToken(reason: "INVALID_ARGUMENT", unregisteredAt: nil))
        let byField = Self.error(
            400, status: "INVALID_ARGUMENT", message: "Invalid value", fieldViolations: ["message.token"])
        #expect(decide(400, byField) == .retireToken(reason: "INVALID_ARGUMENT", unregisteredAt: nil))

        let aboutData = Self.error(
            400, status: "INVALID_ARGUMENT", errorCode: "INVALID_ARGUMENT",
            message: "Invalid value at 'message.data[0].value' (TYPE_STRING)",
            fieldViolations: ["message.data[0].value"])
        #expect(decide(400, aboutData) == .fail(reason: "INVALID_ARGUMENT"))
        let aboutTTL = Self.error(
            400, status: "INVALID_ARGUMENT", message: "Invalid value at 'message.android.ttl'",
            fieldViolations: ["message.android.ttl"])
        #expect(decide(400, aboutTTL) == .fail(reason: "INVALID_ARGUMENT"))
    }

    @Test("QUOTA_EXCEEDED, UNAVAILABLE and INTERNAL are retried, honouring Retry-After")
    func retried() {
        #expect(
            decide(
                429, Self.error(429, status: "RESOURCE_EXHAUSTED", errorCode: "QUOTA_EXCEEDED"), retryAfter: .seconds(7)
            )
                == .retry(reason: "QUOTA_EXCEEDED", retryAfter: .seconds(7)))
        // RESOURCE_EXHAUSTED alone (no FcmError detail) is the same quota problem.
        #expect(
            decide(429, Self.error(429, status: "RESOURCE_EXHAUSTED"))
                == .retry(reason: "QUOTA_EXCEEDED", retryAfter: nil))
        #expect(
            decide(503, Self.error(503, status: "UNAVAILABLE", errorCode: "UNAVAILABLE"), retryAfter: .seconds(2))
                == .retry(reason: "UNAVAILABLE", retryAfter: .seconds(2)))
        #expect(
            decide(500, Self.error(500, status: "INTERNAL", errorCode: "INTERNAL"))
                == .retry(reason: "INTERNAL", retryAfter: nil))
    }

    @Test("401 UNAUTHENTICATED asks for a fresh access token; PERMISSION_DENIED breaks the credential")
    func authentication() {
        #expect(
            decide(401, Self.error(401, status: "UNAUTHENTICATED"))
                == .refreshProviderToken(reason: "UNAUTHENTICATED"))
        // THIRD_PARTY_AUTH_ERROR is about the APNs/web-push credentials in Firebase, not the service account: failed.
        #expect(
            decide(401, Self.error(401, status: "UNAUTHENTICATED", errorCode: "THIRD_PARTY_AUTH_ERROR"))
                == .fail(reason: "THIRD_PARTY_AUTH_ERROR"))
        #expect(
            decide(403, Self.error(403, status: "PERMISSION_DENIED")) == .credentialBroken(reason: "PERMISSION_DENIED"))
    }

    @Test("unknown codes and bare statuses fall back on the HTTP status")
    func fallback() {
        #expect(decide(404, Self.error(404, status: "NOT_FOUND")) == .fail(reason: "NOT_FOUND"))
        #expect(decide(400, Self.error(400, status: "FAILED_PRECONDITION")) == .fail(reason: "FAILED_PRECONDITION"))
        #expect(decide(401, nil) == .refreshProviderToken(reason: "HTTP 401"))
        #expect(decide(429, nil, retryAfter: .seconds(3)) == .retry(reason: "HTTP 429", retryAfter: .seconds(3)))
        #expect(decide(502, nil) == .retry(reason: "HTTP 502", retryAfter: nil))
        #expect(
            decide(504, Self.error(504, status: "DEADLINE_EXCEEDED"))
                == .retry(reason: "DEADLINE_EXCEEDED", retryAfter: nil))
        #expect(decide(413, nil) == .fail(reason: "HTTP 413"))
    }

    @Test("codes parse and print as FCM spells them")
    func spelling() {
        for text in [
            "UNREGISTERED", "SENDER_ID_MISMATCH", "INVALID_ARGUMENT", "QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL",
            "THIRD_PARTY_AUTH_ERROR", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND", "SOMETHING_NEW",
        ] {
            #expect(FCMErrorCode(text).description == text)
        }
        #expect(FCMErrorCode("RESOURCE_EXHAUSTED") == .quotaExceeded)
        #expect(FCMErrorCode("SOMETHING_NEW") == .unknown("SOMETHING_NEW"))
    }
}
