import MarqueeCore
import MarqueeStore
import Testing

@testable import MarqueeAPI

/// The people import's reading of its NDJSON body, without a server: lines, the line cap, what a line keeps.
@Suite("People import parsing")
struct PeopleImportParseTests {
    static func refusal(_ body: [UInt8]) -> ValidationError? {
        do {
            _ = try PeopleImportRoutes.parse(body)
            return nil
        } catch {
            return error
        }
    }

    @Test("every line counts against the cap, blank ones too: a body of newlines alone is refused past it")
    func blankLinesCount() throws {
        let cap = PeopleImportRoutes.maxLines
        // Skipped without being counted, 8 MiB of newlines were 8.4 million lines held at once (256 MiB).
        let refused = Self.refusal([UInt8](repeating: 0x0A, count: cap + 1))
        #expect(refused?.field == "body")
        #expect(refused?.reason.contains("\(cap)") == true, "\(String(describing: refused))")
        #expect(Self.refusal(Array(String(repeating: " \r\n", count: cap).utf8) + Array(#"{"id":"a"}"#.utf8)) != nil)
        // A final newline ends the last line; it starts none.
        let (people, rejected) = try PeopleImportRoutes.parse(
            [UInt8](repeating: 0x0A, count: cap - 1) + Array(#"{"id":"a"}"#.utf8) + [0x0A])
        #expect(people.map(\.line) == [cap])
        #expect(rejected.isEmpty)
    }

    @Test("a line's attributes are kept as their serialized object, a line's number counts blank lines")
    func attributesAsText() throws {
        let body = Array("\n\r\n{\"id\":\"a\",\"attributes\":{\"b\":[1, 2],\"a\":\"x\"}}\n{\"id\":\"b\"}".utf8)
        let (people, rejected) = try PeopleImportRoutes.parse(body)
        #expect(rejected.isEmpty)
        #expect(people.map(\.line) == [3, 4])
        #expect(people.first?.attributes.map { String(decoding: $0, as: UTF8.self) } == #"{"a":"x","b":[1,2]}"#)
        #expect(people.last?.attributes == nil)
    }
}
