import HTTP2
import MarqueeCore
import Observability
import Synchronization

/// Why `ProviderConnections` did not send.
enum ProviderConnectionError: Error, Sendable, Equatable {
    /// The host (or host:port) is not in `MARQUEE_PROVIDER_HOSTS`; nothing was connected.
    case hostNotAllowed
    /// Every client slot is busy with another host; try again later.
    case busy
    /// The delivery's send deadline passed before this request was sent; nothing was sent.
    case deadlinePassed
    /// The connections were shut down (the worker is stopping); nothing was sent.
    case shutDown
}

/// How the worker talks to one provider (APNs or FCM): trust, pool sizes, deadlines and where it may connect.
public struct ProviderClientConfiguration: Sendable {
    /// Extra CA file to trust (e.g. the simulator's), besides the system store.
    public var caFile: String?
    /// Connections per pool (one provider host, one APNs key). Default 2.
    public var connectionsPerHost: Int
    /// Per-request deadline. Default 30 s.
    public var requestTimeout: Duration
    /// `MARQUEE_PROVIDER_HOSTS`: the only hosts connected to (endpoints and token URIs alike). Default: Apple's and
    /// Google's.
    public var allowedHosts: ProviderHosts
    /// Pools kept at once (one per provider host and APNs key; they share the provider's I/O thread and TLS
    /// context). Default 256.
    public var maxPools: Int
    /// A pool without requests for this long is closed. Default 5 minutes.
    public var poolIdleTimeout: Duration
    /// Largest provider response body read. Default 64 KiB.
    public var maxResponseBodySize: Int

    public init(
        caFile: String? = nil, connectionsPerHost: Int = 2, requestTimeout: Duration = .seconds(30),
        allowedHosts: ProviderHosts = .standard, maxPools: Int = 256, poolIdleTimeout: Duration = .seconds(300),
        maxResponseBodySize: Int = 64 << 10
    ) {
        self.caFile = caFile
        self.connectionsPerHost = connectionsPerHost
        self.requestTimeout = requestTimeout
        self.allowedHosts = allowedHosts
        self.maxPools = maxPools
        self.poolIdleTimeout = poolIdleTimeout
        self.maxResponseBodySize = maxResponseBodySize
    }
}

/// One HTTP/2 client pool per provider host and sender identity, opened on first use.
///
/// The identity is what a connection authenticates as: APNs does not take provider tokens of more than one team on a
/// connection (it answers 403 InvalidProviderToken), and a second key of the same team on one connection counts as a
/// token update (429 TooManyProviderTokenUpdates). So every APNs key gets connections of its own; FCM, whose OAuth
/// tokens have no such rule, shares one pool per host (`identity` empty).
///
/// Only hosts in the operator's allowlist are connected to. The pools share one set of I/O threads and one TLS context
/// (`HTTP2ClientThreads`); each still holds connections, so pools unused for `poolIdleTimeout` are closed, and at most
/// `maxPools` exist: a new one evicts the least recently used idle pool, or fails retryably (`busy`) when every pool
/// has requests in flight.
final class ProviderConnections: Sendable {
    typealias Configuration = ProviderClientConfiguration

    private struct Entry {
        var client: HTTP2Client
        var inFlight: Int
        var lastUsed: ContinuousClock.Instant
    }

    let configuration: Configuration
    private let now: @Sendable () -> ContinuousClock.Instant
    private let clients = Mutex<[String: Entry]>([:])
    /// Set by `shutdown`, under `clients`' lock: no pool is opened, and no request sent, after it.
    private let closed = Atomic<Bool>(false)
    /// The I/O threads and TLS context every pool uses, started with the first pool.
    private let threads = Mutex<HTTP2ClientThreads?>(nil)
    private let threadName: String
    /// The last host and identity found in the allowlist and their pool key: a worker sends to one or two hosts with
    /// a key or two, so the check and the key (string work on every send) are done once per change.
    private let lastAllowed = Mutex<(host: String, port: Int, identity: String, key: String)?>(nil)

    init(
        _ configuration: Configuration, name: String = "provider",
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.configuration = configuration
        self.now = now
        self.threadName = name
    }

    /// The shared threads, started on first use (a provider nobody sends to costs no thread).
    private func sharedThreads() throws -> HTTP2ClientThreads {
        try threads.withLock { threads in
            if let threads { return threads }
            let started = try HTTP2ClientThreads(count: 1, name: threadName)
            threads = started
            return started
        }
    }

    /// Sends `request` to `host:port` over the pool of that host and `identity`. With `deadline` (a delivery's send
    /// deadline), the request's timeout is cut to the time left, so no request outlives it; past it, nothing is sent
    /// (`deadlinePassed`).
    func send(
        _ request: HTTP2Request, host: String, port: Int, identity: String = "",
        by deadline: ContinuousClock.Instant? = nil
    ) async throws -> HTTP2Response {
        var request = request
        if let deadline {
            guard let timeout = Self.timeout(request.timeout ?? configuration.requestTimeout, by: deadline) else {
                throw ProviderConnectionError.deadlinePassed
            }
            request.timeout = timeout
        }
        let (result, key, evicted) = try acquire(host: host, port: port, identity: identity)
        if !evicted.isEmpty { await shutdown(evicted) }
        let client = try result.get()
        defer { release(key) }
        return try await client.send(request)
    }

    /// The pool for `host:port` and `identity`, counted as in use until `release(key)`. Closes pools evicted on the
    /// way.
    func lease(host: String, port: Int, identity: String = "") async throws -> (HTTP2Client, key: String) {
        let (result, key, evicted) = try acquire(host: host, port: port, identity: identity)
        await shutdown(evicted)
        return (try result.get(), key)
    }

    private func shutdown(_ clients: [HTTP2Client]) async {
        for client in clients { await client.shutdown() }
    }

    /// A request's timeout within `deadline`: `timeout`, cut to the time left; nil when none is left.
    static func timeout(
        _ timeout: Duration, by deadline: ContinuousClock.Instant, now: ContinuousClock.Instant = .now
    ) -> Duration? {
        let left = now.duration(to: deadline)
        return left > .zero ? min(timeout, left) : nil
    }

    /// `lease` without waiting: the pool (counted as in use when there is one) and the pools evicted to make room,
    /// which the caller closes. Synchronous, so that a send does not pay for another async frame.
    private func acquire(
        host: String, port: Int, identity: String
    ) throws -> (Result<HTTP2Client, any Error>, key: String, evicted: [HTTP2Client]) {
        let key = try poolKey(host: host, port: port, identity: identity)
        let current = now()
        let (result, evicted): (Result<HTTP2Client, any Error>, [HTTP2Client]) = clients.withLock { clients in
            var evicted: [HTTP2Client] = []
            guard !closed.load(ordering: .relaxed) else { return (.failure(ProviderConnectionError.shutDown), []) }
            for (name, entry) in clients
            where name != key && entry.inFlight == 0 && current - entry.lastUsed >= configuration.poolIdleTimeout {
                evicted.append(entry.client)
                clients.removeValue(forKey: name)
            }
            if var entry = clients[key] {
                entry.inFlight += 1
                entry.lastUsed = current
                clients[key] = entry
                return (.success(entry.client), evicted)
            }
            if clients.count >= configuration.maxPools {
                let idle = clients.filter { $0.value.inFlight == 0 }.min { $0.value.lastUsed < $1.value.lastUsed }
                guard let (name, entry) = idle else { return (.failure(ProviderConnectionError.busy), evicted) }
                evicted.append(entry.client)
                clients.removeValue(forKey: name)
            }
            do {
                let shared = try sharedThreads()
                let client = try HTTP2Client(
                    .init(
                        host: host, port: port, tls: TLSClientConfiguration(caFile: configuration.caFile),
                        connections: configuration.connectionsPerHost, requestTimeout: configuration.requestTimeout,
                        maxResponseBodySize: configuration.maxResponseBodySize,
                        allowsSpecialAddresses: !configuration.allowedHosts.requiresPublicAddress(host: host)),
                    threads: shared)
                clients[key] = Entry(client: client, inFlight: 1, lastUsed: current)
                return (.success(client), evicted)
            } catch {
                return (.failure(error), evicted)
            }
        }
        return (result, key, evicted)
    }

    /// The pool key of `host:port` and `identity`, or `hostNotAllowed` when the allowlist does not have the host.
    private func poolKey(host: String, port: Int, identity: String) throws -> String {
        if let last = lastAllowed.withLock({ $0 }), last.port == port, last.host == host, last.identity == identity {
            return last.key
        }
        guard configuration.allowedHosts.allows(host: host, port: port) else {
            throw ProviderConnectionError.hostNotAllowed
        }
        let hostKey = ProviderHosts.poolKey(host: host, port: port)
        let key = identity.isEmpty ? hostKey : hostKey + " " + identity
        lastAllowed.withLock { $0 = (host, port, identity, key) }
        return key
    }

    /// Ends one use of the pool `key`.
    func release(_ key: String) {
        let current = now()
        clients.withLock { clients in
            guard var entry = clients[key] else { return }
            entry.inFlight = max(0, entry.inFlight - 1)
            entry.lastUsed = current
            clients[key] = entry
        }
    }

    /// The keys of the open pools, `host:port` or `host:port identity` (for tests).
    var pools: Set<String> { clients.withLock { Set($0.keys) } }

    /// Open connections and streams in flight across hosts.
    var statistics: (connections: Int, streams: Int) {
        clients.withLock { clients in
            clients.values.reduce((0, 0)) { sum, entry in
                let s = entry.client.statistics
                return (sum.0 + s.openConnections, sum.1 + s.activeStreams)
            }
        }
    }

    /// Closes every pool after its in-flight requests finish, then stops the I/O threads. With `deadline`, requests
    /// still in flight then are not waited for: their connections close at once (the requests fail). From the call on,
    /// no pool is opened and no request sent (`shutDown`): a worker's shutdown records the sends it gave up as retries,
    /// and none of them may still go out afterwards.
    func shutdown(by deadline: ContinuousClock.Instant? = nil) async {
        let all = clients.withLock { clients in
            closed.store(true, ordering: .relaxed)
            defer { clients.removeAll() }
            return clients.values.map(\.client)
        }
        for client in all {
            if let deadline { await client.shutdown(by: deadline) } else { await client.shutdown() }
        }
        await threads.withLock { $0 }?.shutdown()
    }
}

/// Turns a failure to talk to a provider into a decision with a fixed, non-revealing reason (`transport_error`,
/// `tls_error`, `timeout`, `endpoint_not_allowed`) and logs the details (never tokens) for the operator only.
///
/// Tenants see `deliveries.reason` and `status_reason`; echoing addresses, ports, OpenSSL or errno text there would
/// make the worker a port scanner for whoever picks the endpoint.
enum TransportFailure {
    static func decision(_ error: any Error, provider: String, host: String, port: Int, logger: Logger?)
        -> DeliveryDecision
    {
        let decision: DeliveryDecision
        switch error {
        case ProviderConnectionError.deadlinePassed:
            // Not the provider's doing, and nothing was sent: the worker has recorded a retry already.
            return .retry(reason: DeliveryReason.deadline, retryAfter: nil)
        case ProviderConnectionError.shutDown:
            // The worker is stopping (nothing was sent): its shutdown records the delivery as a retry.
            return .retry(reason: DeliveryReason.shutdown, retryAfter: nil)
        case let error as HTTP2Error where error.code == .shutdown:
            // Closed by the worker's shutdown while in flight: ended by the worker, not the provider's doing.
            return .retry(reason: DeliveryReason.shutdown, retryAfter: nil)
        case ProviderConnectionError.hostNotAllowed:
            decision = .credentialBroken(reason: DeliveryReason.endpointNotAllowed)
        case ProviderConnectionError.busy:
            decision = .retry(reason: DeliveryReason.transportError, retryAfter: nil)
        case let error as HTTP2Error:
            decision = .retry(reason: reason(error.code), retryAfter: nil)
        default:
            decision = .retry(reason: DeliveryReason.transportError, retryAfter: nil)
        }
        logger?.warning(
            "provider request failed",
            metadata: [
                "provider": .string(provider), "provider.host": .string(host), "provider.port": .int(port),
                "error": .string(String(reflecting: error)),
            ])
        return decision
    }

    /// The tenant-visible reason for an HTTP/2 error code.
    static func reason(_ code: HTTP2Error.Code) -> String {
        switch code {
        case .timeout: DeliveryReason.timeout
        case .tlsFailed, .certificateVerifyFailed, .alpnMismatch: DeliveryReason.tlsError
        default: DeliveryReason.transportError
        }
    }
}

/// The loud report of a time-based rejection blamed on the clocks (`DeliveryReason.clockSkew`): the delivery is
/// retried, the credential left alone, and the operator told that this host's clock (or the provider's) is off.
enum ClockSkew {
    static func report(provider: String, host: String, date: String?, logger: Logger?) {
        var metadata: LogMetadata = ["provider": .string(provider), "provider.host": .string(host)]
        if let skew = ProviderNumbers.clockSkew(date: date) { metadata["clock.skew_seconds"] = .double(skew) }
        logger?.error(
            "provider refused a token as expired or not yet valid: this host's clock disagrees with the provider's "
                + "(check NTP); deliveries are retried, the tenant's credential is not blamed",
            metadata: metadata)
    }
}
