import Crypto
import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// `DELETE /v1/people/{id}` erases the person's trace from every table of the schema.
@Suite("Erasure")
struct ErasureTests {
    /// How many rows of `tenant` in each table of the schema mention `needle` anywhere (any column, JSON included).
    /// Tables are enumerated from information_schema, so a table added later is searched too.
    static func mentions(_ pool: PostgresPool, tenant: UUID, _ needle: String) async throws -> [String: Int] {
        let tables = try await pool.query(
            """
            SELECT t.table_name::text AS name,
                   EXISTS (SELECT 1 FROM information_schema.columns c
                           WHERE c.table_schema = t.table_schema AND c.table_name = t.table_name
                             AND c.column_name = 'tenant_id') AS tenant_scoped
            FROM information_schema.tables t
            WHERE t.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
            """)
        var found: [String: Int] = [:]
        for row in tables {
            let table = try row.decode(String.self, "name")
            let scoped = try row.decode(Bool.self, "tenant_scoped")
            let filter = scoped ? "x.tenant_id = $2" : (table == "tenants" ? "x.id = $2" : "$2::uuid IS NOT NULL")
            let n = try await pool.count(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT count(*)::int AS n FROM "\(table)" x WHERE \(filter) AND strpos(x::text, $1) > 0
                        """, binds: [needle.encodePostgres(), tenant.encodePostgres()]))
            if n > 0 { found[table] = n }
        }
        return found
    }

    @Test("deleting a person removes their ID, email, devices, tokens, instances, deliveries, events and metrics")
    func deletePersonErasesEveryTrace() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let person = Fake.id("erase")
        let email = person + "@erase.example.com"
        let iphone = Fake.hex()
        let pixel = Fake.fcm()
        let pushToStart = Fake.hex()
        let activityToken = Fake.hex()
        let type = Fake.activityType()
        let instance = Fake.id("inst")
        // Another person of the same tenant keeps everything.
        let other = Fake.id("keep")
        let otherPhone = Fake.hex()
        let otherInstance = Fake.id("inst")

        func ok(_ response: HTTP.Response, _ what: String) throws {
            guard (200..<300).contains(response.status) else {
                throw TestFailure("\(what): \(response.status) \(response.text)")
            }
        }
        try ok(await api.call("PUT", "/v1/people/\(person)", key: tenant.app, json: ["email": email]), "person")
        try ok(
            await api.call("PUT", "/v1/people/\(person)/devices/\(iphone)", key: tenant.sdk, json: ["platform": "ios"]),
            "iphone")
        try ok(
            await api.call(
                "PUT", "/v1/people/\(person)/devices/\(pixel)", key: tenant.sdk, json: ["platform": "android"]),
            "pixel")
        try ok(
            await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "Attrs"]),
            "type")
        try ok(
            await api.call(
                "PUT", "/v1/people/\(person)/devices/\(iphone)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": pushToStart]), "push-to-start")
        try ok(
            await api.call(
                "PUT", "/v1/people/\(other)/devices/\(otherPhone)", key: tenant.sdk, json: ["platform": "ios"]),
            "other's phone")
        try ok(
            await api.call(
                "PUT", "/v1/people/\(other)/devices/\(otherPhone)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": Fake.hex()]), "other's push-to-start")
        for (who, id) in [(person, instance), (other, otherInstance)] {
            try ok(
                await api.call(
                    "POST", "/v1/live_notifications/start", key: tenant.app,
                    json: [
                        "identifiers": ["id": who], "notification_type": type, "instance_id": id,
                        "attributes": ["owner": who, "mail": who == person ? email : "kept@example.com"],
                        "content_state": ["step": 1],
                        "push_payload": ["alert": ["title": "Hi", "body": "for \(who)"]],
                    ], headers: ["Idempotency-Key": "start-" + id]), "start \(id)")
        }
        try ok(
            await api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(iphone)", key: tenant.sdk,
                json: ["token": activityToken]), "activity token")
        for device in [iphone, pixel] {
            try ok(
                await api.call(
                    "POST", "/v1/live_notifications/\(instance)/events", key: tenant.sdk,
                    json: [
                        "event": "started", "device_token": device, "at": Date().timeIntervalSince1970,
                        "content_state": ["step": 1],
                    ]), "event")
        }
        try ok(
            await api.call(
                "POST", "/v1/live_notifications/update", key: tenant.app,
                json: ["instance_id": instance, "content_state_patch": ["step": 2]],
                headers: ["Idempotency-Key": "update-" + instance]), "update")
        // Deliveries are queued (no worker runs here): their metrics, as the SDK reports them.
        let deliveries = try await fixture.pool.query(
            "SELECT id::text AS id FROM deliveries WHERE tenant_id = \(tenant.uuid) AND instance_id = \(instance)"
        ).map { try $0.decode(String.self, "id") }
        #expect(deliveries.count >= 3, "start to push-to-start and FCM, update to the activity token and FCM")
        let secret = try await fixture.tenants.deliverySecret(tenant: tenant.uuid)
        // As the push carries a delivery's ID: a ULID.
        let reported = deliveries.compactMap { UUID(uuidString: $0).map { ULID(uuid: $0).description } }
        for delivery in reported {
            try ok(
                await api.call(
                    "POST", "/v1/deliveries/\(delivery)/metrics", key: tenant.sdk,
                    json: [
                        "metric": "delivered", "recipient": iphone,
                        "delivery_token": DeliveryTokens.make(deliveryID: delivery, secret: secret),
                    ]), "metric")
        }

        // A campaign addressed to both people, started (its run, in process: no worker runs here).
        let campaign = Fake.id("camp")
        try ok(
            await api.call(
                "POST", "/v1/campaigns", key: tenant.app,
                json: [
                    "campaign_id": campaign, "name": "both", "notification_type": type,
                    "audience": ["people": [person, other]],
                    "attributes": ["who": ["$person": "/name", "default": "?"]],
                    "content_state": ["step": 1], "push_payload": ["alert": ["title": "Hi", "body": "all"]],
                ]), "campaign")
        let runner = CampaignRunner(database: TenantDatabase(pool: fixture.pool))
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while try await fixture.pool.count(
            """
            SELECT count(*)::int AS n FROM campaign_members WHERE tenant_id = \(tenant.uuid) AND campaign_id = \(campaign)
            """) < 2 && clock.now < deadline
        {
            _ = try await runner.runDue()
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(try await !Self.mentions(fixture.pool, tenant: tenant.uuid, "\(campaign).\(person)").isEmpty)

        let needles = [person, email, iphone, pixel, pushToStart, activityToken, instance] + deliveries + reported
        for needle in [person, email, iphone, pixel, pushToStart, activityToken, instance] {
            #expect(try await !Self.mentions(fixture.pool, tenant: tenant.uuid, needle).isEmpty, "seeded: \(needle)")
        }
        let before = try await Self.mentions(fixture.pool, tenant: tenant.uuid, otherInstance)

        let deleted = try await api.call("DELETE", "/v1/people/\(person)", key: tenant.app)
        #expect(deleted.status == 204, "\(deleted.text)")

        for needle in needles {
            let left = try await Self.mentions(fixture.pool, tenant: tenant.uuid, needle)
            #expect(left.isEmpty, "after erasure, \(needle) is still in \(left)")
        }
        #expect(
            try await fixture.pool.count(
                """
                SELECT count(*)::int AS n FROM deliveries
                WHERE tenant_id = \(tenant.uuid) AND status = 'queued' AND token = ANY(\([iphone, pixel, pushToStart, activityToken])::text[])
                """) == 0)
        // The other person's instance, deliveries and idempotent replies are untouched.
        #expect(try await Self.mentions(fixture.pool, tenant: tenant.uuid, otherInstance) == before)
        let otherView = try await api.call("GET", "/v1/people/\(other)", key: tenant.app)
        #expect(otherView.status == 200)
        // The campaign keeps the other person: its audience, their member row and instance.
        let kept = try await Self.mentions(fixture.pool, tenant: tenant.uuid, "\(campaign).\(other)")
        #expect(kept["campaign_members"] == 1 && kept["instances"] == 1, "\(kept)")
        #expect(try await Self.mentions(fixture.pool, tenant: tenant.uuid, other)["campaigns"] == 1)
        // Deleting again: the person is gone.
        expectProblem(try await api.call("DELETE", "/v1/people/\(person)", key: tenant.app), 404, "not-found")
    }

    @Test("a delivery metric reported after the person was erased is not kept")
    func metricAfterErasure() async throws {
        let w = try await LifecycleTests.world()
        let instance = Fake.id("erased")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        guard let delivery = try await w.deliveries(instance).first?.string("id") else {
            throw TestFailure("no delivery")
        }
        let token = DeliveryTokens.make(
            deliveryID: delivery, secret: try await w.fixture.tenants.deliverySecret(tenant: w.tenant.uuid))
        func report(_ metric: String) async throws -> HTTP.Response {
            try await w.api.call(
                "POST", "/v1/deliveries/\(delivery)/metrics", key: w.tenant.sdk,
                json: ["metric": metric, "recipient": w.pixel, "delivery_token": token])
        }
        let before = try await report("opened")
        #expect(before.status == 202, "\(before.text)")
        #expect(try before.json()["recorded"] as? Bool == true, "\(before.text)")
        let erased = try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app)
        #expect(erased.status == 204, "\(erased.text)")
        // The same reports, with the delivery's genuine token, once its delivery is gone.
        for metric in ["delivered", "opened"] {
            expectProblem(try await report(metric), 404, "not-found")
        }
        let compat = try await w.api.call(
            "POST", "/v1/b",
            json: CompatIngestTests.envelope(
                [
                    CompatIngestTests.event(
                        "track", "Report Delivery Event", userId: nil,
                        properties: [
                            "metric": "delivered", "deliveryId": delivery, "recipient": w.pixel, "deliveryToken": token,
                        ])
                ], writeKey: w.tenant.sdk), headers: ["Authorization": w.tenant.basicSDK])
        #expect(compat.status == 200, "\(compat.text)")
        #expect(try compat.json()["ignored"] as? Int == 1, "\(compat.text)")
        #expect(try await Self.mentions(w.fixture.pool, tenant: w.tenant.uuid, w.pixel).isEmpty)
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM delivery_metrics WHERE tenant_id = \(w.tenant.uuid)") == 0)
    }

    @Test("an instance started for a person by their email stays theirs when another person takes the address")
    func emailTakenOverKeepsInstance() async throws {
        let w = try await LifecycleTests.world()
        let email = w.person + "@first.example.com"
        #expect(
            try await w.api.call("PUT", "/v1/people/\(w.person)", key: w.tenant.app, json: ["email": email]).status
                == 200)
        let instance = Fake.id("by-email")
        let started = try await w.start(["instance_id": instance, "identifiers": ["email": email]])
        #expect(started.status == 200, "\(started.text)")
        #expect(try await w.instance(instance).object("person")?["id"] as? String == w.person)
        // The first person's address changes; a second person takes the old one, and is erased.
        let moved = try await w.api.call(
            "PUT", "/v1/people/\(w.person)", key: w.tenant.app, json: ["email": w.person + "@second.example.com"])
        #expect(moved.status == 200, "\(moved.text)")
        let second = Fake.id("second")
        let taken = try await w.api.call("PUT", "/v1/people/\(second)", key: w.tenant.app, json: ["email": email])
        #expect(taken.status == 200, "\(taken.text)")
        let erased = try await w.api.call("DELETE", "/v1/people/\(second)", key: w.tenant.app)
        #expect(erased.status == 204, "\(erased.text)")
        let kept = try await w.api.call("GET", "/v1/live_notifications/\(instance)", key: w.tenant.app)
        #expect(kept.status == 200, "the first person's instance is kept: \(kept.text)")
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM deliveries WHERE tenant_id = \(w.tenant.uuid) AND instance_id = \(instance)"
            )
                == 3, "and its pushes")
    }

    @Test("an erasure removes its instances' stored replies, not another request's that contains one's ID")
    func otherRepliesKept() async throws {
        let w = try await LifecycleTests.world()
        // The erased person's instance ID is a word every start's reply holds (its key "state").
        #expect(try await w.start(["instance_id": "state"], headers: ["Idempotency-Key": "k1"]).status == 200)
        let other = Fake.id("other")
        #expect(try await w.api.call("PUT", "/v1/people/\(other)", key: w.tenant.sdk, json: [:]).status == 200)
        // Its instance ID made by the server: a retry without the stored reply would start a second instance.
        let first = try await w.start(["identifiers": ["id": other]], headers: ["Idempotency-Key": "k2"])
        #expect(first.status == 200, "\(first.text)")
        let erased = try await w.api.call("DELETE", "/v1/people/\(w.person)", key: w.tenant.app)
        #expect(erased.status == 204, "\(erased.text)")
        let again = try await w.start(["identifiers": ["id": other]], headers: ["Idempotency-Key": "k2"])
        #expect(again.status == 200, "\(again.text)")
        #expect(try again.json().string("instance_id") == first.json().string("instance_id"), "answered as before")
        #expect(
            try await w.fixture.pool.count(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(w.tenant.uuid) AND person_id = \(other)")
                == 1)
    }
}
