import Foundation
import PostgresClient
import Synchronization
import Testing

@Suite("LISTEN/NOTIFY (database)")
struct ListenerTests {
    @Test("notifications arrive, and arrive again after the listener's backend is terminated")
    func listenAndReconnect() async throws {
        let application = TestDatabase.uniqueName("listen")
        let channel = TestDatabase.uniqueName("Chan")  // mixed case: must be quoted correctly
        let listener = PostgresListener(try TestDatabase.configuration(application: application), channels: [channel])
        let pool = try TestDatabase.pool()
        defer { pool.close() }
        let received = Locked<[PostgresNotification]>([])

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await listener.run() }
            group.addTask {
                for await notification in listener.notifications {
                    received.withLock { $0.append(notification) }
                }
            }

            func payloads() -> [String] { received.withLock { $0.map(\.payload) } }
            // Opening a connection to PostgreSQL took over 5 s in full-suite runs on a loaded 2-core machine (no
            // connection failed: the server log shows none); these deadlines only bound how long a failure takes.
            let connecting: Duration = .seconds(30)

            #expect(await eventually(timeout: connecting) { listener.isListening })
            try await pool.notify(channel: channel, payload: "first")
            #expect(await eventually(timeout: connecting) { payloads().contains("first") })
            let first = try #require(received.withLock { $0.first })
            #expect(first.channel == channel)
            #expect(first.pid > 0)

            #expect(try await TestDatabase.terminateBackends(pool, application: application) == 1)
            #expect(await eventually(timeout: connecting) { listener.connectionCount == 2 && listener.isListening })
            try await pool.execute("SELECT pg_notify(\(channel), \("second ☃"))")
            #expect(await eventually(timeout: connecting) { payloads().contains("second ☃") })

            // A notification inside a transaction is delivered on commit only.
            try await pool.transaction { connection in
                try connection.notify(channel: channel, payload: "third")
            }
            #expect(await eventually(timeout: connecting) { payloads().contains("third") })
            group.cancelAll()
            try await group.waitForAll()
        }
        #expect(received.value.map(\.payload) == ["first", "second ☃", "third"])
    }

    @Test("run() returns promptly when cancelled even while the server is unreachable")
    func cancelWhileReconnecting() async throws {
        var configuration = try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:1/marquee")
        configuration.connectTimeout = .seconds(30)
        let listener = PostgresListener(configuration, channels: ["x"])
        let task = Task { try await listener.run() }
        try await Task.sleep(for: .milliseconds(300))
        #expect(!listener.isListening)
        let start = ContinuousClock.now
        task.cancel()
        try await task.value
        // Below the connect timeout (30 s), with room for a loaded machine: a 3 s bound failed once with four builds
        // running beside the suite, and a 10 s bound once (10.15 s) with `yes` beside it. A listener that ignored the
        // cancellation would not return at all.
        #expect(ContinuousClock.now - start < .seconds(25))
        var iterator = listener.notifications.makeAsyncIterator()
        #expect(await iterator.next() == nil)  // the stream finished
    }
}
