import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import MarqueeStore
import PostgresClient
import Testing

/// Channel-backed instances: a start names a channel; its push-to-start pushes subscribe the new activities to it;
/// each update and end is one broadcast request on it, beside the per-token pushes of iPhones that cannot subscribe.
@Suite("Broadcast instances (iOS 18 channels)", .serialized)
struct BroadcastInstanceTests {
    typealias Tenant = ChannelTests.Tenant

    /// The instance's deliveries, oldest first.
    static func deliveries(_ t: Tenant, _ instance: String) async throws -> [[String: Any]] {
        let r = try await t.api.call(
            "GET", "/v1/live_notifications/\(instance)/deliveries?limit=200", key: t.tenant.app)
        return try r.json().array("data").reversed()
    }

    /// Waits until `instance` has `count` deliveries, none of them queued.
    static func settled(_ t: Tenant, _ instance: String, count: Int) async throws -> [[String: Any]] {
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        var last: [[String: Any]] = []
        while clock.now < deadline {
            last = try await deliveries(t, instance)
            if last.count == count, last.allSatisfy({ $0.string("status") != "queued" }) { return last }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestFailure("deliveries of \(instance) did not settle: \(last)")
    }

    /// An iPhone of `person` on `osVersion` with a push-to-start token for `type`; returns (device, token).
    static func iphone(_ t: Tenant, person: String, osVersion: String) async throws -> (String, String) {
        let device = Fake.hex()
        let token = Fake.hex()
        // An empty version: the SDK did not say.
        let registered = try await t.api.call(
            "PUT", "/v1/people/\(person)/devices/\(device)", key: t.tenant.sdk,
            json: osVersion.isEmpty ? ["platform": "ios"] : ["platform": "ios", "os_version": osVersion])
        guard registered.status == 200 || registered.status == 201 else {
            throw TestFailure("device: \(registered.text)")
        }
        let r = try await t.api.call(
            "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(t.type)", key: t.tenant.sdk,
            json: ["token": token])
        guard r.status == 200 else { throw TestFailure("push-to-start: \(r.text)") }
        return (device, token)
    }

    static func start(_ t: Tenant, person: String, instance: String, channel: String?) async throws -> HTTP.Response {
        var body: [String: Any] = [
            "identifiers": ["id": person], "notification_type": t.type, "instance_id": instance,
            "attributes": ["match": "A-B"], "content_state": ["home": 0, "away": 0],
            "push_payload": ["alert": ["title": "Kick-off", "body": "A v B"]],
        ]
        if let channel { body["channel_id"] = channel }
        return try await t.api.call("POST", "/v1/live_notifications/start", key: t.tenant.app, json: body)
    }

    static func change(_ t: Tenant, _ operation: String, _ instance: String, home: Int) async throws -> HTTP.Response {
        try await t.api.call(
            "POST", "/v1/live_notifications/\(operation)", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["home": home]])
    }

    @Test("a channel start carries input-push-channel; each update and end is one broadcast, whatever the devices")
    func oneBroadcastPerChange() async throws {
        let t = try await ChannelTests.tenant()
        let created = try await t.create("none")
        #expect(created.status == 201, "\(created.text)")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        let person = Fake.id("fan")
        var subscribers: [String] = []
        for version in ["18.1", "26.0", ""] {
            subscribers.append(try await Self.iphone(t, person: person, osVersion: version).1)
        }
        // An iOS 17 iPhone cannot subscribe to a channel: it is started with input-push-token and reports a token.
        let (oldDevice, oldPushToStart) = try await Self.iphone(t, person: person, osVersion: "17.5")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }

        let instance = Fake.id("match")
        let started = try await Self.start(t, person: person, instance: instance, channel: channel)
        #expect(started.status == 200, "\(started.text)")
        #expect(try started.json().string("channel_id") == channel)
        #expect(try started.json()["targets"] as? Int == 4)
        _ = try await Self.settled(t, instance, count: 4)
        for token in subscribers {
            let aps = try #require(t.fixture.simulator.pushes(token: token).first?["payload"]?["aps"])
            #expect(aps["input-push-channel"]?.stringValue == apnsChannel)
            #expect(aps["input-push-token"] == nil)
        }
        let oldAPS = try #require(t.fixture.simulator.pushes(token: oldPushToStart).first?["payload"]?["aps"])
        #expect(oldAPS["input-push-token"] == .int(1) && oldAPS["input-push-channel"] == nil)
        let read = try await t.api.call("GET", "/v1/live_notifications/\(instance)", key: t.tenant.app).json()
        #expect(read.string("channel_id") == channel)

        let oldActivityToken = Fake.hex()
        let registered = try await t.api.call(
            "PUT", "/v1/live_notifications/\(instance)/tokens/\(oldDevice)", key: t.tenant.sdk,
            json: ["token": oldActivityToken])
        #expect(registered.status == 200 || registered.status == 201, "\(registered.text)")
        let update = try await Self.change(t, "update", instance, home: 1)
        #expect(update.status == 200, "\(update.text)")
        #expect(try update.json()["targets"] as? Int == 2, "one broadcast and one iOS 17 token")
        _ = try await Self.settled(t, instance, count: 6)
        let end = try await Self.change(t, "end", instance, home: 2)
        #expect(end.status == 200, "\(end.text)")
        let all = try await Self.settled(t, instance, count: 8)

        let broadcasts = t.fixture.simulator.pushes(token: apnsChannel)
        #expect(broadcasts.map { $0["payload"]?["aps"]?["event"]?.stringValue } == ["update", "end"])
        #expect(broadcasts.map { $0["payload"]?["aps"]?["content-state"]?["home"]?.intValue } == [1, 2])
        #expect(broadcasts.allSatisfy { $0["broadcast"] == .bool(true) && $0["bundle_id"]?.stringValue == t.bundleID })
        // A channel that stores nothing: apns-expiration 0, as Apple requires.
        #expect(broadcasts.allSatisfy { $0["expiration"] == .int(0) })
        #expect(broadcasts.allSatisfy { $0["priority"]?.intValue == 5 }, "no alert: priority 5")
        let sent = all.filter { $0.string("token_kind") == "channel" }
        #expect(sent.count == 2 && sent.allSatisfy { $0.string("status") == "sent" }, "\(sent)")
        // The broadcast's apns-unique-id is recorded on its delivery.
        #expect(
            Set(sent.compactMap { $0.string("provider_id") })
                == Set(broadcasts.compactMap { $0["unique_id"]?.stringValue }))
        #expect(
            t.fixture.simulator.pushes(token: oldActivityToken).map { $0["payload"]?["aps"]?["event"]?.stringValue }
                == ["update", "end"])
        // Every subscribed device got its start and nothing else, one request per change in all.
        for token in subscribers { #expect(t.fixture.simulator.pushes(token: token).count == 1) }
    }

    @Test(
        "a channel Apple forgot: the broadcast fails with ChannelNotRegistered, the channel is gone, later updates plan none"
    )
    func goneChannel() async throws {
        let t = try await ChannelTests.tenant()
        let created = try await t.create("most_recent")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let instance = Fake.id("audience")
        // No device of its own: apps subscribe to the channel themselves. The instance is live at once.
        let started = try await Self.start(t, person: Fake.id("nobody"), instance: instance, channel: channel)
        #expect(started.status == 200, "\(started.text)")
        #expect(try started.json().string("state") == "active")
        #expect(try await Self.change(t, "update", instance, home: 1).status == 200)
        _ = try await Self.settled(t, instance, count: 1)
        // A channel that keeps the latest message: the broadcast expires with the instance, not at once.
        let first = try #require(t.fixture.simulator.pushes(token: apnsChannel).first)
        #expect((first["expiration"]?.intValue ?? 0) > Int64(Date().timeIntervalSince1970))

        #expect(t.fixture.simulator.forgetChannel(bundleID: t.bundleID, channelID: apnsChannel))
        #expect(try await Self.change(t, "update", instance, home: 2).status == 200)
        let failed = try await Self.settled(t, instance, count: 2)
        #expect(failed.last?.string("status") == "failed")
        #expect(failed.last?.string("reason") == "ChannelNotRegistered")
        // Marked gone in the worker's settle step, the transaction after the one that records the outcome.
        try await eventually("the channel is gone") {
            try await t.api.call("GET", "/v1/channels/\(channel)", key: t.tenant.app).json().string("status") == "gone"
        }
        let after = try await Self.change(t, "update", instance, home: 3)
        #expect(try after.json()["targets"] as? Int == 0)
        #expect(try after.json().string("failure_reason") == "channel_gone")
        // A gone channel cannot back a new start.
        expectProblem(
            try await Self.start(t, person: Fake.id("p"), instance: Fake.id("x"), channel: channel), 422,
            "invalid-field", field: "channel_id")
    }

    @Test(
        "a channel stays in its APNs environment: after the credential moves to production, a start naming a sandbox channel fails, its broadcasts still go"
    )
    func channelEnvironment() async throws {
        let t = try await ChannelTests.tenant()
        let created = try await t.create("none")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        let person = Fake.id("fan")
        let (_, pushToStart) = try await Self.iphone(t, person: person, osVersion: "18.1")
        let live = Fake.id("live")
        #expect(try await Self.start(t, person: Fake.id("nobody"), instance: live, channel: channel).status == 200)
        // The app goes to production: the credential says so; the channel was made in sandbox.
        let moved = try await t.api.call(
            "PUT", "/v1/credentials/apns", key: t.tenant.app,
            json: [
                "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
                "bundle_id": t.bundleID, "environment": "production",
                "management_endpoint": t.fixture.managementEndpoint, "endpoint": t.fixture.managementEndpoint,
            ])
        #expect(moved.status == 200, "\(moved.text)")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }

        let instance = Fake.id("match")
        #expect(try await Self.start(t, person: person, instance: instance, channel: channel).status == 200)
        let starts = try await Self.settled(t, instance, count: 1)
        #expect(starts[0].string("status") == "failed", "\(starts)")
        #expect(starts[0].string("reason") == "channel_other_environment")
        #expect(t.fixture.simulator.pushes(token: pushToStart).isEmpty, "no activity that no update could reach")
        // The broadcast on the sandbox channel still goes out, and the channel stays active.
        #expect(try await Self.change(t, "update", live, home: 1).status == 200)
        let broadcast = try await Self.settled(t, live, count: 1)
        #expect(broadcast[0].string("status") == "sent", "\(broadcast)")
        #expect(t.fixture.simulator.pushes(token: apnsChannel).count == 1)
        #expect(
            try await t.api.call("GET", "/v1/channels/\(channel)", key: t.tenant.app).json().string("status")
                == "active")
    }

    /// Puts the tenant's APNs credential on `bundleID` (default: its own) in `environment`, signed with `key` (default:
    /// the one the simulator knows).
    static func moveCredential(
        _ t: Tenant, bundleID: String? = nil, environment: String, key: ES256PrivateKey? = nil
    ) async throws {
        let moved = try await t.api.call(
            "PUT", "/v1/credentials/apns", key: t.tenant.app,
            json: [
                "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": (key ?? t.fixture.key).pkcs8PEM,
                "bundle_id": bundleID ?? t.bundleID, "environment": environment,
                "management_endpoint": t.fixture.managementEndpoint, "endpoint": t.fixture.managementEndpoint,
            ])
        guard moved.status == 200 else { throw TestFailure("credential: \(moved.text)") }
    }

    @Test(
        "a key Apple refuses for a channel of the other environment fails that broadcast alone: the credential stays in use"
    )
    func broadcastRefusedOutOfReach() async throws {
        let t = try await ChannelTests.tenant()
        let created = try await t.create("none")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        let live = Fake.id("live")
        #expect(try await Self.start(t, person: Fake.id("nobody"), instance: live, channel: channel).status == 200)
        // The app goes to production with a key Apple takes for production only: it refuses it for the sandbox
        // channel's broadcasts (403 InvalidProviderToken).
        try await Self.moveCredential(t, environment: "production")
        t.fixture.simulator.setFaults([.init(tokenPrefix: apnsChannel, action: .forbidden)])
        defer { t.fixture.simulator.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }

        #expect(try await Self.change(t, "update", live, home: 1).status == 200)
        let broadcast = try await Self.settled(t, live, count: 1)
        #expect(broadcast[0].string("status") == "failed", "\(broadcast)")
        #expect(broadcast[0].string("reason") == "channel_other_environment")
        let credential = try await t.api.call("GET", "/v1/credentials/apns", key: t.tenant.app).json()
        #expect(credential.string("status") == "ok", "\(credential)")
        // The tenant's other pushes go on.
        let person = Fake.id("fan")
        let (_, pushToStart) = try await Self.iphone(t, person: person, osVersion: "18.1")
        let plain = Fake.id("plain")
        #expect(try await Self.start(t, person: person, instance: plain, channel: nil).status == 200)
        let start = try await Self.settled(t, plain, count: 1)
        #expect(start[0].string("status") == "sent", "\(start)")
        #expect(t.fixture.simulator.pushes(token: pushToStart).count == 1)
        #expect(
            try await t.api.call("GET", "/v1/channels/\(channel)", key: t.tenant.app).json().string("status")
                == "active")
    }

    @Test("a start naming a channel of another app than the credential's fails with channel_other_app, nothing sent")
    func channelOtherApp() async throws {
        let t = try await ChannelTests.tenant()
        let channel = try #require(try await t.create("none").json().string("channel_id"))
        // The credential moves to another app of the team, in the same environment.
        try await Self.moveCredential(t, bundleID: t.bundleID + ".next", environment: "sandbox")
        let person = Fake.id("fan")
        let (_, pushToStart) = try await Self.iphone(t, person: person, osVersion: "18.1")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }

        let instance = Fake.id("match")
        #expect(try await Self.start(t, person: person, instance: instance, channel: channel).status == 200)
        let starts = try await Self.settled(t, instance, count: 1)
        #expect(starts[0].string("status") == "failed", "\(starts)")
        #expect(starts[0].string("reason") == "channel_other_app")
        #expect(t.fixture.simulator.pushes(token: pushToStart).isEmpty, "no activity that no update could reach")
    }

    @Test(
        "a channel of the other environment that Apple refuses the credential's key for is deleted here only; one of its own environment is not"
    )
    func deleteOutOfReach() async throws {
        let t = try await ChannelTests.tenant()
        let sandbox = try await t.create("none").json()
        let sandboxID = try #require(sandbox.string("channel_id"))
        let sandboxAPNs = try #require(sandbox.string("apns_channel_id"))
        try await Self.moveCredential(t, environment: "production")
        let production = try #require(try await t.create("none").json().string("channel_id"))
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 2)
        // A key Apple (the simulator) refuses everywhere: for its own environment that is the key's fault.
        try await Self.moveCredential(t, environment: "production", key: ES256PrivateKey.generate())
        let own = try await t.api.call("DELETE", "/v1/channels/\(production)", key: t.tenant.app)
        expectProblem(own, 502, "apns-refused")
        #expect(try own.json().string("apns_reason") == "InvalidProviderToken")
        #expect(try await t.api.call("GET", "/v1/channels/\(production)", key: t.tenant.app).status == 200)
        // For the sandbox channel only a key of that environment could say: the record goes, the ID is logged.
        let other = try await t.api.call("DELETE", "/v1/channels/\(sandboxID)", key: t.tenant.app)
        #expect(other.status == 204, "\(other.text)")
        expectProblem(try await t.api.call("GET", "/v1/channels/\(sandboxID)", key: t.tenant.app), 404, "not-found")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 2, "left at Apple")
        try await eventually("the channel left at Apple is logged with its ID") {
            t.fixture.serve.log.split(separator: "\n").contains {
                $0.contains("channel deleted here only") && $0.contains(sandboxAPNs)
            }
        }
    }

    @Test("an update planned while its channel backed the instance writes nothing if the channel went before its write")
    func channelGoneBeforeWrite() async throws {
        let t = try await ChannelTests.tenant()
        let (pool, _, store) = try LifecycleWriteTests.oneConnection(t.fixture.databaseURL)
        defer { pool.close() }
        let tenant = t.tenant.uuid
        let queued: PostgresQuery =
            "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(tenant) AND token_kind = 'channel'"
        for ending in ["deleted", "gone"] {
            let created = try await t.create("none")
            let channel = try #require(try created.json().string("channel_id"))
            let apnsChannel = try #require(try created.json().string("apns_channel_id"))
            let instance = Fake.id("audience")
            let started = try await Self.start(t, person: Fake.id("nobody"), instance: instance, channel: channel)
            #expect(started.status == 200, "\(started.text)")
            let stale = try await LifecycleWriteTests.plan(store, tenant, instance, .update, eta: 1)
            #expect(stale.plan.deliveries.map(\.tokenKind) == [.channel], "\(ending)")
            if ending == "deleted" {
                let deleted = try await t.api.call("DELETE", "/v1/channels/\(channel)", key: t.tenant.app)
                #expect(deleted.status == 204, "\(deleted.text)")
            } else {
                // A worker found it gone at Apple (ChannelNotRegistered) and marked it.
                #expect(
                    try await pool.execute(
                        "UPDATE channels SET status = 'gone' WHERE tenant_id = \(tenant) AND apns_channel_id = \(apnsChannel)"
                    ) == 1)
            }
            #expect(try await store.change(tenant: tenant, stale) == .versionConflict, "\(ending)")
            #expect(try await pool.count(queued) == 0, "nothing queued to the channel that went (\(ending))")
            // Planned again: no broadcast.
            let again = try await LifecycleWriteTests.plan(store, tenant, instance, .update, eta: 2)
            #expect(again.plan.deliveries.isEmpty, "\(ending)")
            guard case .written = try await store.change(tenant: tenant, again) else {
                throw TestFailure("the update was not written (\(ending))")
            }
            #expect(try await pool.count(queued) == 0, "\(ending)")
        }
    }

    @Test(
        "a start names a channel of this tenant and of its activity type; a broadcast larger than Apple's limit is 413")
    func startValidation() async throws {
        let t = try await ChannelTests.tenant()
        let other = try await ChannelTests.tenant()
        let foreign = try #require(try await other.create().json().string("channel_id"))
        let otherType = Fake.activityType()
        _ = try await t.api.call(
            "PUT", "/v1/activity_types/\(otherType)", key: t.tenant.app, json: ["attributes_type": "OtherAttributes"])
        let mismatched = try #require(try await t.create(type: otherType).json().string("channel_id"))
        let person = Fake.id("p")
        for (channel, reason) in [
            ("not-a-ulid", "is not a channel ID"), (foreign, "is not a channel of this tenant"),
            (ULIDGenerator.shared.next().description, "is not a channel of this tenant"),
            (mismatched, "belongs to activity type"),
        ] {
            let r = try await Self.start(t, person: person, instance: Fake.id("v"), channel: channel)
            expectProblem(r, 422, "invalid-field", field: "channel_id")
            #expect(r.text.contains(reason), "\(r.text)")
        }
        let channel = try #require(try await t.create().json().string("channel_id"))
        let instance = Fake.id("big")
        #expect(try await Self.start(t, person: person, instance: instance, channel: channel).status == 200)
        let big = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["blob": String(repeating: "x", count: 5000)]])
        expectProblem(big, 413, "push-too-large")
        #expect(try big.json()["over_by"] != nil, "\(big.text)")
    }

    @Test("a campaign on a channel: its starts subscribe to it; each campaign-wide change is one broadcast for all")
    func channelCampaign() async throws {
        let t = try await ChannelTests.tenant()
        let created = try await t.create("none")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        let fans = (0..<3).map { _ in Fake.id("fan") }
        var subscribers: [String] = []
        for fan in fans.prefix(2) { subscribers.append(try await Self.iphone(t, person: fan, osVersion: "18.2").1) }
        let (oldDevice, oldPushToStart) = try await Self.iphone(t, person: fans[2], osVersion: "17.5")
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }

        let campaign = Fake.id("final")
        let started = try await Self.matchCampaign(t, campaign, channel: channel, fans: fans)
        #expect(started.status == 202, "\(started.text)")
        _ = try await Self.campaignSettled(t, campaign, schedules: 1)
        for token in subscribers {
            let aps = try #require(t.fixture.simulator.pushes(token: token).first?["payload"]?["aps"])
            #expect(aps["input-push-channel"]?.stringValue == apnsChannel)
        }
        let oldAPS = try #require(t.fixture.simulator.pushes(token: oldPushToStart).first?["payload"]?["aps"])
        #expect(oldAPS["input-push-token"] == .int(1) && oldAPS["input-push-channel"] == nil)
        let oldActivityToken = Fake.hex()
        let registered = try await t.api.call(
            "PUT", "/v1/live_notifications/\(campaign).\(fans[2])/tokens/\(oldDevice)", key: t.tenant.sdk,
            json: ["token": oldActivityToken])
        #expect(registered.status == 200 || registered.status == 201, "\(registered.text)")

        for (index, operation) in ["update", "end"].enumerated() {
            let changed = try await t.api.call(
                "POST", "/v1/campaigns/\(campaign)/\(operation)", key: t.tenant.app,
                json: ["content_state_patch": ["home": index + 1]])
            #expect(changed.status == 202, "\(changed.text)")
            _ = try await Self.campaignSettled(t, campaign, schedules: index + 2)
        }
        // One broadcast per change for the whole audience, beside the iOS 17 iPhone's own token.
        let broadcasts = t.fixture.simulator.pushes(token: apnsChannel)
        #expect(broadcasts.map { $0["payload"]?["aps"]?["event"]?.stringValue } == ["update", "end"])
        #expect(broadcasts.map { $0["payload"]?["aps"]?["content-state"]?["home"]?.intValue } == [1, 2])
        #expect(
            t.fixture.simulator.pushes(token: oldActivityToken).map { $0["payload"]?["aps"]?["event"]?.stringValue }
                == ["update", "end"])
        for token in subscribers { #expect(t.fixture.simulator.pushes(token: token).count == 1) }
        // The funnel counts one send per channel for each change.
        let read = try await t.api.call("GET", "/v1/campaigns/\(campaign)", key: t.tenant.app).json()
        let viaChannel = read.array("funnel").filter { $0.string("via") == "channel" }
        #expect(viaChannel.map { $0.string("operation") ?? "" } == ["update", "end"], "\(read)")
        #expect(viaChannel.allSatisfy { $0["sent"] as? Int == 1 && $0["targeted"] as? Int == 1 })
        #expect(read.string("channel_id") == channel)
    }

    @Test("a campaign may ask for a new channel: made at Apple once, kept on a replay, deleted again on a conflict")
    func newChannelCampaign() async throws {
        let t = try await ChannelTests.tenant()
        let fan = Fake.id("fan")
        let subscriber = try await Self.iphone(t, person: fan, osVersion: "18.1").1
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let campaign = Fake.id("derby")
        let body: [String: Any] = [
            "campaign_id": campaign, "name": "Derby", "notification_type": t.type,
            "channel": ["storage_policy": "most_recent"], "audience": ["people": [fan]],
            "attributes": ["match": "C-D"], "content_state": ["home": 0, "away": 0],
            "push_payload": ["alert": ["title": "Kick-off", "body": "C v D"]],
        ]
        let key = ["Idempotency-Key": Fake.hex(16)]
        let created = try await t.api.call("POST", "/v1/campaigns", key: t.tenant.app, json: body, headers: key)
        #expect(created.status == 202, "\(created.text)")
        let channel = try #require(try created.json().string("channel_id"))
        let apnsChannel = try #require(try created.json().string("apns_channel_id"))
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
        // A replay answers the same and makes no second channel.
        let replay = try await t.api.call("POST", "/v1/campaigns", key: t.tenant.app, json: body, headers: key)
        #expect(replay.status == 202 && replay.text == created.text, "\(replay.text)")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
        // The same campaign ID without the key: a conflict, and the channel made for it is deleted again.
        let taken = try await t.api.call("POST", "/v1/campaigns", key: t.tenant.app, json: body)
        #expect(taken.status == 409, "\(taken.text)")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
        let listed = try await t.api.call("GET", "/v1/channels", key: t.tenant.app).json()
        #expect(listed.array("data").compactMap { $0.string("channel_id") } == [channel])

        let settled = try await Self.campaignSettled(t, campaign, schedules: 1)
        #expect(settled.string("channel_id") == channel)
        let aps = try #require(t.fixture.simulator.pushes(token: subscriber).first?["payload"]?["aps"])
        #expect(aps["input-push-channel"]?.stringValue == apnsChannel)
        let both = try await t.api.call(
            "POST", "/v1/campaigns", key: t.tenant.app,
            json: body.merging(["campaign_id": Fake.id("x"), "channel_id": channel]) { _, new in new })
        #expect(both.status == 422, "\(both.text)")
        #expect(try both.json().string("field") == "channel")
    }

    @Test(
        "a campaign asking for a new channel is size-checked with its channel's ID: one that no longer fits is 413, the channel deleted again"
    )
    func newChannelCampaignSize() async throws {
        let t = try await ChannelTests.tenant()
        func body(_ padding: Int) -> [String: Any] {
            [
                "campaign_id": Fake.id("size"), "name": "Size", "notification_type": t.type, "platform": "ios",
                "audience": ["people": [Fake.id("fan")]],
                "attributes": ["match": String(repeating: "m", count: padding)],
                "content_state": ["home": 0, "away": 0], "push_payload": ["alert": ["title": "Kick-off", "body": "x"]],
                "start_at": Date().timeIntervalSince1970 + 3600,
            ]
        }
        func create(_ body: [String: Any]) async throws -> HTTP.Response {
            try await t.api.call("POST", "/v1/campaigns", key: t.tenant.app, json: body)
        }
        // The largest attributes that fit without a channel.
        var fits = 0
        var refused = 5000
        #expect(try await create(body(refused)).status == 413)
        while refused - fits > 1 {
            let middle = (fits + refused) / 2
            let status = try await create(body(middle)).status
            #expect(status == 202 || status == 413)
            if status == 202 { fits = middle } else { refused = middle }
        }
        var onChannel = body(fits)
        onChannel["channel"] = ["storage_policy": "none"]
        let tooLarge = try await create(onChannel)
        #expect(tooLarge.status == 413, "input-push-channel counts: \(tooLarge.text)")
        #expect(try tooLarge.json().string("type") == "https://marquee.dev/problems/push-too-large")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 0, "the channel made for it is deleted again")
        // With room for the channel's ID it is created.
        var roomy = body(fits - 200)
        roomy["channel"] = ["storage_policy": "none"]
        #expect(try await create(roomy).status == 202)
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
    }

    /// `POST /v1/campaigns`: the match tracker on `channel` for `fans`, starting at once or at `startAt`.
    static func matchCampaign(
        _ t: Tenant, _ campaign: String, channel: String, fans: [String], startAt: Date? = nil
    ) async throws -> HTTP.Response {
        var body: [String: Any] = [
            "campaign_id": campaign, "name": "Final", "notification_type": t.type, "channel_id": channel,
            "audience": ["people": fans], "attributes": ["match": "A-B"], "content_state": ["home": 0, "away": 0],
            "push_payload": ["alert": ["title": "Kick-off", "body": "A v B"]],
        ]
        if let startAt { body["start_at"] = startAt.timeIntervalSince1970 }
        return try await t.api.call("POST", "/v1/campaigns", key: t.tenant.app, json: body)
    }

    /// Waits until the campaign's `schedules` ran and nothing of it is queued.
    static func campaignSettled(_ t: Tenant, _ id: String, schedules: Int) async throws -> [String: Any] {
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        var last: [String: Any] = [:]
        while clock.now < deadline {
            last = try await t.api.call("GET", "/v1/campaigns/\(id)", key: t.tenant.app).json()
            let ran = last.array("schedules").filter { $0.string("state") != "pending" }.count
            let queued = last.array("funnel").reduce(0) { $0 + ($1["queued"] as? Int ?? 0) }
            if ran == schedules && last.array("schedules").count == schedules && queued == 0 { return last }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestFailure("campaign \(id) did not settle: \(last)")
    }
}
