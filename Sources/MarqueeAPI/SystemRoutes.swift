import HTTPServer
import MarqueeStore
import Observability
import PostgresClient

/// `/healthz`, `/readyz` and `/metrics`: what orchestrators and Prometheus call.
public struct SystemRoutes: Sendable {
    private let migrator: Migrator
    private let metrics: MetricsRegistry
    private let logger: Logger
    private let ready: Gauge

    public init(pool: PostgresPool, migrator: Migrator, metrics: MetricsRegistry, logger: Logger) {
        // A connection of its own: through the requests' pool, a probe waited behind every request for a connection
        // (up to the acquire timeout, 5 s) and failed its own timeout (1 s by default) on every pod at once during a
        // load spike, taking the Service's endpoints away when they were needed most.
        self.migrator = migrator.using(
            pool.sibling(options: .init(maxConnections: 1, acquireTimeout: .seconds(2))))
        self.metrics = metrics
        self.logger = logger
        self.ready = metrics.gauge(
            "marquee_ready", help: "1 when this API process is ready (PostgreSQL answers, migrations current).")
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
            status = try await migrator.status()
        } catch {
            ready.set(0)
            logger.warning(
                "readiness: database check failed",
                metadata: ["request.id": .string(request.requestID), "error": .string(String(describing: error))])
            throw Problems.databaseUnavailable()
        }
        ready.set(status.isCurrent ? 1 : 0)
        guard status.isCurrent else {
            throw Problems.migrationsPending(status.pending.map(\.version), changed: status.changed)
        }
        return .json(["status": "ready", "database": "ok", "migrations": "current"])
    }

}
