import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// Registry writes racing the deletions of what they refer to (a device, an instance, a person): each answers as if
/// it ran wholly before or wholly after, never a 500, and leaves no row pointing at what is gone.
@Suite("Registry races")
struct RegistryRaceTests {
    /// Reports a lifecycle event for `instance` from `device`, as the SDK does.
    static func event(_ w: LifecycleTests.World, _ instance: String, device: String) async throws -> HTTP.Response {
        try await w.api.call(
            "POST", "/v1/live_notifications/\(instance)/events", key: w.tenant.sdk,
            json: ["event": "updated", "device_token": device, "at": Date().timeIntervalSince1970])
    }

    /// The instance's device states and lifecycle events.
    static func leftovers(_ w: LifecycleTests.World, _ instance: String) async throws -> Int {
        try await w.fixture.pool.count(
            """
            SELECT ((SELECT count(*) FROM instance_devices WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance))
                  + (SELECT count(*) FROM activity_events WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)))::int AS n
            """)
    }

    @Test("an event from a device being deleted waits for it and is 404 device, not a 500")
    func eventWhileDeviceDeleted() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("device-gone")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        // The app deletes its device (or a worker retires its FCM token): the row is gone once this commits.
        let deleting = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            try c.execute("DELETE FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel)")
        }
        let reporting = Task { try await Self.event(w, instance, device: w.pixel) }
        try await deleting.waitedOn(via: w.fixture.pool, "the event waits for the device's deletion")
        try await deleting.commit()
        expectProblem(try await reporting.value, 404, "not-found", "event from a deleted device")
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instance_devices WHERE tenant_id = \(w.tenant.uuid) AND device_token = \(w.pixel)"
            ) == 0)
    }

    @Test("an event for an instance being deleted is 404 and leaves no device state behind for its ID")
    func eventWhileInstanceDeleted() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("instance-gone")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        // Retention (or an erasure) deletes the instance; its delete trigger removes its device states (0078).
        let deleting = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            try c.execute("DELETE FROM instances WHERE tenant_id = \(w.tenant.uuid) AND id = \(instance)")
        }
        let reporting = Task { try await Self.event(w, instance, device: w.pixel) }
        try await deleting.waitedOn(via: w.fixture.pool, "the event waits for the instance's deletion")
        try await deleting.commit()
        expectProblem(try await reporting.value, 404, "not-found", "event for a deleted instance")
        #expect(try await Self.leftovers(w, instance) == 0)
        // The ID used again for someone else reaches only their devices, not this person's Android phone.
        let other = Fake.id("bob")
        let phone = Fake.fcm()
        _ = try await w.api.call(
            "PUT", "/v1/people/\(other)/devices/\(phone)", key: w.tenant.sdk, json: ["platform": "android"])
        #expect(try await w.start(["instance_id": instance, "identifiers": ["id": other]]).status == 200)
        let targets = try await w.fixture.pool.query(
            "SELECT device_token FROM marquee_instance_targets(\(w.tenant.uuid), ARRAY[\(instance)])")
        #expect(try targets.map { try $0.decode(String.self, "device_token") } == [phone])
    }

    @Test("a person erased while an event of theirs is being written waits for it, and keeps nothing of it")
    func erasureWaitsForEvent() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("event-erased")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        // Something holds the Android phone's state for the instance: the event, past its checks, waits for it.
        let holding = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            _ = try c.query(
                """
                SELECT 1 FROM instance_devices
                WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance) AND device_token = \(w.pixel)
                FOR UPDATE
                """)
        }
        let reporting = Task { try await Self.event(w, instance, device: w.pixel) }
        try await holding.waitedOn(via: w.fixture.pool, "the event waits")
        let erasing = Task { try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app) }
        try await holding.waitedOn(by: 2, via: w.fixture.pool, "the erasure waits too")
        try await holding.commit()
        let reported = try await reporting.value
        #expect(reported.status == 202, "\(reported.text)")
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        #expect(try await Self.leftovers(w, instance) == 0)
    }

    @Test("a device registered while its person is erased: the erasure waits for it and takes the device too")
    func erasureWaitsForDeviceRegistration() async throws {
        let w = try await LifecycleTests.world()
        let person = Fake.id("newcomer")
        // Someone holds the Android phone (as a token registration does): registering it for `person` (which
        // creates them) waits for it, and the person's erasure begins meanwhile.
        #expect(
            try await w.api.call("PUT", "/v1/people/\(person)", key: w.tenant.app, json: [String: Any]()).status
                == 200)
        let holding = try await HeldTransaction.open(w.fixture.databaseURL) { c in
            _ = try c.query(
                "SELECT 1 FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel) FOR UPDATE")
        }
        let registering = Task {
            try await w.api.call(
                "PUT", "/v1/people/\(person)/devices/\(w.pixel)", key: w.tenant.sdk, json: ["platform": "android"])
        }
        try await holding.waitedOn(via: w.fixture.pool, "the registration waits for the phone")
        let erasing = Task { try await w.api.call("DELETE", "/v1/people/\(person)", key: w.tenant.app) }
        try await holding.waitedOn(by: 2, via: w.fixture.pool, "the erasure waits for the registration")
        try await holding.commit()
        let registered = try await registering.value
        #expect(registered.status == 200, "\(registered.text)")
        let erased = try await erasing.value
        #expect(erased.status == 204, "\(erased.text)")
        #expect(
            try await w.fixture.pool.count(
                """
                SELECT ((SELECT count(*) FROM people WHERE tenant_id = \(w.tenant.uuid) AND id = \(person))
                      + (SELECT count(*) FROM devices WHERE tenant_id = \(w.tenant.uuid) AND token = \(w.pixel)))::int AS n
                """) == 0)
    }
}
