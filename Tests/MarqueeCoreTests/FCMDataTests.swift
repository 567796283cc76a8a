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

    @Test("capacitor state fields FCM reserves are refused at request time, as the FCM simulator refuses them")
    func reservedKeys() throws {
        let state: [String: JSONValue] = ["title": .string("x")]
        try PayloadProfile.capacitor.checkContentState(.object(state))
        for key in [
            "from", "message_type", "collapse_key", "", "google.sent_time", "gcm_id", "gcmKey", "Google", "FROM",
        ] {
            let error = #expect(throws: ValidationError.self) {
                try PayloadProfile.capacitor.checkContentState(
                    .object(state.merging([key: .string("y")]) { a, _ in a }))
            }
            #expect(error?.field == "content_state" + JSONPointer(tokens: [key]).description)
            #expect(FCMData.isReservedKey(key))
        }
        // A null field is not sent, and a name that merely contains a reserved word is fine.
        try PayloadProfile.capacitor.checkContentState(.object(["title": .string("x"), "from": .null]))
        try PayloadProfile.capacitor.checkContentState(.object(["title": .string("x"), "sent_from": .string("y")]))
        // Other profiles nest the state, so the same field is fine there.
        try PayloadProfile.marquee.checkContentState(.object(["from": .string("x")]))
        try PayloadProfile.customerio.checkContentState(.object(["from": .string("x")]))
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

@Suite("FCM message lifetime")
struct FCMTTLTests {
    @Test(
        "ttl runs to the stale date or the expiry, whichever is sooner; an end to the expiry; never negative or > 28 days"
    )
    func ttl() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let hour = now.addingTimeInterval(3600)
        let day = now.addingTimeInterval(86_400)
        #expect(FCMMessage.ttlSeconds(event: .update, staleDate: nil, expiresAt: day, now: now) == 86_400)
        #expect(FCMMessage.ttlSeconds(event: .update, staleDate: hour, expiresAt: day, now: now) == 3600)
        #expect(FCMMessage.ttlSeconds(event: .start, staleDate: day, expiresAt: hour, now: now) == 3600)
        #expect(FCMMessage.ttlSeconds(event: .end, staleDate: hour, expiresAt: day, now: now) == 86_400)
        #expect(
            FCMMessage.ttlSeconds(event: .update, staleDate: now.addingTimeInterval(-5), expiresAt: day, now: now) == 0)
        #expect(
            FCMMessage.ttlSeconds(event: .update, staleDate: nil, expiresAt: now.addingTimeInterval(-1), now: now) == 0)
        #expect(
            FCMMessage.ttlSeconds(event: .update, staleDate: nil, expiresAt: now.addingTimeInterval(1e9), now: now)
                == FCMMessage.maximumTTLSeconds)
        #expect(
            FCMMessage.ttlSeconds(event: .update, staleDate: nil, expiresAt: now.addingTimeInterval(90.9), now: now)
                == 90)
        #expect(FCMMessage.collapseKey(instanceID: "order-42") == "order-42")
    }
}

@Suite("Progress convention (Android 16 ProgressStyle)")
struct ProgressConventionTests {
    @Test("parsed one to one and carried as progress_* data keys by the marquee profile")
    func mapping() throws {
        let state = try JSONValue.parse(
            ##"{"status":"cooking","progress":{"current":3,"max":10,"segments":[{"length":4,"color":"#3366ff"},{"length":6}],"points":[{"position":4,"color":"#FF0000"}]}}"##
        )
        let progress = try #require(try ProgressConvention.parse(state))
        #expect(progress.current == 3 && progress.max == 10)
        #expect(progress.segments.map { $0.length } == [4, 6])
        #expect(progress.points.first?.position == 4)
        let content = ActivityContent(
            event: .update, instanceID: "i", activityType: "com.example.t", attributesType: "A", profile: .marquee,
            contentState: state, timestamp: 1)
        let data = FCMData.compose(content, attribution: .worstCase)
        #expect(data["progress_current"] == "3")
        #expect(data["progress_max"] == "10")
        #expect(data["progress_segments"] == ##"[{"color":"#3366ff","length":4},{"length":6}]"##)
        #expect(data["progress_points"] == ##"[{"color":"#FF0000","position":4}]"##)
        // Other profiles, and a plain number, are left alone.
        var capacitor = content
        capacitor.profile = PayloadProfile.customerio
        #expect(FCMData.compose(capacitor, attribution: .worstCase)["progress_current"] == nil)
        #expect(try ProgressConvention.parse(.object(["progress": .double(0.5)])) == nil)
    }

    @Test("a broken convention names the field")
    func errors() {
        func field(_ json: String) -> String? {
            do {
                _ = try ProgressConvention.parse(JSONValue.parse(json))
                return nil
            } catch let error as ValidationError {
                return error.field
            } catch {
                return "not a ValidationError"
            }
        }
        #expect(field(#"{"progress":{"current":1}}"#) == "content_state/progress/max")
        #expect(field(#"{"progress":{"current":-1,"max":3}}"#) == "content_state/progress/current")
        #expect(
            field(#"{"progress":{"current":1,"max":3,"segments":[{"length":0}]}}"#)
                == "content_state/progress/segments/0/length")
        #expect(
            field(#"{"progress":{"current":1,"max":3,"segments":[{"length":2}]}}"#) == "content_state/progress/segments"
        )
        #expect(
            field(#"{"progress":{"current":1,"max":3,"points":[{"position":4}]}}"#)
                == "content_state/progress/points/0/position")
        #expect(field(#"{"progress":{"current":1,"max":3,"extra":1}}"#) == "content_state/progress/extra")
        // Lengths a client chose to overflow the sum: refused, never a trap.
        #expect(
            field(#"{"progress":{"current":0,"max":1,"segments":[{"length":9223372036854775807},{"length":1}]}}"#)
                == "content_state/progress/segments/0/length")
        let most = Int64.max
        #expect(
            field(#"{"progress":{"current":0,"max":\#(most),"segments":[{"length":\#(most)},{"length":\#(most)}]}}"#)
                == "content_state/progress/segments")
    }

    @Test("a customerio payload's date fields: an attribute of that name out of any date's range is left as it is")
    func customerioDateFieldsOutOfRange() throws {
        let content = ActivityContent(
            event: .update, instanceID: "i", activityType: "com.example.t", attributesType: "A",
            profile: .customerio, attributes: .object(["eta": .double(1e16), "due": .int(Int64.min)]),
            contentState: .object(["status": .string("cooking")]), timestamp: 1,
            dateFields: ["/eta": .epochSeconds, "/due": .appleReference])
        let payload = try JSONValue.parse(
            Array(try #require(FCMData.compose(content, attribution: .worstCase)["payload"]).utf8))
        #expect(payload["eta"] == .double(1e16))
        #expect(payload["due"] == .int(Int64.min))
        #expect(DateFields.epochMilliseconds(1e300) == 253_402_300_799_000)
        #expect(DateFields.epochMilliseconds(-.infinity) == -62_135_596_800_000)
        #expect(DateFields.epochMilliseconds(.nan) == 0)
    }
}
