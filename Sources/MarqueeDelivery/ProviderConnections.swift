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
}

/// How the worker talks to one provider (APNs or FCM): trust, pool sizes, deadlines and where it may connect.
public struct ProviderClientConfiguration: Sendable {
    /// Extra CA file to trust (e.g. the simulator's), besides the system store.
    public var caFile: String?
    /// Connections per provider host. Default 2.
    public var connectionsPerHost: Int
    /// Per-request deadline. Default 30 s.
    public var requestTimeout: Duration
    /// `MARQUEE_PROVIDER_HOSTS`: the only hosts connected to (endpoints and token URIs alike). Default: Apple's and
    /// Google's.
    public var allowedHosts: ProviderHosts
    /// Host pools kept at once (one I/O thread and TLS context each). Default 32.
    public var maxHosts: Int
    /// A host pool without requests for this long is closed. Default 5 minutes.
    public var hostIdleTimeout: Duration
    /// Largest provider response body read. Default 64 KiB.
    public var maxResponseBodySize: Int

    public init(
        caFile: String? = nil, connectionsPerHost: Int = 2, requestTimeout: Duration = .seconds(30),
        allowedHosts: ProviderHosts = .standard, maxHosts: Int = 32, hostIdleTimeout: Duration = .seconds(300),
        maxResponseBodySize: Int = 64 << 10
    ) {
        self.caFile = caFile
        self.connectionsPerHost = connectionsPerHost
        self.requestTimeout = requestTimeout
        self.allowedHosts = allowedHosts
        self.maxHosts = maxHosts
        self.hostIdleTimeout = hostIdleTimeout
        self.maxResponseBodySize = maxResponseBodySize
    }
}

/// One HTTP/2 client pool per provider host, opened on first use, shared by every tenant sending to that host.
///
/// Only hosts in the operator's allowlist are connected to. Each pool costs an I/O thread and a TLS context, so pools
/// unused for `hostIdleTimeout` are closed, and at most `maxHosts` exist: a new host evicts the least recently used idle
/// pool, or fails retryably (`busy`) when every pool has requests in flight.
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
    /// The last host found in the allowlist and its pool key: a worker sends to one or two hosts, so the check and the
    /// key (string work on every send) are done once per host change.
    private let lastAllowed = Mutex<(host: String, port: Int, key: String)?>(nil)

    init(_ configuration: Configuration, now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.configuration = configuration
        self.now = now
    }

    /// Sends `request` to `host:port` over that host's pool.
    func send(_ request: HTTP2Request, host: String, port: Int) async throws -> HTTP2Response {
        let (result, key, evicted) = try acquire(host: host, port: port)
        if !evicted.isEmpty { await shutdown(evicted) }
        let client = try result.get()
        defer { release(key) }
        return try await client.send(request)
    }

    /// The pool for `host:port`, counted as in use until `release(key)`. Closes pools evicted on the way.
    func lease(host: String, port: Int) async throws -> (HTTP2Client, key: String) {
        let (result, key, evicted) = try acquire(host: host, port: port)
        await shutdown(evicted)
        return (try result.get(), key)
    }

    private func shutdown(_ clients: [HTTP2Client]) async {
        for client in clients { await client.shutdown() }
    }

    /// `lease` without waiting: the pool (counted as in use when there is one) and the pools evicted to make room,
    /// which the caller closes. Synchronous, so that a send does not pay for another async frame.
    private func acquire(
        host: String, port: Int
    ) throws -> (Result<HTTP2Client, any Error>, key: String, evicted: [HTTP2Client]) {
        let key = try allowedKey(host: host, port: port)
        let current = now()
        let (result, evicted): (Result<HTTP2Client, any Error>, [HTTP2Client]) = clients.withLock { clients in
            var evicted: [HTTP2Client] = []
            for (name, entry) in clients
            where name != key && entry.inFlight == 0 && current - entry.lastUsed >= configuration.hostIdleTimeout {
                evicted.append(entry.client)
                clients.removeValue(forKey: name)
            }
            if var entry = clients[key] {
                entry.inFlight += 1
                entry.lastUsed = current
                clients[key] = entry
                return (.success(entry.client), evicted)
            }
            if clients.count >= configuration.maxHosts {
                let idle = clients.filter { $0.value.inFlight == 0 }.min { $0.value.lastUsed < $1.value.lastUsed }
                guard let (name, entry) = idle else { return (.failure(ProviderConnectionError.busy), evicted) }
                evicted.append(entry.client)
                clients.removeValue(forKey: name)
            }
            do {
                let client = try HTTP2Client(
                    .init(
                        host: host, port: port, tls: TLSClientConfiguration(caFile: configuration.caFile),
                        connections: configuration.connectionsPerHost, requestTimeout: configuration.requestTimeout,
                        maxResponseBodySize: configuration.maxResponseBodySize,
                        allowsSpecialAddresses: !configuration.allowedHosts.requiresPublicAddress(host: host)))
                clients[key] = Entry(client: client, inFlight: 1, lastUsed: current)
                return (.success(client), evicted)
            } catch {
                return (.failure(error), evicted)
            }
        }
        return (result, key, evicted)
    }

    /// The pool key of `host:port`, or `hostNotAllowed` when the allowlist does not have it.
    private func allowedKey(host: String, port: Int) throws -> String {
        if let last = lastAllowed.withLock({ $0 }), last.port == port, last.host == host { return last.key }
        guard configuration.allowedHosts.allows(host: host, port: port) else {
            throw ProviderConnectionError.hostNotAllowed
        }
        let key = ProviderHosts.poolKey(host: host, port: port)
        lastAllowed.withLock { $0 = (host, port, key) }
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

    /// The `host:port` keys of the open pools (for tests).
    var hosts: Set<String> { clients.withLock { Set($0.keys) } }

    /// Open connections and streams in flight across hosts.
    var statistics: (connections: Int, streams: Int) {
        clients.withLock { clients in
            clients.values.reduce((0, 0)) { sum, entry in
                let s = entry.client.statistics
                return (sum.0 + s.openConnections, sum.1 + s.activeStreams)
            }
        }
    }

    /// Closes every pool after its in-flight requests finish.
    func shutdown() async {
        let all = clients.withLock { clients in
            defer { clients.removeAll() }
            return clients.values.map(\.client)
        }
        for client in all { await client.shutdown() }
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
        case ProviderConnectionError.hostNotAllowed:
            decision = .credentialBroken(reason: "endpoint_not_allowed")
        case ProviderConnectionError.busy:
            decision = .retry(reason: "transport_error", retryAfter: nil)
        case let error as HTTP2Error:
            decision = .retry(reason: reason(error.code), retryAfter: nil)
        default:
            decision = .retry(reason: "transport_error", retryAfter: nil)
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
        case .timeout: "timeout"
        case .tlsFailed, .certificateVerifyFailed, .alpnMismatch: "tls_error"
        default: "transport_error"
        }
    }
}
