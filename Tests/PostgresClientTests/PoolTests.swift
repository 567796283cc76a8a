import Foundation
import Synchronization
import Testing

@testable import PostgresClient

@Suite("Pool behaviour (database)")
struct PoolTests {
    @Test("N+k concurrent callers never open more than N connections")
    func bounded() async throws {
        let application = TestDatabase.uniqueName("bound")
        // The bound is what is under test, not the wait: a loaded machine may take longer than the default 5 s to
        // serve twelve callers three at a time.
        let pool = try TestDatabase.pool(
            application: application, options: .init(maxConnections: 3, acquireTimeout: .seconds(60)))
        defer { pool.close() }
        let observed = Locked<[Int]>([])
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<12 {
                group.addTask {
                    try await pool.withConnection { connection in
                        let rows = try connection.query(
                            """
                            SELECT count(*) AS n, pg_sleep(0.05) FROM pg_stat_activity
                            WHERE application_name = \(application)
                            """)
                        let count = try rows[0].decode(Int.self, "n")
                        observed.withLock { $0.append(count) }
                    }
                    #expect(pool.statistics.open <= 3)
                }
            }
            try await group.waitForAll()
        }
        let counts = observed.withLock { $0 }
        #expect(counts.count == 12)
        #expect(counts.max() == 3)
        #expect(pool.statistics.open == 3)
        #expect(pool.statistics.idle == 3)
    }

    @Test("callers beyond the bound time out with poolTimeout")
    func acquireTimeout() async throws {
        let application = TestDatabase.uniqueName("timeout")
        let pool = try TestDatabase.pool(
            application: application, options: .init(maxConnections: 1, acquireTimeout: .milliseconds(200)))
        defer { pool.close() }
        // Held until the test releases it below, so the bound on the wait can be generous.
        let holder = Task { try await pool.execute("SELECT pg_sleep(60)") }
        #expect(await eventually { pool.statistics.idle == 0 && pool.statistics.open == 1 })
        try await Task.sleep(for: .milliseconds(50))
        let start = ContinuousClock.now
        let error = await #expect(throws: PostgresError.self) { try await pool.query("SELECT 1") }
        #expect(error?.code == .poolTimeout)
        let waited = ContinuousClock.now - start
        // It gave up on its own timeout, long before the holder would release the connection (60 s; a loaded CI
        // machine can be slow to wake it, hence the generous upper bound).
        #expect(waited >= .milliseconds(150) && waited < .seconds(20))
        let admin = try TestDatabase.pool()
        defer { admin.close() }
        #expect(try await TestDatabase.terminateBackends(admin, application: application) == 1)
        _ = try? await holder.value
        #expect(
            await eventually(timeout: .seconds(20)) {
                (try? await pool.query("SELECT 1 AS one")[0].decode(Int.self, "one")) == 1
            })
    }

    @Test("a cancelled waiter stops waiting")
    func cancelledWaiter() async throws {
        let application = TestDatabase.uniqueName("waiter")
        let pool = try TestDatabase.pool(
            application: application, options: .init(maxConnections: 1, acquireTimeout: .seconds(30)))
        defer { pool.close() }
        // The holder keeps the only connection until the test releases it (a 1 s sleep ran out before the waiter
        // queued on a loaded machine, and the waiter then simply got the connection).
        let holder = Task { try await pool.execute("SELECT pg_sleep(60)") }
        #expect(await eventually { pool.statistics.idle == 0 && pool.statistics.open == 1 })
        let waiter = Task { try await pool.query("SELECT 1") }
        #expect(await eventually(timeout: .seconds(20)) { pool.statistics.waiting == 1 })
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(pool.statistics.waiting == 0)
        let admin = try TestDatabase.pool()
        defer { admin.close() }
        #expect(try await TestDatabase.terminateBackends(admin, application: application) == 1)
        _ = try? await holder.value
    }

    @Test("a cancellable connection's statement is cancelled with its task, and the connection serves on")
    func cancellableStatement() async throws {
        let application = TestDatabase.uniqueName("cancel")
        let pool = try TestDatabase.pool(
            application: application, options: .init(maxConnections: 2, acquireTimeout: .seconds(30)))
        defer { pool.close() }
        let admin = try TestDatabase.pool()
        defer { admin.close() }
        func sleeping() async throws -> Int {
            try await admin.query(
                """
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE application_name = \(application) AND query LIKE 'SELECT pg_sleep(600)%'
                """)[0].decode(Int.self, "n")
        }
        let clock = ContinuousClock()
        let long = Task { try await pool.withCancellableConnection { try $0.execute("SELECT pg_sleep(600)") } }
        #expect(await eventually(timeout: .seconds(20)) { (try? await sleeping()) == 1 })
        let cancelledAt = clock.now
        long.cancel()
        do {
            _ = try await long.value
            Issue.record("the statement ran to its end")
        } catch let error as PostgresError {
            #expect(error.sqlState == "57014", "\(error)")
        }
        #expect(clock.now - cancelledAt < .seconds(20), "cancelled, not waited for")
        // The connection is usable afterwards.
        #expect(try await pool.query("SELECT 1 AS one")[0].decode(Int.self, "one") == 1)
        // A task cancelled before the statement starts runs none.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await pool.withCancellableConnection { try $0.execute("SELECT pg_sleep(600)") }
        }
        await #expect(throws: (any Error).self) { try await early.value }
    }

    @Test("the pool recovers by itself after all its backends are terminated")
    func recoversAfterTerminate() async throws {
        let application = TestDatabase.uniqueName("recover")
        let pool = try TestDatabase.pool(application: application, options: .init(maxConnections: 3))
        let admin = try TestDatabase.pool()
        defer {
            pool.close()
            admin.close()
        }
        // Warm up three connections.
        let before = try await withThrowingTaskGroup(of: Int32.self) { group in
            for _ in 0..<3 {
                group.addTask {
                    try await pool.withConnection { connection in
                        try connection.execute("SELECT pg_sleep(0.1)")
                        return connection.backendPID
                    }
                }
            }
            return try await group.reduce(into: Set<Int32>()) { $0.insert($1) }
        }
        #expect(before.count == 3)
        #expect(try await TestDatabase.terminateBackends(admin, application: application) == 3)
        #expect(try await eventually { try await TestDatabase.backendCount(admin, application: application) == 0 })

        // Every caller succeeds: stale idle connections are detected at checkout and replaced.
        let after = try await withThrowingTaskGroup(of: Int32.self) { group in
            for _ in 0..<6 {
                group.addTask {
                    try await pool.withConnection { connection in
                        try connection.execute("SELECT 1")
                        return connection.backendPID
                    }
                }
            }
            return try await group.reduce(into: Set<Int32>()) { $0.insert($1) }
        }
        #expect(after.isDisjoint(with: before))
        #expect(pool.statistics.open <= 3)
        #expect(try await TestDatabase.backendCount(admin, application: application) <= 3)
    }

    @Test("a session's steps share one connection across suspension points; a transaction left open is rolled back")
    func session() async throws {
        let pool = try TestDatabase.pool(options: .init(maxConnections: 1))
        defer { pool.close() }
        let table = TestDatabase.uniqueName("session")
        try await pool.execute("CREATE TABLE \(identifier: table) (id int)")
        let (first, second) = try await pool.withSession { session in
            let first = try await session.run { connection in
                try connection.execute("BEGIN")
                try connection.execute("INSERT INTO \(identifier: table) VALUES (1)")
                return connection.backendPID
            }
            try await Task.sleep(for: .milliseconds(10))
            let second = try await session.run { $0.backendPID }
            return (first, second)  // left open: rolled back
        }
        #expect(first == second)
        let count = try await pool.query("SELECT count(*)::int AS n FROM \(identifier: table)")[0].decode(Int.self, "n")
        #expect(count == 0)
        #expect(pool.statistics.idle == 1)
    }

    @Test("a session that cannot connect fails with connectionFailed; the slot is given back")
    func sessionCannotConnect() async throws {
        // Nothing listens on port 1.
        let pool = PostgresPool(
            try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:1/marquee"),
            options: .init(maxConnections: 1))
        defer { pool.close() }
        for _ in 0..<2 {
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withSession { session in try await session.run { $0.backendPID } }
            }
            #expect(error?.code == .connectionFailed)
            #expect(pool.statistics.open == 0)
        }
    }

    @Test("a connection lost mid-use throws connectionLost and is discarded, not reused")
    func connectionLostMidUse() async throws {
        let application = TestDatabase.uniqueName("lost")
        let pool = try TestDatabase.pool(application: application, options: .init(maxConnections: 1))
        let configuration = try TestDatabase.configuration()
        defer { pool.close() }
        let error = await #expect(throws: PostgresError.self) {
            try await pool.withConnection { connection in
                let pid = connection.backendPID
                let admin = try PostgresConnection(connecting: configuration)
                try admin.execute("SELECT pg_terminate_backend(\(pid))")
                Thread.sleep(forTimeInterval: 0.2)
                try connection.execute("INSERT INTO nowhere VALUES (1)")
            }
        }
        #expect(error?.code == .connectionLost)
        #expect(pool.statistics.open == 0)
        let fresh = try await pool.withConnection { $0.isBroken }
        #expect(fresh == false)
    }

    @Test("a server that goes away while idle is noticed by the health check")
    func healthCheckAndReaping() async throws {
        let application = TestDatabase.uniqueName("health")
        let pool = try TestDatabase.pool(
            application: application,
            options: .init(
                maxConnections: 2, healthCheckInterval: .milliseconds(50), idleTimeout: .milliseconds(400)))
        let admin = try TestDatabase.pool()
        defer {
            pool.close()
            admin.close()
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<2 {
                group.addTask { try await pool.execute("SELECT pg_sleep(0.05)") }
            }
            try await group.waitForAll()
        }
        #expect(pool.statistics.open == 2)
        try await TestDatabase.terminateBackends(admin, application: application)
        // The terminated backends are noticed by a health check once their sockets report the close.
        #expect(
            await eventually {
                await pool.maintain()
                return pool.statistics.open == 0
            })

        try await pool.execute("SELECT 1")
        #expect(pool.statistics.open == 1)
        // Closed once idle for 400 ms, by a maintenance pass after that.
        #expect(
            await eventually {
                await pool.maintain()
                return pool.statistics.open == 0
            })
        #expect(try await eventually { try await TestDatabase.backendCount(admin, application: application) == 0 })
    }

    @Test("run() returns when cancelled; close() fails later checkouts")
    func lifecycle() async throws {
        let pool = try TestDatabase.pool(options: .init(healthCheckInterval: .milliseconds(20)))
        let runner = Task { try await pool.run() }
        try await pool.execute("SELECT 1")
        try await Task.sleep(for: .milliseconds(60))
        runner.cancel()
        try await runner.value
        pool.close()
        let error = await #expect(throws: PostgresError.self) { try await pool.query("SELECT 1") }
        #expect(error?.code == .poolClosed)
    }

    @Test("notices are routed to the handler, not printed")
    func notices() async throws {
        var configuration = try TestDatabase.configuration()
        let received = Locked<[String]>([])
        configuration.noticeHandler = { message in received.withLock { $0.append(message) } }
        let pool = PostgresPool(configuration)
        defer { pool.close() }
        try await pool.execute("DO $$ BEGIN RAISE NOTICE 'hello from plpgsql'; END $$")
        #expect(received.withLock { $0 }.contains { $0.contains("hello from plpgsql") })
    }
}
