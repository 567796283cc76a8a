import Foundation
import MarqueeCore
import PostgresClient
import Testing

@testable import MarqueeStore

/// A channel-backed campaign change in steps: its first half (one instance and the broadcast), then the rest of the
/// instances a chunk at a time, the first half's instance left out.
extension BroadcastInstanceTests {
    @Test("a channel change's rest runs in steps: every instance written once, one broadcast, the counts of all steps")
    func broadcastRestInSteps() async throws {
        let (t, pool, campaign) = try await Self.channelCampaignStartedHere(fans: 5)
        defer { pool.close() }
        let tenant = t.tenant.uuid
        let r = try await t.api.call(
            "POST", "/v1/campaigns/\(campaign)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(r.status == 202, "\(r.text)")
        let (scheduleID, change) = try await CampaignTests.changeSchedule(pool, tenant, campaign, .update)
        func versions() async throws -> [String: Int] {
            var out: [String: Int] = [:]
            for row in try await pool.query(
                "SELECT id, version FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(campaign)")
            {
                out[try row.decode(String.self, "id")] = try row.decode(Int.self, "version")
            }
            return out
        }
        let before = try await versions()
        try #require(before.count == 5)

        /// One run, as the runner does it: the first half, or the next step of the rest.
        func run(_ progress: JSONValue?) async throws -> (result: JSONValue, representative: String?, done: Bool) {
            try await CampaignTests.changeStep(pool, tenant, campaign, change, scheduleID, progress: progress, chunk: 2)
        }
        let first = try await run(nil)
        let representative = try #require(first.representative, "\(first.result)")
        #expect(first.result["broadcasts"]?.intValue == 1 && first.result["instances"]?.intValue == 1)
        var progress: JSONValue = .object([
            "phase": .string("broadcast"), "representative": .string(representative), "broadcast": first.result,
        ])
        var steps = 0
        while true {
            let step = try await run(progress)
            steps += 1
            if step.done {
                progress = step.result
                break
            }
            #expect(step.result["representative"]?.stringValue == representative, "\(step.result)")
            progress = step.result
            try #require(steps < 5, "the rest did not end: \(step.result)")
        }
        #expect(steps == 2, "four instances in chunks of two")
        #expect(progress["instances"]?.intValue == 5 && progress["broadcasts"]?.intValue == 1, "\(progress)")
        let after = try await versions()
        #expect(after == before.mapValues { $0 + 1 }, "every instance written once, the first half's too")
        let broadcasts = try await pool.query(
            "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(tenant) AND token_kind = 'channel'")[0]
            .decode(Int.self, "n")
        let sent = try await pool.query(
            """
            SELECT count(*)::int AS n FROM delivery_history
            WHERE tenant_id = \(tenant) AND token_kind = 'channel' AND operation = 'update'
            """)[0].decode(Int.self, "n")
        #expect(broadcasts + sent == 1, "one broadcast for the change")
    }

    @Test("a channel change whose first instance already shows the new state still broadcasts, carried by another")
    func broadcastPastAnUnchangedInstance() async throws {
        let (t, pool, campaign) = try await Self.channelCampaignStartedHere(fans: 2)
        defer { pool.close() }
        let tenant = t.tenant.uuid
        // The first half takes the first open instance; a single update has already given it the change's state.
        let first = try await pool.query(
            "SELECT min(id) AS id FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(campaign)"
        )[0].decode(String.self, "id")
        let single = try await Self.change(t, "update", first, home: 1)
        #expect(single.status == 200, "\(single.text)")
        let r = try await t.api.call(
            "POST", "/v1/campaigns/\(campaign)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(r.status == 202, "\(r.text)")
        // Run as the runner runs it: the first half, then the rest (from the first half's progress) to the end.
        let (scheduleID, change) = try await CampaignTests.changeSchedule(pool, tenant, campaign, .update)
        var step = try await CampaignTests.changeStep(
            pool, tenant, campaign, change, scheduleID, progress: nil, chunk: 10)
        var steps = 1
        var progress = step.result
        if let representative = step.representative {
            progress = .object([
                "phase": .string("broadcast"), "representative": .string(representative), "broadcast": step.result,
            ])
        }
        while !step.done || step.representative != nil {
            step = try await CampaignTests.changeStep(
                pool, tenant, campaign, change, scheduleID, progress: progress, chunk: 10)
            progress = step.result
            steps += 1
            try #require(steps < 5, "the change did not end: \(step.result)")
        }
        #expect(progress["broadcasts"]?.intValue == 1, "\(progress)")
        // The single update's broadcast, still queued, was superseded (latest wins); the change's own replaces it.
        let queued = try await pool.query(
            """
            SELECT content_state FROM delivery_queue
            WHERE tenant_id = \(tenant) AND token_kind = 'channel' AND operation = 'update'
            """
        ).map { try $0.decode(JSONValue.self, "content_state") }
        #expect(queued.count == 1, "\(queued)")
        #expect(queued.first?["home"]?.intValue == 1)
        let changed = try await pool.query(
            """
            SELECT count(*)::int AS n FROM instances
            WHERE tenant_id = \(tenant) AND campaign_id = \(campaign) AND content_state ->> 'home' = '1'
            """)[0].decode(Int.self, "n")
        #expect(changed == 2)
    }

    @Test("a channel change that changes no instance leaves the older change's queued broadcast in place")
    func unchangedChangeKeepsQueuedBroadcast() async throws {
        let (t, pool, campaign) = try await Self.channelCampaignStartedHere(fans: 2)
        defer { pool.close() }
        let tenant = t.tenant.uuid
        /// Posts a campaign-wide update and runs it here to the end, as the runner does (first half, then the rest).
        func update(home: Int) async throws {
            let r = try await t.api.call(
                "POST", "/v1/campaigns/\(campaign)/update", key: t.tenant.app,
                json: ["content_state_patch": ["home": home]])
            #expect(r.status == 202, "\(r.text)")
            let row = try await pool.query(
                """
                SELECT id, change FROM campaign_schedules
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaign) AND operation = 'update' AND state = 'pending'
                """)[0]
            let scheduleID = try row.decode(UUID.self, "id")
            let change = CampaignChange(operation: .update, json: try row.decode(JSONValue.self, "change"))
            var step = try await CampaignTests.changeStep(
                pool, tenant, campaign, change, scheduleID, progress: nil, chunk: 10)
            var progress = step.result
            if let representative = step.representative {
                progress = .object([
                    "phase": .string("broadcast"), "representative": .string(representative), "broadcast": step.result,
                ])
            }
            var steps = 1
            while !step.done || step.representative != nil {
                step = try await CampaignTests.changeStep(
                    pool, tenant, campaign, change, scheduleID, progress: progress, chunk: 10)
                progress = step.result
                steps += 1
                try #require(steps < 5, "the change did not end: \(step.result)")
            }
            try await pool.execute(
                "UPDATE campaign_schedules SET state = 'done' WHERE tenant_id = \(tenant) AND id = \(scheduleID)")
        }
        func queuedBroadcasts() async throws -> [JSONValue] {
            try await pool.query(
                """
                SELECT content_state FROM delivery_queue
                WHERE tenant_id = \(tenant) AND token_kind = 'channel' AND operation = 'update'
                """
            ).map { try $0.decode(JSONValue.self, "content_state") }
        }
        // The first change's broadcast waits (as a paced one, or one waiting out a Retry-After, would).
        try await update(home: 1)
        #expect(try await queuedBroadcasts().map { $0["home"]?.intValue } == [1])
        // The same change again: every instance already shows it, nothing is written, nothing queued; the waiting
        // broadcast must still go out.
        try await update(home: 1)
        #expect(try await queuedBroadcasts().map { $0["home"]?.intValue } == [1])
        let superseded = try await pool.query(
            """
            SELECT count(*)::int AS n FROM delivery_history
            WHERE tenant_id = \(tenant) AND token_kind = 'channel' AND status = 'superseded'
            """)[0].decode(Int.self, "n")
        #expect(superseded == 0)
    }
}
