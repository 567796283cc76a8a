/// The pool's bookkeeping as a plain state machine: no I/O, no clocks of its own, no locks.
/// `PostgresPool` holds it behind a `Mutex` and carries out the actions it returns.
///
/// Invariants: `open` counts idle, leased and connecting connections and never exceeds `maxConnections`;
/// waiters exist only while no connection is idle and `open == maxConnections`; waiters are served FIFO.
struct PoolStateMachine<Connection> {
    typealias Instant = ContinuousClock.Instant

    struct IdleEntry {
        var connection: Connection
        var idleSince: Instant
    }

    /// What an acquirer receives.
    enum Grant {
        /// Reuse this idle connection, which has been idle for `idleFor`.
        case connection(Connection, idleSince: Instant)
        /// A slot was reserved: open a new connection.
        case create
    }

    enum AcquireAction {
        case grant(Grant)
        /// Wait; the waiter was queued.
        case wait
        case fail(PostgresError)
    }

    enum ReleaseAction {
        case none
        /// Hand the grant to this waiter.
        case grant(waiter: Int, Grant)
        /// The pool is closed: close this connection.
        case close(Connection)
    }

    let maxConnections: Int
    private(set) var idle: [IdleEntry] = []
    private(set) var open = 0
    private(set) var waiters: [Int] = []
    private(set) var isClosed = false

    init(maxConnections: Int) {
        self.maxConnections = max(1, maxConnections)
    }

    var leased: Int { open - idle.count }

    /// A caller wants a connection. The most recently used idle connection is preferred, so surplus connections
    /// age out through the idle timeout.
    mutating func acquire(waiter: Int) -> AcquireAction {
        if isClosed {
            return .fail(PostgresError(code: .poolClosed))
        }
        if let entry = idle.popLast() {
            return .grant(.connection(entry.connection, idleSince: entry.idleSince))
        }
        if open < maxConnections {
            open += 1
            return .grant(.create)
        }
        waiters.append(waiter)
        return .wait
    }

    /// A leased connection comes back healthy. `idleSince` is normally now; health checks pass the original
    /// time so checked connections still reach the idle timeout.
    mutating func release(_ connection: Connection, idleSince: Instant) -> ReleaseAction {
        if isClosed {
            open -= 1
            return .close(connection)
        }
        if !waiters.isEmpty {
            let waiter = waiters.removeFirst()
            return .grant(waiter: waiter, .connection(connection, idleSince: idleSince))
        }
        idle.append(IdleEntry(connection: connection, idleSince: idleSince))
        return .none
    }

    /// A leased or connecting connection went away (broken, failed to connect, reaped). Its slot passes to the
    /// first waiter, which then opens a new connection.
    mutating func discard() -> ReleaseAction {
        if !isClosed, !waiters.isEmpty {
            let waiter = waiters.removeFirst()
            return .grant(waiter: waiter, .create)
        }
        open -= 1
        return .none
    }

    /// A waiter gave up (timeout or cancellation). Returns false if it was no longer waiting.
    mutating func removeWaiter(_ waiter: Int) -> Bool {
        guard let index = waiters.firstIndex(of: waiter) else { return false }
        waiters.remove(at: index)
        return true
    }

    /// Takes idle connections idle since before `cutoff` out of the pool (they count as leased until released
    /// or discarded).
    mutating func takeIdle(idleBefore cutoff: Instant) -> [IdleEntry] {
        let taken = idle.filter { $0.idleSince < cutoff }
        idle.removeAll { $0.idleSince < cutoff }
        return taken
    }

    /// Closes the pool: returns the idle connections to close and the waiters to fail.
    mutating func close() -> (idle: [Connection], waiters: [Int]) {
        isClosed = true
        let connections = idle.map(\.connection)
        open -= idle.count
        idle.removeAll()
        let failed = waiters
        waiters.removeAll()
        return (connections, failed)
    }
}

extension PoolStateMachine.Grant: Sendable where Connection: Sendable {}
extension PoolStateMachine.IdleEntry: Sendable where Connection: Sendable {}
extension PoolStateMachine.ReleaseAction: Sendable where Connection: Sendable {}
extension PoolStateMachine.AcquireAction: Sendable where Connection: Sendable {}
