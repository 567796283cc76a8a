import Observability
import PostgresClient

/// What every process exports beside its own families: the standard `process_*` families and its PostgreSQL pool.
enum RuntimeMetrics {
    static func register(pool: PostgresPool, in registry: MetricsRegistry) {
        ProcessMetrics.register(in: registry)
        let connections = registry.gauge(
            "marquee_db_pool_connections", help: "PostgreSQL connections of this process's pool, by state.",
            labels: ["state"])
        let waiting = registry.gauge(
            "marquee_db_pool_waiters", help: "Callers waiting for a PostgreSQL connection from the pool.")
        let capacity = registry.gauge(
            "marquee_db_pool_max_connections", help: "Most PostgreSQL connections this process's pool opens.")
        capacity.set(Double(pool.options.maxConnections))
        registry.onCollect {
            let statistics = pool.statistics
            connections.set(Double(statistics.open - statistics.idle), ["in_use"])
            connections.set(Double(statistics.idle), ["idle"])
            waiting.set(Double(statistics.waiting))
        }
    }
}
