import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// The change contexts of concurrent updates and ends are read together: one transaction for a batch of requests,
/// of several tenants, each answered as if read alone.
@Suite("Change contexts read in batches")
struct ChangeContextTests {
    @Test("a batch answers each request with its own tenant's instance, targets and stored answer, as read alone")
    func batchEqualsAlone() async throws {
        let a = try await LifecycleTests.world()
        let b = try await LifecycleTests.world()
        var aInstances: [String] = []
        for i in 0..<3 {
            let id = Fake.id("ctx-a")
            #expect(try await a.start(["instance_id": id]).status == 200)
            if i < 2 { _ = try await a.registerActivityTokens(id) }
            aInstances.append(id)
        }
        let bInstance = Fake.id("ctx-b")
        #expect(try await b.start(["instance_id": bInstance]).status == 200)
        _ = try await b.registerActivityTokens(bInstance)
        let key = "ctx-" + Fake.hex(8)
        let keyed = try await a.update(
            ["instance_id": aInstances[0], "content_state_patch": ["eta": 1]], headers: ["Idempotency-Key": key])
        #expect(keyed.status == 200)

        let (ta, tb) = (a.tenant.uuid, b.tenant.uuid)
        let requests: [ChangeContexts.Request] =
            aInstances.map { .init(tenant: ta, instanceID: $0, idempotencyKey: nil) } + [
                .init(tenant: tb, instanceID: bInstance, idempotencyKey: nil),
                // Another tenant's instance, by its ID: not found.
                .init(tenant: tb, instanceID: aInstances[1], idempotencyKey: nil),
                .init(tenant: ta, instanceID: "no-such-" + Fake.hex(8), idempotencyKey: nil),
                // A stored answer is found under its own tenant only, and a key nobody used finds none.
                .init(tenant: ta, instanceID: aInstances[0], idempotencyKey: key),
                .init(tenant: tb, instanceID: bInstance, idempotencyKey: key),
                .init(tenant: ta, instanceID: aInstances[2], idempotencyKey: "unused-" + Fake.hex(8)),
                // The same request twice in one batch.
                .init(tenant: ta, instanceID: aInstances[1], idempotencyKey: nil),
            ]

        // One connection, held while the requests arrive: the first reader waits for it, the others queue behind
        // and are read together once it is free.
        let pool = PostgresPool(
            try PostgresConfiguration(url: a.fixture.databaseURL),
            options: .init(maxConnections: 1, acquireTimeout: .seconds(60)))
        let database = TenantDatabase(pool: pool)
        let sizes = Mutex<[Int]>([])
        let contexts = ChangeContexts(database: database, readers: 1) { size in sizes.withLock { $0.append(size) } }
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.withConnection { _ in release.wait() } }
        try await eventually("the connection is held") { pool.statistics.idle == 0 && pool.statistics.open == 1 }
        let batched = Task {
            try await withThrowingTaskGroup(of: (Int, ChangeContext).self) { group in
                for (i, request) in requests.enumerated() {
                    group.addTask { (i, try await contexts.read(request)) }
                }
                var answers = [ChangeContext?](repeating: nil, count: requests.count)
                for try await (i, context) in group { answers[i] = context }
                return answers.map { $0! }
            }
        }
        try await eventually("a reader waits for the connection and others queue") {
            pool.statistics.waiting == 1 && contexts.queued >= 2
        }
        release.signal()
        try await holder.value
        let answers = try await batched.value

        let reported = sizes.withLock { $0 }
        #expect(reported.reduce(0, +) == requests.count)
        #expect(reported.max()! > 1)
        for (request, context) in zip(requests, answers) {
            let alone = try await ChangeContexts.read(database, [request])[0]
            #expect(Self.summary(context) == Self.summary(alone), "\(request)")
        }
        // Each world's person has two iPhones and an Android phone: the phones that registered an activity token,
        // and the Android phone, are the targets.
        #expect(answers[0].instance?.id == aInstances[0] && answers[0].targets.count == 3)
        #expect(answers[2].instance != nil && answers[2].targets.map(\.platform) == [.android])
        #expect(answers[3].instance?.id == bInstance && answers[3].targets.count == 3)
        #expect(answers[4].instance == nil && answers[5].instance == nil)
        #expect(answers[6].idempotent?.status == 200 && answers[7].idempotent == nil && answers[8].idempotent == nil)
        #expect(answers[6].instance?.version == 2)
        pool.close()
    }

    /// What a context says, comparable.
    static func summary(_ c: ChangeContext) -> String {
        let targets = c.targets.map { "\($0.deviceToken)/\($0.platform.rawValue)/\($0.token)" }
        return [
            c.instance.map { "\($0.id) v\($0.version) \($0.state.rawValue) \($0.contentState)" } ?? "-",
            c.activityType?.identifier ?? "-", targets.joined(separator: ","),
            c.idempotent.map { "\($0.status) \($0.body)" } ?? "-", c.channel.map { "\($0.id)" } ?? "-",
        ].joined(separator: " | ")
    }
}
