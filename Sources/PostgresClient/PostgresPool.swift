import Dispatch
import Foundation
import Synchronization

extension Duration {
    var timeInterval: TimeInterval {
        let (seconds, attoseconds) = components
        return TimeInterval(seconds) + TimeInterval(attoseconds) / 1e18
    }
}

/// Hands a closure to another thread exactly once.
final class ClosureHolder<T: Sendable>: Sendable {
    typealias Body = @Sendable (PostgresConnection) throws -> T
    private let body: Mutex<Body?>

    init(_ body: @escaping Body) {
        self.body = Mutex(body)
    }

    /// Returns the closure and forgets it.
    func take() -> Body? {
        body.withLock { body in
            defer { body = nil }
            return body
        }
    }
}

/// What happened to one checkout on a slot's queue.
enum SlotOutcome<T: Sendable>: Sendable {
    case finished(Result<T, any Error>, reusable: Bool)
    case connectFailed(PostgresError)
}

/// One pooled connection: a serial queue (its own thread of execution, off Swift's cooperative pool) and the
/// connection that lives on it.
///
/// `@unchecked Sendable` is safe because the only mutable state, `connection`, is read and written exclusively
/// by work items on `queue`, a serial DispatchQueue that serialises them (checked with `dispatchPrecondition`).
/// The pool's `Mutex` ensures a slot is checked out by at most one caller at a time.
final class PoolSlot: @unchecked Sendable {
    enum Preparation: Sendable {
        /// Open a new connection.
        case connect
        /// Reuse the connection; do a round-trip ping first if `ping` is true.
        case reuse(ping: Bool)
    }

    let id: Int
    let queue: DispatchQueue
    private var connection: PostgresConnection?

    init(id: Int) {
        self.id = id
        self.queue = DispatchQueue(label: "postgres.pool.connection.\(id)")
    }

    /// Runs one checkout. A stale idle connection is replaced by a fresh one before `body` sees it.
    func run<T: Sendable>(
        _ preparation: Preparation, _ configuration: PostgresConfiguration,
        _ body: (PostgresConnection) throws -> T
    ) -> SlotOutcome<T> {
        dispatchPrecondition(condition: .onQueue(queue))
        let current: PostgresConnection
        switch prepare(preparation, configuration) {
        case .success(let connection): current = connection
        case .failure(let error): return .connectFailed(error)
        }
        let result = Result { try body(current) }
        return .finished(result, reusable: finish())
    }

    /// The first step of a checkout: the connection to use, validated or freshly opened.
    func prepare(_ preparation: Preparation, _ configuration: PostgresConfiguration) -> Result<
        PostgresConnection, PostgresError
    > {
        dispatchPrecondition(condition: .onQueue(queue))
        if case .reuse(let ping) = preparation, let existing = connection {
            if !existing.validate(forcePing: ping) {
                connection = nil
            }
        }
        if let connection { return .success(connection) }
        do {
            let fresh = try PostgresConnection(connecting: configuration)
            connection = fresh
            return .success(fresh)
        } catch {
            return .failure(error as? PostgresError ?? PostgresError(code: .connectionFailed, underlying: "\(error)"))
        }
    }

    /// A step of a held checkout (`PostgresSession`) on the connection `prepare` gave.
    func step<T>(_ body: (PostgresConnection) throws -> T) -> Result<T, any Error> {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let connection else {
            return .failure(PostgresError(code: .connectionLost, context: "the held connection was dropped"))
        }
        return Result { try body(connection) }
    }

    /// The last step of a checkout: rolls back a transaction left open; whether the connection can be reused.
    func finish() -> Bool {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let connection else { return false }
        let reusable = connection.resetForReuse()
        if !reusable {
            self.connection = nil
        }
        return reusable
    }

    /// A round-trip health check; drops the connection if it fails.
    func healthCheck() -> Bool {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let connection, connection.validate(forcePing: true) else {
            connection = nil
            return false
        }
        return true
    }

    /// Closes the connection on the slot's queue.
    func close() {
        queue.async { self.connection = nil }
    }
}

/// A bounded pool of libpq connections.
///
/// Connections are opened lazily, at most `maxConnections` at a time; callers beyond that wait in FIFO order
/// for up to `acquireTimeout` and then get `.poolTimeout`. All libpq work runs on one serial `DispatchQueue`
/// per connection, never on Swift's cooperative threads; async callers are resumed through continuations.
///
/// Broken connections are discarded, never reused. A connection that sat idle is checked before use
/// (a free socket check always; a round-trip ping after `validateAfterIdle` or if the server sent
/// anything while it was idle), and a stale one is replaced transparently, so the first caller after a
/// server restart does not see a stale-connection error.
/// A statement that fails because the connection broke throws `.connectionLost` and is never retried.
public final class PostgresPool: Sendable {
    /// Pool settings.
    public struct Configuration: Sendable {
        /// Upper bound on open connections. Default 10.
        public var maxConnections: Int
        /// How long a caller waits for a free connection before `.poolTimeout`. Default 5 s.
        public var acquireTimeout: Duration
        /// How often `run()` pings connections idle for at least this long. Default 10 s.
        public var healthCheckInterval: Duration
        /// Idle connections older than this are closed by `run()`. Default 60 s.
        public var idleTimeout: Duration
        /// A checkout of a connection idle at least this long pings it first. Default 2 s.
        public var validateAfterIdle: Duration

        /// Creates a configuration; every parameter has the documented default.
        public init(
            maxConnections: Int = 10, acquireTimeout: Duration = .seconds(5),
            healthCheckInterval: Duration = .seconds(10), idleTimeout: Duration = .seconds(60),
            validateAfterIdle: Duration = .seconds(2)
        ) {
            self.maxConnections = maxConnections
            self.acquireTimeout = acquireTimeout
            self.healthCheckInterval = healthCheckInterval
            self.idleTimeout = idleTimeout
            self.validateAfterIdle = validateAfterIdle
        }
    }

    /// A snapshot of the pool's counters.
    public struct Statistics: Sendable, Hashable {
        /// Open connections (idle + in use + being opened).
        public var open: Int
        /// Idle connections.
        public var idle: Int
        /// Callers waiting for a connection.
        public var waiting: Int
    }

    typealias Machine = PoolStateMachine<PoolSlot>

    private struct State {
        var machine: Machine
        var waiters: [Int: CheckedContinuation<Machine.Grant, any Error>] = [:]
        var nextWaiterID = 0
        var nextSlotID = 0
    }

    private let configuration: PostgresConfiguration
    /// The pool settings in effect.
    public let options: Configuration
    private let state: Mutex<State>

    /// Creates a pool. No connection is opened until first use.
    public init(_ configuration: PostgresConfiguration, options: Configuration = .init()) {
        self.configuration = configuration
        self.options = options
        self.state = Mutex(State(machine: Machine(maxConnections: options.maxConnections)))
    }

    /// A pool of its own on the same database, e.g. for a health check that must not queue behind requests.
    public func sibling(options: Configuration) -> PostgresPool {
        PostgresPool(configuration, options: options)
    }

    /// Current counters.
    public var statistics: Statistics {
        state.withLock { state in
            Statistics(
                open: state.machine.open, idle: state.machine.idle.count, waiting: state.machine.waiters.count)
        }
    }

    // MARK: Checkout

    /// Runs `body` on a checked-out connection, on that connection's dedicated thread (never on Swift's
    /// cooperative pool), and returns the connection afterwards. A transaction left open by `body` is rolled
    /// back; a broken connection is discarded.
    ///
    /// - Throws: `.poolTimeout`, `.poolClosed`, `.connectionFailed`, `CancellationError` while waiting, or
    ///   whatever `body` throws.
    public func withConnection<T: Sendable>(_ body: @Sendable (PostgresConnection) throws -> T) async throws -> T {
        let (slot, preparation) = try await checkout()
        let configuration = self.configuration
        let outcome: SlotOutcome<T> = await withoutActuallyEscaping(body) { escapingBody in
            // The dispatch block must not keep the closure alive after we resume (withoutActuallyEscaping
            // checks), so it reaches the block through a holder that is emptied first.
            let holder = ClosureHolder(escapingBody)
            return await withCheckedContinuation { continuation in
                slot.queue.async {
                    let outcome: SlotOutcome<T>
                    if let body = holder.take() {
                        outcome = slot.run(preparation, configuration, body)
                    } else {
                        outcome = .connectFailed(PostgresError(code: .unsupported, context: "checkout body missing"))
                    }
                    continuation.resume(returning: outcome)
                }
            }
        }
        switch outcome {
        case .connectFailed(let error):
            release(slot, reusable: false)
            throw error
        case .finished(let result, let reusable):
            release(slot, reusable: reusable)
            return try result.get()
        }
    }

    /// `withConnection`, except that cancelling the calling task cancels the statement `body` is running (libpq's
    /// `PQcancel`): for long statements a shutdown must not wait for, such as the retention pass. `body` then throws
    /// the server's error (57014, query canceled), and its transaction rolls back.
    public func withCancellableConnection<T: Sendable>(_ body: @Sendable (PostgresConnection) throws -> T)
        async throws -> T
    {
        let current = Mutex<(canceller: StatementCanceller?, cancelled: Bool)>((nil, false))
        return try await withTaskCancellationHandler {
            try await withConnection { connection in
                let cancelled = current.withLock { state in
                    state.canceller = connection.canceller()
                    return state.cancelled
                }
                defer { current.withLock { $0.canceller = nil } }
                if cancelled { throw CancellationError() }
                return try body(connection)
            }
        } onCancel: {
            let canceller = current.withLock { state in
                state.cancelled = true
                return state.canceller
            }
            canceller?.cancelStatement()
        }
    }

    /// Holds one connection for `body`, across suspension points: what `body` runs through the session goes to the
    /// same connection, on its own thread, one step at a time. For a transaction that spans async work — a worker's
    /// claim, whose row locks are held while it sends. A transaction left open is rolled back when `body` returns
    /// or throws, and a broken connection is discarded.
    public func withSession<T: Sendable>(_ body: (PostgresSession) async throws -> T) async throws -> T {
        let (slot, preparation) = try await checkout()
        let configuration = self.configuration
        let prepared = await withCheckedContinuation { continuation in
            slot.queue.async {
                continuation.resume(returning: slot.prepare(preparation, configuration).map { _ in () })
            }
        }
        if case .failure(let error) = prepared {
            release(slot, reusable: false)
            throw error
        }
        let result: Result<T, any Error>
        do {
            result = .success(try await body(PostgresSession(slot: slot)))
        } catch {
            result = .failure(error)
        }
        let reusable = await withCheckedContinuation { continuation in
            slot.queue.async { continuation.resume(returning: slot.finish()) }
        }
        release(slot, reusable: reusable)
        return try result.get()
    }

    /// Runs one statement and returns its rows.
    public func query(_ query: PostgresQuery) async throws -> PostgresRows {
        try await withConnection { try $0.query(query) }
    }

    /// Runs one statement and returns the number of affected rows.
    @discardableResult
    public func execute(_ query: PostgresQuery) async throws -> Int {
        try await withConnection { try $0.execute(query) }
    }

    /// Sends a notification: `SELECT pg_notify(channel, payload)`.
    public func notify(channel: String, payload: String = "") async throws {
        try await withConnection { try $0.notify(channel: channel, payload: payload) }
    }

    /// Runs `body` inside `BEGIN … COMMIT` on one connection; on a throw the transaction is rolled back and the
    /// error rethrown. On serialization failure (40001) or deadlock (40P01), whether raised by `body` or by
    /// `COMMIT`, the whole body is run again in a new transaction after a short jittered backoff, up to
    /// `maxAttempts` times in all. `body` must therefore be safe to repeat, and must not end the transaction.
    /// `cancellable`: cancelling the calling task cancels the statement running (`withCancellableConnection`), and
    /// the transaction rolls back.
    public func transaction<T: Sendable>(
        isolation: IsolationLevel = .readCommitted, maxAttempts: Int = 5, cancellable: Bool = false,
        _ body: @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        var attempt = 1
        while true {
            do {
                let run: @Sendable (PostgresConnection) throws -> T = { connection in
                    try connection.transaction(isolation: isolation, body)
                }
                return try await cancellable ? withCancellableConnection(run) : withConnection(run)
            } catch let error as PostgresError where error.isTransactionRetryable && attempt < maxAttempts {
                let ceiling = min(0.2, 0.005 * Double(1 << min(attempt, 10)))
                try await Task.sleep(for: .seconds(ceiling * Double.random(in: 0.5...1)))
                attempt += 1
            }
        }
    }

    /// Waits for a grant: a new slot to connect, or an idle one to reuse (pinged first if it sat idle long enough).
    private func checkout() async throws -> (PoolSlot, PoolSlot.Preparation) {
        switch try await acquire() {
        case .create:
            return (makeSlot(), .connect)
        case .connection(let idleSlot, let idleSince):
            return (idleSlot, .reuse(ping: ContinuousClock.now - idleSince >= options.validateAfterIdle))
        }
    }

    private func makeSlot() -> PoolSlot {
        let id = state.withLock { state in
            state.nextSlotID += 1
            return state.nextSlotID
        }
        return PoolSlot(id: id)
    }

    private func acquire() async throws -> Machine.Grant {
        let id = state.withLock { state in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Machine.Grant, any Error>) in
                let action = state.withLock { state in
                    let action = state.machine.acquire(waiter: id)
                    if case .wait = action {
                        state.waiters[id] = continuation
                    }
                    return action
                }
                switch action {
                case .grant(let grant):
                    continuation.resume(returning: grant)
                case .fail(let error):
                    continuation.resume(throwing: error)
                case .wait:
                    let timeout = options.acquireTimeout
                    DispatchQueue.global().asyncAfter(deadline: .now() + timeout.timeInterval) { [weak self] in
                        self?.failWaiter(
                            id,
                            with: PostgresError(
                                code: .poolTimeout, context: "no connection became free within \(timeout)"))
                    }
                    if Task.isCancelled {
                        failWaiter(id, with: CancellationError())
                    }
                }
            }
        } onCancel: {
            failWaiter(id, with: CancellationError())
        }
    }

    private func failWaiter(_ id: Int, with error: any Error) {
        let continuation = state.withLock { state -> CheckedContinuation<Machine.Grant, any Error>? in
            guard state.machine.removeWaiter(id) else { return nil }
            return state.waiters.removeValue(forKey: id)
        }
        continuation?.resume(throwing: error)
    }

    private func release(_ slot: PoolSlot, reusable: Bool, idleSince: ContinuousClock.Instant = .now) {
        let (action, continuation) = state.withLock { state in
            let action = reusable ? state.machine.release(slot, idleSince: idleSince) : state.machine.discard()
            var continuation: CheckedContinuation<Machine.Grant, any Error>?
            if case .grant(let waiter, _) = action {
                continuation = state.waiters.removeValue(forKey: waiter)
            }
            return (action, continuation)
        }
        if !reusable {
            slot.close()
        }
        switch action {
        case .none:
            break
        case .grant(_, let grant):
            continuation?.resume(returning: grant)
        case .close(let closing):
            closing.close()
        }
    }

    // MARK: Lifecycle

    /// Background maintenance until the calling task is cancelled: every `healthCheckInterval`, closes
    /// connections idle longer than `idleTimeout` and pings the other connections idle for at least
    /// `healthCheckInterval`, discarding those that fail. Returns (without throwing) when cancelled.
    /// Does not close the pool; call `close()` for that.
    public func run() async throws {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: options.healthCheckInterval)
            } catch {
                return
            }
            await maintain()
        }
    }

    /// One maintenance pass (exposed to tests).
    func maintain() async {
        let now = ContinuousClock.now
        let (expired, stale) = state.withLock { state in
            let expired = state.machine.takeIdle(idleBefore: now - options.idleTimeout)
            let stale = state.machine.takeIdle(idleBefore: now - options.healthCheckInterval)
            return (expired, stale)
        }
        for entry in expired {
            release(entry.connection, reusable: false)
        }
        for entry in stale {
            let slot = entry.connection
            let healthy = await withCheckedContinuation { continuation in
                slot.queue.async { continuation.resume(returning: slot.healthCheck()) }
            }
            release(slot, reusable: healthy, idleSince: entry.idleSince)
        }
    }

    /// Closes idle connections, fails waiting callers with `.poolClosed` and closes connections in use when
    /// they are returned. Later checkouts fail with `.poolClosed`.
    public func close() {
        let (idle, waiters) = state.withLock { state in
            let (idle, waiterIDs) = state.machine.close()
            let continuations = waiterIDs.compactMap { state.waiters.removeValue(forKey: $0) }
            return (idle, continuations)
        }
        for slot in idle {
            slot.close()
        }
        for waiter in waiters {
            waiter.resume(throwing: PostgresError(code: .poolClosed))
        }
    }
}

/// A pooled connection held by `PostgresPool.withSession`: each `run` executes on the connection's own thread, in
/// order. Valid only inside the `withSession` body that made it.
public struct PostgresSession: Sendable {
    let slot: PoolSlot

    /// Runs `body` on the held connection and returns what it returns.
    public func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws -> T {
        let slot = self.slot
        let result: Result<T, any Error> = await withCheckedContinuation { continuation in
            slot.queue.async { continuation.resume(returning: slot.step(body)) }
        }
        return try result.get()
    }

    /// Runs one statement and returns its rows.
    @discardableResult
    public func query(_ query: PostgresQuery) async throws -> PostgresRows {
        try await run { try $0.query(query) }
    }

    /// Runs one statement and returns the number of affected rows.
    @discardableResult
    public func execute(_ query: PostgresQuery) async throws -> Int {
        try await run { try $0.execute(query) }
    }
}
