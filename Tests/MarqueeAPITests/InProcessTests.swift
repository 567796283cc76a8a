import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeAPI

/// The API's logic without sockets or a database: request parsing into the planner's requests, problem rendering,
/// and the per-instance lines.
@Suite("MarqueeAPI in process")
struct InProcessTests {
    static func body(_ json: String) throws -> JSONBody {
        guard case .object(let object) = try JSONValue.parse(Array(json.utf8)) else { throw CancellationError() }
        return JSONBody(object: object)
    }

    static func field(_ json: String, _ operation: LifecyclePlanner.Operation) -> String? {
        do {
            _ = try LifecycleRoutes.parseChange(body(json), operation: operation)
            return nil
        } catch let error as ValidationError {
            return error.field
        } catch {
            return "unexpected \(error)"
        }
    }

    @Test("a campaign's people list drops repeats by bytes: two spellings of one accented letter are two people")
    func audiencePeopleByBytes() throws {
        let body = try Self.body(#"{"audience":{"people":["caf\u00e9","cafe\u0301","caf\u00e9","x"]}}"#)
        guard case .people(let ids) = try CampaignRoutes.audience(body) else {
            Issue.record("not a people audience")
            return
        }
        #expect(ids.map { Array($0.utf8) } == [Array("caf\u{e9}".utf8), Array("cafe\u{301}".utf8), Array("x".utf8)])
    }

    @Test("a channel deleted between a start's read and its write is a 404, not a 500")
    func channelGoneMidWrite() {
        var error = PostgresError(code: .server, context: "write")
        error.sqlState = "23503"
        error.constraint = "instances_tenant_id_channel_id_fkey"
        #expect(problem(for: error)?.status == 404)
        error.constraint = "campaigns_tenant_id_channel_id_fkey"
        #expect(problem(for: error)?.status == 404)
        error.constraint = "instance_devices_tenant_id_device_token_fkey"
        #expect(problem(for: error) == nil, "other references stay what they are")
    }

    @Test("update and end bodies parse into the planner's change requests")
    func parseChanges() throws {
        let (id, patch) = try LifecycleRoutes.parseChange(
            Self.body(#"{"instance_id":"o-1","content_state_patch":{"eta":5},"stale_date":null,"priority":10}"#),
            operation: .update)
        #expect(id == "o-1")
        #expect(patch.content == .patch(.object(["eta": .int(5)])))
        // `stale_date: null`, like an omitted option, keeps the stored one.
        #expect(patch.options.staleDate == nil)
        #expect(patch.options.priority == 10)
        #expect(patch.options.deepLink == nil)
        let (_, end) = try LifecycleRoutes.parseChange(
            Self.body(#"{"instance_id":"o-1","dismissal_policy":"immediate"}"#), operation: .end)
        #expect(end.content == ContentChange.none)
        #expect(end.dismissal == .immediate)
        let (_, at) = try LifecycleRoutes.parseChange(
            Self.body(#"{"instance_id":"o-1","dismissal_date":1800000000}"#), operation: .end)
        #expect(at.dismissal == .at(Date(timeIntervalSince1970: 1_800_000_000)))
    }

    @Test("bad change bodies name the field at fault")
    func badChanges() {
        #expect(Self.field(#"{"instance_id":"o-1"}"#, .update) == "content_state")
        #expect(
            Self.field(#"{"instance_id":"o-1","content_state":{"a":1},"content_state_patch":{"b":2}}"#, .update)
                == "content_state_patch")
        #expect(Self.field(#"{"instance_id":"o-1","content_state":{}}"#, .update) == "content_state")
        #expect(Self.field(#"{"instance_id":"o-1","dismissal_date":1}"#, .update) != nil)
        #expect(
            Self.field(#"{"instance_id":"o-1","dismissal_policy":"immediate","dismissal_date":1800000000}"#, .end)
                == "dismissal_policy")
        #expect(Self.field(#"{"instance_id":"o-1","content_state_patch":{},"priority":7}"#, .update) == "priority")
        #expect(Self.field(#"{"content_state_patch":{"a":1}}"#, .update) == "instance_id")
    }

    @Test("timestamps are accepted from 1970 to before year 3000, as numbers and as ISO 8601 strings alike")
    func timestampRange() throws {
        func at(_ json: String) throws -> Date? { try Self.body(#"{"at":"# + json + "}").timestamp("at") }
        #expect(try at(#""2999-12-31T23:59:59Z""#) == Date(timeIntervalSince1970: 32_503_679_999))
        #expect(try at(#""1970-01-01T00:00:00Z""#) == Date(timeIntervalSince1970: 0))
        #expect(try at("1800000000") == Date(timeIntervalSince1970: 1_800_000_000))
        // An ISO 8601 formatter reads these; year 300000 overflowed the microseconds bound to PostgreSQL (a trap).
        for bad in [
            #""300000-01-01T00:00:00Z""#, #""3000-01-01T00:00:00Z""#, #""1969-12-31T23:59:59Z""#, "32503680000", "-1",
        ] {
            #expect(throws: ValidationError.self, "\(bad)") { try at(bad) }
            do {
                _ = try at(bad)
            } catch let error as ValidationError {
                #expect(error.field == "at")
            }
        }
    }

    @Test("string lengths count code points, as openapi.yaml's maxLength does; emails are bounded in bytes too")
    func stringLengths() throws {
        let combined = try Self.body(#"{"s":"e\u0301\u0301"}"#)  // one character, three code points
        #expect(try combined.string("s", maxLength: 3) == "e\u{301}\u{301}")
        #expect(throws: ValidationError.self) { try combined.string("s", maxLength: 2) }
        #expect(try RegistryRoutes.email(String(repeating: "\u{E9}", count: 157) + "@b.c") != nil)  // 318 bytes
        #expect(throws: ValidationError.self) {
            try RegistryRoutes.email(String(repeating: "\u{E9}", count: 159) + "@b.c")  // 322 bytes
        }
    }

    @Test("the cursors of the instance and campaign lists match the cursor pattern openapi.yaml gives each list")
    func cursorsMatchTheContract() throws {
        let contract = try String(
            contentsOfFile: FileManager.default.currentDirectoryPath + "/openapi.yaml", encoding: .utf8)
        // The `pattern` of the `cursor` parameter of the operation (single- or double-quoted YAML).
        func pattern(_ operation: String) throws -> String {
            let op = try #require(contract.range(of: "operationId: \(operation)\n"))
            let parameter = try #require(
                contract.range(of: "- name: cursor\n", range: op.upperBound..<contract.endIndex))
            let key = try #require(contract.range(of: "pattern: ", range: parameter.upperBound..<contract.endIndex))
            let rest = contract[key.upperBound...]
            let quote = try #require(rest.first)
            let body = rest.dropFirst().prefix { $0 != quote }
            return quote == "\"" ? body.replacingOccurrences(of: "\\\\", with: "\\") : String(body)
        }
        guard case .string(let issued) = TimeCursor.encode(Date(), "camp.a:b-1") else { throw CancellationError() }
        for operation in ["listLiveNotifications", "listCampaigns"] {
            let regex = try NSRegularExpression(pattern: try pattern(operation))
            let range = NSRange(issued.startIndex..., in: issued)
            #expect(regex.firstMatch(in: issued, range: range) != nil, "\(operation): \(issued)")
        }
    }

    @Test("a cursor naming a time outside the accepted range is a 422 for cursor, never a trap")
    func cursorRange() throws {
        func cursor(_ text: String) -> String {
            Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        let now = Date(timeIntervalSince1970: 1_800_000_000.5)
        guard case .string(let issued) = TimeCursor.encode(now, "o-1") else { throw CancellationError() }
        let decoded = try #require(try TimeCursor.decode(issued))
        #expect(decoded.0 == now && decoded.1 == "o-1")
        for bad in ["9223372036854775807|x", "-9223372036854775808|x", "-1|x", "32503680000000000|x"] {
            #expect(throws: ValidationError.self, "\(bad)") { try TimeCursor.decode(cursor(bad)) }
        }
    }

    @Test("domain errors render themselves as problems: 422 with the field, 413 with over_by")
    func problems() throws {
        let invalid = try #require(
            problem(for: ValidationError(field: "content_state/eta", reason: "must be a number")))
        #expect(invalid.status == 422)
        #expect(invalid.field == "content_state/eta")
        let size = PayloadSizeError(platform: .ios, size: 4200, limit: 4096)
        let tooLarge = try #require(problem(for: size))
        #expect(tooLarge.status == 413)
        #expect(tooLarge.extensions["over_by"] == "104")
        #expect(problem(for: CancellationError()) == nil)
    }

    @Test("a write whose commit went unanswered is a 500 that says whether it committed, with no Retry-After")
    func unansweredCommitProblems() throws {
        let committed = try #require(problem(for: UnansweredCommit(outcome: .committed)))
        #expect(committed.status == 500 && committed.type == Problems.typeBase + "write-committed-unanswered")
        let unknown = try #require(problem(for: UnansweredCommit(outcome: .unknown)))
        #expect(unknown.status == 500 && unknown.type == Problems.typeBase + "write-outcome-unknown")
        #expect(committed.headers["Retry-After"] == nil && unknown.headers["Retry-After"] == nil)
    }

    @Test("instance lines: one change at a time per key; the queued ones run together; a change alone runs alone")
    func lines() async throws {
        struct Change: Sendable {
            var n: Int
            var alone = false
        }
        let lines = InstanceLines<String, Change, Int> { leader, next in !leader.alone && !next.alone }
        let batches = Mutex<[[Int]]>([])
        let gate = Mutex<CheckedContinuation<Void, Never>?>(nil)
        let firstRunning = Mutex(false)
        let run: @Sendable ([Change]) async -> [Result<Int, any Error>] = { batch in
            batches.withLock { $0.append(batch.map(\.n)) }
            if batch.first?.n == 1 {
                // The first batch waits until the others have queued behind it.
                await withCheckedContinuation { continuation in
                    gate.withLock { $0 = continuation }
                    firstRunning.withLock { $0 = true }
                }
            }
            return batch.map { .success($0.n * 10) }
        }
        try await withThrowingTaskGroup(of: (Int, Int).self) { group in
            group.addTask { (1, try await lines.submit("a", Change(n: 1), run: run)) }
            while !firstRunning.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(1)) }
            for n in 2...4 {
                group.addTask { (n, try await lines.submit("a", Change(n: n, alone: n == 4), run: run)) }
                // Queued in this order.
                try await Task.sleep(for: .milliseconds(20))
            }
            // Another key never waits for "a".
            #expect(try await lines.submit("b", Change(n: 9), run: run) == 90)
            gate.withLock { $0 }?.resume()
            var answers: [Int: Int] = [:]
            for try await (n, answer) in group { answers[n] = answer }
            #expect(answers == [1: 10, 2: 20, 3: 30, 4: 40])
        }
        #expect(batches.withLock { $0 } == [[1], [9], [2, 3], [4]])
    }
}
