import Synchronization

/// Graceful shutdown, apart from cancellation.
///
/// A `ServiceGroup` asks its services to stop by *triggering* this, not by cancelling them: a service finishes the
/// work it has (a batch it claimed, a request in flight) and returns, with every `await` in it working as usual.
/// Cancellation stays what it is in Swift: stop now. Services read it with ``withGracefulShutdownHandler(operation:onGracefulShutdown:)``,
/// `Task.isShuttingDownGracefully` and ``gracefulShutdown()``, which find the group's trigger in a task-local value;
/// outside a group there is none, and shutdown never begins.
public final class GracefulShutdown: Sendable {
    @TaskLocal static var current: GracefulShutdown?

    private struct State {
        var triggered = false
        var nextID = 0
        var handlers: [Int: @Sendable () -> Void] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    /// Whether shutdown has begun.
    public var isTriggered: Bool { state.withLock { $0.triggered } }

    /// Begins shutdown: every registered handler runs once, now. Later calls do nothing.
    public func trigger() {
        let handlers = state.withLock { state -> [@Sendable () -> Void] in
            guard !state.triggered else { return [] }
            state.triggered = true
            defer { state.handlers = [:] }
            return state.handlers.sorted { $0.key < $1.key }.map(\.value)
        }
        for handler in handlers { handler() }
    }

    /// Runs `body` with this as the current trigger of the task and its child tasks.
    public func whileCurrent<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        try await Self.$current.withValue(self) { try await body() }
    }

    /// Registers `handler`; nil (and the handler is not kept) when shutdown has begun already.
    fileprivate func register(_ handler: @escaping @Sendable () -> Void) -> Int? {
        state.withLock { state in
            guard !state.triggered else { return nil }
            state.nextID += 1
            state.handlers[state.nextID] = handler
            return state.nextID
        }
    }

    fileprivate func unregister(_ id: Int) {
        _ = state.withLock { $0.handlers.removeValue(forKey: id) }
    }
}

/// Runs `operation`; if graceful shutdown begins while it runs (or has begun already), `onGracefulShutdown` is called
/// once, on the thread that began it, so that the operation can wind down (stop accepting, wake its waits).
public func withGracefulShutdownHandler<T>(
    operation: () async throws -> T, onGracefulShutdown: @escaping @Sendable () -> Void
) async rethrows -> T {
    guard let shutdown = GracefulShutdown.current else { return try await operation() }
    guard let id = shutdown.register(onGracefulShutdown) else {
        onGracefulShutdown()
        return try await operation()
    }
    defer { shutdown.unregister(id) }
    return try await operation()
}

/// Suspends until graceful shutdown begins or the task is cancelled; outside a service group, until cancelled.
public func gracefulShutdown() async {
    let waiter = Mutex<CheckedContinuation<Void, Never>?>(nil)
    // Whoever comes first (shutdown, cancellation, or the check below) resumes the continuation, exactly once.
    let resume: @Sendable () -> Void = { waiter.withLock { $0.take() }?.resume() }
    await withTaskCancellationHandler {
        await withGracefulShutdownHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                waiter.withLock { $0 = continuation }
                if Task.isCancelled || Task.isShuttingDownGracefully { resume() }
            }
        } onGracefulShutdown: {
            resume()
        }
    } onCancel: {
        resume()
    }
}

/// A service whose work may simply be cancelled (a maintenance loop, a listener that drains on cancellation):
/// graceful shutdown cancels it.
public struct CancellingService: Service {
    private let body: @Sendable () async throws -> Void

    public init(_ body: @escaping @Sendable () async throws -> Void) { self.body = body }

    public func run() async throws {
        let task = Task { try await body() }
        try await withGracefulShutdownHandler {
            try await withTaskCancellationHandler {
                try await task.value
            } onCancel: {
                task.cancel()
            }
        } onGracefulShutdown: {
            task.cancel()
        }
    }
}

extension Task where Success == Never, Failure == Never {
    /// Whether the service group running this task has begun a graceful shutdown (false outside a group).
    public static var isShuttingDownGracefully: Bool { GracefulShutdown.current?.isTriggered ?? false }
}
