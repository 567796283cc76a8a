import CNGHTTP2
import Foundation
import Synchronization

/// An HTTP/2 server over TLS (ALPN `h2` only), for simulators and tests.
///
/// Sockets are served by dedicated I/O threads. Each complete request goes to the responder on its connection's
/// thread, which answers at once or hands the work to a child task of `run()`, whose answer goes back to the
/// connection's thread (`HTTP2ServerReply`); a plain async `handler` is always run in a task. Call `start()` (or let
/// `run()` do it), keep `run()` running, and end with `stop()` or by cancelling `run()`: both stop accepting, send
/// GOAWAY, let the streams in flight finish and then close.
public final class HTTP2Server: Sendable {
    private let core: ServerCore

    /// Creates a server; nothing is bound before `start()`.
    ///
    /// - Parameters:
    ///   - host: a numeric address to listen on (default `127.0.0.1`).
    ///   - port: the TCP port; 0 picks a free one (see `boundPort`).
    ///   - maxConcurrentStreams: SETTINGS_MAX_CONCURRENT_STREAMS advertised per connection (default 1000).
    ///   - initialWindowSize: SETTINGS_INITIAL_WINDOW_SIZE (default 4 MiB; the connection window is four times it).
    ///   - ioThreads: I/O threads (default 1).
    public convenience init(
        host: String = "127.0.0.1", port: Int, tls: TLSServerConfiguration, maxConcurrentStreams: Int = 1000,
        initialWindowSize: Int = 4 << 20, ioThreads: Int = 1,
        handler: @escaping @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse
    ) {
        self.init(
            host: host, port: port, tls: tls, maxConcurrentStreams: maxConcurrentStreams,
            initialWindowSize: initialWindowSize, ioThreads: ioThreads,
            responder: { request in .later { await handler(request) } })
    }

    /// Creates a server whose `responder` is called on the connection's I/O thread for each complete request and
    /// answers it there (`.now`) or in a task of `run()` (`.later`). Other parameters as in the `handler` form.
    public init(
        host: String = "127.0.0.1", port: Int, tls: TLSServerConfiguration, maxConcurrentStreams: Int = 1000,
        initialWindowSize: Int = 4 << 20, ioThreads: Int = 1,
        responder: @escaping @Sendable (HTTP2ServerRequest) -> HTTP2ServerReply
    ) {
        core = ServerCore(
            host: host, port: port, tls: tls, maxConcurrentStreams: maxConcurrentStreams,
            initialWindowSize: initialWindowSize, ioThreads: max(1, ioThreads), responder: responder)
    }

    deinit {
        core.stopNow()
    }

    /// Loads the certificate, binds, listens and starts the I/O threads.
    ///
    /// Throws `invalidConfiguration` for an unusable certificate/key or address.
    public func start() throws {
        try core.start()
    }

    /// The bound port (valid after `start()`).
    public var boundPort: Int { core.boundPort }

    /// Connections currently open.
    public var openConnections: Int { core.connectionCount.load(ordering: .relaxed) }

    /// Starts the server if needed and runs request handlers until `stop()` completes or the task is cancelled
    /// (which stops the server gracefully; handlers still running then see cancellation).
    public func run() async throws {
        if !core.isStarted { try core.start() }
        let core = self.core
        await withDiscardingTaskGroup { group in
            group.addTask {
                await withTaskCancellationHandler {
                    await core.stopRequested.wait()
                } onCancel: {
                    core.stopRequested.fire()
                }
                await core.stop()
            }
            while let jobs = await core.queue.next() {
                for job in jobs {
                    group.addTask { job.respond(await job.work()) }
                }
            }
        }
    }

    /// Stops gracefully: no new connections, GOAWAY on the open ones, waits (up to 10 s) for their streams to
    /// finish, then closes them and stops the threads.
    public func stop() async {
        core.stopRequested.fire()
        await core.stop()
    }
}

/// A request's `.later` work on its way to `run()`, with the way back.
struct ServerJob: Sendable {
    let work: @Sendable () async -> HTTP2ServerResponse
    let streamID: Int32
    let loop: EventLoop
    let connectionID: Int

    func respond(_ response: HTTP2ServerResponse) {
        let connectionID = connectionID
        let streamID = streamID
        loop.execute { context in
            (context.object(id: connectionID) as? ServerConnection)?.respond(streamID: streamID, response)
        }
    }
}

/// A one-shot signal.
final class Signal: Sendable {
    private let state = Mutex<(fired: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func fire() {
        let waiters = state.withLock { state in
            state.fired = true
            let waiters = state.waiters
            state.waiters = []
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let fired = state.withLock { state in
                if !state.fired { state.waiters.append(continuation) }
                return state.fired
            }
            if fired { continuation.resume() }
        }
    }
}

/// Requests from the I/O threads to `run()`, handed over in batches. Single consumer.
final class JobQueue: Sendable {
    private struct State {
        var jobs: [ServerJob] = []
        var waiter: CheckedContinuation<[ServerJob]?, Never>?
        var finished = false
    }

    private let state = Mutex(State())

    func push(_ job: ServerJob) {
        let waiter: CheckedContinuation<[ServerJob]?, Never>? = state.withLock { state in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.jobs.append(job)
            return nil
        }
        waiter?.resume(returning: [job])
    }

    func finish() {
        let waiter = state.withLock { state in
            state.finished = true
            let waiter = state.waiter
            state.waiter = nil
            return waiter
        }
        waiter?.resume(returning: nil)
    }

    /// The next batch, or `nil` once finished and empty.
    func next() async -> [ServerJob]? {
        await withCheckedContinuation { continuation in
            let ready: [ServerJob]?? = state.withLock { state in
                if !state.jobs.isEmpty {
                    let jobs = state.jobs
                    state.jobs = []
                    return .some(jobs)
                }
                if state.finished { return .some(nil) }
                state.waiter = continuation
                return .none
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// The shared part of `HTTP2Server`.
final class ServerCore: Sendable {
    private enum Phase {
        case idle
        case running
        case stopping
        case stopped
    }

    private struct State {
        var phase = Phase.idle
        var tls: TLSContext?
        var loops: [EventLoop] = []
        var listenFD: Int32 = -1
        var port = 0
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
    }

    let host: String
    let port: Int
    let configuration: TLSServerConfiguration
    let maxConcurrentStreams: Int
    let initialWindowSize: Int
    let ioThreads: Int
    let responder: @Sendable (HTTP2ServerRequest) -> HTTP2ServerReply
    let queue = JobQueue()
    let stopRequested = Signal()
    let connectionCount = Atomic<Int>(0)
    private let state = Mutex(State())

    init(
        host: String, port: Int, tls: TLSServerConfiguration, maxConcurrentStreams: Int, initialWindowSize: Int,
        ioThreads: Int, responder: @escaping @Sendable (HTTP2ServerRequest) -> HTTP2ServerReply
    ) {
        self.host = host
        self.port = port
        self.configuration = tls
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialWindowSize = initialWindowSize
        self.ioThreads = ioThreads
        self.responder = responder
    }

    var isStarted: Bool { state.withLock { $0.phase != .idle } }
    var boundPort: Int { state.withLock { $0.port } }
    var loops: [EventLoop] { state.withLock { $0.loops } }
    var tls: TLSContext { state.withLock { $0.tls! } }

    func start() throws {
        let tls = try TLSContext.server(configuration)
        let (fd, port) = try listen(host: host, port: port)
        let loops: [EventLoop]
        do {
            loops = try (0..<ioThreads).map { try EventLoop(name: "http2-server-\($0)") }
        } catch {
            close(fd)
            throw error
        }
        let ok = state.withLock { state in
            guard state.phase == .idle else { return false }
            state.phase = .running
            state.tls = tls
            state.loops = loops
            state.listenFD = fd
            state.port = port
            return true
        }
        guard ok else {
            close(fd)
            for loop in loops { loop.shutdown() }
            throw HTTP2Error(.invalidConfiguration, "the server was already started")
        }
        loops[0].execute { [self] context in Listener(fd: fd, core: self, context: context).start() }
    }

    func submit(_ job: ServerJob) { queue.push(job) }

    func connectionOpened() { connectionCount.wrappingAdd(1, ordering: .relaxed) }
    func connectionClosed() { connectionCount.wrappingSubtract(1, ordering: .relaxed) }

    func stop() async {
        let (first, loops) = state.withLock { state -> (Bool?, [EventLoop]) in
            switch state.phase {
            case .idle:
                state.phase = .stopped
                return (nil, [])
            case .running:
                state.phase = .stopping
                return (true, state.loops)
            case .stopping:
                return (false, [])
            case .stopped:
                return (nil, [])
            }
        }
        guard let first else {
            queue.finish()
            return
        }
        guard first else {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let done = state.withLock { state in
                    if state.phase != .stopped { state.stopWaiters.append(continuation) }
                    return state.phase == .stopped
                }
                if done { continuation.resume() }
            }
            return
        }
        for loop in loops {
            loop.execute { context in
                for listener in context.all(Listener.self) { listener.stop() }
                for connection in context.all(ServerConnection.self) { connection.beginShutdown() }
            }
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while connectionCount.load(ordering: .relaxed) > 0 && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        for loop in loops { loop.shutdown() }
        for loop in loops { await loop.join() }
        queue.finish()
        let waiters = state.withLock { state in
            state.phase = .stopped
            let waiters = state.stopWaiters
            state.stopWaiters = []
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func stopNow() {
        let loops = state.withLock { $0.loops }
        for loop in loops { loop.shutdown() }
        queue.finish()
    }

    private func listen(host: String, port: Int) throws -> (Int32, Int) {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let address = list else {
            throw HTTP2Error(.invalidConfiguration, "the listen address must be a numeric host and a port")
        }
        defer { freeaddrinfo(list) }
        let socketType = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        let fd = socket(address.pointee.ai_family, socketType, 0)
        guard fd >= 0 else { throw HTTP2Error(.invalidConfiguration, "cannot create a socket", details: errnoText()) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0, Glibc.listen(fd, 4096) == 0 else {
            let details = errnoText()
            close(fd)
            throw HTTP2Error(.invalidConfiguration, "cannot listen on the address", details: details)
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let bound = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard bound == 0 else {
            close(fd)
            throw HTTP2Error(.invalidConfiguration, "cannot read the bound address", details: errnoText())
        }
        let family = Int32(storage.ss_family)
        let boundPort: UInt16 = withUnsafePointer(to: &storage) { pointer in
            if family == AF_INET6 {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_port }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_port }
        }
        return (fd, Int(UInt16(bigEndian: boundPort)))
    }
}
