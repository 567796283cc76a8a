import Testing

@testable import MarqueeCore

@Suite("JSON Merge Patch (RFC 7396)")
struct MergePatchTests {
    /// Appendix A of RFC 7396: (target, patch, result).
    static let appendixA: [(String, String, String)] = [
        (#"{"a":"b"}"#, #"{"a":"c"}"#, #"{"a":"c"}"#),
        (#"{"a":"b"}"#, #"{"b":"c"}"#, #"{"a":"b","b":"c"}"#),
        (#"{"a":"b"}"#, #"{"a":null}"#, #"{}"#),
        (#"{"a":"b","b":"c"}"#, #"{"a":null}"#, #"{"b":"c"}"#),
        (#"{"a":["b"]}"#, #"{"a":"c"}"#, #"{"a":"c"}"#),
        (#"{"a":"c"}"#, #"{"a":["b"]}"#, #"{"a":["b"]}"#),
        (#"{"a":{"b":"c"}}"#, #"{"a":{"b":"d","c":null}}"#, #"{"a":{"b":"d"}}"#),
        (#"{"a":[{"b":"c"}]}"#, #"{"a":[1]}"#, #"{"a":[1]}"#),
        (#"["a","b"]"#, #"["c","d"]"#, #"["c","d"]"#),
        (#"{"a":"b"}"#, #"["c"]"#, #"["c"]"#),
        (#"{"a":"foo"}"#, #"null"#, #"null"#),
        (#"{"a":"foo"}"#, #""bar""#, #""bar""#),
        (#"{"e":null}"#, #"{"a":1}"#, #"{"a":1,"e":null}"#),
        (#"[1,2]"#, #"{"a":"b","c":null}"#, #"{"a":"b"}"#),
        (#"{}"#, #"{"a":{"bb":{"ccc":null}}}"#, #"{"a":{"bb":{}}}"#),
    ]

    @Test("every example of RFC 7396 appendix A", arguments: 0..<15)
    func appendix(_ index: Int) throws {
        let (target, patch, expected) = Self.appendixA[index]
        let result = MergePatch.apply(try JSONValue.parse(patch), to: try JSONValue.parse(target))
        #expect(result.serialized() == expected, "example \(index + 1)")
    }

    @Test("a nested merge keeps untouched siblings and deletes only what the patch nulls")
    func nested() throws {
        let target = try JSONValue.parse(#"{"eta":1,"driver":{"name":"Ana","phone":"x"},"stops":[1,2,3]}"#)
        let patch = try JSONValue.parse(#"{"driver":{"phone":null},"stops":[9]}"#)
        #expect(MergePatch.apply(patch, to: target).serialized() == #"{"driver":{"name":"Ana"},"eta":1,"stops":[9]}"#)
    }
}
