import Foundation
import MarqueeStore
import PostgresClient
import Synchronization
import Testing

/// A body that runs until `open` is called.
final class Gate: Sendable {
    private let started = Mutex(0)

    /// Bodies that got to the gate.
    var arrived: Int { started.withLock { $0 } }

    private let state = Mutex<(open: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        started.withLock { $0 += 1 }
        await withCheckedContinuation { continuation in
            let open = state.withLock { state in
                if !state.open { state.waiting.append(continuation) }
                return state.open
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiting = state.withLock { state in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}

@Suite("Tenants' shares of the pool")
struct TenantSharesTests {
    @Test("a tenant past its share waits behind itself; another tenant is admitted at once")
    func sharesPerTenant() async throws {
        let shares = TenantShares(limit: 2, timeout: .seconds(60))
        let (a, b) = (UUID(), UUID())
        let gate = Gate()
        let tasks = (0..<5).map { _ in
            Task {
                try await shares.withShare(a) { await gate.wait() }
            }
        }
        try await eventually("two admitted and three waiting", timeout: .seconds(30)) {
            shares.counts(a) == (2, 3)
        }
        #expect(gate.arrived == 2)
        #expect(try await shares.withShare(b) { shares.counts(b) } == (1, 0))
        gate.open()
        for task in tasks { try await task.value }
        #expect(gate.arrived == 5)
        #expect(shares.counts(a) == (0, 0))
    }

    @Test("a wait for a busy share ends after its timeout, or when cancelled, and leaves nothing behind")
    func timeoutAndCancellation() async throws {
        let shares = TenantShares(limit: 1, timeout: .milliseconds(300))
        let tenant = UUID()
        let gate = Gate()
        let holder = Task { try await shares.withShare(tenant) { await gate.wait() } }
        try await eventually("the share taken", timeout: .seconds(30)) { shares.counts(tenant).held == 1 }
        await #expect(throws: PostgresError.self) { try await shares.withShare(tenant) {} }
        #expect(shares.counts(tenant) == (1, 0))

        let patient = TenantShares(limit: 1, timeout: .seconds(600))
        let patientHolder = Task { try await patient.withShare(tenant) { await gate.wait() } }
        try await eventually("the share taken", timeout: .seconds(30)) { patient.counts(tenant).held == 1 }
        let waiter = Task { try await patient.withShare(tenant) {} }
        try await eventually("the waiter queued", timeout: .seconds(30)) { patient.counts(tenant).waiting == 1 }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(patient.counts(tenant) == (1, 0))
        gate.open()
        try await holder.value
        try await patientHolder.value
        #expect(shares.counts(tenant) == (0, 0))
        #expect(patient.counts(tenant) == (0, 0))
    }

    @Test("one tenant's transactions stuck on a lock do not keep another tenant from the pool")
    func stuckTenantLeavesRoom() async throws {
        let running = try await RegistryFixture.get()
        let configuration = try PostgresConfiguration(url: running.databaseURL)
        let holder = PostgresPool(configuration, options: .init(maxConnections: 1))
        defer { holder.close() }
        // Four connections, of which one tenant may take two; a wait for the pool ends after 3 s.
        let pool = PostgresPool(configuration, options: .init(maxConnections: 4, acquireTimeout: .seconds(3)))
        defer { pool.close() }
        let database = TenantDatabase(pool: pool)
        let lock = Int64.random(in: 1..<Int64.max)
        let (busy, other) = (UUID(), UUID())
        try await holder.withConnection { _ = try $0.query("SELECT pg_advisory_lock(\(lock))") }
        // Ten of one tenant's transactions that wait for the lock the test holds.
        let stuck = (0..<10).map { _ in
            Task {
                try await database.tenantTransaction(busy) {
                    _ = try $0.query("SELECT pg_advisory_xact_lock_shared(\(lock))")
                }
            }
        }
        try await eventually("all ten running or queued", timeout: .seconds(30)) {
            let blocked = try await holder.withConnection {
                try $0.query(
                    """
                    SELECT count(*)::int AS n FROM pg_locks
                    WHERE locktype = 'advisory' AND NOT granted
                      AND (classid::bigint << 32) | objid::bigint = \(lock)
                    """
                ).first!.decode(Int.self, "n")
            }
            return blocked + pool.statistics.waiting + database.shares.counts(busy).waiting == 10
        }
        // Without shares the other tenant queued behind the six waiting for the pool, and timed out with them.
        let answer = try await database.tenantTransaction(other) {
            try $0.query("SELECT 1 AS one").first!.decode(Int.self, "one")
        }
        #expect(answer == 1)
        try await holder.withConnection { _ = try $0.query("SELECT pg_advisory_unlock(\(lock))") }
        for task in stuck { _ = try? await task.value }
    }
}
