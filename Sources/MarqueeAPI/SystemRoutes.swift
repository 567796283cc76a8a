import HTTPServer
import MarqueeStore
import Observability
import PostgresClient
import Synchronization

/// `/healthz`, `/readyz` and `/metrics`: what orchestrators and Prometheus call.
public struct SystemRoutes: Sendable {
    private let metrics: MetricsRegistry
    private let logger: Logger
    private let ready: Gauge
    /// The database check, shared: `/readyz` and `/metrics` are public and unauthenticated, so each of a flood of
    /// probes asking PostgreSQL on the probe's one connection would queue the kubelet's own probe behind them.
    private let check: SharedCheck<MigrationStatus>

    public init(pool: PostgresPool, migrator: Migrator, metrics: MetricsRegistry, logger: Logger) {
        // A connection of its own: through the requests' pool, a probe waited behind every request for a connection
        // (up to the acquire timeout, 5 s) and failed its own timeout (1 s by default) on every pod at once during a
        // load spike, taking the Service's endpoints away when they were needed most.
        let migrator = migrator.using(
            pool.sibling(options: .init(maxConnections: 1, acquireTimeout: .seconds(2))))
        self.metrics = metrics
        self.logger = logger
        let ready = metrics.gauge(
            "marquee_ready", help: "1 when this API process is ready (PostgreSQL answers, migrations current).")
        self.ready = ready
        self.check = SharedCheck(fresh: .seconds(1)) {
            do {
                let status = try await migrator.status()
                ready.set(status.isCurrent ? 1 : 0)
                return status
            } catch {
                ready.set(0)
                logger.warning(
                    "readiness: database check failed", metadata: ["error": .string(String(describing: error))])
                throw error
            }
        }
    }

    /// Adds the three routes.
    public func register(in router: inout Router) {
        router.add(.GET, "/healthz") { _ in
            .json(["status": "ok"])
        }
        router.add(.GET, "/readyz") { request in
            try await readiness(request)
        }
        router.add(.GET, "/metrics") { request in
            // Readiness is sampled at each scrape too, so an alert sees it without an orchestrator probing.
            _ = try? await readiness(request)
            return .text(metrics.exposition(), contentType: Exposition.contentType)
        }
    }

    /// Ready when PostgreSQL answers and every migration this build knows is applied unchanged.
    func readiness(_ request: HTTPRequest) async throws -> HTTPResponse {
        let status: MigrationStatus
        do {
            status = try await check.value()
        } catch {
            throw Problems.databaseUnavailable()
        }
        guard status.isCurrent else {
            throw Problems.migrationsPending(status.pending.map(\.version), changed: status.changed)
        }
        return .json(["status": "ready", "database": "ok", "migrations": "current"])
    }

}

/// One answer shared by every caller within `fresh` of the check that gave it; callers arriving while a check runs
/// wait for that one. A check that hangs past `fresh` is not waited for by later callers: they start another, so at
/// most one check a `fresh` period is started however many callers come.
final class SharedCheck<Value: Sendable>: Sendable {
    private let fresh: Duration
    private let run: @Sendable () async throws -> Value
    private let latest = Mutex<(task: Task<Result<Value, any Error>, Never>, started: ContinuousClock.Instant)?>(nil)

    init(fresh: Duration, _ run: @escaping @Sendable () async throws -> Value) {
        self.fresh = fresh
        self.run = run
    }

    func value() async throws -> Value {
        let now = ContinuousClock.now
        let task = latest.withLock { latest in
            if let latest, now - latest.started < fresh { return latest.task }
            let run = self.run
            let task = Task<Result<Value, any Error>, Never> {
                do { return .success(try await run()) } catch { return .failure(error) }
            }
            latest = (task, now)
            return task
        }
        return try await task.value.get()
    }
}
