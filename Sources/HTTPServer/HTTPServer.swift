import CMicroHTTPD
import Dispatch
import Foundation
import Synchronization

/// An HTTP/1.1 server on libmicrohttpd.
///
/// MHD's internal thread pool (epoll) parses requests and collects bodies; when a request is complete its
/// connection is *suspended* and the handler runs as a Swift task, so thousands of requests can wait on
/// slow work without holding a server thread. When the handler returns, the response is queued and the
/// connection resumed. Keep-alive is on for HTTP/1.1 clients.
///
/// A request is routed as soon as its headers are in: a body sent to an unknown path or with a method its path does
/// not take is never read (404 or 405 at once, then the connection is closed). Bodies the server holds, being received
/// or in a running handler, count against one server-wide budget (`maxBufferedBodySize`), so many clients sending
/// large bodies at once cannot take the process's memory.
///
/// Use `run()` from a service group (serves until cancelled, then drains), or `start()` + `stop()`.
public final class HTTPServer: Sendable {
    /// Server settings.
    public struct Configuration: Sendable {
        /// Numeric IPv4 or IPv6 address to listen on (`localhost` means `127.0.0.1`). Default `127.0.0.1`.
        public var host: String
        /// TCP port; 0 picks an ephemeral one (see `boundPort`). Default 8080.
        public var port: Int
        /// Largest accepted request body in bytes; beyond it the answer is 413 and the connection is closed. Checked
        /// against `Content-Length` before the body is read, and as it arrives (a chunked body is answered as soon as
        /// it passes the limit; the rest is not read). Default 1 MiB.
        public var maxBodySize: Int
        /// Most request-body bytes held at once over all requests (bodies being received and bodies of running
        /// handlers); 0 disables the cap. A request's share is reserved before its body is read, from its
        /// `Content-Length` (or chunk by chunk, growing as an array does, for a chunked body), and given back when the
        /// request is over. A request that would take the server over it is answered 503 `service-unavailable` with
        /// `Retry-After: 1` and its connection closed. It also caps every route's body limit. At least `maxBodySize`.
        /// Default 64 MiB.
        public var maxBufferedBodySize: Int
        /// MHD threads doing network I/O (handlers run on Swift's task pool, not here).
        /// Default: the number of cores, at least 2.
        public var threadCount: Int
        /// Idle time after which MHD closes a connection; `.zero` disables it. Rounded up to whole seconds.
        /// Suspended connections (handler running) do not time out. Default 60 s.
        public var connectionTimeout: Duration
        /// Most connections open at once (MHD splits it across its threads); beyond it new connections wait in
        /// the kernel's listen backlog until one closes. Default 10 000.
        public var connectionLimit: Int
        /// Most connections open at once from one client address; a connection beyond it is accepted and closed at
        /// once, so one client cannot take every slot. 0 disables the cap (e.g. behind a proxy that is the only
        /// client address). Default 256.
        public var perAddressConnectionLimit: Int
        /// The longest a client may take to send one whole request (request line, headers and body), counted from
        /// the connection's opening or, on a kept-alive connection, from the end of the previous response. A client
        /// still sending after it (a "slowloris" dribbling bytes just inside `connectionTimeout`) is disconnected
        /// unanswered. Time a handler runs does not count. `.zero` disables it. Default 30 s.
        public var requestReadTimeout: Duration
        /// How long `stop()` waits for in-flight requests before answering the rest with 503. Default 10 s.
        public var drainTimeout: Duration
        /// Headers sent with every response that does not set them itself, including the server's own answers
        /// (404, 405, 413, 503…), e.g. `Cache-Control` and `X-Content-Type-Options`. Default none.
        public var defaultHeaders: HTTPHeaders
        /// The proxies in front of the server whose `X-Forwarded-For` names a request's client
        /// (`HTTPRequest.remoteAddress`, the access log's address). Default none: the peer is the client.
        public var trustedProxies: TrustedProxies
        /// Longest accepted request target (path and query) in bytes; beyond it the answer is 414 `uri-too-long` and
        /// the connection is closed. At most `maxRequestHeadSize`. Default 8 KiB.
        public var maxTargetLength: Int
        /// Most memory a request's head (request line and header fields) may take: its bytes as sent, plus 64 for each
        /// header field, query parameter and cookie and a copy of the `Cookie` header (`RequestHead.size`); beyond it
        /// the answer is 431 `header-fields-too-large` and the connection is closed. Each connection holds a pool of
        /// twice this from its first request to its close (libmicrohttpd's, where the head is kept); a head beyond
        /// the pool is answered by libmicrohttpd itself (see `RequestHead`). At least 4 KiB. Default 16 KiB.
        public var maxRequestHeadSize: Int

        /// Creates a configuration; every parameter has the documented default.
        public init(
            host: String = "127.0.0.1",
            port: Int = 8080,
            maxBodySize: Int = 1 << 20,
            threadCount: Int = max(2, ProcessInfo.processInfo.activeProcessorCount),
            connectionTimeout: Duration = .seconds(60),
            connectionLimit: Int = 10_000,
            drainTimeout: Duration = .seconds(10),
            perAddressConnectionLimit: Int = 256,
            requestReadTimeout: Duration = .seconds(30),
            maxBufferedBodySize: Int = 64 << 20,
            defaultHeaders: HTTPHeaders = [:],
            trustedProxies: TrustedProxies = .empty,
            maxTargetLength: Int = 8 << 10,
            maxRequestHeadSize: Int = 16 << 10
        ) {
            self.host = host
            self.port = port
            self.maxBodySize = maxBodySize
            self.threadCount = threadCount
            self.connectionTimeout = connectionTimeout
            self.connectionLimit = connectionLimit
            self.drainTimeout = drainTimeout
            self.perAddressConnectionLimit = perAddressConnectionLimit
            self.requestReadTimeout = requestReadTimeout
            self.maxBufferedBodySize = maxBufferedBodySize
            self.defaultHeaders = defaultHeaders
            self.trustedProxies = trustedProxies
            self.maxTargetLength = maxTargetLength
            self.maxRequestHeadSize = maxRequestHeadSize
        }
    }

    let core: ServerCore

    /// Creates a server. Nothing listens until `start()` or `run()`.
    ///
    /// `onRequestCompleted` is called once per request when it is over, on a server thread: keep it quick
    /// (hand the record to a logger or a metrics registry).
    public init(
        configuration: Configuration, router: Router,
        onRequestCompleted: (@Sendable (AccessLogRecord) -> Void)? = nil
    ) {
        core = ServerCore(configuration: configuration, router: router, onRequestCompleted: onRequestCompleted)
    }

    deinit {
        core.stopImmediately()
    }

    /// Starts listening, serves until the calling task is cancelled (or `stop()` is called), then drains
    /// gracefully and returns. Throws if the address can't be bound.
    public func run() async throws {
        try start()
        await withTaskCancellationHandler {
            await core.waitForStopRequest()
        } onCancel: {
            core.requestStop()
        }
        await stop()
    }

    /// Begins a graceful stop: `run()` stops accepting, drains and returns. Returns at once.
    public func requestStop() {
        core.requestStop()
    }

    /// Binds and starts serving; on return `boundPort` is valid. Throws `HTTPServerError` if the server
    /// was already started or the address can't be bound.
    public func start() throws {
        try core.start()
    }

    /// Stops gracefully: stops accepting connections (new ones are refused), lets in-flight requests
    /// finish for up to `drainTimeout` (their responses carry `Connection: close`), answers any still
    /// running with 503, then shuts the daemon down. Safe to call more than once and concurrently; every
    /// caller returns once the server is stopped.
    public func stop() async {
        await core.stop()
    }

    /// The port the server listens on (useful with port 0); 0 before `start()`.
    public var boundPort: Int {
        core.state.withLock { $0.boundPort }
    }

    /// Requests received and not yet finished (for tests and diagnostics).
    var liveRequestCount: Int {
        core.liveRequests.load(ordering: .relaxed)
    }

    /// Request-body bytes held now, against `maxBufferedBodySize` (for a gauge).
    public var bufferedBodyBytes: Int {
        core.bodyBudget.inUse
    }
}

// MARK: - Core

/// Per-request state, shared between the MHD thread that owns the connection and the handler task.
final class RequestContext: Sendable {
    enum Stage {
        /// Created at the request line; the access handler has not run yet.
        case new
        /// Headers seen and routed; collecting the body.
        case receiving
        /// Headers seen; the route's body admission running, connection suspended (see `BodyPolicy.admission`).
        case admitting
        /// Admitted: MHD's repeated first call (after the resume) starts collecting the body.
        case admitted
        /// Handler running, connection suspended.
        case suspended
        /// Handler finished; the next access-handler call queues this.
        case ready(HTTPResponse)
        /// A response was queued.
        case responded
    }

    struct State {
        var stage: Stage = .new
        var method = HTTPMethod.GET
        var requestID = ""
        /// The request as its headers made it (its target taken apart once, its client address found once); the body
        /// and the route's parameters are added when the handler runs.
        var request: HTTPRequest?
        var body: [UInt8] = []
        var bytesIn = 0
        /// The request's share of the server's body budget (`ServerCore.bodyBudget`); given back when the body is
        /// dropped or the request is over.
        var reservedBody = 0
        /// How the body is delimited, from the headers (`BodyFraming`).
        var framing = BodyFraming.none
        /// Set when the body was refused: nothing more of it is kept, and it is answered 413 or 503.
        var bodyRejection: BodyRejection?
        /// What routing found, from the headers (`nil` until then).
        var routed: RouteResult?
        /// The route's admission let this request through: its body may have the route's limit.
        var admitted = false
        var route: String?
        var status = 0
        var bytesOut = 0
        var handlerError: String?
        /// The answer was written whole by `answerMidBody` (MHD then ends the request as failed).
        var answeredMidBody = false
    }

    /// The request target as text (`RequestTarget.text(received:)`), up to a NUL it may hold.
    let target: String
    /// Where libmicrohttpd holds the target (`targetBytes` bytes up to the first NUL, or its end), in place in the
    /// request line, where it stays for the whole request (see `ServerCore.sentTargetLength`).
    let targetAddress: Int
    let targetBytes: Int
    let remoteAddress: String?
    let startedAt = ContinuousClock.now
    let state = Mutex(State())

    init(target: UnsafeBufferPointer<UInt8>, remoteAddress: String?) {
        self.target = RequestTarget.text(received: target)
        self.targetAddress = Int(bitPattern: target.baseAddress)
        self.targetBytes = target.count
        self.remoteAddress = remoteAddress
    }
}

/// The server's shared state and the logic behind the MHD callbacks.
final class ServerCore: Sendable {
    enum Phase {
        case idle
        case running
        /// Quiesced; in-flight requests may finish.
        case draining
        /// Drain time is over: no new suspensions, remaining ones answered 503.
        case closing
        case stopped
    }

    struct Suspension {
        var context: RequestContext
        var connection: MHDHandle
        var task: Task<Void, Never>?
    }

    struct State {
        var phase = Phase.idle
        var daemon: MHDHandle?
        var boundPort = 0
        /// Suspended connections by context. Suspending, taking an entry to resume it, and the phase change to
        /// `.closing` happen under this lock, so no connection can be suspended when the daemon is stopped, and
        /// each is resumed once, by whoever took its entry (a handler resumes outside the lock, counted in
        /// `resuming`). (MHD's own lock is taken inside; MHD never calls back into us while holding it.)
        var suspended: [ObjectIdentifier: Suspension] = [:]
        var stopRequested = false
        var stopRequestWaiters: [CheckedContinuation<Void, Never>] = []
        var stoppedWaiters: [CheckedContinuation<Void, Never>] = []
    }

    let configuration: HTTPServer.Configuration
    let router: Router
    let onRequestCompleted: (@Sendable (AccessLogRecord) -> Void)?
    let state = Mutex(State())
    /// Request-body bytes held, against `maxBufferedBodySize`.
    let bodyBudget: BodyBudget
    /// Requests between MHD's URI callback and its completion callback. An atomic rather than `state`, so
    /// those callbacks take none of our locks.
    let liveRequests = Atomic<Int>(0)
    /// Handlers between taking their suspension entry and returning from `MHD_resume_connection`: the daemon is
    /// stopped only when there are none.
    let resuming = Atomic<Int>(0)
    /// Open connections (by MHD connection pointer) and since when each has been reading a request; `nil` while
    /// a request is being handled or answered. Enforces `requestReadTimeout`.
    let reading = Mutex<[Int: ReadingConnection]>([:])

    struct ReadingConnection {
        var socket: Int32
        var since: ContinuousClock.Instant?
    }

    init(
        configuration: HTTPServer.Configuration, router: Router,
        onRequestCompleted: (@Sendable (AccessLogRecord) -> Void)?
    ) {
        self.configuration = configuration
        self.router = router
        self.onRequestCompleted = onRequestCompleted
        self.bodyBudget = BodyBudget(limit: configuration.maxBufferedBodySize)
    }

    // MARK: Lifecycle

    func start() throws(HTTPServerError) {
        let config = configuration
        guard (0...65_535).contains(config.port) else {
            throw HTTPServerError(.invalidConfiguration, "port must be 0...65535", details: "port \(config.port)")
        }
        guard config.maxBodySize >= 0, config.connectionLimit > 0, config.threadCount > 0,
            config.perAddressConnectionLimit >= 0, config.requestReadTimeout >= .zero
        else {
            throw HTTPServerError(
                .invalidConfiguration, "maxBodySize, connectionLimit and threadCount must be positive")
        }
        guard config.maxBufferedBodySize == 0 || config.maxBufferedBodySize >= config.maxBodySize else {
            throw HTTPServerError(
                .invalidConfiguration, "maxBufferedBodySize must be 0 (off) or at least maxBodySize",
                details: "maxBufferedBodySize \(config.maxBufferedBodySize), maxBodySize \(config.maxBodySize)")
        }
        guard config.maxRequestHeadSize >= 4096, (1...config.maxRequestHeadSize).contains(config.maxTargetLength)
        else {
            throw HTTPServerError(
                .invalidConfiguration,
                "maxRequestHeadSize must be at least 4096, maxTargetLength 1...maxRequestHeadSize",
                details: "maxRequestHeadSize \(config.maxRequestHeadSize), maxTargetLength \(config.maxTargetLength)")
        }
        guard var address = SocketAddress(host: config.host, port: UInt16(config.port)) else {
            throw HTTPServerError(
                .invalidConfiguration, "host must be a numeric IP address", details: "host \(config.host)")
        }
        try state.withLock { (s: inout State) throws(HTTPServerError) in
            guard s.phase == .idle else {
                throw HTTPServerError(.invalidState, "the server was already started")
            }
            s.phase = .running
        }

        var flags =
            MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue
            | MHD_ALLOW_SUSPEND_RESUME.rawValue
        if address.isIPv6 { flags |= MHD_USE_IPv6.rawValue }
        let cls = Unmanaged.passUnretained(self).toOpaque()
        let completed: MHD_RequestCompletedCallback = mhdRequestCompleted
        let uriLog:
            @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?)
                -> UnsafeMutableRawPointer? = mhdURILog
        let notify: MHD_NotifyConnectionCallback = mhdNotifyConnection
        let timeout = Self.wholeSeconds(config.connectionTimeout)
        let errnoAfter: Int32
        let daemon: OpaquePointer? = address.withSockaddr { sockaddr in
            var arguments: [any CVarArg] = [
                MHD_OPTION.CONNECTION_TIMEOUT.rawValue, UInt32(clamping: timeout),
                MHD_OPTION.CONNECTION_LIMIT.rawValue, UInt32(clamping: config.connectionLimit),
                MHD_OPTION.CONNECTION_MEMORY_LIMIT.rawValue,
                RequestHead.connectionMemory(maxSize: config.maxRequestHeadSize),
                MHD_OPTION.NOTIFY_COMPLETED.rawValue, unsafeBitCast(completed, to: OpaquePointer.self),
                OpaquePointer(cls),
                MHD_OPTION.URI_LOG_CALLBACK.rawValue, unsafeBitCast(uriLog, to: OpaquePointer.self), OpaquePointer(cls),
                MHD_OPTION.SOCK_ADDR.rawValue, sockaddr,
                MHD_OPTION.NOTIFY_CONNECTION.rawValue, unsafeBitCast(notify, to: OpaquePointer.self),
                OpaquePointer(cls),
            ]
            if config.perAddressConnectionLimit > 0 {
                arguments += [
                    MHD_OPTION.PER_IP_CONNECTION_LIMIT.rawValue, UInt32(clamping: config.perAddressConnectionLimit),
                ]
            }
            if config.threadCount > 1 {
                arguments += [MHD_OPTION.THREAD_POOL_SIZE.rawValue, UInt32(clamping: config.threadCount)]
            }
            arguments.append(MHD_OPTION.END.rawValue)
            return withVaList(arguments) { list in
                MHD_start_daemon_va(flags, UInt16(config.port), nil, nil, mhdAccessHandler, cls, list)
            }
        }
        errnoAfter = errno
        guard let daemon else {
            state.withLock { $0.phase = .stopped }
            throw HTTPServerError(
                .bindFailed, "could not start listening on \(config.host):\(config.port)",
                details: String(cString: strerror(errnoAfter)))
        }
        let port = cmhd_get_daemon_info(daemon, .DAEMON_INFO_BIND_PORT).map { Int($0.pointee.port) }
        let handle = MHDHandle(daemon)
        state.withLock { s in
            s.daemon = handle
            s.boundPort = port ?? config.port
        }
        if config.requestReadTimeout > .zero {
            let thread = Thread { [self] in enforceReadTimeout() }
            thread.name = "http.read-deadline"
            thread.start()
        }
    }

    /// Marks that the server should stop (used by `run()`'s cancellation handler).
    func requestStop() {
        let waiters = state.withLock { s in
            s.stopRequested = true
            defer { s.stopRequestWaiters = [] }
            return s.stopRequestWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func waitForStopRequest() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { s in
                if s.stopRequested { return true }
                s.stopRequestWaiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    func stop() async {
        requestStop()
        enum Action {
            case drain(OpaquePointer)
            case wait
            case done
        }
        let action: Action = state.withLock { s in
            switch s.phase {
            case .idle, .stopped:
                s.phase = .stopped
                return .done
            case .running:
                s.phase = .draining
                return s.daemon.map { .drain($0.pointer) } ?? .done
            case .draining, .closing:
                return .wait
            }
        }
        switch action {
        case .done:
            return
        case .wait:
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let stopped = state.withLock { s in
                    if s.phase == .stopped { return true }
                    s.stoppedWaiters.append(continuation)
                    return false
                }
                if stopped { continuation.resume() }
            }
        case .drain(let daemon):
            let listenSocket = MHD_quiesce_daemon(daemon)
            if listenSocket >= 0 {
                // Take the socket out of LISTEN so new connections are refused instead of queueing in the
                // backlog. It is closed only after MHD_stop_daemon, as MHD requires.
                _ = shutdown(listenSocket, Int32(SHUT_RDWR))
            }
            let deadline = ContinuousClock.now + configuration.drainTimeout
            while liveRequests.load(ordering: .acquiring) > 0, ContinuousClock.now < deadline {
                await Self.pause(milliseconds: 5)
            }
            resumeRemainingWith503()
            // Give the 503s (and responses still being written) a moment to go out.
            let closeDeadline = ContinuousClock.now + .seconds(1)
            while liveRequests.load(ordering: .acquiring) > 0, ContinuousClock.now < closeDeadline {
                await Self.pause(milliseconds: 5)
            }
            finishStop(daemon, listenSocket: listenSocket)
        }
    }

    /// Synchronous last-resort stop (deinit of a server that is still running).
    func stopImmediately() {
        guard
            let daemon = state.withLock({ s -> OpaquePointer? in
                guard s.phase == .running || s.phase == .draining else { return nil }
                return s.daemon?.pointer
            })
        else { return }
        resumeRemainingWith503()
        let deadline = ContinuousClock.now + .milliseconds(500)
        while liveRequests.load(ordering: .acquiring) > 0, ContinuousClock.now < deadline {
            usleep(2_000)
        }
        finishStop(daemon, listenSocket: -1)
    }

    private func resumeRemainingWith503() {
        let unavailable = HTTPResponse.problem(
            .serviceUnavailable(detail: "The server is shutting down.", retryAfterSeconds: 1))
        state.withLock { s in
            s.phase = .closing
            for entry in s.suspended.values {
                entry.task?.cancel()
                entry.context.state.withLock { $0.stage = .ready(unavailable) }
                MHD_resume_connection(entry.connection.pointer)
            }
            s.suspended = [:]
        }
    }

    private func finishStop(_ daemon: OpaquePointer, listenSocket: Int32) {
        // Every suspension is taken by now (phase `.closing`); wait for the resumes still being made (microseconds).
        while resuming.load(ordering: .acquiring) > 0 { usleep(100) }
        MHD_stop_daemon(daemon)
        if listenSocket >= 0 { close(listenSocket) }
        let waiters = state.withLock { s in
            s.phase = .stopped
            s.daemon = nil
            defer { s.stoppedWaiters = [] }
            return s.stoppedWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Sleeps without observing cancellation (stop() often runs in a cancelled task).
    private static func pause(milliseconds: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(milliseconds)) {
                continuation.resume()
            }
        }
    }

    static func wholeSeconds(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.components
        if seconds < 0 { return 0 }
        return Int(seconds) + (attoseconds > 0 ? 1 : 0)
    }

    // MARK: Request read deadline

    func connectionOpened(_ connection: OpaquePointer) {
        guard let info = cmhd_get_connection_info(connection, .CONNECTION_INFO_CONNECTION_FD) else { return }
        let socket = info.pointee.connect_fd
        reading.withLock { $0[Int(bitPattern: connection)] = ReadingConnection(socket: socket, since: .now) }
    }

    /// MHD calls this before it closes the socket, so `enforceReadTimeout` (which shuts sockets down under the same
    /// lock) never touches a descriptor number that was closed and reused.
    func connectionClosed(_ connection: OpaquePointer) {
        _ = reading.withLock { $0.removeValue(forKey: Int(bitPattern: connection)) }
    }

    /// Marks the connection's request as read (`false`) or the next one as being awaited (`true`).
    func setReading(_ connection: OpaquePointer?, _ isReading: Bool) {
        guard let connection else { return }
        reading.withLock { table in
            table[Int(bitPattern: connection)]?.since = isReading ? .now : nil
        }
    }

    /// Runs on its own thread while the server runs: disconnects every connection that has been reading one
    /// request for longer than `requestReadTimeout`. The socket is shut down, not closed: MHD sees the connection
    /// end, closes it and frees it as usual.
    private func enforceReadTimeout() {
        let limit = configuration.requestReadTimeout
        let tick = max(Duration.milliseconds(10), min(Duration.milliseconds(250), limit / 4))
        let tickMicroseconds = UInt32(
            clamping: tick.components.seconds * 1_000_000 + tick.components.attoseconds / 1_000_000_000_000)
        while true {
            let phase = state.withLock { $0.phase }
            if phase == .stopped { return }
            let now = ContinuousClock.now
            reading.withLock { table in
                for (key, entry) in table {
                    guard let since = entry.since, now - since > limit else { continue }
                    _ = shutdown(entry.socket, Int32(SHUT_RDWR))
                    table[key]?.since = nil
                }
            }
            usleep(tickMicroseconds)
        }
    }

    // MARK: Request handling (MHD threads)

    /// A request's client: its peer, or behind a trusted proxy the address `X-Forwarded-For` names.
    func client(_ context: RequestContext, _ headers: HTTPHeaders) -> String? {
        let proxies = configuration.trustedProxies
        guard !proxies.networks.isEmpty else { return context.remoteAddress }
        return proxies.client(peer: context.remoteAddress, forwardedFor: headers.values("X-Forwarded-For"))
    }

    func requestStarted(target: UnsafeBufferPointer<UInt8>, connection: OpaquePointer?) -> RequestContext {
        liveRequests.add(1, ordering: .relaxed)
        return RequestContext(target: target, remoteAddress: connection.flatMap(Self.clientAddress))
    }

    /// Bytes of the request target as sent, a NUL and what follows it included.
    ///
    /// libmicrohttpd hands the target over as a C string (`URI_LOG_CALLBACK`), cut at the first NUL, and reports no
    /// length; but it parses the request line in place (`parse_initial_message_line`, 0.9.75): the target, one space,
    /// then the version, which every request that reaches the server has (8 bytes, `HTTP/d.d`) and whose position it
    /// passes to the access handler. So the target runs up to the byte before the version. A position that does not
    /// fit that reading (never seen) gives the C string's length.
    static func sentTargetLength(_ context: RequestContext, version: UnsafePointer<CChar>?, bound: Int) -> Int {
        guard let version, context.targetAddress != 0 else { return context.targetBytes }
        let length = Int(bitPattern: version) - 1 - context.targetAddress
        return (context.targetBytes...bound).contains(length) ? length : context.targetBytes
    }

    func requestCompleted(
        _ context: RequestContext, connection: OpaquePointer?, termination: MHD_RequestTerminationCode
    ) {
        releaseBody(context)  // every way a request ends comes through here: answered, aborted, timed out, stopped
        liveRequests.subtract(1, ordering: .releasing)
        setReading(connection, true)  // a kept-alive connection now awaits its next request
        guard let onRequestCompleted else { return }
        let snapshot = context.state.withLock { $0 }
        if case .new = snapshot.stage { return }  // never reached us (MHD rejected it)
        onRequestCompleted(
            AccessLogRecord(
                method: snapshot.method, path: snapshot.request?.path ?? "", route: snapshot.route,
                status: snapshot.status,
                bytesIn: snapshot.bytesIn, bytesOut: snapshot.bytesOut,
                duration: ContinuousClock.now - context.startedAt, requestID: snapshot.requestID,
                remoteAddress: snapshot.request?.remoteAddress ?? context.remoteAddress,
                userAgent: snapshot.request?.headers["User-Agent"],
                handlerError: snapshot.handlerError,
                completed: termination == .REQUEST_TERMINATED_COMPLETED_OK || snapshot.answeredMidBody,
                bodyRejection: snapshot.bodyRejection,
                peerAddress: context.remoteAddress))
    }

    /// The access handler: returns false to make MHD close the connection.
    func access(
        _ context: RequestContext, connection: OpaquePointer, method: String, version: UnsafePointer<CChar>?,
        upload: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>
    ) -> Bool {
        let stage = context.state.withLock { $0.stage }
        switch stage {
        case .new:
            let http10 = version.map { String(cString: $0) == "HTTP/1.0" } ?? false
            // The request line is within the connection's pool (`RequestHead.connectionMemory`).
            let targetLength = Self.sentTargetLength(
                context, version: version,
                bound: RequestHead.connectionMemory(maxSize: configuration.maxRequestHeadSize))
            return headersArrived(
                context, connection: connection, method: method, http10: http10, targetLength: targetLength,
                upload: upload, uploadSize: uploadSize)
        case .admitted:
            // MHD repeats its first call (no body yet) after the resume; the body follows.
            context.state.withLock { s in
                s.stage = .receiving
                s.admitted = true
            }
            return startBody(context, connection: connection, upload: upload, uploadSize: uploadSize)
        case .receiving:
            return receive(context, connection: connection, upload: upload, uploadSize: uploadSize)
        case .ready(let response):
            setReading(connection, false)
            return queue(response, context: context, connection: connection)
        case .admitting, .suspended, .responded:
            uploadSize.pointee = 0
            return true
        }
    }

    /// MHD's first call, with the request's headers: routes the request and decides, before any of the body is read,
    /// whether the body is taken.
    private func headersArrived(
        _ context: RequestContext, connection: OpaquePointer, method: String, http10: Bool, targetLength: Int,
        upload: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>
    ) -> Bool {
        let headers = Self.requestHeaders(connection)
        let httpMethod = HTTPMethod(rawValue: method)
        let requestID = RequestID.accept(headers["X-Request-Id"]) ?? RequestID.generate()
        let target = targetLength > context.targetBytes ? RequestTarget.cutAtNUL(context.target) : context.target
        let request = HTTPRequest(
            method: httpMethod, target: target, headers: headers, requestID: requestID,
            remoteAddress: client(context, headers), peerAddress: context.remoteAddress)
        let framing = BodyFraming(headers, http10: http10)
        let problem =
            Self.headProblem(
                connection: connection, targetLength: targetLength, headers: headers, rawPath: request.rawPath,
                configuration: configuration)
            ?? RequestHead.hostProblem(http10: http10, hosts: headers.values("Host")) ?? framing.problem
        let routed = problem == nil ? router.route(request) : nil
        context.state.withLock { s in
            s.stage = .receiving
            s.method = httpMethod
            s.requestID = requestID
            s.request = request
            s.routed = routed
            s.framing = framing
            if case .matched(let match) = routed { s.route = match.pattern }
        }
        guard let routed, problem == nil else {
            // Not routed: the head is over a limit, its Host is missing or ambiguous, or its body's framing is refused.
            return answerBeforeBody(.problem(problem!), context: context, connection: connection)
        }
        // Answers given here come before the body is read: MHD then skips it and closes the connection (with
        // `Expect: 100-continue` the client never sends it).
        let match: RouteMatch
        switch routed {
        case .matched(let found):
            match = found
        case .problem(let problem):
            // No route (404, 405, or a target that is not text): a body announced is not read. Without one, the answer
            // waits for the request's end like any other, which keeps the connection alive.
            if framing.hasBody {
                return answerBeforeBody(.problem(problem), context: context, connection: connection)
            }
            return startBody(context, connection: connection, upload: upload, uploadSize: uploadSize)
        }
        if framing.exceeds(bodyLimit(context, admitted: true)) {
            context.state.withLock { $0.bodyRejection = .tooLarge }
            return answerBeforeBody(
                .problem(.payloadTooLarge(limit: bodyLimit(context, admitted: true))), context: context,
                connection: connection)
        }
        // A body that may exceed the server's limit, to a route that admits its callers first: nothing of it is read
        // (or reserved) before they are admitted.
        if framing.exceeds(configuration.maxBodySize) || framing == .chunked, let admission = match.bodyPolicy.admission
        {
            return admit(admission, context: context, connection: connection)
        }
        return startBody(context, connection: connection, upload: upload, uploadSize: uploadSize)
    }

    /// Refuses (503, before it is read) a body announced by `Content-Length` that the server's budget cannot hold
    /// now; then takes what MHD passed along, if anything.
    ///
    /// Nothing is reserved for an announced length: a body's share is reserved as its bytes arrive (`receive`), so
    /// that connections announcing large bodies and sending nothing hold nothing of the budget.
    private func startBody(
        _ context: RequestContext, connection: OpaquePointer, upload: UnsafePointer<CChar>?,
        uploadSize: UnsafeMutablePointer<Int>
    ) -> Bool {
        let length = context.state.withLock { $0.framing.length }
        if let length, length > 0, !bodyBudget.wouldFit(length) {
            context.state.withLock { $0.bodyRejection = .overBudget }
            return answerBeforeBody(Self.overBudget, context: context, connection: connection)
        }
        if uploadSize.pointee == 0 { return true }
        return receive(context, connection: connection, upload: upload, uploadSize: uploadSize)
    }

    /// Answers before the body is read and closes the connection (MHD skips the body and closes it anyway).
    private func answerBeforeBody(_ response: HTTPResponse, context: RequestContext, connection: OpaquePointer) -> Bool
    {
        setReading(connection, false)
        var response = response
        response.headers["Connection"] = "close"
        return queue(response, context: context, connection: connection)
    }

    /// 503: the body would take the server over its budget of buffered bodies.
    static let overBudget = HTTPResponse.problem(
        .serviceUnavailable(
            detail: "The server is holding too many request bodies at once; retry shortly.", retryAfterSeconds: 1))

    /// The largest body this request may send: its route's limit (`BodyPolicy.maxSize`, else the server's
    /// `maxBodySize`), unless the route admits callers first and this request was not admitted (`admitted` false),
    /// then the server's `maxBodySize`; never more than the body budget.
    private func bodyLimit(_ context: RequestContext, admitted: Bool? = nil) -> Int {
        let (routed, wasAdmitted) = context.state.withLock { ($0.routed, $0.admitted) }
        var limit = configuration.maxBodySize
        if case .matched(let match) = routed, let size = match.bodyPolicy.maxSize,
            match.bodyPolicy.admission == nil || admitted ?? wasAdmitted
        {
            limit = size
        }
        if bodyBudget.limit > 0 { limit = min(limit, bodyBudget.limit) }
        return limit
    }

    /// Runs the route's admission on the request's headers with the connection suspended, before any of the body
    /// is read. MHD repeats its first call after the resume: admitted, it collects the body (`.admitted`); refused,
    /// it answers at once and closes the connection without reading the body (`.ready`).
    private func admit(
        _ admission: @escaping BodyPolicy.Admission, context: RequestContext, connection: OpaquePointer
    ) -> Bool {
        let stored = context.state.withLock { $0.request }
        guard let request = stored else { return false }
        return suspend(context, connection: connection, as: .admitting) { [self] in
            var next = RequestContext.Stage.admitted
            var failure: String?
            do {
                try await admission(request)
            } catch {
                var response: HTTPResponse
                if let convertible = error as? any HTTPProblemConvertible {
                    response = .problem(convertible.problem)
                } else {
                    failure = String(describing: error)
                    response = .problem(.internalError(requestID: request.requestID))
                }
                response.headers["Connection"] = "close"
                next = .ready(response)
            }
            self.resume(context, as: next, failure: failure)
        }
    }

    /// Takes a part of the body, or the end of it (`uploadSize` 0), then dispatches.
    ///
    /// A body that turns out too large, or that the budget cannot hold (a chunked one, reserved as it grows), is
    /// dropped and its reservation given back at once, and refused there and then (`answerMidBody`): the client learns
    /// it while still sending, and nothing more of the body is read.
    private func receive(
        _ context: RequestContext, connection: OpaquePointer, upload: UnsafePointer<CChar>?,
        uploadSize: UnsafeMutablePointer<Int>
    ) -> Bool {
        let size = uploadSize.pointee
        guard size > 0 else { return dispatch(context, connection: connection) }
        uploadSize.pointee = 0
        let limit = bodyLimit(context)
        let rejection = context.state.withLock { s -> BodyRejection? in
            s.bytesIn += size
            guard s.bodyRejection == nil, let upload else { return nil }
            let needed = s.body.count + size
            if needed > limit {
                s.bodyRejection = .tooLarge
            } else if needed > s.reservedBody {
                // Reserve ahead as the array grows (doubling, up to the announced length), so that what is reserved
                // is what is allocated, and only for bytes that came.
                let target = min(limit, s.framing.length ?? limit, max(needed, 2 * s.reservedBody))
                if bodyBudget.reserve(target - s.reservedBody) {
                    s.reservedBody = target
                } else {
                    s.bodyRejection = .overBudget
                }
            }
            if s.bodyRejection != nil {
                s.body = []
                bodyBudget.release(s.reservedBody)
                s.reservedBody = 0
                return s.bodyRejection
            }
            if s.body.capacity < s.reservedBody { s.body.reserveCapacity(s.reservedBody) }
            s.body.append(contentsOf: UnsafeRawBufferPointer(start: upload, count: size))
            return nil
        }
        switch rejection {
        case .tooLarge:
            return answerMidBody(.problem(.payloadTooLarge(limit: limit)), context: context, connection: connection)
        case .overBudget:
            return answerMidBody(Self.overBudget, context: context, connection: connection)
        case nil:
            return true
        }
    }

    /// Answers while the body is still coming, and closes the connection without reading the rest of it.
    ///
    /// MHD queues no response while it passes body data (`MHD_queue_response` refuses it in that state) and cannot
    /// skip the rest of a chunked body, so the answer is written to the socket here, on the MHD thread that owns the
    /// connection, while MHD has nothing of its own to send (any `100 Continue` went out before the body). Then the
    /// sending side is shut down (the client reads the answer, then end of stream) and MHD is told to close the
    /// connection. The answer is a few hundred bytes into an empty send buffer; a socket that takes less drops the
    /// rest, the connection being closed either way.
    private func answerMidBody(_ response: HTTPResponse, context: RequestContext, connection: OpaquePointer) -> Bool {
        setReading(connection, false)
        var response = response
        response.headers["Connection"] = "close"
        response = finalize(response, context: context)
        guard let info = cmhd_get_connection_info(connection, .CONNECTION_INFO_CONNECTION_FD) else { return false }
        let socket = info.pointee.connect_fd
        let bytes = Self.serialize(response)
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
            }
            if sent <= 0 { break }
            offset += sent
        }
        _ = shutdown(socket, Int32(SHUT_WR))
        context.state.withLock { $0.answeredMidBody = offset == bytes.count }
        return false
    }

    /// A finalized response (`finalize`) as HTTP/1.1 bytes, with `Content-Length` and `Date`, for `answerMidBody`.
    /// Like MHD, it drops a header whose name or value holds CR, LF or NUL.
    static func serialize(_ response: HTTPResponse) -> [UInt8] {
        let reason = MHD_get_reason_phrase_for(UInt32(response.status)).map { String(cString: $0) } ?? ""
        var head = "HTTP/1.1 \(response.status) \(reason)\r\n"
        for (name, value) in response.headers
        where !name.utf8.contains(where: { $0 == 13 || $0 == 10 || $0 == 0 })
            && !value.utf8.contains(where: { $0 == 13 || $0 == 10 || $0 == 0 })
        {
            head += "\(name): \(value)\r\n"
        }
        head += "Content-Length: \(response.body.count)\r\nDate: \(httpDate(time(nil)))\r\n\r\n"
        return Array(head.utf8) + response.body
    }

    /// An IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`, without the C library's locale.
    static func httpDate(_ seconds: time_t) -> String {
        var t = seconds
        var parts = tm()
        gmtime_r(&t, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    /// Gives back the request's share of the body budget.
    private func releaseBody(_ context: RequestContext) {
        context.state.withLock { s in
            bodyBudget.release(s.reservedBody)
            s.reservedBody = 0
        }
    }

    /// The request is complete: answer at once (routing found nothing) or suspend and run the handler. (A refused body
    /// was answered as it came, in `receive`.)
    private func dispatch(_ context: RequestContext, connection: OpaquePointer) -> Bool {
        setReading(connection, false)
        let snapshot = context.state.withLock { s in
            defer { s.body = [] }
            return s
        }
        let match: RouteMatch
        switch snapshot.routed {
        case .problem(let problem):
            return queue(.problem(problem), context: context, connection: connection)
        case .matched(let found):
            match = found
        case nil:
            return queue(
                .problem(.internalError(requestID: snapshot.requestID)), context: context, connection: connection)
        }
        guard var request = snapshot.request else {
            return queue(
                .problem(.internalError(requestID: snapshot.requestID)), context: context, connection: connection)
        }
        request.body = snapshot.body
        request.route = match.pattern
        request.pathParameters = match.parameters
        if let problem = match.bodyPolicy.violation(for: request) {
            return queue(.problem(problem), context: context, connection: connection)
        }

        let handler = match.handler
        let routed = request
        return suspend(context, connection: connection, as: .suspended) { [self] in
            await self.runHandler(handler, request: routed, context: context)
        }
    }

    /// Suspends the connection (its stage becomes `stage`) and runs `work` as a task, recorded so that a stop
    /// answers the connection (503) and cancels the task. `work` ends with `resume(_:as:failure:)`.
    private func suspend(
        _ context: RequestContext, connection: OpaquePointer, as stage: RequestContext.Stage,
        _ work: @escaping @Sendable () async -> Void
    ) -> Bool {
        let handle = MHDHandle(connection)
        let id = ObjectIdentifier(context)
        let suspended = state.withLock { s -> Bool in
            guard s.phase == .running || s.phase == .draining else { return false }
            context.state.withLock { $0.stage = stage }
            MHD_suspend_connection(handle.pointer)
            s.suspended[id] = Suspension(context: context, connection: handle, task: nil)
            return true
        }
        if !suspended {
            return queue(
                .problem(.serviceUnavailable(detail: "The server is shutting down.", retryAfterSeconds: 1)),
                context: context, connection: connection)
        }
        // One task per request is the point of the design: the handler may await for a long time and must not
        // hold an MHD thread. It is not a child of `run()` on purpose, so that cancelling `run()` lets in-flight
        // handlers finish during the drain. Started outside the lock (starting one may wake a thread), then
        // recorded for a stop to cancel; if its entry is gone already (a stop answered it, or it finished), it is
        // cancelled here instead (a no-op once finished).
        let task = Task { await work() }
        let recorded = state.withLock { s -> Bool in
            guard s.suspended[id] != nil else { return false }
            s.suspended[id]?.task = task
            return true
        }
        if !recorded { task.cancel() }
        return true
    }

    private func runHandler(_ handler: HTTPHandler, request: HTTPRequest, context: RequestContext) async {
        var response: HTTPResponse
        var failure: String?
        do {
            response = try await handler(request)
        } catch let error as any HTTPProblemConvertible {
            response = .problem(error.problem)
        } catch {
            failure = String(describing: error)
            response = .problem(.internalError(requestID: request.requestID))
        }
        resume(context, as: .ready(response), failure: failure)
    }

    /// Ends a suspension: sets the connection's next stage and resumes it, unless a stop took it first.
    private func resume(_ context: RequestContext, as stage: RequestContext.Stage, failure: String?) {
        // The entry is taken under the lock (whoever takes it resumes the connection: this handler, or a stop
        // answering 503), the resume made outside it: MHD's resume signals the daemon's thread (a syscall), and the
        // server-wide lock is on every request's path. `resuming` keeps the daemon from being stopped meanwhile.
        let entry = state.withLock { s -> Suspension? in
            guard let entry = s.suspended.removeValue(forKey: ObjectIdentifier(context)) else { return nil }
            resuming.add(1, ordering: .relaxed)
            return entry
        }
        guard let entry else { return }
        context.state.withLock { c in
            c.stage = stage
            c.handlerError = failure
        }
        MHD_resume_connection(entry.connection.pointer)
        resuming.subtract(1, ordering: .releasing)
    }

    /// Finalizes headers and hands the response to MHD.
    private func queue(_ response: HTTPResponse, context: RequestContext, connection: OpaquePointer) -> Bool {
        let response = finalize(response, context: context)
        let mhdResponse = response.body.withUnsafeBytes { bytes in
            MHD_create_response_from_buffer(
                bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress), .RESPMEM_MUST_COPY)
        }
        guard let mhdResponse else { return false }
        defer { MHD_destroy_response(mhdResponse) }
        for (name, value) in response.headers {
            _ = MHD_add_response_header(mhdResponse, name, value)  // MHD refuses CR/LF; such headers are dropped
        }
        return MHD_queue_response(connection, UInt32(response.status), mhdResponse) == .YES
    }

    /// The response as sent: request ID, default headers, `Content-Type`, `Connection: close` while stopping, no body
    /// where none may go; records its status and size as the request's.
    private func finalize(_ response: HTTPResponse, context: RequestContext) -> HTTPResponse {
        var response = response
        let (method, requestID) = context.state.withLock { ($0.method, $0.requestID) }
        if !(100...999).contains(response.status) {
            response = .problem(.internalError(requestID: requestID))
        }
        response.headers["X-Request-Id"] = requestID
        for (name, value) in configuration.defaultHeaders where !response.headers.contains(name) {
            response.headers[name] = value
        }
        response.headers.remove("Content-Length")
        response.headers.remove("Transfer-Encoding")
        if response.status < 200 || response.status == 204 || response.status == 304 {
            response.body = []
        } else if !response.body.isEmpty, !response.headers.contains("Content-Type") {
            response.headers["Content-Type"] = "application/octet-stream"
        }
        if state.withLock({ $0.phase != .running }) {
            response.headers["Connection"] = "close"
        }
        let sentBytes = method == .HEAD ? 0 : response.body.count
        context.state.withLock { s in
            s.stage = .responded
            s.status = response.status
            s.bytesOut = sentBytes
        }
        return response
    }

    private static func requestHeaders(_ connection: OpaquePointer) -> HTTPHeaders {
        var headers = HTTPHeaders()
        withUnsafeMutablePointer(to: &headers) { pointer in
            _ = MHD_get_connection_values(connection, .HEADER_KIND, mhdCollectHeader, pointer)
        }
        return headers
    }

    /// The request's head as libmicrohttpd holds it (see `RequestHead`).
    /// The head's 414 or 431 (`RequestHead.problem`), or nil. MHD's lists of query parameters and cookies are walked
    /// to count them only when the head could be over the limit with the most of them its text allows (a usual
    /// request's head is far under it).
    private static func headProblem(
        connection: OpaquePointer, targetLength: Int, headers: HTTPHeaders, rawPath: String,
        configuration: HTTPServer.Configuration
    ) -> HTTPProblem? {
        let text = cmhd_get_connection_info(connection, .CONNECTION_INFO_REQUEST_HEADER_SIZE).map {
            Int($0.pointee.header_size)
        }
        var head = RequestHead(
            targetLength: targetLength, textLength: text ?? targetLength,
            fieldCount: headers.count, queryParameterCount: nil, cookieCount: nil,
            cookieHeaderLength: headers.first("Cookie")?.utf8.count ?? 0)
        if head.targetLength <= configuration.maxTargetLength && head.size <= configuration.maxRequestHeadSize {
            return nil
        }
        head.queryParameterCount = Int(MHD_get_connection_values(connection, .GET_ARGUMENT_KIND, nil, nil))
        head.cookieCount = Int(MHD_get_connection_values(connection, .COOKIE_KIND, nil, nil))
        return head.problem(
            maxTargetLength: configuration.maxTargetLength, maxSize: configuration.maxRequestHeadSize,
            rawPath: rawPath, headers: headers)
    }

    private static func clientAddress(_ connection: OpaquePointer) -> String? {
        guard let info = cmhd_get_connection_info(connection, .CONNECTION_INFO_CLIENT_ADDRESS),
            let address = info.pointee.client_addr
        else { return nil }
        return SocketAddress.numericHost(address)
    }
}

/// An MHD daemon or connection pointer that crosses threads.
///
/// `@unchecked Sendable` is safe here because the pointer is only used through MHD entry points that MHD
/// documents as callable from any thread (`MHD_resume_connection`, `MHD_quiesce_daemon`,
/// `MHD_stop_daemon`). Connection handles are suspended and resumed only under `ServerCore.state`'s lock,
/// which also keeps the pointee alive: a suspended connection cannot be freed until it is resumed, and the
/// daemon (quiesced and stopped once, by the single caller that wins the phase change in `stop()`) is
/// stopped only after every suspended connection was resumed (see `ServerCore.State.suspended`).
struct MHDHandle: @unchecked Sendable {
    let pointer: OpaquePointer
    init(_ pointer: OpaquePointer) { self.pointer = pointer }
}

// MARK: - C callbacks (nonisolated free functions; context arrives through Unmanaged)

private func mhdURILog(
    _ cls: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?, _ connection: OpaquePointer?
) -> UnsafeMutableRawPointer? {
    guard let cls else { return nil }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    // Its bytes as sent, not `String(cString:)`, which would repair bytes that are not UTF-8 (see `RequestTarget`).
    let target = uri.map {
        UnsafeBufferPointer(start: UnsafeRawPointer($0).assumingMemoryBound(to: UInt8.self), count: strlen($0))
    }
    let context = core.requestStarted(
        target: target ?? UnsafeBufferPointer(start: nil, count: 0), connection: connection)
    return Unmanaged.passRetained(context).toOpaque()  // released in mhdRequestCompleted
}

private func mhdAccessHandler(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadDataSize: UnsafeMutablePointer<Int>?, _ requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let cls, let connection, let uploadDataSize, let opaque = requestContext?.pointee else { return .NO }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    let context = Unmanaged<RequestContext>.fromOpaque(opaque).takeUnretainedValue()
    let handled = core.access(
        context, connection: connection, method: method.map { String(cString: $0) } ?? "GET", version: version,
        upload: uploadData, uploadSize: uploadDataSize)
    return handled ? .YES : .NO
}

private func mhdRequestCompleted(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ termination: MHD_RequestTerminationCode
) {
    guard let cls, let requestContext, let opaque = requestContext.pointee else { return }
    requestContext.pointee = nil
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    let context = Unmanaged<RequestContext>.fromOpaque(opaque).takeRetainedValue()
    core.requestCompleted(context, connection: connection, termination: termination)
}

private func mhdNotifyConnection(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ code: MHD_ConnectionNotificationCode
) {
    guard let cls, let connection else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    if code == .CONNECTION_NOTIFY_STARTED {
        core.connectionOpened(connection)
    } else {
        core.connectionClosed(connection)
    }
}

private func mhdCollectHeader(
    _ cls: UnsafeMutableRawPointer?, _ kind: MHD_ValueKind, _ key: UnsafePointer<CChar>?,
    _ value: UnsafePointer<CChar>?
) -> MHD_Result {
    guard let cls, let key else { return .YES }
    let headers = cls.assumingMemoryBound(to: HTTPHeaders.self)
    headers.pointee.add(String(cString: key), value.map { String(cString: $0) } ?? "")
    return .YES
}
