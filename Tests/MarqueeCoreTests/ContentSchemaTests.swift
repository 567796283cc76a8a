import Testing

@testable import MarqueeCore

@Suite("Content-state schema subset")
struct ContentSchemaTests {
    let schema = try! ContentSchema(
        JSONValue.parse(
            """
            {"type":"object","required":["status","eta"],"additionalProperties":false,
             "properties":{
               "status":{"type":"string","enum":["preparing","on_the_way","delivered"]},
               "eta":{"type":"integer","minimum":0,"maximum":86400},
               "driver":{"type":"string","minLength":1,"maxLength":20},
               "stops":{"type":"array","items":{"type":"object","properties":{"n":{"type":"number"}}}},
               "note":{"type":["string","null"],"description":"free text"}}}
            """))

    func violation(_ json: String) throws -> ContentSchema.Violation? {
        schema.firstViolation(in: try JSONValue.parse(json))
    }

    @Test("a conforming state passes")
    func conforming() throws {
        #expect(
            try violation(#"{"status":"preparing","eta":600,"driver":"Ann","stops":[{"n":1.5}],"note":null}"#) == nil)
        #expect(try violation(#"{"status":"delivered","eta":0.0}"#) == nil)
    }

    @Test(
        "violations point at the offending value",
        arguments: [
            (#"{"eta":5}"#, "/status", "is required"),
            (#"{"status":"lost","eta":5}"#, "/status", "must be one of"),
            (#"{"status":"preparing","eta":-1}"#, "/eta", "at least 0"),
            (#"{"status":"preparing","eta":90000}"#, "/eta", "at most 86400"),
            (#"{"status":"preparing","eta":1.5}"#, "/eta", "expected integer"),
            (#"{"status":"preparing","eta":"soon"}"#, "/eta", "expected integer, found string"),
            (#"{"status":"preparing","eta":1,"driver":""}"#, "/driver", "at least 1 characters"),
            (#"{"status":"preparing","eta":1,"driver":"012345678901234567890"}"#, "/driver", "at most 20"),
            // One grapheme cluster of 21 code points is 21 characters to JSON Schema.
            (
                #"{"status":"preparing","eta":1,"driver":"e\#(String(repeating: "\u{301}", count: 20))"}"#, "/driver",
                "at most 20"
            ),
            (#"{"status":"preparing","eta":1,"stops":[{"n":1},{"n":"x"}]}"#, "/stops/1/n", "expected number"),
            (#"{"status":"preparing","eta":1,"extra":true}"#, "/extra", "not an allowed property"),
            (#"[1]"#, "", "expected object"),
        ])
    func violations(json: String, pointer: String, reason: String) throws {
        let v = try #require(try violation(json))
        #expect(v.pointer.description == pointer)
        #expect(v.reason.contains(reason), "\(v.reason)")
    }

    @Test("additionalProperties as a schema checks the extra properties")
    func additionalSchema() throws {
        let s = try ContentSchema(JSONValue.parse(#"{"type":"object","additionalProperties":{"type":"integer"}}"#))
        #expect(s.firstViolation(in: try JSONValue.parse(#"{"a":1,"b":2}"#)) == nil)
        #expect(s.firstViolation(in: try JSONValue.parse(#"{"a":1,"b":"x"}"#))?.pointer.description == "/b")
    }

    @Test(
        "schemas using unsupported or malformed keywords are refused with the keyword's location",
        arguments: [
            (#"{"type":"object","properties":{"a":{"pattern":"^x"}}}"#, "content_state_schema/properties/a/pattern"),
            (#"{"type":"strin"}"#, "content_state_schema/type"),
            (#"{"required":"a"}"#, "content_state_schema/required"),
            (#"{"minimum":"0"}"#, "content_state_schema/minimum"),
            (#"{"maxLength":-1}"#, "content_state_schema/maxLength"),
            (#"{"enum":[]}"#, "content_state_schema/enum"),
            (#"[]"#, "content_state_schema"),
            (#"{"oneOf":[]}"#, "content_state_schema/oneOf"),
        ])
    func refused(json: String, field: String) throws {
        do {
            _ = try ContentSchema(JSONValue.parse(json))
            Issue.record("accepted \(json)")
        } catch let error as ValidationError {
            #expect(error.field == field)
        }
    }
}
