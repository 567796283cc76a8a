import Foundation
import MarqueeCore
import Testing

@Suite("Campaign templates and campaign-wide content changes")
struct CampaignTemplateTests {
    static func json(_ text: String) throws -> JSONValue { try JSONValue.parse(Array(text.utf8)) }

    @Test("$person nodes anywhere in the attributes, with their target path, pointer and default")
    func fills() throws {
        let template = try PersonTemplate(
            Self.json(
                #"{"match":"A-B","team":{"$person":"/team/name"},"seats":[1,{"$person":"/seat","default":0}]}"#))
        #expect(template.fills.count == 2)
        let byPath = Dictionary(uniqueKeysWithValues: template.fills.map { ($0.at, $0) })
        #expect(byPath[["team"]]?.pointer.tokens == ["team", "name"])
        #expect(byPath[["team"]]?.defaultValue == nil)
        #expect(byPath[["seats", "1"]]?.pointer.tokens == ["seat"])
        #expect(byPath[["seats", "1"]]?.defaultValue == .int(0))
        // The sample measures defaults, or an empty string.
        #expect(template.sample == (try Self.json(#"{"match":"A-B","team":"","seats":[1,0]}"#)))
        #expect(
            template.fillsJSON.arrayValue?.contains {
                $0["at"] == .array([.string("team")]) && $0["path"] == .array([.string("team"), .string("name")])
            } == true)
        // A token that names an array element is a number; any other (`01`, `-1`, `-`) a string, a member only.
        let indexed = try PersonTemplate(Self.json(#"{"a":{"$person":"/t/1/01/-1/-/0"}}"#))
        #expect(
            indexed.fillsJSON.arrayValue?.first?["path"]
                == .array([.string("t"), .int(1), .string("01"), .string("-1"), .string("-"), .int(0)]))
    }

    @Test("bad $person nodes name the node at fault")
    func badNodes() throws {
        let cases: [(String, String)] = [
            (#"{"t":{"$person":"team"}}"#, "attributes/t/$person"),
            (#"{"t":{"$person":""}}"#, "attributes/t/$person"),
            (#"{"t":{"$person":7}}"#, "attributes/t/$person"),
            (#"{"t":{"$person":"/a","other":1}}"#, "attributes/t"),
            (#"{"$person":"/a"}"#, "attributes"),
        ]
        for (text, field) in cases {
            #expect(throws: ValidationError.self) { try PersonTemplate(Self.json(text)) }
            do {
                _ = try PersonTemplate(Self.json(text))
            } catch {
                #expect((error as? ValidationError)?.field == field, "\(text)")
            }
        }
        let many = JSONValue.object(
            Dictionary(
                uniqueKeysWithValues: (0...PersonTemplate.maximumFills).map {
                    ("k\($0)", JSONValue.object(["$person": .string("/k")]))
                }))
        #expect(throws: ValidationError.self) { try PersonTemplate(many) }
    }

    @Test("a change applies per current state: replace, merge patch, or none; each result checked by the schema")
    func contentChanges() throws {
        let schema = try Self.json(
            #"{"type":"object","required":["home"],"properties":{"home":{"type":"integer"}}}"#)
        let current = try Self.json(#"{"home":1,"away":2}"#)
        let patched = try ContentChange.patch(Self.json(#"{"home":2,"away":null}"#)).apply(
            to: current, schema: schema, dateFields: [:], profile: .marquee)
        #expect(patched == (try Self.json(#"{"home":2}"#)))
        let replaced = try ContentChange.replace(Self.json(#"{"home":5}"#)).apply(
            to: current, schema: schema, dateFields: [:], profile: .marquee)
        #expect(replaced == (try Self.json(#"{"home":5}"#)))
        #expect(
            try ContentChange.none.apply(to: current, schema: schema, dateFields: [:], profile: .marquee) == current)
        #expect(throws: ValidationError.self) {
            try ContentChange.patch(Self.json(#"{"home":"two"}"#)).apply(
                to: current, schema: schema, dateFields: [:], profile: .marquee)
        }
    }
}
