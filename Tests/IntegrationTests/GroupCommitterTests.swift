import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

@Suite("Group commit")
struct GroupCommitterTests {
    @Test("every committed batch is reported with its size; the sizes add up to the statements")
    func batchSizesAreReported() async throws {
        let fixture = try await RegistryFixture.get()
        let sizes = Mutex<[Int]>([])
        let committer = GroupCommitter(
            pool: fixture.pool, configuration: .init(writers: 1, maxBatch: 16, notifyChannel: nil)
        ) { size in sizes.withLock { $0.append(size) } }
        let tenant = UUID()
        try await withThrowingTaskGroup(of: Int.self) { group in
            for i in 0..<100 {
                group.addTask {
                    try await committer.submit(tenant: tenant, Echo(n: i)).decode(Int.self, "n")
                }
            }
            let total = try await group.reduce(0, +)
            #expect(total == (0..<100).reduce(0, +))
        }
        let reported = sizes.withLock { $0 }
        #expect(reported.reduce(0, +) == 100)
        #expect(reported.allSatisfy { (1...16).contains($0) })
        #expect(committer.statistics.batches == reported.count)
        #expect(committer.statistics.statements == 100)
    }

    @Test("a database that cannot be reached fails a whole batch at once, not each write again alone")
    func unreachableFailsAtOnce() async throws {
        // Nothing listens on the port: every connection attempt is refused.
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        let port = UInt16(bigEndian: address.sin_port)
        close(listener)
        let pool = PostgresPool(
            try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:\(port)/none?connect_timeout=2"),
            options: .init(maxConnections: 2))
        defer { pool.close() }
        let committer = GroupCommitter(pool: pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil))
        let tenant = UUID()
        let failures = try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<40 {
                group.addTask {
                    do {
                        _ = try await committer.submit(tenant: tenant, Echo(n: i))
                        return false
                    } catch let error as PostgresError {
                        return error.code == .connectionFailed
                    }
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(failures == 40, "every caller hears the database is unreachable")
        #expect(committer.statistics.fallbacks == 0, "no write was tried again alone")
    }

    @Test("a batch of several tenants' statements runs each inside its own tenant, answered in its caller's order")
    func tenantsInterleaved() async throws {
        let fixture = try await RegistryFixture.get()
        let sizes = Mutex<[Int]>([])
        let committer = GroupCommitter(
            pool: fixture.pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil)
        ) { size in sizes.withLock { $0.append(size) } }
        let tenants = (0..<3).map { _ in UUID() }
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<60 {
                let tenant = tenants[i % 3]
                group.addTask {
                    let row = try await committer.submit(tenant: tenant, Echo(n: i))
                    return try row.decode(String.self, "tenant") == tenant.uuidString.lowercased()
                        && row.decode(Int.self, "n") == i
                }
            }
            for try await ok in group { #expect(ok) }
        }
        // Statements did share transactions (otherwise nothing here was grouped).
        #expect(sizes.withLock { $0 }.contains { $0 > 1 })
    }
}

/// A write that writes nothing: each row answers its number and the tenant its statement ran in.
struct Echo: SetWrite {
    var n: Int
    var exclusiveKeys: [String] { [] }

    static func statement(tenant: UUID, _ writes: [Echo]) -> PostgresQuery {
        """
        SELECT current_setting('marquee.tenant_id') AS tenant, e.n::int AS n
        FROM unnest(\(writes.map(\.n))::int[]) WITH ORDINALITY AS e(n, i) ORDER BY e.i
        """
    }
}

/// A batch whose connection is lost with its COMMIT in flight may have committed: the committer asks another
/// connection before writing anything again. The connection is cut by a proxy (`CommitCutter`) right after the
/// server ran the COMMIT, or right before it could.
@Suite("Group commit, connection lost at COMMIT")
struct GroupCommitInDoubtTests {
    /// A table of counters that `Hit` writes, and a committer whose connections go through `cutter`.
    struct Rig {
        let fixture: RegistryFixture.Running
        let table: String
        let cutter: CommitCutter
        let pool: PostgresPool
        let committer: GroupCommitter

        init(inDoubtTimeout: Duration = .seconds(30)) async throws {
            fixture = try await RegistryFixture.get()
            table = "hits_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(12)
            _ = try await fixture.pool.execute(
                "CREATE TABLE \(identifier: table) (key text PRIMARY KEY, hits int NOT NULL)")
            _ = try await fixture.pool.execute("GRANT SELECT, INSERT, UPDATE ON \(identifier: table) TO marquee_api")
            // As serve connects: its login role, which may only end its own backends.
            cutter = try CommitCutter(TestEnvironment.appURL(fixture.databaseURL))
            pool = PostgresPool(try PostgresConfiguration(url: cutter.url), options: .init(maxConnections: 2))
            committer = GroupCommitter(
                pool: pool,
                configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil, inDoubtTimeout: inDoubtTimeout))
        }

        func hit(_ key: String) async throws -> Int {
            try await committer.submit(tenant: UUID(), Hit(table: table, key: key)).decode(Int.self, "hits")
        }

        /// Each key's count, read directly (not through the proxy).
        func hits() async throws -> [String: Int] {
            var hits: [String: Int] = [:]
            for row in try await fixture.pool.query("SELECT key, hits FROM \(identifier: table)") {
                hits[try row.decode(String.self, "key")] = try row.decode(Int.self, "hits")
            }
            return hits
        }

        func close() {
            pool.close()
            cutter.close()
        }
    }

    @Test("a batch that committed is not written again: its callers hear it committed, each write applied once")
    func committedIsNotWrittenAgain() async throws {
        let rig = try await Rig()
        defer { rig.close() }
        rig.cutter.arm(.afterCommit)
        let keys = (0..<5).map { "k\($0)" }
        let outcomes = try await withThrowingTaskGroup(of: (String, Result<Int, any Error>).self) { group in
            for key in keys {
                group.addTask { (key, await outcome { try await rig.hit(key) }) }
            }
            return try await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        #expect(rig.cutter.fired)
        #expect(try await rig.hits() == Dictionary(uniqueKeysWithValues: keys.map { ($0, 1) }), "each write once")
        var unanswered = 0
        for (key, outcome) in outcomes {
            switch outcome {
            case .success(let hits): #expect(hits == 1, "\(key)")
            case .failure(let error):
                #expect(error as? UnansweredCommit == UnansweredCommit(outcome: .committed), "\(key): \(error)")
                unanswered += 1
            }
        }
        #expect(unanswered >= 1, "the cut batch's callers are told it committed")
        let statistics = rig.committer.statistics
        #expect(statistics.inDoubtCommitted == 1 && statistics.fallbacks == 0, "\(statistics)")
        #expect(statistics.statements == 5, "the cut batch committed, and is counted")
    }

    @Test("a batch cut before its COMMIT ran is written again alone, each write once")
    func abortedIsWrittenAlone() async throws {
        let rig = try await Rig()
        defer { rig.close() }
        rig.cutter.arm(.beforeCommit(holdServer: false))
        #expect(try await rig.hit("a") == 1)
        #expect(rig.cutter.fired)
        #expect(try await rig.hits() == ["a": 1])
        let statistics = rig.committer.statistics
        #expect(statistics.inDoubtAborted == 1 && statistics.fallbacks == 1, "\(statistics)")
    }

    @Test("a batch whose backend has not noticed the cut is ended, then written again alone: no wait for TCP")
    func inProgressBackendIsTerminated() async throws {
        // Long enough that, on a loaded machine, the backend is ended (at half of it) and asked about before the
        // deadline (at 2 s the answer once came too late: "outcome unknown").
        let rig = try await Rig(inDoubtTimeout: .seconds(10))
        defer { rig.close() }
        // The batch updates the row, so its transaction, left open behind the cut, holds the row's lock: a write
        // alone of the same key would wait for it as long as the server keeps the transaction.
        _ = try await rig.fixture.pool.execute("INSERT INTO \(identifier: rig.table) VALUES ('held', 0)")
        rig.cutter.arm(.beforeCommit(holdServer: true))
        let answer = Mutex<Result<Int, any Error>?>(nil)
        let writing = Task {
            let result = await outcome { try await rig.hit("held") }
            answer.withLock { $0 = result }
        }
        defer { writing.cancel() }
        try await eventually("the write is answered", timeout: .seconds(30)) { answer.withLock { $0 != nil } }
        #expect(try answer.withLock { try $0!.get() } == 1)
        #expect(try await rig.hits() == ["held": 1])
        let statistics = rig.committer.statistics
        #expect(statistics.inDoubtAborted == 1 && statistics.fallbacks == 1, "\(statistics)")
    }

    @Test("when no connection can say whether the batch committed, its callers hear the outcome is unknown")
    func unknownOutcome() async throws {
        let rig = try await Rig(inDoubtTimeout: .milliseconds(500))
        defer { rig.close() }
        rig.cutter.arm(.afterCommit, isolate: true)
        let error = await #expect(throws: UnansweredCommit.self) { try await rig.hit("u") }
        #expect(error?.outcome == .unknown)
        #expect(try await rig.hits() == ["u": 1], "it did commit, and was not written again")
        let statistics = rig.committer.statistics
        #expect(statistics.inDoubtUnknown == 1 && statistics.fallbacks == 0, "\(statistics)")
    }

    @Test(
        "a change committed unanswered: without a key its caller hears so, with one its record answers; one version each"
    )
    func changeCommittedUnanswered() async throws {
        let w = try await LifecycleTests.world()
        let cutter = try CommitCutter(TestEnvironment.appURL(w.fixture.databaseURL))
        let pool = PostgresPool(try PostgresConfiguration(url: cutter.url), options: .init(maxConnections: 2))
        defer {
            pool.close()
            cutter.close()
        }
        let committer = GroupCommitter(pool: pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil))
        let store = LiveActivityStore(database: TenantDatabase(pool: pool), committer: committer)
        let tenant = w.tenant.uuid
        let instance = Fake.id("unanswered")
        #expect(try await w.start(["instance_id": instance]).status == 200)
        _ = try await w.registerActivityTokens(instance)
        func version() async throws -> Int { try #require(try await w.instance(instance)["version"] as? Int) }
        func updates() async throws -> Int {
            try await w.fixture.pool.count(
                """
                SELECT count(*)::int AS n FROM deliveries
                WHERE tenant_id = \(tenant) AND instance_id = \(instance) AND operation = 'update'
                """)
        }

        let plain = try await LifecycleWriteTests.plan(store, tenant, instance, .update, eta: 1)
        cutter.arm(.afterCommit)
        await #expect(throws: UnansweredCommit(outcome: .committed)) { try await store.change(tenant: tenant, plain) }
        #expect(try await version() == 2)
        let queued = try await updates()
        #expect(queued > 0)

        let key = "unanswered-" + Fake.hex(8)
        let keyed = try await LifecycleWriteTests.plan(store, tenant, instance, .update, eta: 2, key: key)
        cutter.arm(.afterCommit)
        #expect(try await store.change(tenant: tenant, keyed) == .alreadyExists, "read back from the key's record")
        #expect(try await version() == 3)
        #expect(try await updates() == 2 * queued, "each change queued its pushes once")
        let context = try await store.changeContext(tenant: tenant, instanceID: instance, idempotencyKey: key)
        #expect(context.idempotent?.status == 200)
        #expect(committer.statistics.inDoubtCommitted == 2 && committer.statistics.fallbacks == 0)
    }
}

/// A write that counts: each adds one to its key's row of `table` and answers the count.
struct Hit: SetWrite {
    var table: String
    var key: String
    var exclusiveKeys: [String] { [key] }

    static func statement(tenant: UUID, _ writes: [Hit]) -> PostgresQuery {
        let keys = writes.map(\.key)
        return """
            WITH up AS (
                INSERT INTO \(identifier: writes[0].table) AS t (key, hits)
                SELECT k, 1 FROM unnest(\(keys)::text[]) AS k
                ON CONFLICT (key) DO UPDATE SET hits = t.hits + 1
                RETURNING t.key, t.hits
            )
            SELECT up.hits FROM unnest(\(keys)::text[]) WITH ORDINALITY AS w(key, i) JOIN up USING (key) ORDER BY w.i
            """
    }
}

/// `body`'s value or error.
func outcome<T>(_ body: () async throws -> T) async -> Result<T, any Error> {
    do { return .success(try await body()) } catch { return .failure(error) }
}
