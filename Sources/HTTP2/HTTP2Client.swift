import Foundation
import Synchronization

/// A pool of HTTP/2 connections to one `host:port` with one TLS configuration.
///
/// Requests go to the least busy open connection (to one still connecting only while none is open); connections open
/// lazily up to `connections`, each carries many
/// concurrent streams (up to the server's SETTINGS_MAX_CONCURRENT_STREAMS, the rest wait in a bounded queue), answer
/// PINGs, close when idle and are re-opened with exponential backoff after failures. Requests refused by GOAWAY or
/// REFUSED_STREAM are retried on a fresh connection. All socket work happens on dedicated I/O threads.
public final class HTTP2Client: Sendable {
    /// Client settings.
    public struct Configuration: Sendable {
        /// Reconnect backoff: the n-th consecutive failure waits between half and all of
        /// `min(maximum, initial * 2^(n-1))`.
        public struct Backoff: Sendable, Hashable {
            /// First delay (default 0.1 s).
            public var initial: Duration
            /// Cap (default 30 s).
            public var maximum: Duration

            /// Creates a backoff policy.
            public init(initial: Duration = .milliseconds(100), maximum: Duration = .seconds(30)) {
                self.initial = initial
                self.maximum = maximum
            }
        }

        /// Host name or IP address.
        public var host: String
        /// TCP port (default 443).
        public var port: Int
        /// TLS settings.
        public var tls: TLSClientConfiguration
        /// Connections in the pool (default 1).
        public var connections: Int
        /// Requests allowed to wait for a stream, per connection (default 100,000); beyond it `queueFull`.
        public var maxQueuedRequests: Int
        /// TCP + TLS setup limit (default 10 s).
        public var connectTimeout: Duration
        /// Deadline for requests without their own `timeout` (default 30 s).
        public var requestTimeout: Duration
        /// PING interval (default 60 s); `nil` disables keep-alive PINGs.
        public var pingInterval: Duration?
        /// A connection whose PING is not acknowledged within this time is closed (default 10 s), and a closing
        /// connection whose peer has not taken its last frames within this time is torn down without them.
        public var pingTimeout: Duration
        /// Connections without streams for this long close (default 300 s); `nil` keeps them.
        public var idleTimeout: Duration?
        /// Reconnect backoff.
        public var backoff: Backoff
        /// How often one request is retried after GOAWAY or REFUSED_STREAM (default 3).
        public var maxRetries: Int
        /// I/O threads (default 1).
        public var ioThreads: Int
        /// Per-stream receive window advertised to the server (default 4 MiB; the connection gets four times it).
        public var initialWindowSize: Int
        /// Largest response body accepted, and separately the largest header list, sized as RFC 7541 §4.1 does (32
        /// bytes a field besides name and value) and sent to the server as SETTINGS_MAX_HEADER_LIST_SIZE (default
        /// `nil`: no limit). A bigger one, or a response with more than 256 header fields (limit or not), resets the
        /// stream and fails the request with `responseTooLarge`.
        public var maxResponseBodySize: Int?
        /// Whether the host may resolve to loopback, private, link-local, unspecified or other special-purpose
        /// addresses (default `true`). When `false` those addresses are skipped, and the connection goes to the very
        /// addresses that were checked (no second lookup). A connection tries the host's addresses in turn: one that
        /// refuses or fails the TCP connect is left for the next.
        public var allowsSpecialAddresses: Bool

        /// Creates a configuration with the documented defaults.
        public init(
            host: String, port: Int = 443, tls: TLSClientConfiguration = TLSClientConfiguration(),
            connections: Int = 1, maxQueuedRequests: Int = 100_000, connectTimeout: Duration = .seconds(10),
            requestTimeout: Duration = .seconds(30), pingInterval: Duration? = .seconds(60),
            pingTimeout: Duration = .seconds(10), idleTimeout: Duration? = .seconds(300),
            backoff: Backoff = Backoff(), maxRetries: Int = 3, ioThreads: Int = 1,
            initialWindowSize: Int = 4 << 20, maxResponseBodySize: Int? = nil, allowsSpecialAddresses: Bool = true
        ) {
            self.host = host
            self.port = port
            self.tls = tls
            self.connections = connections
            self.maxQueuedRequests = maxQueuedRequests
            self.connectTimeout = connectTimeout
            self.requestTimeout = requestTimeout
            self.pingInterval = pingInterval
            self.pingTimeout = pingTimeout
            self.idleTimeout = idleTimeout
            self.backoff = backoff
            self.maxRetries = maxRetries
            self.ioThreads = ioThreads
            self.initialWindowSize = initialWindowSize
            self.maxResponseBodySize = maxResponseBodySize
            self.allowsSpecialAddresses = allowsSpecialAddresses
        }
    }

    /// Counters for metrics.
    public struct Statistics: Sendable, Hashable {
        /// Connections with a finished TLS handshake that are not closed yet (draining ones included).
        public var openConnections: Int
        /// Streams in flight.
        public var activeStreams: Int
        /// Requests waiting for a stream.
        public var queuedRequests: Int
        /// Successful connects since the client was created.
        public var connectsTotal: Int
        /// GOAWAY frames received since the client was created.
        public var goAwaysTotal: Int
    }

    /// The configuration.
    public var configuration: Configuration { core.configuration }

    private let core: ClientCore

    /// Creates the pool and its I/O threads, or with `threads` on those shared threads (and their TLS context for
    /// this configuration); no connection opens before the first request.
    ///
    /// Throws `invalidConfiguration` when the CA file cannot be loaded or the threads cannot be set up.
    public init(_ configuration: Configuration, threads: HTTP2ClientThreads? = nil) throws {
        core = try ClientCore(configuration, threads: threads)
    }

    /// A client whose host names resolve with `resolve` (tests: a host with several addresses).
    init(
        _ configuration: Configuration,
        resolve: @escaping @Sendable (String, Int, Bool) -> Result<[ResolvedAddress], HTTP2Error>
    ) throws {
        core = try ClientCore(configuration, threads: nil, resolve: resolve)
    }

    deinit {
        core.stopNow()
    }

    /// Sends a request and waits for its response.
    ///
    /// Throws `HTTP2Error`; `mayHaveBeenProcessed` tells whether the server may have acted on the request.
    public func send(_ request: HTTP2Request) async throws -> HTTP2Response {
        try await core.send(request)
    }

    /// Current counters.
    public var statistics: Statistics {
        Statistics(
            openConnections: core.openConnections.load(ordering: .relaxed),
            activeStreams: core.activeStreams.load(ordering: .relaxed),
            queuedRequests: core.queuedRequests.load(ordering: .relaxed),
            connectsTotal: core.connectsTotal.load(ordering: .relaxed),
            goAwaysTotal: core.goAwaysTotal.load(ordering: .relaxed))
    }

    /// Stops accepting requests, waits for those in flight (and queued) to finish, then closes every connection
    /// with GOAWAY and stops the I/O threads.
    public func shutdown() async {
        await core.shutdown()
    }

    /// `shutdown()`, waiting for requests in flight only until `deadline`: past it this client's connections close at
    /// once, and their requests (and any dispatched later) fail with `shutdown`, those sent as possibly processed.
    public func shutdown(by deadline: ContinuousClock.Instant) async {
        let core = self.core
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await core.shutdown()
                return true
            }
            group.addTask {
                do { try await Task.sleep(until: deadline, clock: .continuous) } catch { return false }
                core.abort()
                return false
            }
            while let drained = await group.next() {
                if drained { group.cancelAll() }
            }
        }
    }
}

/// One connection as the pool sees it.
final class ConnectionHandle: Sendable {
    let id: Int
    let slot: Int
    let loop: EventLoop
    /// Requests handed to this connection and not finished or handed back.
    let outstanding = Atomic<Int>(0)
    /// Whether its TLS handshake finished (set by `ClientCore.connectionReady`); until then it is connecting, or waiting
    /// out a backoff.
    let isOpen = Atomic<Bool>(false)

    init(id: Int, slot: Int, loop: EventLoop) {
        self.id = id
        self.slot = slot
        self.loop = loop
    }
}

/// The shared part of `HTTP2Client`, referenced by its connections.
final class ClientCore: Sendable {
    private struct Slot {
        var connection: ConnectionHandle?
        var backoff: Backoff
        var notBefore: ContinuousClock.Instant?
    }

    private struct State {
        var slots: [Slot]
        var shuttingDown = false
        var drainWaiters: [CheckedContinuation<Void, Never>] = []
        var generator = SystemRandomNumberGenerator()
    }

    let configuration: HTTP2Client.Configuration
    /// Resolves host, port and `allowsSpecialAddresses` to the addresses a connection tries in turn.
    let resolve: @Sendable (String, Int, Bool) -> Result<[ResolvedAddress], HTTP2Error>
    let machineConfiguration: ConnectionStateMachine<ClientPayload>.Configuration
    let tls: TLSContext
    /// The `:authority` of requests without their own: the host, and the port unless it is 443.
    let defaultAuthority: String
    private let loops: [EventLoop]
    /// Whether `loops` are this client's own (stopped at shutdown) rather than shared `HTTP2ClientThreads`.
    private let ownsLoops: Bool
    private let state: Mutex<State>
    private let outstanding = Atomic<Int>(0)
    private let shuttingDown = Atomic<Bool>(false)
    /// Set by `abort()`: requests are failed rather than dispatched.
    private let aborted = Atomic<Bool>(false)
    let openConnections = Atomic<Int>(0)
    let activeStreams = Atomic<Int>(0)
    let queuedRequests = Atomic<Int>(0)
    let connectsTotal = Atomic<Int>(0)
    let goAwaysTotal = Atomic<Int>(0)

    init(
        _ configuration: HTTP2Client.Configuration, threads: HTTP2ClientThreads?,
        resolve: @escaping @Sendable (String, Int, Bool) -> Result<[ResolvedAddress], HTTP2Error> = {
            HTTP2.resolve(host: $0, port: $1, allowsSpecialAddresses: $2)
        }
    ) throws {
        guard configuration.connections > 0, configuration.ioThreads > 0,
            (1...65_535).contains(configuration.port)
        else {
            throw HTTP2Error(.invalidConfiguration, "connections, ioThreads and port must be positive")
        }
        self.configuration = configuration
        self.resolve = resolve
        var machine = ConnectionStateMachine<ClientPayload>.Configuration()
        machine.maxQueued = configuration.maxQueuedRequests
        machine.maxRetries = configuration.maxRetries
        machine.connectTimeout = configuration.connectTimeout
        machine.pingInterval = configuration.pingInterval
        machine.pingTimeout = configuration.pingTimeout
        machine.idleTimeout = configuration.idleTimeout
        machineConfiguration = machine
        defaultAuthority =
            configuration.port == 443 ? configuration.host : "\(configuration.host):\(configuration.port)"
        let threadCount = min(configuration.ioThreads, configuration.connections)
        if let threads {
            tls = try threads.tlsContext(configuration.tls)
            loops = threads.assign(threadCount)
            ownsLoops = false
        } else {
            tls = try TLSContext.client(configuration.tls)
            loops = try (0..<threadCount).map { try EventLoop(name: "http2-client-\($0)") }
            ownsLoops = true
        }
        let slot = Slot(
            backoff: Backoff(initial: configuration.backoff.initial, maximum: configuration.backoff.maximum))
        state = Mutex(State(slots: Array(repeating: slot, count: configuration.connections)))
    }

    func send(_ request: HTTP2Request) async throws -> HTTP2Response {
        if shuttingDown.load(ordering: .sequentiallyConsistent) {
            throw HTTP2Error(.shutdown, "the client is shutting down")
        }
        outstanding.wrappingAdd(1, ordering: .sequentiallyConsistent)
        let deadline = ContinuousClock.now + (request.timeout ?? configuration.requestTimeout)
        let headers = HeaderBlock(request: request, authority: request.authority ?? defaultAuthority)
        return try await withCheckedThrowingContinuation { continuation in
            let payload = ClientPayload(headers: headers, body: request.body, continuation: continuation)
            dispatch(ClientEntry(payload: payload, deadline: deadline))
        }
    }

    /// Routes a request to the least busy open connection, or, while none is open, to the least busy one connecting.
    /// When every connection is busy and a slot is free, one more opens there: it takes the request while none is
    /// open; otherwise it opens beside them for later requests, and the request goes to an open one now (a connection
    /// still connecting, resolving or waiting out a backoff holds a request for as long as that takes).
    func dispatch(_ entry: ClientEntry) {
        // Aborted: a request handed back by a closing connection (or not yet routed) is not given a new one.
        if aborted.load(ordering: .sequentiallyConsistent) {
            finish(entry, .failure(HTTP2Error(.shutdown, "the client was shut down")))
            return
        }
        typealias Choice = (
            handle: ConnectionHandle, create: Bool, notBefore: ContinuousClock.Instant?,
            beside: (handle: ConnectionHandle, notBefore: ContinuousClock.Instant?)?
        )
        let choice: Choice? = state.withLock { state in
            var best: ConnectionHandle?
            var bestLoad = Int.max
            var bestOpen = false
            var free: Int?
            for index in state.slots.indices {
                if let handle = state.slots[index].connection {
                    let load = handle.outstanding.load(ordering: .relaxed)
                    let open = handle.isOpen.load(ordering: .relaxed)
                    if (open && !bestOpen) || (open == bestOpen && load < bestLoad) {
                        best = handle
                        bestLoad = load
                        bestOpen = open
                    }
                } else if free == nil {
                    free = index
                }
            }
            if let free, best == nil || bestLoad > 0 {
                let handle = ConnectionHandle(
                    id: makeObjectID(), slot: free, loop: loops[free % loops.count])
                state.slots[free].connection = handle
                if bestOpen, let best {
                    best.outstanding.wrappingAdd(1, ordering: .relaxed)
                    return (best, false, nil, (handle, state.slots[free].notBefore))
                }
                handle.outstanding.wrappingAdd(1, ordering: .relaxed)
                return (handle, true, state.slots[free].notBefore, nil)
            }
            guard let best else { return nil }
            best.outstanding.wrappingAdd(1, ordering: .relaxed)
            return (best, false, nil, nil)
        }
        guard let choice else {
            finish(entry, .failure(HTTP2Error(.shutdown, "the client has no connection slots")))
            return
        }
        if let (beside, notBefore) = choice.beside {
            // Opens without a request: it takes requests once open (or closes when idle).
            let started = beside.loop.execute { [self] context in
                ClientConnection(handle: beside, core: self, notBefore: notBefore, context: context).start()
            }
            if !started { detach(beside) }
        }
        let handle = choice.handle
        let accepted: Bool
        if choice.create {
            let notBefore = choice.notBefore
            accepted = handle.loop.execute { [self] context in
                let connection = ClientConnection(handle: handle, core: self, notBefore: notBefore, context: context)
                connection.start()
                connection.enqueue(entry)
            }
        } else {
            accepted = handle.loop.execute { [self] context in
                if let connection = context.object(id: handle.id) as? ClientConnection {
                    connection.enqueue(entry)
                } else {
                    handle.outstanding.wrappingSubtract(1, ordering: .relaxed)
                    dispatch(entry)
                }
            }
        }
        if !accepted {
            finish(entry, .failure(HTTP2Error(.shutdown, "the client is shutting down")))
        }
    }

    /// Resumes the caller.
    func finish(_ entry: ClientEntry, _ result: Result<HTTP2Response, HTTP2Error>) {
        switch result {
        case .success(let response): entry.payload.continuation.resume(returning: response)
        case .failure(let error): entry.payload.continuation.resume(throwing: error)
        }
        let remaining = outstanding.wrappingSubtract(1, ordering: .sequentiallyConsistent).newValue
        if remaining == 0 && shuttingDown.load(ordering: .sequentiallyConsistent) {
            let waiters = state.withLock { state in
                guard outstanding.load(ordering: .sequentiallyConsistent) == 0 else {
                    return [CheckedContinuation<Void, Never>]()
                }
                let waiters = state.drainWaiters
                state.drainWaiters = []
                return waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    func connectionReady(_ handle: ConnectionHandle) {
        handle.isOpen.store(true, ordering: .relaxed)
        state.withLock { state in
            state.slots[handle.slot].backoff.reset()
            state.slots[handle.slot].notBefore = nil
        }
        connectsTotal.wrappingAdd(1, ordering: .relaxed)
        openConnections.wrappingAdd(1, ordering: .relaxed)
    }

    /// No new requests for this connection (GOAWAY received or closing).
    func detach(_ handle: ConnectionHandle) {
        state.withLock { state in
            if state.slots[handle.slot].connection === handle { state.slots[handle.slot].connection = nil }
        }
    }

    func connectionClosed(_ handle: ConnectionHandle, wasOpen: Bool, failedToConnect: Bool, failedAfterConnect: Bool) {
        state.withLock { state in
            if state.slots[handle.slot].connection === handle { state.slots[handle.slot].connection = nil }
            if failedToConnect || failedAfterConnect {
                let delay = state.slots[handle.slot].backoff.fail(using: &state.generator)
                state.slots[handle.slot].notBefore = .now + delay
            }
        }
        if wasOpen { openConnections.wrappingSubtract(1, ordering: .relaxed) }
    }

    func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state in
                state.shuttingDown = true
                shuttingDown.store(true, ordering: .sequentiallyConsistent)
                if outstanding.load(ordering: .sequentiallyConsistent) == 0 { return true }
                state.drainWaiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
        guard ownsLoops else {
            // Shared threads go on: close this client's connections there (nothing is in flight any more: GOAWAY and
            // close now), and wait until they are.
            for loop in loops {  // distinct threads (`HTTP2ClientThreads.assign`)
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let queued = loop.execute { [self] context in
                        for connection in context.all(ClientConnection.self) where connection.core === self {
                            connection.terminate()
                        }
                        continuation.resume()
                    }
                    if !queued { continuation.resume() }  // the threads stopped: their connections are gone
                }
            }
            return
        }
        for loop in loops {
            loop.execute { context in
                for connection in context.all(ClientConnection.self) { connection.closeForShutdown() }
            }
            loop.shutdown()
        }
        for loop in loops { await loop.join() }
    }

    /// Closes this client's connections at once, failing their requests; later requests fail too. The I/O threads go
    /// on (a `shutdown()` in progress stops them once nothing is outstanding).
    func abort() {
        shuttingDown.store(true, ordering: .sequentiallyConsistent)
        aborted.store(true, ordering: .sequentiallyConsistent)
        for loop in loops {
            loop.execute { [self] context in
                for connection in context.all(ClientConnection.self) where connection.core === self {
                    connection.terminate()
                }
            }
        }
    }

    func stopNow() {
        shuttingDown.store(true, ordering: .sequentiallyConsistent)
        guard ownsLoops else {
            for loop in loops {
                loop.execute { [self] context in
                    for connection in context.all(ClientConnection.self) where connection.core === self {
                        connection.terminate()
                    }
                }
            }
            return
        }
        for loop in loops { loop.shutdown() }
    }
}
