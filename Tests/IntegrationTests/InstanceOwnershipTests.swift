import Foundation
import MarqueeCore
import MarqueeStore
import PostgresClient
import Testing

/// An activity token or a lifecycle event for an instance is taken only from a device of the instance's person:
/// one rule in SQL (`marquee_device_belongs_to_instance`), checked by the registration itself.
@Suite("Instance ownership")
struct InstanceOwnershipTests {
    @Test("the registration statement checks the device's owner itself: no_instance for another person's device")
    func registrationChecksOwnership() async throws {
        let fixture = try await RegistryFixture.get()
        let tenant = try await fixture.api.createTenant()
        let victim = Fake.id("victim")
        let attacker = Fake.id("mallory")
        let victimPhone = Fake.hex()
        let attackerPhone = Fake.hex()
        let instance = Fake.id("order")
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: victim)
        for (person, phone) in [(victim, victimPhone), (attacker, attackerPhone)] {
            _ = try await fixture.registry.upsertDevice(
                tenant: tenant.uuid, DeviceRegistration(personID: person, token: phone, platform: .ios))
        }
        let register: @Sendable (String, String) async throws -> String = { instanceID, device in
            try await fixture.pool.query(
                """
                SELECT outcome FROM marquee_register_instance_token(
                    \(tenant.uuid), \(instanceID), \(device), \(Fake.hex()))
                """
            )[0].decode(String.self, "outcome")
        }
        // Whoever calls the statement, not only the API's routes.
        #expect(try await register(instance, attackerPhone) == "no_instance")
        #expect(try await register(Fake.id("order"), victimPhone) == "no_instance", "unknown instance, same answer")
        #expect(try await register(instance, Fake.hex()) == "no_device")
        #expect(try await register(instance, victimPhone) == "ok")
        let stored = try await fixture.pool.query(
            "SELECT device_token FROM activity_tokens WHERE tenant_id = \(tenant.uuid) AND instance_id = \(instance)")
        #expect(try stored.map { try $0.decode(String.self, "device_token") } == [victimPhone])

        // Events go by the same rule.
        await #expect(throws: NotFound("instance")) {
            try await fixture.registry.recordEvent(
                tenant: tenant.uuid, instanceID: instance, event: .started, deviceToken: attackerPhone, at: Date(),
                contentState: nil)
        }
        try await fixture.registry.recordEvent(
            tenant: tenant.uuid, instanceID: instance, event: .started, deviceToken: victimPhone, at: Date(),
            contentState: nil)
    }

    @Test("a device that changes hands while its token registers is checked as it is then: 404, nothing stored")
    func ownershipCheckedUnderTheDeviceLock() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let victim = Fake.id("victim")
        let other = Fake.id("other")
        let phone = Fake.hex()
        let instance = Fake.id("order")
        try await fixture.seedInstance(tenant: tenant.uuid, id: instance, person: victim)
        _ = try await fixture.registry.upsertDevice(
            tenant: tenant.uuid, DeviceRegistration(personID: victim, token: phone, platform: .ios))
        _ = try await fixture.registry.upsertPerson(tenant: tenant.uuid, id: other, email: nil, attributes: nil)

        // The device moves to another person in a transaction that holds its row until the registration waits.
        let holder = try PostgresConnection(connecting: try PostgresConfiguration(url: fixture.databaseURL))
        try holder.execute("BEGIN")
        try holder.execute(
            "UPDATE devices SET person_id = \(other) WHERE tenant_id = \(tenant.uuid) AND token = \(phone)")
        let holderPID = try holder.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")
        let sent = Task {
            try await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(phone)", key: tenant.sdk,
                json: ["token": Fake.hex()])
        }
        let waiting = try await fixture.backend(blockedBy: holderPID)
        try holder.execute("COMMIT")
        #expect(waiting != nil, "the registration waited for the device's row")
        let response = try await sent.value
        expectProblem(response, 404, "not-found")
        #expect(try await fixture.registry.activityTargets(tenant: tenant.uuid, instanceID: instance).isEmpty)
    }
}
