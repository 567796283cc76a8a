import CNGHTTP2
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Something living on an event loop thread: a connection or a listener.
protocol LoopHandler: AnyObject {
    /// `events` (epoll bits) arrived for the handler's file descriptor.
    func handleEvent(_ events: UInt32)
    /// Called once per loop iteration after `markDirty`: write what is pending (batched).
    func flush()
    /// Called about every `EventLoop.tickInterval`.
    func tick(now: ContinuousClock.Instant)
    /// The loop stops: release everything now.
    func terminate()
}

/// One I/O thread: epoll over non-blocking sockets, an eventfd to wake it, a locked job queue for other threads, a
/// periodic tick for timers, and a per-iteration flush so that everything produced in one iteration goes out in as
/// few TLS writes as possible.
///
/// Work reaches the thread only through `execute`; jobs receive the thread's `LoopContext`, which is never shared.
final class EventLoop: Sendable {
    typealias Job = @Sendable (LoopContext) -> Void

    private struct Pending {
        var jobs: [Job] = []
        var wakePending = false
        var stopping = false
    }

    /// Timer granularity (deadlines, PINGs, idle close).
    static let tickInterval: Duration = .milliseconds(20)

    let name: String
    private let epollFD: Int32
    private let wakeFD: Int32
    private let pending = Mutex(Pending())
    private let exit = Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    init(name: String) throws {
        self.name = name
        let epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epollFD >= 0 else {
            throw HTTP2Error(.invalidConfiguration, "cannot create an epoll instance", details: errnoText())
        }
        let wakeFD = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        guard wakeFD >= 0 else {
            close(epollFD)
            throw HTTP2Error(.invalidConfiguration, "cannot create an eventfd", details: errnoText())
        }
        self.epollFD = epollFD
        self.wakeFD = wakeFD
        var event = epoll_event(events: EPOLLIN.rawValue, data: epoll_data_t(fd: wakeFD))
        epoll_ctl(epollFD, EPOLL_CTL_ADD, wakeFD, &event)
        let thread = Thread { [self] in self.run() }
        thread.name = name
        thread.start()
    }

    deinit {
        close(wakeFD)
        close(epollFD)
    }

    /// Runs `job` on the loop thread. Returns `false` (and drops the job) when the loop is stopping.
    @discardableResult
    func execute(_ job: @escaping Job) -> Bool {
        let needsWake: Bool? = pending.withLock { state in
            if state.stopping { return nil }
            state.jobs.append(job)
            if state.wakePending { return false }
            state.wakePending = true
            return true
        }
        guard let needsWake else { return false }
        if needsWake { wake() }
        return true
    }

    /// Asks the thread to stop: jobs already accepted still run, then every handler is terminated.
    func shutdown() {
        let first = pending.withLock { state in
            let first = !state.stopping
            state.stopping = true
            return first
        }
        if first { wake() }
    }

    /// Waits until the thread has exited.
    func join() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = exit.withLock { state in
                if !state.done { state.waiters.append(continuation) }
                return state.done
            }
            if done { continuation.resume() }
        }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    func control(_ operation: Int32, fd: Int32, events: UInt32) {
        var event = epoll_event(events: events, data: epoll_data_t(fd: fd))
        epoll_ctl(epollFD, operation, fd, &event)
    }

    private func run() {
        // Every socket write of this module happens on a loop thread, and OpenSSL writes with write(2): a peer that
        // closed first would raise SIGPIPE, whose default action ends the process (the `marquee` binary ignores it,
        // a process embedding this module may not). Blocked on this thread, the write fails with EPIPE instead, and
        // the connection is torn down as for any other write error.
        var pipe = sigset_t()
        sigemptyset(&pipe)
        sigaddset(&pipe, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &pipe, nil)
        let context = LoopContext(loop: self)
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        var nextTick = ContinuousClock.now + Self.tickInterval
        var running = true
        while running {
            var timeout: Int32 = 0
            if !context.hasDirty {
                let remaining = nextTick - ContinuousClock.now
                let milliseconds =
                    remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000
                timeout = Int32(max(0, min(milliseconds + 1, 1000)))
            }
            let count = events.withUnsafeMutableBufferPointer { buffer in
                epoll_wait(epollFD, buffer.baseAddress, Int32(buffer.count), timeout)
            }
            context.now = .now
            var woke = false
            if count > 0 {
                for index in 0..<Int(count) {
                    let fd = events[index].data.fd
                    if fd == wakeFD {
                        var value: UInt64 = 0
                        _ = read(wakeFD, &value, 8)
                        woke = true
                    } else {
                        context.handler(forFD: fd)?.handleEvent(events[index].events)
                    }
                }
            }
            if woke {
                let (jobs, stopping) = pending.withLock { state in
                    let jobs = state.jobs
                    state.jobs = []
                    state.wakePending = false
                    return (jobs, state.stopping)
                }
                for job in jobs { job(context) }
                if stopping { running = false }
            }
            if context.now >= nextTick {
                context.tickAll()
                nextTick = context.now + Self.tickInterval
            }
            context.flushDirty()
        }
        context.terminateAll()
        let waiters = exit.withLock { state in
            state.done = true
            let waiters = state.waiters
            state.waiters = []
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// The state of one loop thread; only ever used on that thread.
final class LoopContext {
    let loop: EventLoop
    /// The time at the start of the current iteration.
    var now: ContinuousClock.Instant = .now
    private var objects: [Int: any LoopHandler] = [:]
    private var byFD: [Int32: any LoopHandler] = [:]
    private var dirty: [any LoopHandler] = []
    private var dirtyIDs = Set<ObjectIdentifier>()

    init(loop: EventLoop) { self.loop = loop }

    var hasDirty: Bool { !dirty.isEmpty }

    /// Adds a handler under `id` (ticks it until `remove`).
    func add(id: Int, _ handler: any LoopHandler) { objects[id] = handler }

    /// Removes a handler.
    func remove(id: Int) { objects.removeValue(forKey: id) }

    /// The handler with `id`.
    func object(id: Int) -> (any LoopHandler)? { objects[id] }

    /// Every handler of a type.
    func all<T>(_ type: T.Type) -> [T] { objects.values.compactMap { $0 as? T } }

    func handler(forFD fd: Int32) -> (any LoopHandler)? { byFD[fd] }

    /// Starts watching `fd` for `events` on behalf of `handler`.
    func register(fd: Int32, events: UInt32, _ handler: any LoopHandler) {
        byFD[fd] = handler
        loop.control(EPOLL_CTL_ADD, fd: fd, events: events)
    }

    /// Changes the watched events.
    func modify(fd: Int32, events: UInt32) {
        loop.control(EPOLL_CTL_MOD, fd: fd, events: events)
    }

    /// Stops watching `fd` (call before closing it).
    func unregister(fd: Int32) {
        guard byFD.removeValue(forKey: fd) != nil else { return }
        loop.control(EPOLL_CTL_DEL, fd: fd, events: 0)
    }

    /// Schedules `handler.flush()` for the end of this iteration.
    func markDirty(_ handler: any LoopHandler) {
        if dirtyIDs.insert(ObjectIdentifier(handler)).inserted { dirty.append(handler) }
    }

    func flushDirty() {
        while !dirty.isEmpty {
            let batch = dirty
            dirty = []
            dirtyIDs.removeAll(keepingCapacity: true)
            for handler in batch { handler.flush() }
        }
    }

    func tickAll() {
        for handler in Array(objects.values) { handler.tick(now: now) }
    }

    func terminateAll() {
        flushDirty()
        for handler in Array(objects.values) { handler.terminate() }
        objects.removeAll()
        byFD.removeAll()
    }
}

func errnoText(_ code: Int32 = errno) -> String {
    String(cString: strerror(code))
}

/// Process-wide identifiers for connections and listeners.
let nextObjectID = Atomic<Int>(1)

func makeObjectID() -> Int {
    nextObjectID.wrappingAdd(1, ordering: .relaxed).oldValue
}
