import Foundation
import MarqueeCore
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
}
