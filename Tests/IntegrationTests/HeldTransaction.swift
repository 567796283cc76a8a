import Dispatch
import Foundation
import PostgresClient
import Synchronization

/// A transaction held open on a connection of its own, as a concurrent writer's would be: `begin` runs in it, then it
/// waits to be released, runs `end` and commits. Tests use it to hold row locks while another writer meets them.
final class HeldTransaction: Sendable {
    /// What the transaction's task and the test share.
    private final class Shared: Sendable {
        let release = DispatchSemaphore(value: 0)
        let pid = Mutex<Int?>(nil)
        let finished = Mutex(false)
    }

    private let pool: PostgresPool
    private let shared = Shared()
    private let task: Task<Void, any Error>

    /// Opens the transaction and returns once `begin` ran.
    static func open(
        _ url: String, begin: @escaping @Sendable (PostgresConnection) throws -> Void,
        end: @escaping @Sendable (PostgresConnection) throws -> Void = { _ in }
    ) async throws -> HeldTransaction {
        let held = try HeldTransaction(url, begin: begin, end: end)
        // Either it holds its locks, or it failed (and the failure is thrown here).
        try await eventually("the transaction holds its locks") { held.shared.pid.withLock { $0 } != nil || held.ended }
        if held.ended { try await held.task.value }
        return held
    }

    private init(
        _ url: String, begin: @escaping @Sendable (PostgresConnection) throws -> Void,
        end: @escaping @Sendable (PostgresConnection) throws -> Void
    ) throws {
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        let shared = shared
        self.pool = pool
        task = Task {
            defer { shared.finished.withLock { $0 = true } }
            try await pool.withConnection { c in
                try c.execute("BEGIN")
                try begin(c)
                let pid = try c.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")
                shared.pid.withLock { $0 = pid }
                shared.release.wait()
                try end(c)
                try c.execute("COMMIT")
            }
        }
    }

    private var ended: Bool { shared.finished.withLock { $0 } }

    /// Its session's backend (`pg_backend_pid()`).
    var pid: Int { shared.pid.withLock { $0 } ?? 0 }

    /// Waits until another session waits for this transaction (a lock it holds).
    func waitedOn(via pool: PostgresPool, _ what: String) async throws {
        try await waitedOn(by: 1, via: pool, what)
    }

    /// Waits until `sessions` sessions wait for this transaction, directly (a lock it holds) or one removed (a lock held
    /// by a session waiting for it).
    func waitedOn(by sessions: Int, via pool: PostgresPool, _ what: String) async throws {
        try await eventually(what) { try await waiting(via: pool) >= sessions }
    }

    /// The sessions waiting for this transaction now, directly or one removed.
    func waiting(via pool: PostgresPool) async throws -> Int {
        let pid = shared.pid.withLock { $0 } ?? 0
        return try await pool.count(
            """
            SELECT count(*)::int AS n FROM pg_stat_activity a
            WHERE \(pid) = ANY(pg_blocking_pids(a.pid))
               OR EXISTS (SELECT 1 FROM unnest(pg_blocking_pids(a.pid)) b(pid)
                          WHERE \(pid) = ANY(pg_blocking_pids(b.pid)))
            """)
    }

    /// Lets it run `end` and commit; throws what it threw.
    func commit() async throws {
        shared.release.signal()
        defer { pool.close() }
        try await task.value
    }
}
