import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Testing

@testable import MarqueeStore

/// A device's queued pushes go with it (migration 0083): removed, evicted past the person's cap, deleted through the
/// Customer.io ingest or registered again under another person, it gets none of what was queued to it before, from a
/// worker sending to the APNs simulator; the person's other devices still get theirs.
extension DeliveryTests {
    /// `"<status> <reason>"` of each delivery of `instance` by `"<device token> <operation>"`, from the database
    /// (the API masks device tokens).
    static func outcomes(_ t: Tenant, _ instance: String) async throws -> [String: String] {
        let rows = try await t.fixture.pool.query(
            """
            SELECT device_token || ' ' || operation AS k, status || ' ' || COALESCE(reason, '') AS outcome
            FROM deliveries WHERE tenant_id = \(t.tenant.uuid) AND instance_id = \(instance)
            """)
        var found: [String: String] = [:]
        for row in rows { found[try row.decode(String.self, "k")] = try row.decode(String.self, "outcome") }
        return found
    }

    /// The APNs simulator's pushes to `token`, each as the instance ID its payload names (a start's attributes do;
    /// an update has none: nil).
    static func pushedInstances(_ t: Tenant, _ token: String) -> [String?] {
        t.fixture.simulator.pushes(token: token).map {
            $0["payload"]?["aps"]?["attributes"]?["cioInstanceId"]?.stringValue
        }
    }

    /// Registers an activity token of `instance` for `device`; returns it.
    static func activityToken(_ t: Tenant, _ instance: String, _ device: String) async throws -> String {
        let token = Fake.hex()
        let r = try await t.api.call(
            "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: t.tenant.sdk, json: ["token": token])
        guard r.status == 200 else { throw TestFailure("activity token: \(r.status) \(r.text)") }
        return token
    }

    @Test("a deleted device gets neither its queued push-to-start nor its queued update; the other device gets both")
    func deletedDeviceGetsNothingQueued() async throws {
        let t = try await Self.tenant()
        let (gone, goneStart) = try await t.iphone()
        let (kept, keptStart) = try await t.iphone()
        let instance = Fake.id("removed")
        #expect(try await t.start(instance).status == 200)
        let goneActivity = try await Self.activityToken(t, instance, gone)
        let keptActivity = try await Self.activityToken(t, instance, kept)
        let update = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": instance, "content_state_patch": ["status": "baking"]])
        #expect(update.status == 200, "\(update.text)")
        // No worker yet: each iPhone has a start and an update waiting. The app logs out on one of them.
        let removed = try await t.api.call("DELETE", "/v1/people/\(t.person)/devices/\(gone)", key: t.tenant.sdk)
        #expect(removed.status == 204, "\(removed.text)")

        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        _ = try await t.settled(instance, count: 4, timeout: .seconds(120))
        #expect(Self.pushedInstances(t, goneStart).isEmpty, "the removed phone got its queued start")
        #expect(Self.pushedInstances(t, goneActivity).isEmpty, "the removed phone got its queued update")
        #expect(Self.pushedInstances(t, keptStart) == [instance])
        #expect(Self.pushedInstances(t, keptActivity).count == 1)
        let outcomes = try await Self.outcomes(t, instance)
        for operation in ["start", "update"] {
            #expect(outcomes["\(gone) \(operation)"] == "superseded device_removed", "\(outcomes)")
            #expect(outcomes["\(kept) \(operation)"] == "sent ", "\(outcomes)")
        }
    }

    @Test("a device evicted past the person's cap, by a registration or an import, gets none of its queued pushes")
    func evictedDeviceGetsNothingQueued() async throws {
        let t = try await Self.tenant()
        let cap = try await t.api.call(
            "PATCH", "/v1/settings", key: t.tenant.app, json: ["max_devices_per_person": 1])
        #expect(cap.status == 200, "\(cap.text)")
        // A registration: the person's second phone evicts the first, whose start is still queued.
        let (old, oldStart) = try await t.iphone()
        let first = Fake.id("evicted")
        #expect(try await t.start(first).status == 200)
        let (new, newStart) = try await t.iphone()
        let second = Fake.id("evictor")
        #expect(try await t.start(second).status == 200)
        // An import: another person's phone, whose start is queued, evicted by the phone the import gives them.
        let other = Fake.id("bob")
        let (otherOld, otherOldStart) = (Fake.hex(), Fake.hex())
        _ = try await t.api.call(
            "PUT", "/v1/people/\(other)/devices/\(otherOld)", key: t.tenant.sdk, json: ["platform": "ios"])
        let registered = try await t.api.call(
            "PUT", "/v1/people/\(other)/devices/\(otherOld)/push_to_start/\(t.type)", key: t.tenant.sdk,
            json: ["token": otherOldStart])
        #expect(registered.status == 200, "\(registered.text)")
        let third = Fake.id("imported")
        #expect(try await t.start(third, extra: ["identifiers": ["id": other]]).status == 200)
        let imported = try await PeopleImportTests.post(
            t.api, t.tenant.app,
            PeopleImportTests.ndjson([
                try PeopleImportTests.json([
                    "id": other,
                    "devices": [["token": Fake.hex(), "platform": "ios", "push_to_start": [t.type: Fake.hex()]]],
                ])
            ]))
        #expect(imported.status == 200, "\(imported.text)")
        let devices = try await t.api.call("GET", "/v1/people/\(other)", key: t.tenant.app).json().array("devices")
        #expect(devices.count == 1, "the import evicted the older phone: \(devices)")
        // Someone the import creates with more phones than the cap keeps as many as it allows.
        let newcomer = Fake.id("carol")
        let created = try await PeopleImportTests.post(
            t.api, t.tenant.app,
            PeopleImportTests.ndjson([
                try PeopleImportTests.json([
                    "id": newcomer,
                    "devices": [
                        ["token": Fake.hex(), "platform": "ios"], ["token": Fake.fcm(), "platform": "android"],
                    ],
                ])
            ]))
        #expect(try created.json()["imported"] as? Int == 1, "\(created.text)")
        let theirs = try await t.api.call("GET", "/v1/people/\(newcomer)", key: t.tenant.app).json().array("devices")
        #expect(theirs.count == 1, "a new person's imported phones past the cap: \(theirs)")

        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        for instance in [first, second, third] {
            _ = try await t.settled(instance, count: 1, timeout: .seconds(120))
        }
        #expect(Self.pushedInstances(t, oldStart).isEmpty, "the evicted phone got its queued start")
        #expect(Self.pushedInstances(t, otherOldStart).isEmpty, "the phone the import evicted got its queued start")
        #expect(Self.pushedInstances(t, newStart) == [second])
        #expect(try await Self.outcomes(t, first)["\(old) start"] == "superseded device_removed")
        #expect(try await Self.outcomes(t, third)["\(otherOld) start"] == "superseded device_removed")
        #expect(try await Self.outcomes(t, second)["\(new) start"] == "sent ")
    }

    @Test("a Customer.io Device Deleted cancels the device's queued pushes; the other device gets its own")
    func compatDeletedDeviceGetsNothingQueued() async throws {
        let t = try await Self.tenant()
        let (gone, goneStart) = try await t.iphone()
        let (_, keptStart) = try await t.iphone()
        let instance = Fake.id("cio")
        #expect(try await t.start(instance).status == 200)
        let deleted = try await t.api.call(
            "POST", "/v1/b",
            json: CompatIngestTests.envelope(
                [CompatIngestTests.event("track", "Device Deleted", userId: t.person, deviceToken: gone)],
                writeKey: t.tenant.sdk),
            headers: ["Authorization": t.tenant.basicSDK])
        #expect(deleted.status == 200, "\(deleted.text)")
        #expect(try deleted.json()["applied"] as? Int == 1, "\(deleted.text)")

        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        _ = try await t.settled(instance, count: 2, timeout: .seconds(120))
        #expect(Self.pushedInstances(t, goneStart).isEmpty, "the deleted phone got its queued start")
        #expect(Self.pushedInstances(t, keptStart) == [instance])
        #expect(try await Self.outcomes(t, instance)["\(gone) start"] == "superseded device_removed")
    }

    @Test("a token registered again under another person gets its new owner's pushes, none its previous owner queued")
    func movedDeviceGetsOnlyItsNewOwnersPushes() async throws {
        let t = try await Self.tenant()
        let (phone, phoneStart) = try await t.iphone()
        let first = Fake.id("sold")
        #expect(try await t.start(first).status == 200)
        let firstActivity = try await Self.activityToken(t, first, phone)
        let update = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": first, "content_state_patch": ["status": "baking"]])
        #expect(update.status == 200, "\(update.text)")
        // The phone changes hands: the next owner's app registers the same token under their person ID.
        let buyer = Fake.id("buyer")
        let moved = try await t.api.call(
            "PUT", "/v1/people/\(buyer)/devices/\(phone)", key: t.tenant.sdk, json: ["platform": "ios"])
        #expect(moved.status == 200, "\(moved.text)")
        let second = Fake.id("bought")
        #expect(try await t.start(second, extra: ["identifiers": ["id": buyer]]).status == 200)

        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        _ = try await t.settled(first, count: 2, timeout: .seconds(120))
        _ = try await t.settled(second, count: 1, timeout: .seconds(120))
        #expect(Self.pushedInstances(t, phoneStart) == [second], "only the new owner's start reaches the phone")
        #expect(Self.pushedInstances(t, firstActivity).isEmpty, "the previous owner's queued update reached the phone")
        let outcomes = try await Self.outcomes(t, first)
        #expect(outcomes["\(phone) start"] == "superseded device_removed", "\(outcomes)")
        #expect(outcomes["\(phone) update"] == "superseded device_removed", "\(outcomes)")
    }

    @Test("a device moved to another person gets none of its previous person's later updates (migration 0086)")
    func movedDeviceLeavesPreviousOwnersActivities() async throws {
        let t = try await Self.tenant()
        let (phone, _) = try await t.iphone()
        let first = Fake.id("handed-on")
        #expect(try await t.start(first).status == 200)
        _ = try await Self.activityToken(t, first, phone)
        let buyer = Fake.id("next-owner")
        let moved = try await t.api.call(
            "PUT", "/v1/people/\(buyer)/devices/\(phone)", key: t.tenant.sdk, json: ["platform": "ios"])
        #expect(moved.status == 200, "\(moved.text)")
        // After the move, the previous person's activity changes: nothing of it may be planned for the phone.
        let update = try await t.api.call(
            "POST", "/v1/live_notifications/update", key: t.tenant.app,
            json: ["instance_id": first, "content_state_patch": ["status": "out for delivery"]])
        #expect(update.status == 200, "\(update.text)")
        let outcomes = try await Self.outcomes(t, first)
        #expect(outcomes["\(phone) update"] == nil, "an update after the move was planned for the phone: \(outcomes)")
        let token = try await t.fixture.pool.query(
            """
            SELECT status || ' ' || COALESCE(retired_reason, '') AS s FROM activity_tokens
            WHERE tenant_id = \(t.tenant.uuid) AND instance_id = \(first) AND device_token = \(phone)
            """
        ).map { try $0.decode(String.self, "s") }
        #expect(token == ["retired device_moved"])
    }
}

extension ClaimTests {
    @Test(
        "a device removed while its push is sent: the removal does not wait, the send is recorded once, a retry not made"
    )
    func removalLeavesHeldRowsToTheirWorker() async throws {
        let w = try await LifecycleTests.world(fixture: .holding)
        let instance = Fake.id("inflight")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        let (sent, retried) = (w.iphones[0], w.iphones[1])
        let held = AsyncGate()
        let release = AsyncGate()
        defer { release.open(0) }
        let claiming = Task {
            try await DeliveryQueue(pool: w.fixture.pool).claim(
                limit: 10, hold: .seconds(120), tenants: [w.tenant.uuid]
            ) { batch in
                held.open(batch.count)
                await release.wait()
                return ClaimResults(
                    results: batch.map { d in
                        d.deviceToken == retried
                            ? DeliveryResult(
                                tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .queued,
                                httpStatus: 503, reason: "ServiceUnavailable", retryDelay: .zero)
                            : DeliveryResult(
                                tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .sent,
                                providerID: Fake.hex(16))
                    })
            }
        }
        #expect(try await held.value(within: .seconds(60)) == 3, "the claim holds the start's three deliveries")
        // Both iPhones are removed while their starts are being sent. The claim is released only once both removals
        // answered, so a removal that waited for it would never answer (the client gives up, or the server's
        // statement timeout ends it with a 503).
        for device in [sent, retried] {
            let r = try await w.api.call(
                "DELETE", "/v1/people/\(w.person)/devices/\(device)", key: w.tenant.app, timeout: 90)
            #expect(r.status == 204, "\(r.text)")
        }
        release.open(0)
        #expect(try await claiming.value == 3)

        let rows = try await w.fixture.pool.query(
            """
            SELECT device_token, status, reason, attempts, 'queue' AS source FROM delivery_queue
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)
            UNION ALL
            SELECT device_token, status, reason, attempts, 'history' FROM delivery_history
            WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)
            """)
        var found: [String: [String]] = [:]
        for row in rows {
            found[try row.decode(String.self, "device_token"), default: []].append(
                [
                    try row.decode(String.self, "source"), try row.decode(String.self, "status"),
                    try row.decode(String?.self, "reason") ?? "", String(try row.decode(Int.self, "attempts")),
                ].joined(separator: " "))
        }
        // Each delivery recorded once: the send in flight as sent, the retry as superseded (it would have gone to the
        // removed phone later), the Android phone's as sent.
        #expect(found[sent] == ["history sent  1"], "\(found)")
        #expect(found[retried] == ["history superseded device_removed 1"], "\(found)")
        #expect(found[w.pixel] == ["history sent  1"], "\(found)")
    }
}
