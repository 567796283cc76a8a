import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// Campaigns end to end: audiences resolved at start, `$person` attributes, campaign-wide update and end, schedules
/// run exactly once by three workers (one of them restarted in between), cancel, and the funnel against the
/// simulators' records.
@Suite("Campaigns", .serialized)
struct CampaignTests {
    struct Tenant {
        var fixture: FCMDeliveryFixture.Running
        var tenant: TestTenant
        var type: String
        var api: API { fixture.api }

        /// Imports people (NDJSON lines) through the API.
        func importPeople(_ lines: [[String: Any]]) async throws {
            let body = try lines.map {
                String(decoding: try JSONSerialization.data(withJSONObject: $0), as: UTF8.self)
            }.joined(separator: "\n")
            // A bulk import on a loaded machine may take a while: a long socket timeout.
            let r = try await api.call(
                "POST", "/v1/people/import", key: tenant.app, body: Data(body.utf8),
                contentType: "application/x-ndjson", timeout: 300)
            guard r.status == 200, try r.json().array("rejected").isEmpty else {
                throw TestFailure("import: \(r.status) \(r.text)")
            }
        }

        func create(_ body: [String: Any], headers: [String: String] = [:]) async throws -> HTTP.Response {
            var full: [String: Any] = [
                "name": "Match tracker", "notification_type": type,
                "attributes": ["match": "A-B", "team": ["$person": "/team"]],
                "content_state": ["home": 0, "away": 0],
                "push_payload": ["alert": ["title": "Kick-off", "body": "A v B"]],
            ]
            full.merge(body) { _, new in new }
            return try await api.call("POST", "/v1/campaigns", key: tenant.app, json: full, headers: headers)
        }

        func campaign(_ id: String) async throws -> [String: Any] {
            // A generous socket timeout: on a loaded machine a read beside a 5,000-row run can take a while.
            let r = try await api.call("GET", "/v1/campaigns/\(id)", key: tenant.app, timeout: 60)
            guard r.status == 200 else { throw TestFailure("campaign: \(r.status) \(r.text)") }
            return try r.json()
        }

        /// Waits until every schedule of the campaign ran and no delivery of it is queued; returns the campaign.
        func settled(_ id: String, schedules: Int, timeout: Duration = .seconds(60)) async throws -> [String: Any] {
            let clock = ContinuousClock()
            let deadline = clock.now + timeout
            var last: [String: Any] = [:]
            while clock.now < deadline {
                last = try await campaign(id)
                let ran = last.array("schedules").filter { $0.string("state") != "pending" }
                let queued = last.array("funnel").reduce(0) { $0 + ($1["queued"] as? Int ?? 0) }
                if ran.count == schedules && last.array("schedules").count == schedules && queued == 0 {
                    return last
                }
                try await Task.sleep(for: .milliseconds(100))
            }
            throw TestFailure("campaign \(id) did not settle: \(last)")
        }

        func funnel(_ campaign: [String: Any], _ platform: String, _ operation: String) -> [String: Any] {
            campaign.array("funnel").first {
                $0.string("platform") == platform && $0.string("operation") == operation
            } ?? [:]
        }
    }

    static func tenant() async throws -> Tenant {
        let fixture = try await FCMDeliveryFixture.campaigns.running()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let apns = try await api.call("PUT", "/v1/credentials/apns", key: tenant.app, json: fixture.apnsCredentials)
        guard apns.status == 200 else { throw TestFailure("APNs credentials: \(apns.text)") }
        let fcm = try await api.call("PUT", "/v1/credentials/fcm", key: tenant.app, json: fixture.fcmCredentials)
        guard fcm.status == 200 else { throw TestFailure("FCM credentials: \(fcm.text)") }
        let type = Fake.activityType()
        let defined = try await api.call(
            "PUT", "/v1/activity_types/\(type)", key: tenant.app,
            json: [
                "attributes_type": "MatchAttributes",
                "content_state_schema": [
                    "type": "object", "required": ["home", "away"],
                    "properties": ["home": ["type": "integer"], "away": ["type": "integer"]],
                ],
            ])
        guard defined.status == 201 else { throw TestFailure("activity type: \(defined.text)") }
        return Tenant(fixture: fixture, tenant: tenant, type: type)
    }

    /// An iOS person line for the import: an iPhone with a push-to-start token for `type`.
    static func iosPerson(_ id: String, type: String, attributes: [String: Any]) -> ([String: Any], String) {
        let token = Fake.hex()
        return (
            [
                "id": id, "attributes": attributes,
                "devices": [["token": Fake.hex(), "platform": "ios", "push_to_start": [type: token]]],
            ], token
        )
    }

    @Test("a segment campaign: $person attributes, only the segment, update and end reach all of it and nothing else")
    func segmentCampaign() async throws {
        let t = try await Self.tenant()
        let workers = try (0..<2).map { _ in try t.fixture.worker() }
        defer { for w in workers { w.signal(SIGKILL) } }
        let red1 = Fake.id("red")
        let red2 = Fake.id("red")
        let blue = Fake.id("blue")
        let lonely = Fake.id("red")
        let (line1, pts1) = Self.iosPerson(red1, type: t.type, attributes: ["team": "Red Lions"])
        let (line3, pts3) = Self.iosPerson(blue, type: t.type, attributes: ["team": "Blue Sharks"])
        let android = Fake.fcm()
        try await t.importPeople([
            line1, line3,
            ["id": red2, "attributes": ["team": "Red Lions"], "devices": [["token": android, "platform": "android"]]],
            // In the segment, without a device: addressed, but nothing to start on.
            ["id": lonely, "attributes": ["team": "Red Lions"]],
        ])
        let segment = Fake.id("reds")
        let saved = try await t.api.call(
            "PUT", "/v1/segments/\(segment)", key: t.tenant.app,
            json: ["name": "Reds", "filter": ["attribute": "/team", "op": "eq", "value": "Red Lions"]])
        #expect(saved.status == 201, "\(saved.text)")

        let campaignID = Fake.id("cup")
        let created = try await t.create(["campaign_id": campaignID, "audience": ["segment": segment]])
        #expect(created.status == 202, "\(created.text)")
        #expect(try created.json().string("state") == "starting")
        var campaign = try await t.settled(campaignID, schedules: 1)
        #expect(campaign.string("state") == "active", "\(campaign)")
        #expect(campaign["audience_size"] as? Int == 3)
        #expect((campaign["instances"] as? [String: Any])?["failed"] as? Int == 1, "\(campaign)")

        // The iPhone got a push-to-start with its person's team filled in; the blue fan got nothing.
        let start = try #require(t.fixture.apns.pushes(token: pts1).first)
        let aps = try #require(start["payload"]?["aps"])
        #expect(aps["event"]?.stringValue == "start")
        #expect(aps["attributes"]?["team"]?.stringValue == "Red Lions")
        #expect(aps["attributes"]?["match"]?.stringValue == "A-B")
        #expect(aps["alert"]?["title"]?.stringValue == "Kick-off")
        #expect(t.fixture.apns.pushes(token: pts3).isEmpty)
        let fcmStart = try #require(t.fixture.fcm.messages(token: android).first)
        #expect(fcmStart["message"]?["data"]?["event"]?.stringValue == "start")
        #expect(t.funnel(campaign, "ios", "start")["sent"] as? Int == 1)
        #expect(t.funnel(campaign, "android", "start")["sent"] as? Int == 1)

        // Who the campaign addressed is kept, with the instance each got.
        let people = try await t.api.call("GET", "/v1/campaigns/\(campaignID)/people", key: t.tenant.app)
        let members = try people.json().array("data")
        #expect(Set(members.compactMap { $0.string("person_id") }) == [red1, red2, lonely])
        #expect(members.first { $0.string("person_id") == red1 }?.string("instance_id") == "\(campaignID).\(red1)")
        let listed = try await t.api.call(
            "GET", "/v1/live_notifications?campaign=\(campaignID)", key: t.tenant.app)
        #expect(
            Set(try listed.json().array("data").compactMap { $0.string("instance_id") }).count == 3, "\(listed.text)")
        #expect(try listed.json().array("data").allSatisfy { $0.string("campaign_id") == campaignID })

        // The iPhone's activity reports its token; a metric report for the start push counts in the funnel.
        let device = try #require(
            (line1["devices"] as? [[String: Any]])?.first?.string("token"))
        let activityToken = Fake.hex()
        let put = try await t.api.call(
            "PUT", "/v1/live_notifications/\(campaignID).\(red1)/tokens/\(device)", key: t.tenant.sdk,
            json: ["token": activityToken])
        #expect(put.status == 200, "\(put.text)")
        let metadata = try #require(aps["content-state"]?["marqueeMetadata"])
        for metric in ["delivered", "opened"] {
            let reported = try await t.api.call(
                "POST", "/v1/deliveries/\(metadata["deliveryId"]?.stringValue ?? "")/metrics", key: t.tenant.sdk,
                json: ["metric": metric, "delivery_token": metadata["deliveryToken"]?.stringValue ?? ""])
            #expect(reported.status == 202, "\(reported.text)")
        }
        // An instance of the same person outside the campaign is not touched by campaign-wide changes.
        let outside = Fake.id("solo")
        let solo = try await t.api.call(
            "POST", "/v1/live_notifications/start", key: t.tenant.app,
            json: [
                "identifiers": ["id": red1], "notification_type": t.type, "instance_id": outside,
                "attributes": ["match": "C-D"], "content_state": ["home": 5, "away": 5],
                "push_payload": ["alert": ["title": "C v D", "body": "on"]],
            ])
        #expect(solo.status == 200, "\(solo.text)")

        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(campaignID)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1]])
        #expect(update.status == 202, "\(update.text)")
        campaign = try await t.settled(campaignID, schedules: 2)
        let updateRun = campaign.array("schedules").first { $0.string("operation") == "update" }
        #expect(updateRun?.string("state") == "done", "\(campaign)")
        let updates = t.fixture.apns.pushes(token: activityToken)
        #expect(updates.count == 1)
        #expect(updates.first?["payload"]?["aps"]?["content-state"]?["home"]?.intValue == 1)
        #expect(updates.first?["payload"]?["aps"]?["content-state"]?["away"]?.intValue == 0)
        // No alert, no frequent updates declared: Apple's budget is protected at priority 5.
        #expect(updates.first?["priority"]?.intValue == 5)
        #expect(t.fixture.fcm.messages(token: android).count == 2)
        let soloState = try await t.api.call("GET", "/v1/live_notifications/\(outside)", key: t.tenant.app)
        #expect((try soloState.json()["content_state"] as? [String: Any])?["home"] as? Int == 5)

        // Still running: the worker pool's finalizer leaves it active, without looking for its queued pushes (a walk
        // of every instance of the campaign).
        let finalizer = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        try await finalizer.finalize()
        #expect(try await t.campaign(campaignID).string("state") == "active")
        let plan = try await t.fixture.pool.withConnection { c in
            let statement = CampaignRunner.finalizeStatement
            try c.execute("BEGIN")
            defer { _ = try? c.execute("ROLLBACK") }
            return try c.query(
                PostgresQuery(unsafeSQL: "EXPLAIN (ANALYZE, COSTS OFF) " + statement.sql, binds: statement.binds)
            ).map { try $0.decode(String.self, "QUERY PLAN") }
        }
        let queueScans = plan.filter { $0.contains("on delivery_queue") }
        #expect(!queueScans.isEmpty && queueScans.allSatisfy { $0.contains("never executed") }, "\(plan)")

        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(campaignID)/end", key: t.tenant.app,
            json: ["content_state_patch": ["away": 2], "dismissal_date": Date().timeIntervalSince1970 + 60])
        #expect(end.status == 202, "\(end.text)")
        campaign = try await t.settled(campaignID, schedules: 3)
        #expect(campaign.string("state") == "ended", "\(campaign)")
        let ends = t.fixture.apns.pushes(token: activityToken)
        #expect(ends.count == 2)
        #expect(ends.last?["payload"]?["aps"]?["event"]?.stringValue == "end")
        #expect(ends.last?["payload"]?["aps"]?["content-state"]?["home"]?.intValue == 1)
        #expect(ends.last?["payload"]?["aps"]?["content-state"]?["away"]?.intValue == 2)
        #expect(t.fixture.fcm.messages(token: android).count == 3)
        // Over: stored as ended, so reads no longer walk its instances.
        try await finalizer.finalize()
        let stored = try await t.fixture.pool.query(
            "SELECT state FROM campaigns WHERE tenant_id = \(t.tenant.uuid) AND id = \(campaignID)")
        #expect(try stored[0].decode(String.self, "state") == "ended")
        #expect(try await t.campaign(campaignID).string("state") == "ended")
        let soloAfter = try await t.api.call("GET", "/v1/live_notifications/\(outside)", key: t.tenant.app)
        #expect(try soloAfter.json().string("state") != "ended")

        // The funnel against the simulators' records: per platform and operation.
        #expect(t.funnel(campaign, "ios", "start")["delivered"] as? Int == 1)
        #expect(t.funnel(campaign, "ios", "start")["opened"] as? Int == 1)
        #expect(t.funnel(campaign, "ios", "update")["sent"] as? Int == 1)
        #expect(t.funnel(campaign, "ios", "end")["sent"] as? Int == 1)
        #expect(t.funnel(campaign, "android", "update")["sent"] as? Int == 1)
        #expect(t.funnel(campaign, "android", "end")["sent"] as? Int == 1)
        #expect(t.funnel(campaign, "ios", "start")["targeted"] as? Int == 1)

        // Over: no more campaign-wide changes.
        let late = try await t.api.call(
            "POST", "/v1/campaigns/\(campaignID)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 9]])
        #expect(late.status == 409, "\(late.text)")
    }

    @Test(
        "people and all audiences; a $person default; a person without the attribute, or too large for a push, is skipped and counted"
    )
    func peopleAndAll() async throws {
        let t = try await Self.tenant()
        let workers = try (0..<2).map { _ in try t.fixture.worker() }
        defer { for w in workers { w.signal(SIGKILL) } }
        let a = Fake.id("p")
        let b = Fake.id("p")
        let c = Fake.id("p")
        let (la, pa) = Self.iosPerson(a, type: t.type, attributes: ["team": "X", "seat": ["row": 7]])
        let (lb, pb) = Self.iosPerson(b, type: t.type, attributes: [:])
        let (lc, pc) = Self.iosPerson(c, type: t.type, attributes: ["team": "Z"])
        try await t.importPeople([la, lb, lc])

        // People: a and b (and an ID nobody has). b has no team: skipped.
        let listed = Fake.id("listed")
        let r1 = try await t.create([
            "campaign_id": listed, "audience": ["people": [a, b, "nobody-\(Fake.hex(6))"]],
        ])
        #expect(r1.status == 202, "\(r1.text)")
        let first = try await t.settled(listed, schedules: 1)
        #expect(first["audience_size"] as? Int == 2, "\(first)")
        #expect((first["skipped"] as? [String: Any])?["missing_attribute"] as? Int == 1, "\(first)")
        #expect(t.fixture.apns.pushes(token: pa).count == 1)
        #expect(t.fixture.apns.pushes(token: pb).isEmpty)
        #expect(t.fixture.apns.pushes(token: pc).isEmpty)

        // All, with a default and a nested pointer: everyone gets an instance.
        let everyone = Fake.id("all")
        let r2 = try await t.create([
            "campaign_id": everyone, "audience": ["all": true],
            "attributes": [
                "team": ["$person": "/team", "default": "Guests"], "row": ["$person": "/seat/row", "default": 0],
            ],
        ])
        #expect(r2.status == 202, "\(r2.text)")
        let second = try await t.settled(everyone, schedules: 1)
        #expect(second["audience_size"] as? Int == 3, "\(second)")
        #expect((second["skipped"] as? [String: Any])?.isEmpty == true, "\(second)")
        let teams = [pa, pb, pc].map {
            t.fixture.apns.pushes(token: $0).last?["payload"]?["aps"]?["attributes"]?["team"]?.stringValue
        }
        #expect(teams == ["X", "Guests", "Z"])
        #expect(t.fixture.apns.pushes(token: pa).last?["payload"]?["aps"]?["attributes"]?["row"]?.intValue == 7)
        // A campaign instance takes single updates like any other.
        let single = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": "\(everyone).\(c)", "content_state_patch": ["home": 3]])
        #expect(single.status == 200, "\(single.text)")

        // A person whose filled attributes would not fit in a push (past the headroom the campaign's checks left)
        // is skipped and counted as such; the others start.
        let d = Fake.id("p")
        let (ld, pd) = Self.iosPerson(d, type: t.type, attributes: ["team": String(repeating: "x", count: 5_000)])
        try await t.importPeople([ld])
        let pushedToA = t.fixture.apns.pushes(token: pa).count
        let large = Fake.id("large")
        let r3 = try await t.create(["campaign_id": large, "audience": ["people": [a, d]]])
        #expect(r3.status == 202, "\(r3.text)")
        let third = try await t.settled(large, schedules: 1)
        #expect(third["audience_size"] as? Int == 2, "\(third)")
        #expect((third["skipped"] as? [String: Any])?["payload_too_large"] as? Int == 1, "\(third)")
        #expect(t.fixture.apns.pushes(token: pa).count == pushedToA + 1)
        #expect(t.fixture.apns.pushes(token: pd).isEmpty)
    }

    @Test(
        "a person whose attributes would nest the filled template deeper than a document may is skipped; others start")
    func deepPersonFill() async throws {
        let t = try await Self.tenant()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let deep = Fake.id("deep")
        let fine = Fake.id("fine")
        let (ld, pd) = Self.iosPerson(deep, type: t.type, attributes: [:])
        let (lf, pf) = Self.iosPerson(fine, type: t.type, attributes: ["team": "X"])
        try await t.importPeople([ld, lf])
        // The app, with its public sdk key, sets the person's team as deep as a request may nest it (the body's object
        // and `attributes` take two levels).
        var team: Any = "X"
        for _ in 0..<(JSONValue.maxDepth - 2) { team = [team] }
        let put = try await t.api.call(
            "PUT", "/v1/people/\(deep)", key: t.tenant.sdk, json: ["attributes": ["team": team]])
        #expect(put.status == 200, "\(put.text)")
        // Filled three levels down in the template, it would nest one level deeper than any document may: that
        // person is skipped, and the other gets their start (in the same claims, had the first been written).
        let id = Fake.id("deep")
        let created = try await t.create([
            "campaign_id": id, "audience": ["people": [deep, fine]],
            "attributes": ["match": ["teams": [["$person": "/team"]]]],
        ])
        #expect(created.status == 202, "\(created.text)")
        let campaign = try await t.settled(id, schedules: 1)
        #expect(campaign["audience_size"] as? Int == 2, "\(campaign)")
        #expect((campaign["skipped"] as? [String: Any])?["attributes_too_deep"] as? Int == 1, "\(campaign)")
        #expect(t.fixture.apns.pushes(token: pd).isEmpty)
        #expect(t.fixture.apns.pushes(token: pf).count == 1)
        let people = try await t.api.call("GET", "/v1/campaigns/\(id)/people", key: t.tenant.app)
        let skipped = try people.json().array("data").filter { $0.string("person_id") == deep }
        #expect(skipped.first?.string("skipped_reason") == "attributes_too_deep", "\(people.text)")
    }

    @Test("a campaign-wide end keeps the ends still waiting for an activity token, and sends each when it registers")
    func campaignEndWaitsForTokens() async throws {
        let t = try await Self.tenant()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let early = Fake.id("early")
        let late = Fake.id("late")
        let (earlyLine, _) = Self.iosPerson(early, type: t.type, attributes: ["team": "Red Lions"])
        let (lateLine, _) = Self.iosPerson(late, type: t.type, attributes: ["team": "Red Lions"])
        try await t.importPeople([earlyLine, lateLine])
        let campaignID = Fake.id("cup")
        let created = try await t.create(["campaign_id": campaignID, "audience": ["people": [early, late]]])
        #expect(created.status == 202, "\(created.text)")
        _ = try await t.settled(campaignID, schedules: 1)

        // Both push-to-starts went out; only the early activity reports its token before the end.
        func register(_ line: [String: Any], _ person: String) async throws -> String {
            let device = try #require((line["devices"] as? [[String: Any]])?.first?.string("token"))
            let token = Fake.hex()
            let put = try await t.api.call(
                "PUT", "/v1/live_notifications/\(campaignID).\(person)/tokens/\(device)", key: t.tenant.sdk,
                json: ["token": token])
            #expect(put.status == 200, "\(put.text)")
            return token
        }
        let earlyToken = try await register(earlyLine, early)
        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(campaignID)/end", key: t.tenant.app, json: ["content_state_patch": ["away": 2]])
        #expect(end.status == 202, "\(end.text)")
        let campaign = try await t.settled(campaignID, schedules: 2)
        #expect(campaign.string("state") == "ended", "\(campaign)")
        #expect(t.fixture.apns.pushes(token: earlyToken).last?["payload"]?["aps"]?["event"]?.stringValue == "end")
        let pending = try await t.fixture.pool.query(
            """
            SELECT id, state, pending_end FROM instances
            WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(campaignID) ORDER BY id
            """
        ).map {
            "\(try $0.decode(String.self, "id")):\(try $0.decode(String.self, "state")):\(try $0.decode(Bool.self, "pending_end"))"
        }
        #expect(
            Set(pending) == ["\(campaignID).\(early):ended:false", "\(campaignID).\(late):ended:true"], "\(pending)")

        // The late token registers after the end: the kept end goes to it, with the end's content state.
        let lateToken = try await register(lateLine, late)
        try await eventually("the late activity got its end") {
            t.fixture.apns.pushes(token: lateToken).contains { $0["payload"]?["aps"]?["event"]?.stringValue == "end" }
        }
        let lateEnd = try #require(t.fixture.apns.pushes(token: lateToken).last)
        #expect(lateEnd["payload"]?["aps"]?["content-state"]?["away"]?.intValue == 2)
        #expect(
            t.fixture.apns.pushes(token: earlyToken).filter { $0["payload"]?["aps"]?["event"]?.stringValue == "end" }
                .count == 1)
    }

    @Test("scheduled start, update and end run exactly once with three workers, one restarted in between")
    func schedulesRunOnce() async throws {
        let t = try await Self.tenant()
        var workers = try (0..<3).map { _ in try t.fixture.worker() }
        defer { for w in workers { w.signal(SIGKILL) } }
        var tokens: [String] = []
        var lines: [[String: Any]] = []
        for _ in 0..<20 {
            let (line, token) = Self.iosPerson(Fake.id("s"), type: t.type, attributes: ["team": "S"])
            lines.append(line)
            tokens.append(token)
        }
        try await t.importPeople(lines)
        let people = lines.compactMap { $0.string("id") }
        let now = Date().timeIntervalSince1970
        let id = Fake.id("sched")
        let created = try await t.create([
            "campaign_id": id, "audience": ["people": people], "start_at": now + 2,
        ])
        #expect(created.status == 202, "\(created.text)")
        #expect(try created.json().string("state") == "scheduled")
        #expect(try await t.campaign(id).string("state") == "scheduled")
        // Changes are accepted before the start and run after it, in order.
        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1], "at": now + 3])
        #expect(update.status == 202, "\(update.text)")
        #expect(try update.json().string("state") == "scheduled")
        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/end", key: t.tenant.app, json: ["at": now + 4])
        #expect(end.status == 202, "\(end.text)")
        // One worker dies and another takes its place before anything is due.
        workers[0].signal(SIGKILL)
        workers[0] = try t.fixture.worker()

        let campaign = try await t.settled(id, schedules: 3)
        #expect(campaign.array("schedules").allSatisfy { $0.string("state") == "done" }, "\(campaign)")
        #expect(campaign.string("state") == "ended", "\(campaign)")
        for token in tokens {
            // The start exactly once; the update and end found no activity token (none registered): none sent.
            let pushes = t.fixture.apns.pushes(token: token)
            #expect(pushes.count == 1, "\(pushes.count) pushes to one token")
        }
        #expect(t.funnel(campaign, "ios", "start")["sent"] as? Int == 20)
        let schedules = campaign.array("schedules")
        let starts = schedules.filter { $0.string("operation") == "start" }
        #expect(starts.count == 1)
        #expect((starts.first?["result"] as? [String: Any])?["instances"] as? Int == 20)
    }

    @Test("a worker killed in the middle of a start run: another runs it, exactly once")
    func crashMidRun() async throws {
        let t = try await Self.tenant()
        var lines: [[String: Any]] = []
        var tokens: [String] = []
        for _ in 0..<5_000 {
            let (line, token) = Self.iosPerson(Fake.id("k"), type: t.type, attributes: ["team": "K"])
            lines.append(line)
            tokens.append(token)
        }
        try await t.importPeople(lines)
        let id = Fake.id("crash")
        let created = try await t.api.call(
            "POST", "/v1/campaigns", key: t.tenant.app,
            json: [
                "campaign_id": id, "name": "Crash", "notification_type": t.type, "audience": ["all": true],
                "attributes": ["match": "A-B"], "content_state": ["home": 0, "away": 0],
                "push_payload": ["alert": ["title": "Kick-off", "body": "A v B"]],
            ], timeout: 60)
        #expect(created.status == 202, "\(created.text)")
        // The run must not be able to commit before its worker dies, however slow this machine is: another session
        // holds campaign_schedules in SHARE mode, so the run's last step (marking its schedule done) waits.
        let lock = try await TableLock.take(url: t.fixture.databaseURL, table: "campaign_schedules", mode: "SHARE")
        let clock = ContinuousClock()
        var workers = try (0..<2).map { _ in try t.fixture.worker() }
        defer { for w in workers { w.signal(SIGKILL) } }
        // The run's big statement is under way (its transaction open): kill every worker.
        let deadline = clock.now + .seconds(60)
        var caught = false
        while clock.now < deadline {
            let running = try await t.fixture.pool.count(
                """
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE state = 'active' AND query LIKE '%marquee_fill_person%' AND pid <> pg_backend_pid()
                """)
            if running > 0 {
                caught = true
                break
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        for w in workers { w.signal(SIGKILL) }
        for w in workers { _ = try? await w.waitForExit(timeout: .seconds(20)) }
        // Let the run's transaction go on: its client is gone, so it can only roll back.
        try await lock.release()
        try #require(caught, "the start run was not seen running")
        // Nothing of the run was committed; a new worker runs it (once the dead connection's locks are gone).
        #expect(
            try await t.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)")
                < 5_000)
        workers = [try t.fixture.worker()]
        let campaign = try await t.settled(id, schedules: 1, timeout: .seconds(180))
        #expect(campaign.string("state") == "active", "\(campaign)")
        #expect(campaign["audience_size"] as? Int == 5_000)
        #expect(t.funnel(campaign, "ios", "start")["sent"] as? Int == 5_000, "\(campaign)")
        #expect(
            try await t.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)")
                == 5_000)
        let counts = Dictionary(grouping: tokens.prefix(2_000)) { t.fixture.apns.pushes(token: $0).count }
        #expect(counts.keys.sorted() == [1], "pushes per token: \(counts.mapValues(\.count)) \(workers.map(\.log))")
    }

    @Test("a campaign-wide update of a paced activity type waits out the interval since the instance's last update")
    func pacedCampaignUpdate() async throws {
        let t = try await Self.tenant()
        let paced = Fake.activityType()
        let defined = try await t.api.call(
            "PUT", "/v1/activity_types/\(paced)", key: t.tenant.app,
            json: [
                "attributes_type": "MatchAttributes", "min_update_interval_ms": 60_000,
                "content_state_schema": [
                    "type": "object", "required": ["home", "away"],
                    "properties": ["home": ["type": "integer"], "away": ["type": "integer"]],
                ],
            ])
        #expect(defined.status == 201, "\(defined.text)")
        let (person, phone) = (Fake.id("paced"), Fake.fcm())
        try await t.importPeople([
            ["id": person, "attributes": ["team": "A"], "devices": [["token": phone, "platform": "android"]]]
        ])
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let id = Fake.id("paced")
        #expect(
            try await t.create(["campaign_id": id, "notification_type": paced, "audience": ["people": [person]]])
                .status == 202)
        _ = try await t.settled(id, schedules: 1)
        let first = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(first.status == 202, "\(first.text)")
        _ = try await t.settled(id, schedules: 2)
        let sent = try await t.fixture.pool.query(
            """
            SELECT d.sent_at FROM deliveries d JOIN instances i ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
            WHERE i.tenant_id = \(t.tenant.uuid) AND i.campaign_id = \(id) AND d.operation = 'update'
              AND d.status = 'sent'
            """
        ).map { try $0.decode(Date.self, "sent_at") }
        try #require(sent.count == 1, "\(sent)")
        // The next one, a moment later, is due a whole interval after the first went out.
        let second = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 2]])
        #expect(second.status == 202, "\(second.text)")
        try await eventually("the second update ran") {
            try await t.campaign(id).array("schedules").allSatisfy { $0.string("state") == "done" }
        }
        let due = try await t.fixture.pool.query(
            """
            SELECT q.next_attempt_at FROM delivery_queue q
            JOIN instances i ON i.tenant_id = q.tenant_id AND i.id = q.instance_id
            WHERE i.tenant_id = \(t.tenant.uuid) AND i.campaign_id = \(id) AND q.operation = 'update'
            """
        ).map { try $0.decode(Date.self, "next_attempt_at") }
        #expect(due.count == 1, "the second update waits (queued), not sent at once: \(due)")
        #expect(due.allSatisfy { $0 >= sent[0].addingTimeInterval(60 - 0.001) }, "sent \(sent[0]), due \(due)")
    }

    @Test("a start step whose Android device is deleted while it runs leaves that device out and goes on")
    func startStepWithDeletedDevice() async throws {
        let t = try await Self.tenant()
        let (kept, gone) = (Fake.fcm(), Fake.fcm())
        let people = [(Fake.id("a"), kept), (Fake.id("a"), gone)]
        try await t.importPeople(
            people.map {
                ["id": $0.0, "attributes": ["team": "A"], "devices": [["token": $0.1, "platform": "android"]]]
            })
        let id = Fake.id("gone-device")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": people.map(\.0)]]).status == 202)
        try await Self.startWhileDeleting(t, id, device: gone)
        let states = try await t.fixture.pool.query(
            """
            SELECT s.device_token FROM instance_devices s JOIN instances i
              ON i.tenant_id = s.tenant_id AND i.id = s.instance_id
            WHERE i.tenant_id = \(t.tenant.uuid) AND i.campaign_id = \(id)
            """
        ).map { try $0.decode(String.self, "device_token") }
        #expect(states == [kept], "\(states)")
        // Nor is its start queued: the logged-out phone gets nothing.
        #expect(try await Self.queued(t, token: gone) == 0)
        #expect(try await Self.queued(t, token: kept) == 1)
    }

    @Test("a start step whose iPhone is deleted while it runs queues no start to its push-to-start token")
    func startStepWithDeletedIPhone() async throws {
        let t = try await Self.tenant()
        let (kept, gone) = (Fake.id("a"), Fake.id("a"))
        let (keptLine, keptToken) = Self.iosPerson(kept, type: t.type, attributes: ["team": "A"])
        let (goneLine, goneToken) = Self.iosPerson(gone, type: t.type, attributes: ["team": "A"])
        try await t.importPeople([keptLine, goneLine])
        let phone = try #require((goneLine["devices"] as? [[String: Any]])?.first?["token"] as? String)
        let id = Fake.id("gone-iphone")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [kept, gone]]]).status == 202)
        try await Self.startWhileDeleting(t, id, device: phone)
        #expect(try await Self.queued(t, token: goneToken) == 0)
        #expect(try await Self.queued(t, token: keptToken) == 1)
        // Its person had nothing left to start on.
        let state = try await t.fixture.pool.query(
            """
            SELECT state, failure_reason FROM instances
            WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id) AND person_id = \(gone)
            """)
        #expect(try state.first?.decode(String.self, "state") == "failed")
        #expect(try state.first?.decode(String?.self, "failure_reason") == "no_push_to_start_token")
    }

    /// Runs the campaign's start while `device` is being deleted (a logout; FCM calling it unregistered): the step
    /// meets the deletion, which commits, and the start runs to the end.
    static func startWhileDeleting(_ t: Tenant, _ id: String, device: String) async throws {
        let deleting = try await HeldTransaction.open(t.fixture.databaseURL) { c in
            try c.execute("DELETE FROM devices WHERE tenant_id = \(t.tenant.uuid) AND token = \(device)")
        }
        // This campaign's start, not whichever is due first (other suites leave theirs due).
        let schedule = try await t.fixture.pool.query(
            """
            SELECT id FROM campaign_schedules
            WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id) AND operation = 'start'
            """
        )[0].decode(UUID.self, "id")
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        let running = Task { try await runner.run(schedule) }
        do {
            try await deleting.waitedOn(via: t.fixture.pool, "the step waits for the deletion")
        } catch {
            try await deleting.commit()
            _ = try await running.value
            throw error
        }
        try await deleting.commit()
        _ = try await running.value
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while try await t.campaign(id).string("state") == "starting" && clock.now < deadline {
            if try await runner.run(schedule) == nil { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(try await t.campaign(id).string("state") == "active")
    }

    /// The tenant's queued pushes to `token`.
    static func queued(_ t: Tenant, token: String) async throws -> Int {
        try await t.fixture.pool.count(
            "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(t.tenant.uuid) AND token = \(token)")
    }

    @Test("a person erased while a start step writes their instance keeps nothing of it")
    func erasureDuringStartStep() async throws {
        let t = try await Self.tenant()
        let (person, phone) = (Fake.id("erased"), Fake.fcm())
        try await t.importPeople([
            ["id": person, "attributes": ["team": "A"], "devices": [["token": phone, "platform": "android"]]]
        ])
        let id = Fake.id("erasure")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [person]]]).status == 202)
        // Something holds the phone (as a registration's write would): the step waits for it, the person's instance
        // written, and the person's erasure begins meanwhile.
        let holding = try await HeldTransaction.open(t.fixture.databaseURL) { c in
            _ = try c.query("SELECT 1 FROM devices WHERE tenant_id = \(t.tenant.uuid) AND token = \(phone) FOR UPDATE")
        }
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        let running = Task { try await runner.runDue() }
        try await holding.waitedOn(via: t.fixture.pool, "the step waits for the phone")
        let erasing = Task { try await t.api.call("DELETE", "/v1/people/\(person)", key: t.tenant.app) }
        try await holding.waitedOn(by: 2, via: t.fixture.pool, "the erasure waits too")
        try await holding.commit()
        _ = try await running.value
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        let left = try await t.fixture.pool.count(
            """
            SELECT ((SELECT count(*) FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id))
                  + (SELECT count(*) FROM delivery_queue WHERE tenant_id = \(t.tenant.uuid)))::int AS n
            """)
        #expect(left == 0)
    }

    @Test(
        "a start step cancelled (a worker's shutdown) stops at once, rolls back and is no failure: the next run does it"
    )
    func cancelledStartStep() async throws {
        let t = try await Self.tenant()
        let (person, phone) = (Fake.id("cancel"), Fake.fcm())
        try await t.importPeople([
            ["id": person, "attributes": ["team": "A"], "devices": [["token": phone, "platform": "android"]]]
        ])
        let id = Fake.id("cancelled-step")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [person]]]).status == 202)
        // An erasure in the tenant holds its lock: the step waits for it (as a long audience statement would run).
        let erasure = try await HeldTransaction.open(t.fixture.databaseURL) { c in
            _ = try c.query(
                "SELECT pg_advisory_xact_lock(hashtextextended('marquee/erasure/' || \(t.tenant.uuid)::text, 0))")
        }
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        let returned = Mutex(false)
        let running = Task {
            defer { returned.withLock { $0 = true } }
            return try await runner.runDue()
        }
        try await erasure.waitedOn(via: t.fixture.pool, "the step waits for the erasure")
        running.cancel()
        // The step's statement is cancelled: the run returns while the erasure still holds its lock.
        let stopped =
            (try? await eventually("the cancelled run returns", timeout: .seconds(20)) { returned.withLock { $0 } })
            != nil
        try await erasure.commit()
        #expect(stopped, "the run waited for the erasure")
        await #expect(throws: (any Error).self) { try await running.value }
        // Nothing of the step stays, and the schedule is pending as before: no failure recorded.
        let schedule = try await t.fixture.pool.query(
            "SELECT state, result FROM campaign_schedules WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)")
        #expect(try schedule.map { try $0.decode(String.self, "state") } == ["pending"])
        #expect(try schedule.first?.decode(JSONValue?.self, "result") == nil)
        #expect(try await t.campaign(id).string("state") != "failed")
        // The next run does the step.
        try await Self.runDue(runner) { try await t.campaign(id).string("state") == "active" }
        #expect(try await t.campaign(id).string("state") == "active")
    }

    /// Runs `runner`'s due schedules here (no worker) until `done`, for at most 30 s.
    static func runDue(_ runner: CampaignRunner, until done: () async throws -> Bool) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while try await !done() && clock.now < deadline {
            if try await runner.runDue() == nil { try await Task.sleep(for: .milliseconds(20)) }
        }
    }

    @Test("a campaign-wide end ends every instance, even one whose final content its type now refuses")
    func endEndsRefusedContent() async throws {
        let t = try await Self.tenant()
        var lines: [[String: Any]] = []
        for _ in 0..<2 { lines.append(Self.iosPerson(Fake.id("e"), type: t.type, attributes: ["team": "E"]).0) }
        try await t.importPeople(lines)
        let id = Fake.id("refused-end")
        #expect(
            try await t.create(["campaign_id": id, "audience": ["people": lines.compactMap { $0.string("id") }]])
                .status == 202)
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        func run(until done: () async throws -> Bool) async throws { try await Self.runDue(runner, until: done) }
        try await run { try await t.campaign(id).string("state") == "active" }
        // The end is scheduled; before it runs, the type's rules change: its patched content is refused everywhere.
        let at = Date().timeIntervalSince1970 + 1
        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/end", key: t.tenant.app, json: ["content_state_patch": ["away": 2], "at": at])
        #expect(end.status == 202, "\(end.text)")
        let retyped = try await t.api.call(
            "PUT", "/v1/activity_types/\(t.type)", key: t.tenant.app,
            json: [
                "attributes_type": "MatchAttributes",
                "content_state_schema": [
                    "type": "object", "required": ["home", "away", "period"],
                    "properties": [
                        "home": ["type": "integer"], "away": ["type": "integer"], "period": ["type": "integer"],
                    ],
                ],
            ])
        #expect(retyped.status < 300, "\(retyped.text)")
        try await run { try await t.campaign(id).string("state") == "ended" }
        let states = try await t.fixture.pool.query(
            "SELECT state FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)"
        ).map { try $0.decode(String.self, "state") }
        #expect(states == ["ended", "ended"], "\(states)")
    }

    @Test(
        "a campaign-wide change whose pushes would be too large: 413 for a whole state, rejected at run time for a patch, an end still ends without its alert"
    )
    func oversizedChanges() async throws {
        let t = try await Self.tenant()
        let (line, _) = Self.iosPerson(Fake.id("big"), type: t.type, attributes: ["team": "B"])
        try await t.importPeople([line])
        let person = try #require(line.string("id"))
        let id = Fake.id("oversized")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [person]]]).status == 202)
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        func run(until done: () async throws -> Bool) async throws { try await Self.runDue(runner, until: done) }
        try await run { try await t.campaign(id).string("state") == "active" }
        func ran(_ count: Int) async throws -> Bool {
            let schedules = try await t.campaign(id).array("schedules")
            return schedules.count == count && schedules.allSatisfy { $0.string("state") != "pending" }
        }
        func rejected(_ operation: String) async throws -> Int? {
            let schedule = try await t.campaign(id).array("schedules").first { $0.string("operation") == operation }
            let result = schedule?["result"] as? [String: Any]
            return (result?["rejected_states"] as? [String: Any])?["push-too-large"] as? Int
        }
        func instance() async throws -> (state: String, version: Int, contentState: JSONValue, options: JSONValue) {
            let row = try await t.fixture.pool.query(
                """
                SELECT state, version, content_state, options FROM instances
                WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)
                """)[0]
            return (
                try row.decode(String.self, "state"), try row.decode(Int.self, "version"),
                try row.decode(JSONValue.self, "content_state"), try row.decode(JSONValue.self, "options")
            )
        }
        func queued(_ operation: String) async throws -> Int {
            try await t.fixture.pool.query(
                """
                SELECT count(*)::int AS n FROM delivery_queue
                WHERE tenant_id = \(t.tenant.uuid) AND operation = \(operation)
                """)[0].decode(Int.self, "n")
        }

        // A whole new state of 5 KB: refused at once, nothing scheduled.
        let whole = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state": ["home": 1, "away": 0, "note": String(repeating: "x", count: 5000)]])
        #expect(whole.status == 413, "\(whole.text)")
        #expect(try whole.json().string("type")?.hasSuffix("/push-too-large") == true, "\(whole.text)")
        #expect(try await t.campaign(id).array("schedules").count == 1, "only the start")

        // A patch is measured at run time, on each state it makes: this one is rejected, nothing written or queued.
        let patch = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["note": String(repeating: "x", count: 4000)]])
        #expect(patch.status == 202, "\(patch.text)")
        try await run { try await ran(2) }
        #expect(try await rejected("update") == 1)
        let kept = try await instance()
        #expect(kept.version == 1 && kept.contentState == .object(["home": .int(0), "away": .int(0)]), "\(kept)")
        #expect(try await queued("update") == 0)

        // An end whose alert no state fits: the instance still ends, its end going without the alert.
        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/end", key: t.tenant.app,
            json: [
                "push_payload": [
                    "alert": [
                        "title": String(repeating: "\u{20AC}", count: 256),
                        "body": String(repeating: "\u{20AC}", count: 1024),
                    ]
                ],
                "dismissal_policy": "immediate",
            ])
        #expect(end.status == 202, "\(end.text)")
        try await run { try await ran(3) }
        #expect(try await rejected("end") == 1)
        let ended = try await instance()
        #expect(ended.state == "ended" && ended.options["alert"] == nil, "\(ended)")
        #expect(ended.options["dismissal_date"] != nil, "\(ended)")
    }

    @Test("a campaign-wide change with a stale date already past drops it with a warning, as a single update does")
    func pastStaleDate() async throws {
        let t = try await Self.tenant()
        let (line, _) = Self.iosPerson(Fake.id("st"), type: t.type, attributes: ["team": "S"])
        try await t.importPeople([line])
        let person = try #require(line.string("id"))
        let id = Fake.id("stale")
        let later = Date().timeIntervalSince1970.rounded(.down) + 3600
        #expect(
            try await t.create(["campaign_id": id, "audience": ["people": [person]], "stale_date": later]).status
                == 202)
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        try await Self.runDue(runner) { try await t.campaign(id).string("state") == "active" }
        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1], "stale_date": Date().timeIntervalSince1970 - 60])
        #expect(update.status == 202, "\(update.text)")
        #expect(try update.json()["warnings"] as? [String] == ["stale_date_in_past"], "\(update.text)")
        try await Self.runDue(runner) {
            try await t.campaign(id).array("schedules").allSatisfy { $0.string("state") != "pending" }
        }
        let rows = try await t.fixture.pool.query(
            """
            SELECT version, options FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)
            """)
        #expect(try rows[0].decode(Int.self, "version") == 2)
        let options = try rows[0].decode(JSONValue.self, "options")
        #expect(options["stale_date"] == nil, "\(options)")
        // A stale date still ahead is kept, with no warning.
        let ahead = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 2], "stale_date": later])
        #expect(try ahead.json()["warnings"] as? [String] == [], "\(ahead.text)")
    }

    @Test("a campaign whose pushes wait parked on a broken credential is ending, not ended, until its instances expire")
    func parkedPushesKeepCampaignEnding() async throws {
        let t = try await Self.tenant()
        let (line, _) = Self.iosPerson(Fake.id("k"), type: t.type, attributes: ["team": "K"])
        try await t.importPeople([line])
        let person = try #require(line.string("id"))
        let id = Fake.id("parked")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [person]]]).status == 202)
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        func run(until done: () async throws -> Bool) async throws { try await Self.runDue(runner, until: done) }
        try await run { try await t.campaign(id).string("state") == "active" }
        #expect(try await t.api.call("POST", "/v1/campaigns/\(id)/end", key: t.tenant.app, json: [:]).status == 202)
        try await run { try await t.campaign(id).string("state") == "ended" }
        // The end's push to the device, parked (the tenant's credential broke before it went).
        let instance = "\(id).\(person)"
        try await t.fixture.pool.execute(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, status)
            SELECT tenant_id, gen_random_uuid(), \(instance), token, 'apns', 'activity', \(Fake.hex()), 'end', 2,
                   'parked'
            FROM devices WHERE tenant_id = \(t.tenant.uuid) AND person_id = \(person)
            """)
        #expect(try await t.campaign(id).string("state") == "ending")
        try await runner.finalize()
        let stored = try await t.fixture.pool.query(
            "SELECT state FROM campaigns WHERE tenant_id = \(t.tenant.uuid) AND id = \(id)")
        #expect(try stored[0].decode(String.self, "state") == "active", "not stored as ended")
        // Expired, the instance's parked push can no longer go: the campaign is over.
        try await t.fixture.pool.execute(
            """
            UPDATE instances SET expires_at = now() - interval '1 second'
            WHERE tenant_id = \(t.tenant.uuid) AND id = \(instance)
            """)
        #expect(try await t.campaign(id).string("state") == "ended")
        try await runner.finalize()
        let over = try await t.fixture.pool.query(
            "SELECT state FROM campaigns WHERE tenant_id = \(t.tenant.uuid) AND id = \(id)")
        #expect(try over[0].decode(String.self, "state") == "ended")
    }

    @Test("a person whose ID is another person's MD5 gets an instance of their own")
    func hashedInstanceIDsApart() async throws {
        let t = try await Self.tenant()
        let email = "\(Fake.hex(6))@example.com"  // not usable in an instance ID: its instance ID is hashed
        let hashed = try await t.fixture.pool.query("SELECT md5(\(email)) AS h")[0].decode(String.self, "h")
        let (first, _) = Self.iosPerson(email, type: t.type, attributes: ["team": "H"])
        let (second, _) = Self.iosPerson(hashed, type: t.type, attributes: ["team": "H"])
        try await t.importPeople([first, second])
        let id = Fake.id("md5")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [email, hashed]]]).status == 202)
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while try await t.campaign(id).string("state") == "starting" && clock.now < deadline {
            if try await runner.runDue() == nil { try await Task.sleep(for: .milliseconds(10)) }
        }
        let owners = try await t.fixture.pool.query(
            "SELECT id, person_id FROM instances WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id)"
        ).map { try $0.decode(String.self, "person_id") }
        #expect(Set(owners) == [email, hashed], "\(owners)")
    }

    @Test("a campaign's rate limit spreads its pushes: 20 a second are due 50 ms apart, then all go out")
    func rateLimit() async throws {
        let t = try await Self.tenant()
        var lines: [[String: Any]] = []
        for _ in 0..<20 { lines.append(Self.iosPerson(Fake.id("r"), type: t.type, attributes: ["team": "R"]).0) }
        try await t.importPeople(lines)
        let id = Fake.id("paced")
        #expect(
            try await t.create([
                "campaign_id": id, "audience": ["people": lines.compactMap { $0.string("id") }],
                "rate_limit_per_second": 20,
            ]).status == 202)
        // The start runs here, with no worker yet: the due times are read as the run wrote them.
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while try await t.campaign(id).string("state") == "starting" && clock.now < deadline {
            if try await runner.runDue() == nil { try await Task.sleep(for: .milliseconds(10)) }
        }
        let due = try await t.fixture.pool.query(
            """
            SELECT extract(epoch FROM max(d.next_attempt_at) - min(d.next_attempt_at))::float8 AS spread,
                   count(DISTINCT d.next_attempt_at)::int AS distinct_times, count(*)::int AS n
            FROM deliveries d JOIN instances i ON i.tenant_id = d.tenant_id AND i.id = d.instance_id
            WHERE i.tenant_id = \(t.tenant.uuid) AND i.campaign_id = \(id) AND d.operation = 'start'
            """)
        #expect(try due[0].decode(Int.self, "n") == 20)
        #expect(try due[0].decode(Int.self, "distinct_times") == 20)
        // 19 intervals of 50 ms, counted from when each row is written: at least 0.95 s apart end to end, plus however
        // long writing the 20 rows took (a loaded machine may stall the statement).
        let spread = try due[0].decode(Double.self, "spread")
        #expect(spread >= 0.95 - 0.001 && spread < 0.95 + 0.5, "spread \(spread) s")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let campaign = try await t.settled(id, schedules: 1)
        #expect(t.funnel(campaign, "ios", "start")["sent"] as? Int == 20, "\(campaign)")
    }

    @Test("cancel waits for a worker running one of the campaign's changes, and never deadlocks with it")
    func cancelWaitsForRun() async throws {
        let t = try await Self.tenant()
        let (line, _) = Self.iosPerson(Fake.id("c"), type: t.type, attributes: ["team": "C"])
        try await t.importPeople([line])
        let id = Fake.id("racing")
        #expect(try await t.create(["campaign_id": id, "audience": ["all": true]]).status == 202)
        // Started here, with no worker; then a change, due later. (A start a worker runs is not waited for: it has
        // begun, cancelDuringAudience.)
        let start = try await t.fixture.pool.query(
            """
            SELECT id FROM campaign_schedules
            WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id) AND operation = 'start'
            """
        )[0].decode(UUID.self, "id")
        let runner = CampaignRunner(database: TenantDatabase(pool: t.fixture.pool))
        try await eventually("the campaign started") {
            _ = try await runner.run(start)
            return try await t.campaign(id).string("state") == "active"
        }
        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1], "at": Date().timeIntervalSince1970 + 3600])
        #expect(update.status == 202, "\(update.text)")
        // A worker's run of the change, as CampaignRunner takes its locks: the schedule, then (later) the campaign.
        let running = try await HeldTransaction.open(
            t.fixture.databaseURL,
            begin: { c in
                _ = try c.query(
                    """
                    SELECT id FROM campaign_schedules
                    WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(id) AND operation = 'update' FOR UPDATE
                    """
                )
            },
            end: { c in
                // NOWAIT: the cancel, waiting for this run, must not hold the campaign meanwhile (it did, and the
                // two deadlocked until PostgreSQL aborted one).
                _ = try c.query(
                    "SELECT state FROM campaigns WHERE tenant_id = \(t.tenant.uuid) AND id = \(id) FOR NO KEY UPDATE NOWAIT"
                )
            })
        let cancelling = Task { try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app) }
        try await running.waitedOn(via: t.fixture.pool, "the cancel waits for the run")
        try await running.commit()  // the run takes the campaign and commits: no deadlock
        let cancelled = try await cancelling.value
        #expect(cancelled.status == 200, "\(cancelled.text)")
        #expect(try cancelled.json()["schedules_cancelled"] as? Int == 1, "\(cancelled.text)")
        #expect(try cancelled.json()["campaign_cancelled"] as? Bool == false, "\(cancelled.text)")
        #expect(try await t.campaign(id).string("state") == "active")
    }

    @Test("cancel: a scheduled campaign never starts; a started one keeps running but loses its pending changes")
    func cancel() async throws {
        let t = try await Self.tenant()
        let (line, token) = Self.iosPerson(Fake.id("c"), type: t.type, attributes: ["team": "C"])
        try await t.importPeople([line])
        let id = Fake.id("later")
        let created = try await t.create([
            "campaign_id": id, "audience": ["all": true], "start_at": Date().timeIntervalSince1970 + 3600,
        ])
        #expect(created.status == 202, "\(created.text)")
        let cancelled = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app)
        #expect(cancelled.status == 200, "\(cancelled.text)")
        #expect(try cancelled.json()["campaign_cancelled"] as? Bool == true)
        #expect(try await t.campaign(id).string("state") == "cancelled")
        let update = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
        #expect(update.status == 409, "\(update.text)")

        // Started: a pending scheduled end is cancelled, the campaign stays active.
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let live = Fake.id("live")
        #expect(try await t.create(["campaign_id": live, "audience": ["all": true]]).status == 202)
        _ = try await t.settled(live, schedules: 1)
        #expect(t.fixture.apns.pushes(token: token).count == 1)
        let end = try await t.api.call(
            "POST", "/v1/campaigns/\(live)/end", key: t.tenant.app, json: ["at": Date().timeIntervalSince1970 + 3600])
        #expect(end.status == 202)
        let again = try await t.api.call("POST", "/v1/campaigns/\(live)/cancel", key: t.tenant.app)
        #expect(try again.json()["campaign_cancelled"] as? Bool == false)
        #expect(try again.json()["schedules_cancelled"] as? Int == 1)
        let after = try await t.campaign(live)
        #expect(after.string("state") == "active")
        #expect(after.array("schedules").map { $0.string("state") ?? "" } == ["done", "cancelled"])
    }

    @Test("a cancel retried with its Idempotency-Key is told what the cancel did, not that nothing was left")
    func cancelRetried() async throws {
        let t = try await Self.tenant()
        let id = Fake.id("later")
        let created = try await t.create([
            "campaign_id": id, "audience": ["all": true], "start_at": Date().timeIntervalSince1970 + 3600,
        ])
        #expect(created.status == 202, "\(created.text)")
        let key = ["Idempotency-Key": Fake.hex(16)]
        let first = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app, headers: key)
        #expect(first.status == 200, "\(first.text)")
        #expect(try first.json()["campaign_cancelled"] as? Bool == true)
        #expect(try first.json()["schedules_cancelled"] as? Int == 1)
        let retry = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app, headers: key)
        #expect(retry.status == 200, "\(retry.text)")
        #expect(retry.text == first.text)
        #expect(retry.header("Idempotent-Replayed") == "true")
        // Without the key, a second cancel finds nothing left to cancel; the key on another campaign is refused.
        let again = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app)
        #expect(try again.json()["campaign_cancelled"] as? Bool == false)
        let other = try await t.api.call(
            "POST", "/v1/campaigns/\(Fake.id("other"))/cancel", key: t.tenant.app, headers: key)
        #expect(other.status == 422, "\(other.text)")
        #expect(try other.json().string("field") == "Idempotency-Key")
    }

    @Test("a run that can never succeed fails its schedule and campaign, visibly, and the queue moves on")
    func poisonedRun() async throws {
        let t = try await Self.tenant()
        let (line, token) = Self.iosPerson(Fake.id("x"), type: t.type, attributes: ["team": "X"])
        try await t.importPeople([line])
        let poisoned = Fake.id("poisoned")
        #expect(
            try await t.create([
                "campaign_id": poisoned, "audience": ["all": true], "start_at": Date().timeIntervalSince1970 + 600,
            ]).status == 202)
        // Its stored plan is corrupted (as a bug might), and made due now.
        try await t.fixture.pool.execute(
            """
            UPDATE campaign_schedules SET change = jsonb_set(change, '{fills}', '"not an array"'), due_at = now()
            WHERE tenant_id = \(t.tenant.uuid) AND campaign_id = \(poisoned)
            """)
        try await t.fixture.pool.execute(
            "UPDATE campaigns SET start_at = now() WHERE tenant_id = \(t.tenant.uuid) AND id = \(poisoned)")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let healthy = Fake.id("healthy")
        #expect(try await t.create(["campaign_id": healthy, "audience": ["all": true]]).status == 202)
        let failed = try await t.settled(poisoned, schedules: 1)
        #expect(failed.string("state") == "failed", "\(failed)")
        let result = failed.array("schedules").first?["result"] as? [String: Any]
        #expect(result?["reason"] as? String == "database_error", "\(failed)")
        #expect(failed.string("failure_reason") == "database_error")
        let ran = try await t.settled(healthy, schedules: 1)
        #expect(ran.string("state") == "active", "\(ran)")
        #expect(t.fixture.apns.pushes(token: token).count == 1)
    }

    /// Holds one member row of the campaign in a transaction of its own (inserted, and deleted again before it
    /// commits): the start's audience statement, which writes that row too, waits for it until it commits.
    static func holdAudience(_ t: Tenant, _ campaignID: String, person: String) async throws -> HeldTransaction {
        let tenant = t.tenant.uuid
        return try await HeldTransaction.open(t.fixture.databaseURL) { c in
            try c.execute(
                """
                INSERT INTO campaign_members (tenant_id, campaign_id, person_id, instance_id)
                VALUES (\(tenant), \(campaignID), \(person), 'held')
                """)
        } end: { c in
            try c.execute(
                """
                DELETE FROM campaign_members
                WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND person_id = \(person)
                """)
        }
    }

    @Test("a start whose audience statement times out fails, visibly, instead of being tried again forever")
    func audienceTimeout() async throws {
        let t = try await Self.tenant()
        let person = Fake.id("p")
        let (line, token) = Self.iosPerson(person, type: t.type, attributes: ["team": "X"])
        try await t.importPeople([line])
        let id = Fake.id("slow")
        #expect(try await t.create(["campaign_id": id, "audience": ["all": true]]).status == 202)
        let held = try await Self.holdAudience(t, id, person: person)
        defer { Task { try? await held.commit() } }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        try await held.waitedOn(via: t.fixture.pool, "the start's audience statement waiting")
        // Its statement ends as its timeout (15 minutes) would end it: cancelled.
        #expect(
            try await t.fixture.pool.count(
                """
                WITH waiting AS MATERIALIZED (
                    SELECT pid FROM pg_stat_activity WHERE \(held.pid) = ANY(pg_blocking_pids(pid)))
                SELECT count(*)::int AS n FROM waiting WHERE pg_cancel_backend(pid)
                """) == 1)
        let failed = try await t.settled(id, schedules: 1)
        #expect(failed.string("state") == "failed", "\(failed)")
        #expect(failed.string("failure_reason") == "audience_timeout", "\(failed)")
        let result = failed.array("schedules").first?["result"] as? [String: Any]
        #expect(result?["reason"] as? String == "audience_timeout", "\(failed)")
        #expect(t.fixture.apns.pushes(token: token).isEmpty)
    }

    @Test("a start's audience statement running past MARQUEE_WORKER_LIVENESS_SECONDS leaves the worker live")
    func longAudienceKeepsWorkerLive() async throws {
        let t = try await Self.tenant()
        let person = Fake.id("p")
        let (line, _) = Self.iosPerson(person, type: t.type, attributes: ["team": "X"])
        try await t.importPeople([line])
        let id = Fake.id("big")
        #expect(try await t.create(["campaign_id": id, "audience": ["all": true]]).status == 202)
        let held = try await Self.holdAudience(t, id, person: person)
        defer { Task { try? await held.commit() } }
        let liveness = 4
        let worker = try t.fixture.worker([
            "MARQUEE_WORKER_HOLD_SECONDS": "2", "MARQUEE_WORKER_LIVENESS_SECONDS": "\(liveness)",
        ])
        defer { worker.signal(SIGKILL) }
        try await worker.waitUntilServing()
        try await held.waitedOn(via: t.fixture.pool, "the start's audience statement waiting")
        // The audience statement may run for the bulk statement timeout: past the liveness bound, the worker's
        // campaign runner is not called stalled (a probe would restart the worker, and the next one the same).
        let clock = ContinuousClock()
        let until = clock.now + .seconds(liveness + 3)
        var answers = 0
        var stalled: [String] = []
        while clock.now < until {
            let health = try await HTTP.get(worker.baseURL + "/healthz")
            if health.text.contains("campaigns") { stalled.append("\(health.status) \(health.text)") }
            answers += 1
            try await Task.sleep(for: .milliseconds(250))
        }
        #expect(answers > 0)
        #expect(stalled.isEmpty, "the campaign runner called stalled: \(stalled.first ?? "")")
        try await held.waitedOn(via: t.fixture.pool, "the audience statement still waiting")
        let campaign = try await t.campaign(id)
        #expect(campaign.array("schedules").first?.string("state") == "pending", "\(campaign)")
    }

    @Test("a cancel while a start's audience is being resolved answers at once: the start has begun, its changes go")
    func cancelDuringAudience() async throws {
        let t = try await Self.tenant()
        let person = Fake.id("p")
        let (line, token) = Self.iosPerson(person, type: t.type, attributes: ["team": "X"])
        try await t.importPeople([line])
        let id = Fake.id("resolving")
        #expect(try await t.create(["campaign_id": id, "audience": ["all": true]]).status == 202)
        let held = try await Self.holdAudience(t, id, person: person)
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        do {
            try await held.waitedOn(via: t.fixture.pool, "the start's audience statement waiting")
            let update = try await t.api.call(
                "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: ["content_state_patch": ["home": 1]])
            #expect(update.status == 202, "\(update.text)")
            // The audience statement may run for minutes: the cancel does not wait for it (nor answer 503).
            let clock = ContinuousClock()
            let asked = clock.now
            let cancelled = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app, timeout: 20)
            #expect(clock.now - asked < .seconds(10))
            #expect(cancelled.status == 200, "\(cancelled.text)")
            let answer = try cancelled.json()
            #expect(answer["campaign_cancelled"] as? Bool == false, "\(cancelled.text)")
            #expect(answer["schedules_cancelled"] as? Int == 1, "\(cancelled.text)")
        } catch {
            try await held.commit()
            throw error
        }
        try await held.commit()
        // The start runs to the end; the change cancelled never runs.
        let started = try await t.settled(id, schedules: 2)
        #expect(started.string("state") == "active", "\(started)")
        let states = started.array("schedules").map { "\($0.string("operation") ?? "")=\($0.string("state") ?? "")" }
        #expect(states.sorted() == ["start=done", "update=cancelled"], "\(started)")
        try await eventually("the start sent") { t.fixture.apns.pushes(token: token).count == 1 }
    }

    @Test("a worker stopped in the middle of a campaign run gives up what the run holds after the statement timeout")
    func stoppedWorkerReleasesRun() async throws {
        let t = try await Self.tenant()
        let person = Fake.id("p")
        let (line, _) = Self.iosPerson(person, type: t.type, attributes: ["team": "X"])
        try await t.importPeople([line])
        let id = Fake.id("stopped")
        #expect(try await t.create(["campaign_id": id, "audience": ["people": [person]]]).status == 202)
        let held = try await Self.holdAudience(t, id, person: person)
        let worker = try t.fixture.worker(["MARQUEE_DB_STATEMENT_TIMEOUT": "5"])
        defer { worker.signal(SIGKILL) }
        try await held.waitedOn(via: t.fixture.pool, "the start's audience statement waiting")
        let run = try await t.fixture.pool.count(
            "SELECT pid AS n FROM pg_stat_activity WHERE \(held.pid) = ANY(pg_blocking_pids(pid)) LIMIT 1")
        // The worker's host vanishes (stopped here): its audience statement completes, and its transaction sits idle
        // with the schedule, the campaign and the tenant's erasures held. PostgreSQL ends it after the statement
        // timeout, not hours later when the TCP keepalives notice.
        worker.signal(SIGSTOP)
        try await held.commit()
        try await eventually("the stopped run's session ended", timeout: .seconds(45)) {
            try await t.fixture.pool.count(
                "SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = \(run)") == 0
        }
        // Its schedule is free again: a cancel does not wait for it (the start had not begun writing).
        let cancelled = try await t.api.call("POST", "/v1/campaigns/\(id)/cancel", key: t.tenant.app, timeout: 30)
        #expect(cancelled.status == 200, "\(cancelled.text)")
        #expect(try cancelled.json()["campaign_cancelled"] as? Bool == true, "\(cancelled.text)")
    }

    @Test("a retry of an accepted create or change gets its answer, though its time has passed and its segment is gone")
    func retryAfterTheTime() async throws {
        let t = try await Self.tenant()
        let segment = Fake.id("seg")
        let saved = try await t.api.call(
            "PUT", "/v1/segments/\(segment)", key: t.tenant.app,
            json: ["name": "s", "filter": ["has_device": [:] as [String: Any]]])
        #expect(saved.status == 201, "\(saved.text)")
        let soon = (Date().timeIntervalSince1970 + 2).rounded(.up)
        let id = Fake.id("soon")
        let createKey = ["Idempotency-Key": Fake.hex(16)]
        let createBody: [String: Any] = ["campaign_id": id, "audience": ["segment": segment], "start_at": soon]
        let created = try await t.create(createBody, headers: createKey)
        #expect(created.status == 202, "\(created.text)")
        let changeKey = ["Idempotency-Key": Fake.hex(16)]
        let changeBody: [String: Any] = ["content_state_patch": ["home": 1], "at": soon]
        func change() async throws -> HTTP.Response {
            try await t.api.call(
                "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app, json: changeBody, headers: changeKey)
        }
        let changed = try await change()
        #expect(changed.status == 202, "\(changed.text)")
        #expect(try await t.api.call("DELETE", "/v1/segments/\(segment)", key: t.tenant.app).status == 204)

        // Until start_at and at have passed (no worker runs the start meanwhile).
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while Date().timeIntervalSince1970 < soon + 0.5 && clock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        // The answers the requests got: not 422 for a time now past, or for a segment since deleted.
        let createAgain = try await t.create(createBody, headers: createKey)
        #expect(createAgain.status == 202, "\(createAgain.text)")
        #expect(createAgain.text == created.text)
        #expect(createAgain.header("Idempotent-Replayed") == "true")
        let changeAgain = try await change()
        #expect(changeAgain.status == 202, "\(changeAgain.text)")
        #expect(changeAgain.text == changed.text)
        #expect(changeAgain.header("Idempotent-Replayed") == "true")
        // Another request under a used key is still refused, before anything else is checked.
        let other = try await t.create(
            ["campaign_id": Fake.id("other"), "audience": ["all": true]], headers: createKey)
        #expect(other.status == 422, "\(other.text)")
        #expect(try other.json().string("field") == "Idempotency-Key")
        #expect(try await t.campaign(id).array("schedules").count == 2, "one start, one update: nothing twice")
    }

    @Test("a campaign end takes dismissal_policy and dismissal_date as an instance's end does; none before its at")
    func endDismissal() async throws {
        let t = try await Self.tenant()
        let now = Date().timeIntervalSince1970.rounded(.down)
        let id = Fake.id("dismiss")
        #expect(
            try await t.create(["campaign_id": id, "audience": ["all": true], "start_at": now + 600]).status == 202)
        let end = "/v1/campaigns/\(id)/end"
        let at = now + 3600
        let refused: [([String: Any], String)] = [
            // Before the end is sent: it could only dismiss at once, which dismissal_policy immediate says.
            (["at": at, "dismissal_date": at - 1800], "dismissal_date"),
            (["at": at, "dismissal_date": now - 60], "dismissal_date"),
            (["dismissal_policy": "sometimes"], "dismissal_policy"),
            (["dismissal_policy": "immediate", "dismissal_date": at + 60], "dismissal_policy"),
        ]
        for (body, field) in refused {
            let r = try await t.api.call("POST", end, key: t.tenant.app, json: body)
            #expect(r.status == 422, "\(body): \(r.text)")
            #expect(try r.json().string("field") == field, "\(body): \(r.text)")
        }
        // Accepted: the dismissal date each stored end carries (immediate: the time it is due).
        let accepted: [([String: Any], Double?)] = [
            (["at": at, "dismissal_date": at + 1800], at + 1800), (["at": at, "dismissal_date": at], at),
            (["at": at, "dismissal_policy": "immediate"], at), (["at": at, "dismissal_policy": "default"], nil),
        ]
        for (body, expected) in accepted {
            let r = try await t.api.call("POST", end, key: t.tenant.app, json: body)
            #expect(r.status == 202, "\(body): \(r.text)")
            let changeID = try #require(try r.json().string("change_id"))
            let uuid = try #require(ULID(string: changeID)?.uuid)
            let rows = try await t.fixture.pool.query(
                """
                SELECT (change -> 'options' ->> 'dismissal_date')::float8 AS d FROM campaign_schedules
                WHERE tenant_id = \(t.tenant.uuid) AND id = \(uuid)
                """)
            #expect(try rows[0].decode(Double?.self, "d") == expected, "\(body)")
        }
    }

    @Test("bad requests: 4xx problems naming the field, never a 500; Idempotency-Key replays")
    func validation() async throws {
        let t = try await Self.tenant()
        let past = Date().timeIntervalSince1970 - 60
        let cases: [([String: Any], Int, String)] = [
            (["audience": ["all": true], "start_at": past], 422, "start_at"),
            // A day that does not exist: not rolled over into March.
            (["audience": ["all": true], "start_at": "2031-02-29T12:00:00Z"], 422, "start_at"),
            (["audience": ["all": true], "start_at": "2031-04-31T12:00:00+02:00"], 422, "start_at"),
            (["audience": ["all": true, "people": ["a"]]], 422, "audience"),
            (["audience": ["segment": "nope-\(Fake.hex(4))"]], 422, "audience.segment"),
            (["audience": ["people": []]], 422, "audience.people"),
            (["audience": ["people": [1]]], 422, "audience.people[0]"),
            (["audience": ["all": true], "attributes": ["team": ["$person": "team"]]], 422, "attributes/team/$person"),
            (["audience": ["all": true], "attributes": ["team": ["$person": "/t", "x": 1]]], 422, "attributes/team"),
            (["audience": ["all": true], "content_state": ["home": "zero", "away": 0]], 422, "content_state/home"),
            (["audience": ["all": true], "push_payload": NSNull()], 422, "push_payload.alert"),
            (["audience": ["all": true], "notification_type": "com.example.unknown"], 422, "notification_type"),
            (["audience": ["all": true], "campaign_id": String(repeating: "x", count: 65)], 422, "campaign_id"),
            (["audience": ["all": true], "rate_limit_per_second": 0], 422, "rate_limit_per_second"),
            (["audience": ["all": true], "extra": 1], 422, "extra"),
        ]
        for (body, status, field) in cases {
            let r = try await t.create(body)
            #expect(r.status == status, "\(body): \(r.text)")
            #expect(r.header("Content-Type")?.hasPrefix("application/problem+json") == true)
            #expect(try r.json().string("field") == field, "\(body): \(r.text)")
        }
        let id = Fake.id("idem")
        let key = ["Idempotency-Key": Fake.hex(16)]
        let body: [String: Any] = [
            "campaign_id": id, "audience": ["all": true], "start_at": Date().timeIntervalSince1970.rounded() + 600,
        ]
        let first = try await t.create(body, headers: key)
        #expect(first.status == 202, "\(first.text)")
        let replay = try await t.create(body, headers: key)
        #expect(replay.status == 202, "\(replay.text)")
        #expect(replay.text == first.text)
        #expect(replay.header("Idempotent-Replayed") == "true")
        let taken = try await t.create(
            ["campaign_id": id, "audience": ["all": true], "start_at": Date().timeIntervalSince1970 + 600])
        #expect(taken.status == 409, "\(taken.text)")
        let pastChange = try await t.api.call(
            "POST", "/v1/campaigns/\(id)/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1], "at": past])
        #expect(pastChange.status == 422)
        #expect(try pastChange.json().string("field") == "at")
        let missing = try await t.api.call(
            "POST", "/v1/campaigns/\(Fake.id("none"))/update", key: t.tenant.app,
            json: ["content_state_patch": ["home": 1]])
        #expect(missing.status == 404)
        let second = try await t.create([
            "campaign_id": Fake.id("second"), "audience": ["all": true],
            "start_at": Date().timeIntervalSince1970 + 600,
        ])
        #expect(second.status == 202, "\(second.text)")
        let list = try await t.api.call("GET", "/v1/campaigns?limit=1", key: t.tenant.app)
        #expect(try list.json().array("data").count == 1)
        let cursor = try #require(try list.json().string("next_cursor"))
        let next = try await t.api.call(
            "GET",
            "/v1/campaigns?limit=1&cursor=\(cursor.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")",
            key: t.tenant.app)
        #expect(next.status == 200, "\(next.text)")
    }
}
