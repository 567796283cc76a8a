import Foundation
import PostgresClient
import Testing

/// A worker whose database stops answering: its queue cannot be read (a sample waits on a lock with no statement
/// timeout), or nothing answers at all (a dead TCP connection). Each test has a database of its own.
@Suite("A worker that cannot read its queue", .serialized)
struct WorkerHealthTests {
    /// A migrated database, and a worker on it serving `/metrics` and `/healthz`.
    /// The worker reaches the database through `relay` when given.
    static func worker(_ extra: [String: String] = [:], through relay: FreezableRelay? = nil) async throws -> (
        url: String, worker: MarqueeProcess
    ) {
        let (url, owner) = try await QueueStatisticsTests.migratedDatabase()
        owner.close()
        let port = TestEnvironment.freePort()
        var environment = [
            "DATABASE_URL": relay?.url(for: url) ?? url, "MARQUEE_METRICS_LISTEN": "127.0.0.1:\(port)",
        ]
        environment.merge(extra) { _, new in new }
        let worker = try MarqueeProcess(["worker"], environment: environment, port: port)
        try await worker.waitUntilServing()
        return (url, worker)
    }

    /// Locks the whole queue in a transaction of its own, as long as it stays open.
    static func lockQueue(_ url: String) async throws -> HeldTransaction {
        try await HeldTransaction.open(url) { try $0.execute("LOCK TABLE delivery_queue IN ACCESS EXCLUSIVE MODE") }
    }

    /// An unlabelled series of the worker's `/metrics`.
    static func metric(_ worker: MarqueeProcess, _ name: String) async throws -> Double? {
        let text = try await HTTP.get(worker.baseURL + "/metrics").text
        return text.split(separator: "\n").first { $0.hasPrefix(name + " ") }
            .flatMap { Double($0.split(separator: " ")[1]) }
    }

    @Test("the queue's sample age grows while the queue cannot be read, and drops once it can")
    func sampleAge() async throws {
        let (url, worker) = try await Self.worker()
        defer { worker.signal(SIGKILL) }
        let age = { try await Self.metric(worker, "marquee_queue_sample_age_seconds") }
        try await eventually("a first sample") { try await age().map { $0 < 6 } ?? false }
        let lock = try await Self.lockQueue(url)
        // Sampled every 5 s: past 12 s, at least two samples failed.
        try await eventually("the sample age past 12 s") { try await age().map { $0 > 12 } ?? false }
        try await lock.commit()
        try await eventually("a fresh sample") { try await age().map { $0 < 6 } ?? false }
    }

    @Test("a worker's background statement stuck behind a lock ends at MARQUEE_DB_STATEMENT_TIMEOUT, not never")
    func backgroundStatementTimeout() async throws {
        let (url, worker) = try await Self.worker(["MARQUEE_DB_STATEMENT_TIMEOUT": "2"])
        defer { worker.signal(SIGKILL) }
        let owner = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { owner.close() }
        let lock = try await Self.lockQueue(url)
        defer { Task { try? await lock.commit() } }
        // The sampler's read of the queue (every 5 s) meets the lock: one such wait, by its backend and start.
        let waiting = {
            try await owner.query(
                """
                SELECT pid, query_start::text AS started FROM pg_stat_activity
                WHERE application_name = 'marquee-worker' AND state = 'active' AND wait_event_type = 'Lock'
                  AND query LIKE '%SELECT q.provider, count(*)%'
                """
            ).map { "\(try $0.decode(Int.self, "pid")) \(try $0.decode(String.self, "started"))" }
        }
        var first: String?
        try await eventually("the sampler waiting on the queue's lock", timeout: .seconds(60)) {
            first = try await waiting().first
            return first != nil
        }
        // Without a statement timeout that same statement waits as long as the lock is held (here, for good).
        try await eventually("that wait ended by the statement timeout", timeout: .seconds(60)) {
            try await !waiting().contains(first!)
        }
        #expect(worker.log.contains("queue depth sample failed"))
    }

    @Test("/healthz answers 503 once the claim loops are stuck past MARQUEE_WORKER_LIVENESS_SECONDS, 200 again after")
    func liveness() async throws {
        let relay = try FreezableRelay(to: URLComponents(string: TestEnvironment.databaseURL)!.port!)
        defer { relay.stop() }
        let (_, worker) = try await Self.worker(
            ["MARQUEE_WORKER_HOLD_SECONDS": "2", "MARQUEE_WORKER_LIVENESS_SECONDS": "4"], through: relay)
        defer { worker.signal(SIGKILL) }
        let healthz = { try await HTTP.get(worker.baseURL + "/healthz") }
        #expect(try await healthz().status == 200)
        // The database stops answering, its connections open: the claims wait for answers that do not come (a claim
        // waiting on a lock is stopped by its statement timeout, and its loop claims again).
        relay.freeze()
        // Each claim loop stops beating when its claim starts waiting: both within a poll interval of the freeze.
        var stalled = ""
        try await eventually("/healthz answering 503, naming both claim loops") {
            let response = try await healthz()
            stalled = response.text
            return response.status == 503 && stalled.contains("loop 0") && stalled.contains("loop 1")
        }
        #expect(worker.log.contains("worker loops stalled"))
        relay.thaw()
        try await eventually("/healthz answering 200 again") { try await healthz().status == 200 }
    }
}
