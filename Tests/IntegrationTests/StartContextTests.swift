import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// The contexts of concurrent starts are read together: one transaction for a batch of requests, of several
/// tenants, each answered as if read alone.
@Suite("Start contexts read in batches")
struct StartContextTests {
    @Test("two people whose IDs are canonically equivalent (é and e+U+0301) are two people in one batch")
    func canonicallyEquivalentPeople() async throws {
        let w = try await LifecycleTests.world()
        let stem = Fake.id("caf")
        let (composed, decomposed) = (stem + "\u{e9}", stem + "e\u{301}")
        var phones: [String] = []
        for person in [composed, decomposed] {
            let phone = Fake.hex()
            let r = try await w.api.call(
                "PUT", "/v1/people/\(person)/devices/\(phone)", key: w.tenant.sdk, json: ["platform": "ios"])
            #expect(r.status == 200 || r.status == 201, "\(r.text)")
            phones.append(phone)
        }
        let requests = [composed, decomposed].map {
            StartContexts.Request(
                tenant: w.tenant.uuid, activityType: w.type, personID: $0, email: nil, instanceID: Fake.id("n"),
                idempotencyKey: nil, channelID: nil)
        }
        let database = TenantDatabase(pool: w.fixture.pool)
        let contexts = try await StartContexts.read(database, requests)
        #expect(contexts.map { $0.personID.map { Array($0.utf8) } } == [Array(composed.utf8), Array(decomposed.utf8)])
        #expect(contexts.map { $0.candidates.map(\.deviceToken) } == [[phones[0]], [phones[1]]])
    }

    @Test("a batch answers each start with its own tenant's type, person, devices, tokens, instance, key and channel")
    func batchEqualsAlone() async throws {
        let a = try await LifecycleTests.world()
        let b = try await LifecycleTests.world()
        let started = Fake.id("sctx")
        let key = "sctx-" + Fake.hex(8)
        #expect(try await a.start(["instance_id": started], headers: ["Idempotency-Key": key]).status == 200)
        let email = Fake.id("mail") + "@Example.com"
        let mailed = Fake.id("bea")
        let r = try await a.api.call(
            "PUT", "/v1/people/\(mailed)", key: a.tenant.sdk, json: ["email": email])
        #expect(r.status == 200 || r.status == 201, "\(r.text)")
        let (ta, tb) = (a.tenant.uuid, b.tenant.uuid)
        func request(
            _ tenant: UUID, type: String, person: String? = nil, email: String? = nil, instance: String = Fake.id("n"),
            key: String? = nil
        ) -> StartContexts.Request {
            .init(
                tenant: tenant, activityType: type, personID: person, email: email, instanceID: instance,
                idempotencyKey: key, channelID: nil)
        }
        let requests: [StartContexts.Request] = [
            request(ta, type: a.type, person: a.person),
            request(tb, type: b.type, person: b.person),
            // Another tenant's person and type, by their IDs: neither found.
            request(tb, type: a.type, person: a.person),
            // A type the person has no push-to-start token for: the devices, without tokens.
            request(ta, type: "other-" + Fake.hex(4), person: a.person),
            // By email, in another case; and an email nobody has.
            request(ta, type: a.type, email: email.uppercased()),
            request(ta, type: a.type, email: "nobody-" + Fake.hex(4) + "@example.com"),
            // A taken instance ID with its stored answer, and a key used before; the same key in the other tenant.
            request(ta, type: a.type, person: a.person, instance: started, key: key),
            request(tb, type: b.type, person: b.person, key: key),
            // The same request twice.
            request(ta, type: a.type, person: a.person),
        ]

        let pool = PostgresPool(
            try PostgresConfiguration(url: a.fixture.databaseURL),
            options: .init(maxConnections: 1, acquireTimeout: .seconds(60)))
        let database = TenantDatabase(pool: pool)
        let contexts = StartContexts(database: database, readers: 1)
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in release.wait() } }
        try await eventually("the connection is held") { pool.statistics.idle == 0 && pool.statistics.open == 1 }
        let batched = Task {
            try await withThrowingTaskGroup(of: (Int, StartContext).self) { group in
                for (i, request) in requests.enumerated() {
                    group.addTask { (i, try await contexts.read(request)) }
                }
                var answers = [StartContext?](repeating: nil, count: requests.count)
                for try await (i, context) in group { answers[i] = context }
                return answers.map { $0! }
            }
        }
        try await eventually("a reader waits for the connection and others queue") {
            pool.statistics.waiting == 1 && contexts.queued == requests.count - 1
        }
        release.signal()
        try await holder.value
        let answers = try await batched.value
        for (request, context) in zip(requests, answers) {
            let alone = try await StartContexts.read(database, [request])[0]
            #expect(Self.summary(context) == Self.summary(alone), "\(request)")
        }
        pool.close()

        // The world's person: two iPhones with push-to-start tokens for its type, and an Android phone.
        #expect(answers[0].activityType?.identifier == a.type && answers[0].personID == a.person)
        #expect(answers[0].candidates.map(\.deviceToken) == a.iphones + [a.pixel])
        #expect(answers[0].candidates.compactMap(\.pushToStartToken) == a.pushToStart)
        #expect(answers[1].personID == b.person && answers[1].candidates.count == 3)
        #expect(answers[2].activityType == nil && answers[2].personID == nil && answers[2].candidates.isEmpty)
        #expect(answers[3].activityType == nil && answers[3].candidates.count == 3)
        #expect(answers[3].candidates.allSatisfy { $0.pushToStartToken == nil })
        #expect(answers[4].personID == mailed && answers[4].candidates.isEmpty)
        #expect(answers[5].personID == nil)
        #expect(answers[6].existingInstance && answers[6].existingStart != nil && answers[6].idempotent != nil)
        #expect(!answers[7].existingInstance && answers[7].idempotent == nil)
        #expect(Self.summary(answers[8]) == Self.summary(answers[0]))
    }

    /// What a context says, comparable.
    static func summary(_ c: StartContext) -> String {
        [
            c.activityType?.identifier ?? "-", c.personID ?? "-",
            c.candidates.map { "\($0.deviceToken)/\($0.platform.rawValue)/\($0.pushToStartToken ?? "-")" }
                .joined(separator: ","),
            c.idempotent.map { "\($0.status)" } ?? "-", c.existingStart.map { "\($0.body)" } ?? "-",
            "\(c.existingInstance)", c.channel.map { "\($0.id)" } ?? "-",
        ].joined(separator: " | ")
    }
}
