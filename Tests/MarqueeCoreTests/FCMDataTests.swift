import Foundation
import Testing

@testable import MarqueeCore

@Suite("FCM data and message")
struct FCMDataTests {
    @Test("flattened values: strings verbatim, shortest numbers, true/false, JSON for containers, nulls left out")
    func flattening() {
        #expect(FCMData.flatString(.string("a \"b\"")) == "a \"b\"")
        #expect(FCMData.flatString(.double(0.95)) == "0.95")
        #expect(FCMData.flatString(.double(1.0)) == "1")
        #expect(FCMData.flatString(.int(-3)) == "-3")
        #expect(FCMData.flatString(.bool(true)) == "true")
        #expect(FCMData.flatString(.bool(false)) == "false")
        #expect(FCMData.flatString(.array([.int(1), .string("x")])) == #"[1,"x"]"#)
        #expect(FCMData.flatString(.object(["b": .int(1), "a": .null])) == #"{"a":null,"b":1}"#)
        #expect(FCMData.flatString(.null) == nil)

        var content = PayloadFixtures.content(.capacitor, .update)
        content.contentState = .object(["gone": .null, "event": .string("team field"), "n": .double(2.5)])
        let data = FCMData.compose(content, attribution: PayloadFixtures.attribution)
        #expect(data["gone"] == nil)
        #expect(data["n"] == "2.5")
        #expect(data["event"] == "update", "envelope keys win over state fields")
        #expect(data["liveActivityId"] == "order-1234")
    }

    @Test("capacitor state fields FCM reserves are refused at request time")
    func reservedKeys() throws {
        var content = PayloadFixtures.content(.capacitor, .update)
        try FCMData.checkKeys(content)
        for key in ["from", "message_type", "google.sent_time", "gcmKey", "Google"] {
            content.contentState = .object([key: .string("x")])
            let error = #expect(throws: ValidationError.self) { try FCMData.checkKeys(content) }
            #expect(error?.field == "content_state/\(key)")
        }
        // Other profiles nest the state, so the same field is fine there.
        var marquee = PayloadFixtures.content(.marquee, .update)
        marquee.contentState = .object(["from": .string("x")])
        try FCMData.checkKeys(marquee)
    }

    @Test("size counts UTF-8 bytes of keys and values")
    func size() {
        #expect(FCMData.size(["ab": "cd", "é": "€"]) == 4 + 2 + 3)
    }

    @Test("message envelope: token, data, high priority, ttl in seconds, optional collapse key")
    func message() {
        let body = FCMMessage.body(token: "tok", data: ["a": "1"], ttlSeconds: 3600, collapseKey: "order-1234")
        #expect(
            body.serialized()
                == #"{"message":{"android":{"collapse_key":"order-1234","priority":"high","ttl":"3600s"},"#
                + #""data":{"a":"1"},"token":"tok"}}"#)
        let plain = FCMMessage.body(token: "tok", data: [:], ttlSeconds: -5)
        #expect(
            plain.serialized() == #"{"message":{"android":{"priority":"high","ttl":"0s"},"data":{},"token":"tok"}}"#)
    }
}
