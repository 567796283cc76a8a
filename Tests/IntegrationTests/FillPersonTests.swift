import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// `marquee_fill_person` (migrations 0049, 0062): a campaign's `$person` attributes filled from one person's
/// attributes, as a start writes them. The fills are `CampaignTemplate.fillsJSON`.
@Suite("Campaign $person fills in SQL")
struct FillPersonTests {
    @Test(
        "pointers into objects and arrays, defaults, JSON null, a missing value without a default, keys with any characters"
    )
    func fills() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        // (template, fills, person attributes, expected; nil: the person is skipped)
        let cases: [(String, String, String, String?)] = [
            (
                #"{"team": {"$person": "/team"}, "match": "A-B"}"#, #"[{"at": ["team"], "pointer": ["team"]}]"#,
                #"{"team": "Reds"}"#, #"{"team": "Reds", "match": "A-B"}"#
            ),
            (
                #"{"a": {"b": 1}, "c": 2}"#,
                #"[{"at": ["a", "b"], "pointer": ["x", "0"]}, {"at": ["c"], "pointer": ["y"], "default": "d"}]"#,
                #"{"x": ["first", "second"], "y": null}"#, #"{"a": {"b": "first"}, "c": "d"}"#
            ),
            (
                #"{"a": {"b": 1}, "c": 2}"#,
                #"[{"at": ["a", "b"], "pointer": ["x", "0"]}, {"at": ["c"], "pointer": ["y"]}]"#,
                #"{"x": ["first"]}"#, nil
            ),
            (#"{"a": 1}"#, "[]", "{}", #"{"a": 1}"#),
            (#"{"a": 1}"#, #"[{"at": ["a"], "pointer": []}]"#, #"{"z": 1}"#, #"{"a": {"z": 1}}"#),
            (
                #"{"a,\"b}": 1}"#, #"[{"at": ["a,\"b}"], "pointer": ["k\n{x}"]}]"#, #"{"k\n{x}": [7]}"#,
                #"{"a,\"b}": [7]}"#
            ),
            (
                #"{"n": 0}"#, #"[{"at": ["n"], "pointer": ["p"], "default": {"v": false}}]"#, "{}",
                #"{"n": {"v": false}}"#
            ),
        ]
        for (template, fills, person, expected) in cases {
            let row = try await pool.query(
                """
                SELECT marquee_fill_person(\(template)::jsonb, \(fills)::jsonb, \(person)::jsonb)::text AS filled,
                       \(expected)::jsonb::text AS expected
                """)[0]
            let filled = try row.decode(String?.self, "filled")
            #expect(filled == (try row.decode(String?.self, "expected")), "\(template) \(fills) \(person)")
        }
    }

    @Test("a pointer's array indexes as RFC 6901 reads them: /tags/-1, /tags/01, /tags/+1, /tags/ 1 name no element")
    func arrayIndexes() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let person = #"{"tags": ["first", "second"], "m": {"01": "k", "-1": "l", "0": "z", "-": "d"}}"#
        // (pointer, the value filled; "none" is the default, used when the pointer names nothing)
        let cases: [(String, String)] = [
            ("/tags/0", "first"), ("/tags/1", "second"), ("/tags/-1", "none"), ("/tags/01", "none"),
            ("/tags/+1", "none"), ("/tags/ 1", "none"), ("/tags/-", "none"), ("/tags/2", "none"),
            ("/m/01", "k"), ("/m/-1", "l"), ("/m/0", "z"), ("/m/-", "d"),
        ]
        for (pointer, expected) in cases {
            let template = try PersonTemplate(
                .object(["v": .object(["$person": .string(pointer), "default": .string("none")])]))
            let row = try await pool.query(
                """
                SELECT marquee_fill_person(\(template.attributes)::jsonb, \(template.fillsJSON)::jsonb,
                                           \(person)::jsonb) ->> 'v' AS v
                """)[0]
            #expect(try row.decode(String?.self, "v") == expected, "\(pointer)")
        }
    }
}
