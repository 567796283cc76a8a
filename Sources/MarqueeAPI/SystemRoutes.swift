import HTTPServer
import MarqueeStore
import Observability
import PostgresClient

/// `/healthz`, `/readyz` and `/metrics`: what orchestrators and Prometheus call.
public struct SystemRoutes: Sendable {
    private let pool: PostgresPool
    private let migrator: Migrator
    private let metrics: MetricsRegistry
    private let logger: Logger

    public init(pool: PostgresPool, migrator: Migrator, metrics: MetricsRegistry, logger: Logger) {
        self.pool = pool
        self.migrator = migrator
        self.metrics = metrics
        self.logger = logger
    }

    /// Adds the three routes.
    public func register(in router: inout Router) {
        router.add(.GET, "/healthz") { _ in
            .json(["status": "ok"])
        }
        router.add(.GET, "/readyz") { request in
            try await readiness(request)
        }
        router.add(.GET, "/metrics") { _ in
            .text(metrics.exposition(), contentType: Exposition.contentType)
        }
    }

    /// Ready when PostgreSQL answers and every migration this build knows is applied unchanged.
    func readiness(_ request: HTTPRequest) async throws -> HTTPResponse {
        let status: MigrationStatus
        do {
            status = try await migrator.status()
        } catch {
            logger.warning(
                "readiness: database check failed",
                metadata: ["request.id": .string(request.requestID), "error": .string(String(describing: error))])
            throw Problems.databaseUnavailable()
        }
        guard status.isCurrent else {
            throw Problems.migrationsPending(status.pending.map(\.version), changed: status.changed)
        }
        return .json(["status": "ready", "database": "ok", "migrations": "current"])
    }
}
