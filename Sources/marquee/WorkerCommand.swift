import CMalloc
import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeDelivery
import MarqueeStore
import Observability
import PostgresClient
import ProcessLifecycle

/// `marquee worker`: one delivery worker process, with `/metrics` and `/healthz` on `MARQUEE_METRICS_LISTEN`.
struct WorkerCommand {
    init(arguments: [String]) throws {
        if let first = arguments.first { throw UsageError("worker: unknown option '\(first)'") }
    }

    /// glibc gives a thread that allocates while the other arenas are busy an arena of its own (up to 8 per core),
    /// and an arena keeps what is freed in it. The worker's threads (libpq's queues, HTTP/2 I/O, the concurrency pool)
    /// made about fifteen, most holding a megabyte or more: with two, `bench/fanout` measured 51–53 MiB per worker
    /// instead of 59–66. `MALLOC_ARENA_MAX` in the environment still decides when it is set.
    static func limitMallocArenas() {
        if ProcessInfo.processInfo.environment["MALLOC_ARENA_MAX"] == nil { _ = cmalloc_set_arena_max(2) }
    }

    func run() async throws {
        Self.limitMallocArenas()
        let configuration = try Startup.configuration()
        let workerID = "\(ProcessInfo.processInfo.hostName)-\(getpid())"
        let logger = Startup.logger("marquee.worker", configuration).with("worker.id", .string(workerID))
        let keyRing = try Startup.keyRing(configuration, command: "worker")
        var pgConfiguration = try PostgresConfiguration(url: try configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-worker"
        // The worker's work is cross-tenant (claims, results, token retirement, clean-up): its sessions run as
        // marquee_system (migration 0010); tenant-scoped steps still switch to marquee_api per transaction.
        pgConfiguration.startupSettings["role"] = "marquee_system"
        pgConfiguration.startupSettings["jit"] = Database.jit
        // Background statements (the queue's sampler and statistics, idempotency expiry, campaign steps, settles) end
        // rather than wait forever behind a lock; a claim sets its own, its record none (`DeliveryQueue.claim`).
        if configuration.databaseStatementTimeoutSeconds > 0 {
            pgConfiguration.startupSettings["statement_timeout"] = "\(configuration.databaseStatementTimeoutSeconds)s"
        }
        let pool = PostgresPool(
            pgConfiguration,
            options: .init(
                maxConnections: DeliveryWorker.poolConnections(
                    loops: configuration.workerLoops, expressBatch: configuration.workerExpressBatch),
                acquireTimeout: .seconds(configuration.databaseAcquireTimeoutSeconds)))
        let metrics = MetricsRegistry()
        RuntimeMetrics.register(pool: pool, in: metrics)
        StallWatch.start(logger: logger, registry: metrics)
        let worker = DeliveryWorker(
            pool: pool, listenerConfiguration: pgConfiguration,
            apns: APNsProvider(
                configuration: .init(
                    caFile: configuration.caFile, connectionsPerHost: configuration.apnsConnections,
                    allowedHosts: configuration.providerHosts),
                logger: logger),
            fcm: FCMProvider(
                configuration: .init(
                    caFile: configuration.caFile, connectionsPerHost: configuration.apnsConnections,
                    allowedHosts: configuration.providerHosts),
                logger: logger),
            keyRing: keyRing,
            configuration: .init(
                workerID: workerID, batchSize: configuration.workerBatch, loops: configuration.workerLoops,
                expressBatch: configuration.workerExpressBatch,
                hold: .seconds(configuration.workerHoldSeconds),
                pollInterval: .milliseconds(configuration.workerPollMilliseconds),
                retryPolicy: RetryPolicy(
                    maxAttempts: configuration.retryMaxAttempts,
                    initialDelay: .milliseconds(configuration.retryInitialMilliseconds)),
                drainTimeout: .seconds(configuration.drainTimeoutSeconds)),
            metrics: metrics, logger: logger)

        let retention = RetentionService(
            store: RetentionStore(pool: pool), configuration: .init(keepDays: configuration.retentionDays),
            metrics: metrics, logger: logger)

        let credentialHealth = CredentialHealthSampler(pool: pool, metrics: metrics)

        var router = Router()
        // Live while every loop finishes its iterations: a loop stuck past the bound (a claim waiting forever on a
        // dead connection) delivers nothing until the process is restarted, which a liveness probe does on a 503.
        let liveness = Duration.seconds(configuration.workerLivenessSeconds)
        router.add(.GET, "/healthz") { _ in
            let stalled = worker.stalledLoops(after: liveness)
            guard !stalled.isEmpty else { return .json(["status": "ok"]) }
            let loops = stalled.map { "\($0.loop) (\($0.since.components.seconds) s)" }
            logger.error(
                "worker loops stalled", metadata: ["worker.stalled": .string(loops.joined(separator: ", "))])
            return .json(["status": "stalled", "stalled": loops.joined(separator: ", ")], status: 503)
        }
        router.add(.GET, "/metrics") { _ in
            // Credential state is read at each scrape (one small query), so the gauges are never stale.
            try? await credentialHealth.sample()
            return .text(metrics.exposition(), contentType: Exposition.contentType)
        }
        let metricsServer = HTTPServer(
            configuration: .init(
                host: configuration.metricsListen.host, port: configuration.metricsListen.port, threadCount: 1,
                drainTimeout: .seconds(2)),
            router: router)

        let roleGuard = try await Startup.databaseGuard(
            pool: pool, keyRing: keyRing, command: "worker", configuration, logger: logger)
        logger.info(
            "worker starting",
            metadata: [
                "metrics.listen": .string(configuration.metricsListen.description),
                "worker.batch": .int(configuration.workerBatch), "worker.loops": .int(configuration.workerLoops),
                "worker.express_batch": .int(configuration.workerExpressBatch),
                "worker.liveness_seconds": .int(configuration.workerLivenessSeconds),
            ])
        try await ServiceGroup(
            services: [
                ("postgres.pool", pool.service),
                (
                    "worker",
                    ClosureService {
                        try await withGracefulShutdownHandler {
                            try await worker.run()
                        } onGracefulShutdown: {
                            worker.beginShutdown()
                        }
                    }
                ),
                ("retention", CancellingService { await retention.run() }),
                ("metrics", metricsServer.service),
            ] + (roleGuard.map { [("database.role", $0)] } ?? []),
            // The worker returns within MARQUEE_DRAIN_TIMEOUT (it gives up sends still open near its end, recorded as
            // retries); 5 s more before the group forces the process out.
            configuration: .init(drainTimeout: .seconds(configuration.drainTimeoutSeconds + 5)),
            logger: logger
        ).run()
        pool.close()
    }
}
