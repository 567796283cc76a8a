import Crypto
import Foundation
import HTTPServer
import MarqueeAPI
import MarqueeCore
import MarqueeDelivery
import MarqueeStore
import Observability
import PostgresClient
import ProcessLifecycle

/// `marquee serve`: the REST API.
struct ServeCommand {
    init(arguments: [String]) throws {
        if let first = arguments.first { throw UsageError("serve: unknown option '\(first)'") }
    }

    /// Descriptors beyond the listener's connections and the database pool: the listening socket, provider
    /// connections (channels), logs, the metrics listener.
    static let descriptorReserve = 256

    /// Raises the open-files soft limit to cover `MARQUEE_HTTP_CONNECTIONS` and the database pool (as far as the hard
    /// limit allows), and says when it cannot: past it, connections wait in the kernel's backlog, unanswered.
    static func ensureOpenFiles(_ configuration: MarqueeConfiguration, logger: Logger) {
        let needed = configuration.httpConnections + configuration.databasePoolSize + Self.descriptorReserve
        guard let outcome = OpenFileLimit.ensure(atLeast: needed) else { return }
        let metadata: [String: LogValue] = [
            "open_files.needed": .int(needed), "open_files.before": .int(Int(clamping: outcome.before)),
            "open_files.soft": .int(Int(clamping: outcome.after)), "open_files.hard": .int(Int(clamping: outcome.hard)),
        ]
        if !outcome.enough {
            logger.warning(
                "the open-files limit is below what MARQUEE_HTTP_CONNECTIONS and the database pool may use: raise the "
                    + "hard limit (systemd LimitNOFILE=, ulimit -Hn) or lower MARQUEE_HTTP_CONNECTIONS",
                metadata: metadata)
        } else if outcome.after > outcome.before {
            logger.info("open-files limit raised", metadata: metadata)
        }
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        let logger = Startup.logger("marquee.api", configuration)
        Self.ensureOpenFiles(configuration, logger: logger)
        let migrations = try Database.migrations(configuration)

        var pgConfiguration = try PostgresConfiguration(url: try configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-serve"
        pgConfiguration.startupSettings["jit"] = Database.jit
        if configuration.databaseStatementTimeoutSeconds > 0 {
            pgConfiguration.startupSettings["statement_timeout"] = "\(configuration.databaseStatementTimeoutSeconds)s"
        }
        let pool = PostgresPool(
            pgConfiguration,
            options: .init(
                maxConnections: configuration.databasePoolSize,
                acquireTimeout: .seconds(configuration.databaseAcquireTimeoutSeconds)))
        let migrator = Migrator(pool: pool, migrations: migrations)
        let metrics = MetricsRegistry()
        let httpMetrics = HTTPMetrics(registry: metrics)
        RuntimeMetrics.register(pool: pool, in: metrics)
        StallWatch.start(logger: logger, registry: metrics)

        let keyRing = try Startup.keyRing(configuration, command: "serve")
        var trustedProxies = TrustedProxies.empty
        if let text = configuration.trustedProxies {
            guard let parsed = TrustedProxies(parsing: text) else {
                throw ConfigurationError(problems: [
                    .init(
                        variable: "MARQUEE_TRUSTED_PROXIES",
                        reason: "must be IP addresses or CIDR blocks (192.0.2.0/24, 2001:db8::/32) separated by commas")
                ])
            }
            trustedProxies = parsed
        }

        // Broadcast channels are created and deleted at Apple synchronously, from this process.
        let channelClient = APNsChannelClient(
            configuration: APNsChannelClient.serving(
                caFile: configuration.caFile, allowedHosts: configuration.providerHosts),
            logger: logger)
        let channelManager = APNsChannelManager(
            client: channelClient,
            credentials: CredentialStore(database: TenantDatabase(pool: pool), keyRing: keyRing), keyRing: keyRing,
            logger: logger)

        var router = Router()
        MarqueeAPI(
            pool: pool, migrator: migrator, keyRing: keyRing, adminToken: configuration.adminToken,
            keyCacheTTL: .seconds(configuration.keyCacheSeconds),
            requestLimits: RequestLimits(
                appPerSecond: configuration.rateLimitApp, sdkPerSecond: configuration.rateLimitSDK,
                burstSeconds: configuration.rateLimitBurstSeconds,
                sdkPerAddressPerSecond: configuration.rateLimitSDKPerAddress,
                keyLookupsPerAddressPerSecond: configuration.keyLookupsPerAddress),
            groupCommit: .init(writers: configuration.databaseWriteBatches),
            readBatches: configuration.databaseReadBatches, providerHosts: configuration.providerHosts,
            channelManager: channelManager, metrics: metrics,
            logger: logger
        ).register(in: &router)

        let accessLogger = logger.labelled("marquee.access")
        let server = HTTPServer(
            configuration: .init(
                host: configuration.listen.host, port: configuration.listen.port,
                maxBodySize: configuration.maxBodyBytes, threadCount: configuration.httpThreads,
                connectionTimeout: .seconds(configuration.httpIdleTimeoutSeconds),
                connectionLimit: configuration.httpConnections,
                drainTimeout: .seconds(configuration.drainTimeoutSeconds),
                perAddressConnectionLimit: configuration.httpConnectionsPerAddress,
                requestReadTimeout: .seconds(configuration.httpReadTimeoutSeconds),
                maxBufferedBodySize: configuration.maxBufferedBodyBytes, defaultHeaders: MarqueeAPI.responseHeaders,
                trustedProxies: trustedProxies),
            router: router,
            onRequestCompleted: { record in
                httpMetrics.record(record)
                if let failure = record.handlerError {
                    // The client saw only the request ID; the cause is logged here (errors describe themselves
                    // without values, tokens or secrets).
                    var metadata = HTTPMetrics.accessMetadata(record)
                    metadata["error"] = .string(failure)
                    accessLogger.error("request failed", metadata: metadata)
                } else {
                    accessLogger.info("request", metadata: HTTPMetrics.accessMetadata(record))
                }
            })

        httpMetrics.observe(server)

        let roleGuard = try await Startup.databaseGuard(
            pool: pool, keyRing: keyRing, command: "serve", configuration, logger: logger)
        if let status = try? await migrator.status(), !status.isCurrent {
            logger.warning(
                "database schema is not current; /readyz answers 503 until `marquee migrate` runs",
                metadata: ["migrations.pending": .int(status.pending.count)])
        }
        logger.info(
            "listening",
            metadata: ["listen": .string(configuration.listen.description), "version": .string(MarqueeVersion.current)])
        try await ServiceGroup(
            services: [("postgres.pool", pool.service), ("http", server.service)]
                + (roleGuard.map { [("database.role", $0)] } ?? []),
            configuration: .init(drainTimeout: .seconds(configuration.drainTimeoutSeconds + 5)),
            logger: logger
        ).run()
        await channelClient.shutdown()
        pool.close()
        logger.info("stopped")
    }
}

/// Request counters and latency histograms, by method, route pattern and status; bodies refused and held.
struct HTTPMetrics: Sendable {
    let registry: MetricsRegistry
    let requests: Counter
    let duration: Histogram
    let bodyRejections: Counter

    init(registry: MetricsRegistry) {
        self.registry = registry
        requests = registry.counter(
            "marquee_http_requests_total", help: "HTTP requests served.", labels: ["method", "route", "status"])
        duration = registry.histogram(
            "marquee_http_request_duration_seconds", help: "Time from request received to response queued.",
            labels: ["method", "route", "status"])
        bodyRejections = registry.counter(
            "marquee_http_body_rejections_total",
            help: "Request bodies refused before the handler ran: too_large (413), over_budget (503).",
            labels: ["reason"])
        for reason in BodyRejection.allCases { bodyRejections.inc(0, [reason.rawValue]) }
    }

    /// Samples the server's buffered request-body bytes at each scrape.
    func observe(_ server: HTTPServer) {
        let buffered = registry.gauge(
            "marquee_http_buffered_body_bytes",
            help: "Request-body bytes held now (being received or in a running handler), against "
                + "MARQUEE_MAX_BUFFERED_BODY_BYTES.")
        registry.onCollect { buffered.set(Double(server.bufferedBodyBytes)) }
    }

    func record(_ record: AccessLogRecord) {
        // The route pattern, never the raw path: paths carry tokens and would explode cardinality. Likewise a method
        // token a client made up counts as OTHER.
        let labels = [record.method.boundedLabel, record.route ?? "unmatched", String(record.status)]
        requests.inc(1, labels)
        duration.observe(record.duration, labels)
        if let rejection = record.bodyRejection { bodyRejections.inc(1, [rejection.rawValue]) }
    }

    /// Access-log fields. The raw path is left out on purpose: it can hold device tokens.
    static func accessMetadata(_ record: AccessLogRecord) -> LogMetadata {
        var metadata: LogMetadata = [
            "request.id": .string(record.requestID),
            "http.method": .string(record.method.rawValue),
            "http.route": .string(record.route ?? "unmatched"),
            "http.status": .int(record.status),
            "http.bytes_in": .int(record.bytesIn),
            "http.bytes_out": .int(record.bytesOut),
            "duration.ms": .double(
                Double(record.duration.components.seconds) * 1000 + Double(record.duration.components.attoseconds)
                    / 1e15),
        ]
        if let address = record.remoteAddress { metadata["client.address"] = .string(address) }
        if let peer = record.peerAddress, peer != record.remoteAddress {
            metadata["network.peer.address"] = .string(peer)
        }
        if let agent = record.userAgent { metadata["http.user_agent"] = .string(agent) }
        return metadata
    }
}
