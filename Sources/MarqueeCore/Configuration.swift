import Crypto
import Foundation

/// Marquee's process configuration, read from environment variables and validated at start.
///
/// Names are fixed because tools and scripts depend on them; the README's configuration table lists them all.
public struct MarqueeConfiguration: Sendable, Equatable {
    /// A `host:port` pair to listen on.
    public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int

        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }

        /// Parses `host:port`, `[v6]:port` or `:port` (all interfaces).
        public init?(_ text: String) {
            let hostPart: Substring
            let portPart: Substring
            if text.hasPrefix("[") {
                guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                    return nil
                }
                hostPart = text[text.index(after: text.startIndex)..<close]
                portPart = text[text.index(close, offsetBy: 2)...]
            } else {
                guard let colon = text.lastIndex(of: ":") else { return nil }
                hostPart = text[..<colon]
                portPart = text[text.index(after: colon)...]
                if hostPart.contains(":") { return nil }
            }
            guard let port = Int(portPart), (0...65535).contains(port) else { return nil }
            self.host = hostPart.isEmpty ? "0.0.0.0" : String(hostPart)
            self.port = port
        }

        public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
    }

    /// `DATABASE_URL`: libpq URI or conninfo. Required by every command that touches the database.
    public var databaseURL: String?
    /// `MARQUEE_MIGRATE_DATABASE_URL`: the owner's URL for `marquee migrate`; default `DATABASE_URL`.
    public var migrateDatabaseURL: String?
    /// `MARQUEE_APP_PASSWORD`: if set, `marquee migrate` gives the `marquee_app` login role this password.
    public var appPassword: String?
    /// `MARQUEE_ALLOW_PRIVILEGED_ROLE`: `true` lets `serve` and `worker` run (with a loud warning) as a database role
    /// that is a superuser, has BYPASSRLS or owns Marquee's tables. Default `false`: they refuse to start.
    public var allowPrivilegedRole: Bool
    /// `MARQUEE_LISTEN`: the API's address. Default `127.0.0.1:8080`.
    public var listen: ListenAddress
    /// `MARQUEE_LOG_LEVEL`: `trace` … `critical`. Default `info`.
    public var logLevel: String
    /// `MARQUEE_MASTER_KEY`: base64 of 32 bytes; seals tenant secrets at rest.
    public var masterKey: [UInt8]?
    /// A named sealing key.
    public struct NamedKey: Sendable, Equatable {
        public var id: String
        public var key: [UInt8]
        public init(id: String, key: [UInt8]) {
            self.id = id
            self.key = key
        }
    }
    /// `MARQUEE_MASTER_KEY_ID`: the name recorded in everything sealed with `MARQUEE_MASTER_KEY`. Default `k1`.
    public var masterKeyID: String
    /// `MARQUEE_MASTER_KEYS_PREVIOUS`: earlier master keys, `id:base64[,id:base64…]`, still able to open what they
    /// sealed (until `marquee reseal` has moved everything to the current key).
    public var previousMasterKeys: [NamedKey]
    /// `MARQUEE_ADMIN_TOKEN`: bearer token for `/admin/v1/…`; the admin API is off when unset.
    public var adminToken: String?
    /// `MARQUEE_DB_POOL_SIZE`: connections per process. Default 16.
    public var databasePoolSize: Int
    /// `MARQUEE_DB_ACQUIRE_TIMEOUT`: seconds a request (or a worker's step) waits for a free pooled connection before
    /// it fails (503 `database-unavailable` from the API). Default 5.
    public var databaseAcquireTimeoutSeconds: Int
    /// `MARQUEE_DB_WRITE_BATCHES`: transactions of the API's group commit (lifecycle writes) in flight at once. Fewer
    /// means larger batches: each set-based statement's fixed cost is shared by more requests. Default 2.
    public var databaseWriteBatches: Int
    /// `MARQUEE_DB_READ_BATCHES`: batched reads of change and start contexts in flight at once (per kind). Default 2.
    public var databaseReadBatches: Int
    /// `MARQUEE_DB_STATEMENT_TIMEOUT`: seconds any one statement of `marquee serve` or `marquee worker` may run
    /// (PostgreSQL's `statement_timeout`). PostgreSQL keeps running a statement whose client is gone: this bounds what
    /// a disconnected or stuck request costs, and a worker's background statement stuck behind a lock fails instead
    /// of stopping its loop for good. Exceptions: the people import and a campaign's audience allow themselves 15
    /// minutes (`BulkStatements`), a claim 2 s, a claim's record and the retention pass none. 0 disables it.
    /// Default 60.
    public var databaseStatementTimeoutSeconds: Int
    /// `MARQUEE_HTTP_THREADS`: listener threads. Default: the number of cores, at least 2.
    public var httpThreads: Int
    /// `MARQUEE_MAX_BODY_BYTES`: request body limit. Default 1 MiB.
    public var maxBodyBytes: Int
    /// `MARQUEE_MAX_BUFFERED_BODY_BYTES`: most request-body bytes `serve` holds at once, over all requests (bodies being
    /// received and those of running handlers); a request that would go over it is answered 503. Also caps every
    /// route's body limit (the people import's 64 MiB). 0 turns it off; otherwise at least `MARQUEE_MAX_BODY_BYTES`.
    /// Default 64 MiB: with the API's ~45 MiB at rest, it keeps a pod inside its 256 MiB limit whatever clients send.
    public var maxBufferedBodyBytes: Int
    /// `MARQUEE_HTTP_CONNECTIONS_PER_ADDRESS`: most connections open at once from one client address (further ones
    /// are closed at once); 0 disables the cap, e.g. behind a proxy. Default 256.
    public var httpConnectionsPerAddress: Int
    /// `MARQUEE_HTTP_READ_TIMEOUT`: seconds a client may take to send one whole request (headers and body); a
    /// slower one is disconnected. 0 disables it. Default 30.
    public var httpReadTimeoutSeconds: Int
    /// `MARQUEE_HTTP_IDLE_TIMEOUT`: seconds a connection may stay silent (kept alive between requests, or stalled
    /// mid-request) before the listener closes it. 0 disables it. Default 60.
    public var httpIdleTimeoutSeconds: Int
    /// `MARQUEE_HTTP_CONNECTIONS`: most connections the listener holds open at once; further ones wait in the
    /// kernel's listen backlog. Each holds about 33 KiB once it has served a request (the listener's per-connection
    /// pool), so the default keeps 4096 idle kept-alive connections near 130 MiB. Default 4096.
    public var httpConnections: Int
    /// `MARQUEE_DRAIN_TIMEOUT`: seconds to finish in-flight work on SIGTERM. Default 30.
    public var drainTimeoutSeconds: Int
    /// `MARQUEE_KEY_CACHE_SECONDS`: how long a checked API key is trusted without a database lookup. Default 5;
    /// 0 turns the cache off. A revoked key keeps working for at most this long; a key found invalid is refused
    /// without a lookup for as long.
    public var keyCacheSeconds: Int
    /// `MARQUEE_RATE_LIMIT_APP`: requests a second each `marquee serve` process takes from one tenant's app keys when
    /// the tenant set no limit of its own; 0: no limit. Default 1000.
    public var rateLimitApp: Int
    /// `MARQUEE_RATE_LIMIT_SDK`: the same for sdk keys. Default 1000.
    public var rateLimitSDK: Int
    /// `MARQUEE_RATE_LIMIT_BURST`: a tenant's request bucket holds this many seconds' worth of its rate. Default 10.
    public var rateLimitBurstSeconds: Int
    /// `MARQUEE_RATE_LIMIT_SDK_PER_ADDRESS`: requests a second each `marquee serve` process takes from one client
    /// address with one tenant's sdk keys (an IPv6 address counts by its /64); 0: no such limit. Default 0.
    public var rateLimitSDKPerAddress: Int
    /// `MARQUEE_KEY_LOOKUPS_PER_ADDRESS`: lookups a second each `marquee serve` process makes for one client address
    /// of API keys its key cache does not hold (bursts of twice that; a lookup that finds a valid key does not
    /// count); over it, 429. 0: no such limit. Default 20.
    public var keyLookupsPerAddress: Int
    /// `MARQUEE_TRUSTED_PROXIES`: the proxies in front of `serve` (addresses and CIDR blocks separated by commas)
    /// whose `X-Forwarded-For` names the client. Default none. Parsed by `serve` (HTTPServer's `TrustedProxies`).
    public var trustedProxies: String?
    /// `MARQUEE_METRICS_LISTEN`: where a worker serves `/metrics` and `/healthz`. Default `127.0.0.1:9464`.
    public var metricsListen: ListenAddress
    /// `MARQUEE_CA_FILE`: an extra CA certificate file (PEM) to trust for APNs/FCM, besides the system store.
    public var caFile: String?
    /// `MARQUEE_PROVIDER_HOSTS`: where tenants' credential endpoints and FCM `token_uri` may point, as `host` or
    /// `host:port` entries separated by commas. Default: Apple's and Google's hosts (`ProviderHosts.defaultHosts`).
    public var providerHosts: ProviderHosts
    /// `MARQUEE_WORKERS`: worker processes `marquee up` runs. Default: the number of cores.
    public var workers: Int
    /// `MARQUEE_WORKER_BATCH`: deliveries per claim. Default 256.
    public var workerBatch: Int
    /// `MARQUEE_WORKER_LOOPS`: concurrent claim–send–record loops per worker. Default 2.
    public var workerLoops: Int
    /// `MARQUEE_WORKER_EXPRESS_BATCH`: the express lane's claim size (what was just queued goes out while every loop
    /// is busy with a batch); 0 turns the lane off. Default 16.
    public var workerExpressBatch: Int
    /// `MARQUEE_WORKER_HOLD_SECONDS`: the longest a worker holds a claim (its sends get three quarters of it; a
    /// worker stuck longer is disconnected by PostgreSQL, which releases the claim). Default 60.
    public var workerHoldSeconds: Int
    /// `MARQUEE_WORKER_POLL_MS`: the longest a worker waits between claims without a notification. Default 1000.
    public var workerPollMilliseconds: Int
    /// `MARQUEE_WORKER_LIVENESS_SECONDS`: a worker's `/healthz` answers 503 once one of its loops (claim loops, express
    /// lanes, campaign schedules) has not finished an iteration for this long. An iteration takes at most about the
    /// hold plus the poll interval, so it must exceed those; default three holds plus the poll interval (181). The
    /// campaign runner is allowed its longest statement more (a start's audience: the bulk statement timeout).
    public var workerLivenessSeconds: Int
    /// `MARQUEE_APNS_CONNECTIONS`: HTTP/2 connections per APNs host per worker. Default 2.
    public var apnsConnections: Int
    /// `MARQUEE_RETENTION_DAYS`: days lifecycle events, delivery metrics and finished instances are kept; 0 keeps
    /// everything. Default 30.
    public var retentionDays: Int
    /// `MARQUEE_RETRY_INITIAL_MS`: the first retry's delay ceiling. Default 8000.
    public var retryInitialMilliseconds: Int
    /// `MARQUEE_RETRY_MAX_ATTEMPTS`: attempts before a delivery fails. Default 10.
    public var retryMaxAttempts: Int
    /// `MARQUEE_MIGRATIONS_DIR`: where the numbered `.sql` files are. Default: found next to the binary or in `./Migrations`.
    public var migrationsDirectory: String?

    /// A configuration problem, naming the variable at fault (never its value, which may be a secret).
    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        public var variable: String
        public var reason: String
        public init(variable: String, reason: String) {
            self.variable = variable
            self.reason = reason
        }
        public var description: String { "\(variable): \(reason)" }
    }

    /// Reads and validates the configuration; collects every problem rather than stopping at the first.
    public init(environment: [String: String]) throws(ConfigurationError) {
        var problems: [Problem] = []
        // Spaces and line breaks around a value are not part of it: a value written to a file (a Kubernetes Secret
        // from a file, `echo` into an env file) ends with a newline that nothing should compare or parse.
        func value(_ name: String) -> String? {
            guard let v = environment[name]?.trimmingCharacters(in: .whitespacesAndNewlines), !v.isEmpty else {
                return nil
            }
            return v
        }
        func integer(_ name: String, default def: Int, range: ClosedRange<Int>) -> Int {
            guard let text = value(name) else { return def }
            guard let n = Int(text), range.contains(n) else {
                problems.append(
                    Problem(variable: name, reason: "must be an integer in \(range.lowerBound)...\(range.upperBound)"))
                return def
            }
            return n
        }

        databaseURL = value("DATABASE_URL")
        migrateDatabaseURL = value("MARQUEE_MIGRATE_DATABASE_URL")
        appPassword = environment["MARQUEE_APP_PASSWORD"].flatMap { $0.isEmpty ? nil : $0 }
        switch value("MARQUEE_ALLOW_PRIVILEGED_ROLE")?.lowercased() {
        case nil, "false", "0", "no": allowPrivilegedRole = false
        case "true", "1", "yes": allowPrivilegedRole = true
        default:
            problems.append(Problem(variable: "MARQUEE_ALLOW_PRIVILEGED_ROLE", reason: "must be true or false"))
            allowPrivilegedRole = false
        }

        if let text = value("MARQUEE_LISTEN") {
            if let address = ListenAddress(text) {
                listen = address
            } else {
                problems.append(Problem(variable: "MARQUEE_LISTEN", reason: "must be host:port, e.g. 127.0.0.1:8080"))
                listen = ListenAddress(host: "127.0.0.1", port: 8080)
            }
        } else {
            listen = ListenAddress(host: "127.0.0.1", port: 8080)
        }

        let levels = ["trace", "debug", "info", "notice", "warning", "warn", "error", "critical"]
        let level = value("MARQUEE_LOG_LEVEL")?.lowercased() ?? "info"
        if levels.contains(level) {
            logLevel = level
        } else {
            problems.append(
                Problem(variable: "MARQUEE_LOG_LEVEL", reason: "must be one of \(levels.joined(separator: ", "))"))
            logLevel = "info"
        }

        masterKey = nil
        if let text = value("MARQUEE_MASTER_KEY") {
            if let key = SealingKeyRing.masterKey(base64: text) {
                masterKey = key
            } else {
                problems.append(
                    Problem(variable: "MARQUEE_MASTER_KEY", reason: "must be the base64 encoding of exactly 32 bytes"))
            }
        }

        func validKeyID(_ id: Substring) -> Bool {
            (1...32).contains(id.utf8.count)
                && id.utf8.allSatisfy {
                    ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2D
                        || $0 == 0x5F
                }
        }
        masterKeyID = value("MARQUEE_MASTER_KEY_ID") ?? "k1"
        if !validKeyID(Substring(masterKeyID)) {
            problems.append(Problem(variable: "MARQUEE_MASTER_KEY_ID", reason: "must be 1 to 32 of A-Z a-z 0-9 - _"))
        }
        previousMasterKeys = []
        if let text = value("MARQUEE_MASTER_KEYS_PREVIOUS") {
            for entry in text.split(separator: ",") {
                let parts = entry.split(separator: ":", maxSplits: 1)
                guard parts.count == 2, case let id = parts[0].trimmingCharacters(in: .whitespacesAndNewlines),
                    validKeyID(Substring(id)), let key = SealingKeyRing.masterKey(base64: parts[1]), id != masterKeyID
                else {
                    problems.append(
                        Problem(
                            variable: "MARQUEE_MASTER_KEYS_PREVIOUS",
                            reason:
                                "must be id:base64-of-32-bytes entries separated by commas, ids other than the current")
                    )
                    break
                }
                previousMasterKeys.append(NamedKey(id: id, key: key))
            }
        }

        adminToken = value("MARQUEE_ADMIN_TOKEN")
        if let token = adminToken, token.utf8.count < 16 {
            problems.append(Problem(variable: "MARQUEE_ADMIN_TOKEN", reason: "must be at least 16 characters"))
        } else if let token = adminToken,
            token.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
        {
            // No header can carry it: the admin API would refuse every request.
            problems.append(Problem(variable: "MARQUEE_ADMIN_TOKEN", reason: "must not contain control characters"))
        }

        databasePoolSize = integer("MARQUEE_DB_POOL_SIZE", default: 16, range: 1...500)
        databaseAcquireTimeoutSeconds = integer("MARQUEE_DB_ACQUIRE_TIMEOUT", default: 5, range: 1...3600)
        databaseWriteBatches = integer("MARQUEE_DB_WRITE_BATCHES", default: 2, range: 1...64)
        databaseReadBatches = integer("MARQUEE_DB_READ_BATCHES", default: 2, range: 1...64)
        databaseStatementTimeoutSeconds = integer("MARQUEE_DB_STATEMENT_TIMEOUT", default: 60, range: 0...86_400)
        httpThreads = integer(
            "MARQUEE_HTTP_THREADS", default: max(2, ProcessInfo.processInfo.activeProcessorCount), range: 1...256)
        maxBodyBytes = integer("MARQUEE_MAX_BODY_BYTES", default: 1 << 20, range: 1024...(64 << 20))
        maxBufferedBodyBytes = integer("MARQUEE_MAX_BUFFERED_BODY_BYTES", default: 64 << 20, range: 0...(1 << 40))
        if maxBufferedBodyBytes != 0, maxBufferedBodyBytes < maxBodyBytes {
            problems.append(
                Problem(
                    variable: "MARQUEE_MAX_BUFFERED_BODY_BYTES",
                    reason: "must be 0 (off) or at least MARQUEE_MAX_BODY_BYTES (\(maxBodyBytes))"))
        }
        httpReadTimeoutSeconds = integer("MARQUEE_HTTP_READ_TIMEOUT", default: 30, range: 0...3600)
        httpIdleTimeoutSeconds = integer("MARQUEE_HTTP_IDLE_TIMEOUT", default: 60, range: 0...86_400)
        httpConnections = integer("MARQUEE_HTTP_CONNECTIONS", default: 4096, range: 1...1_000_000)
        httpConnectionsPerAddress = integer("MARQUEE_HTTP_CONNECTIONS_PER_ADDRESS", default: 256, range: 0...1_000_000)
        drainTimeoutSeconds = integer("MARQUEE_DRAIN_TIMEOUT", default: 30, range: 1...3600)
        keyCacheSeconds = integer("MARQUEE_KEY_CACHE_SECONDS", default: 5, range: 0...300)
        rateLimitApp = integer("MARQUEE_RATE_LIMIT_APP", default: 1000, range: 0...1_000_000)
        rateLimitSDK = integer("MARQUEE_RATE_LIMIT_SDK", default: 1000, range: 0...1_000_000)
        rateLimitBurstSeconds = integer("MARQUEE_RATE_LIMIT_BURST", default: 10, range: 1...3600)
        rateLimitSDKPerAddress = integer("MARQUEE_RATE_LIMIT_SDK_PER_ADDRESS", default: 0, range: 0...1_000_000)
        keyLookupsPerAddress = integer("MARQUEE_KEY_LOOKUPS_PER_ADDRESS", default: 20, range: 0...1_000_000)
        trustedProxies = value("MARQUEE_TRUSTED_PROXIES")
        if let text = value("MARQUEE_METRICS_LISTEN") {
            if let address = ListenAddress(text) {
                metricsListen = address
            } else {
                problems.append(Problem(variable: "MARQUEE_METRICS_LISTEN", reason: "must be host:port"))
                metricsListen = ListenAddress(host: "127.0.0.1", port: 9464)
            }
        } else {
            metricsListen = ListenAddress(host: "127.0.0.1", port: 9464)
        }
        caFile = value("MARQUEE_CA_FILE")
        if let caFile, let problem = CertificateFile.problem(path: caFile) {
            problems.append(Problem(variable: "MARQUEE_CA_FILE", reason: problem))
        }
        providerHosts = .standard
        if let text = value("MARQUEE_PROVIDER_HOSTS") {
            if let hosts = ProviderHosts(text) {
                providerHosts = hosts
            } else {
                problems.append(
                    Problem(
                        variable: "MARQUEE_PROVIDER_HOSTS",
                        reason: "must be host or host:port entries separated by commas"))
            }
        }
        workers = integer(
            "MARQUEE_WORKERS", default: max(1, ProcessInfo.processInfo.activeProcessorCount), range: 0...64)
        workerBatch = integer("MARQUEE_WORKER_BATCH", default: 256, range: 1...5000)
        workerLoops = integer("MARQUEE_WORKER_LOOPS", default: 2, range: 1...64)
        workerExpressBatch = integer("MARQUEE_WORKER_EXPRESS_BATCH", default: 16, range: 0...10_000)
        workerHoldSeconds = integer("MARQUEE_WORKER_HOLD_SECONDS", default: 60, range: 2...3600)
        workerPollMilliseconds = integer("MARQUEE_WORKER_POLL_MS", default: 1000, range: 10...600_000)
        let pollSeconds = (workerPollMilliseconds + 999) / 1000
        workerLivenessSeconds = integer(
            "MARQUEE_WORKER_LIVENESS_SECONDS", default: 3 * workerHoldSeconds + pollSeconds, range: 1...86_400)
        if workerLivenessSeconds <= workerHoldSeconds + pollSeconds {
            problems.append(
                Problem(
                    variable: "MARQUEE_WORKER_LIVENESS_SECONDS",
                    reason: "must exceed MARQUEE_WORKER_HOLD_SECONDS plus MARQUEE_WORKER_POLL_MS "
                        + "(\(workerHoldSeconds + pollSeconds) s): a claim loop's iteration may take that long"))
        }
        apnsConnections = integer("MARQUEE_APNS_CONNECTIONS", default: 2, range: 1...64)
        retentionDays = integer("MARQUEE_RETENTION_DAYS", default: 30, range: 0...3650)
        retryInitialMilliseconds = integer("MARQUEE_RETRY_INITIAL_MS", default: 8000, range: 10...600_000)
        retryMaxAttempts = integer("MARQUEE_RETRY_MAX_ATTEMPTS", default: 10, range: 1...100)
        migrationsDirectory = value("MARQUEE_MIGRATIONS_DIR")

        if !problems.isEmpty { throw ConfigurationError(problems: problems) }
    }

    /// The database URL, or a problem saying it is required.
    public func requireDatabaseURL() throws(ConfigurationError) -> String {
        guard let url = databaseURL else {
            throw ConfigurationError(problems: [Problem(variable: "DATABASE_URL", reason: "is required")])
        }
        return url
    }
}

/// One or more configuration problems; `description` lists them one per line.
public struct ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var problems: [MarqueeConfiguration.Problem]
    public init(problems: [MarqueeConfiguration.Problem]) { self.problems = problems }
    public var description: String {
        "invalid configuration:\n" + problems.map { "  \($0)" }.joined(separator: "\n")
    }
}
