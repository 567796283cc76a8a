import Dispatch
import Foundation
import Observability
import Synchronization

/// A long-lived component: an HTTP listener, a connection pool's health checker, a worker loop.
///
/// `run()` works until graceful shutdown begins (``withGracefulShutdownHandler(operation:onGracefulShutdown:)``,
/// `Task.isShuttingDownGracefully`), then finishes what is in flight (drains) and returns; every `await` keeps
/// working while it drains. Cancellation means stop at once. Throwing means the component failed; the group then
/// stops the others. A component whose work may simply be cancelled runs as a ``CancellingService``.
public protocol Service: Sendable {
    func run() async throws
}

/// A service made from a closure, for small components.
public struct ClosureService: Service {
    private let body: @Sendable () async throws -> Void
    public init(_ body: @escaping @Sendable () async throws -> Void) { self.body = body }
    public func run() async throws { try await body() }
}

/// Runs services together and shuts them all down on SIGTERM/SIGINT, or when any one of them stops.
///
/// Shutdown is graceful, not cancellation: the group begins a ``GracefulShutdown`` that every service sees, and
/// waits for all of them to return, up to `drainTimeout`; past that, or on a second signal, the process exits at
/// once with status 1. Cancelling the task that runs the group cancels the services (stop at once).
public struct ServiceGroup: Sendable {
    public struct Configuration: Sendable {
        /// Signals that start a graceful shutdown. Default SIGTERM and SIGINT.
        public var signals: [Int32]
        /// How long services may take to drain after shutdown begins. Default 30 s.
        public var drainTimeout: Duration

        public init(signals: [Int32] = [SIGTERM, SIGINT], drainTimeout: Duration = .seconds(30)) {
            self.signals = signals
            self.drainTimeout = drainTimeout
        }
    }

    /// Why the group stopped.
    public enum StopReason: Sendable, Equatable {
        case signal(Int32)
        case serviceFinished(String)
        case serviceFailed(String)
        case cancelled
    }

    private let services: [(name: String, service: any Service)]
    private let configuration: Configuration
    private let logger: Logger

    public init(
        services: [(name: String, service: any Service)], configuration: Configuration = .init(), logger: Logger
    ) {
        self.services = services
        self.configuration = configuration
        self.logger = logger
    }

    private enum Event: Sendable {
        case signal(Int32)
        case finished(String)
        case failed(String, any Error)
    }

    /// Runs every service until shutdown; rethrows the first service error, if any.
    @discardableResult
    public func run() async throws -> StopReason {
        let signals = SignalStream(signals: configuration.signals)
        defer { signals.cancel() }
        // A signal that arrives before Dispatch has registered its handler would be lost (the default action is
        // already ignored): services start only once every signal is observed.
        await signals.registered()
        let shutdown = GracefulShutdown()
        return try await withThrowingTaskGroup(of: Event?.self) { group in
            for (name, service) in services {
                group.addTask {
                    do {
                        try await shutdown.whileCurrent { try await service.run() }
                        return .finished(name)
                    } catch {
                        return .failed(name, error)
                    }
                }
            }
            group.addTask {
                for await signal in signals.stream {
                    return .signal(signal)
                }
                return nil
            }

            var reason = StopReason.cancelled
            var firstError: (any Error)?
            if let first = try await group.next() ?? nil {
                switch first {
                case .signal(let signal):
                    reason = .signal(signal)
                    logger.notice(
                        "shutting down",
                        metadata: [
                            "signal": .int(Int(signal)), "drain.timeout": .string("\(configuration.drainTimeout)"),
                        ])
                case .finished(let name):
                    reason = .serviceFinished(name)
                    logger.notice("service stopped; shutting down the others", metadata: ["service": .string(name)])
                case .failed(let name, let error):
                    reason = .serviceFailed(name)
                    firstError = error
                    logger.error(
                        "service failed; shutting down the others",
                        metadata: ["service": .string(name), "error": .string(String(describing: error))])
                }
            }
            shutdown.trigger()
            // The signal task ends (a second signal is the watchdog's from now on).
            signals.endStream()
            let watchdog = Watchdog(timeout: configuration.drainTimeout, signals: signals, logger: logger)
            defer { watchdog.disarm() }
            while let event = try await group.next() {
                if case .failed(let name, let error)? = event {
                    if error is CancellationError { continue }
                    logger.warning(
                        "service failed while draining",
                        metadata: ["service": .string(name), "error": .string(String(describing: error))])
                    if firstError == nil { firstError = error }
                }
            }
            if let firstError { throw firstError }
            return reason
        }
    }
}

/// Bridges POSIX signals to an AsyncStream through Dispatch signal sources.
final class SignalStream: Sendable {
    let stream: AsyncStream<Int32>
    private let sources: Mutex<[any DispatchSourceSignal]>
    private let continuation: AsyncStream<Int32>.Continuation

    private let registration: SignalRegistration

    init(signals: [Int32]) {
        let (stream, continuation) = AsyncStream<Int32>.makeStream()
        self.stream = stream
        self.continuation = continuation
        let registration = SignalRegistration(pending: signals.count)
        self.registration = registration
        var sources: [any DispatchSourceSignal] = []
        for sig in signals {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { continuation.yield(sig) }
            source.setRegistrationHandler { registration.didRegister() }
            source.resume()
            sources.append(source)
        }
        self.sources = Mutex(sources)
    }

    /// Returns once Dispatch observes every signal (their sources are registered).
    func registered() async { await registration.wait() }

    /// Observes later signals during the drain: a second one forces an exit.
    func onNextSignal(_ handler: @escaping @Sendable (Int32) -> Void) {
        sources.withLock { sources in
            for source in sources {
                let sig = Int32(source.handle)
                source.setEventHandler { handler(sig) }
            }
        }
    }

    /// Ends `stream` (its reader returns) without unregistering the signals.
    func endStream() { continuation.finish() }

    func cancel() {
        sources.withLock { sources in
            for source in sources { source.cancel() }
        }
        continuation.finish()
    }
}

/// Counts signal sources until Dispatch has registered them all, and wakes who waits for that.
final class SignalRegistration: Sendable {
    private let state: Mutex<(pending: Int, waiters: [CheckedContinuation<Void, Never>])>

    init(pending: Int) { state = Mutex((pending, [])) }

    func didRegister() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.pending -= 1
            guard state.pending <= 0 else { return [] }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state in
                if state.pending > 0 { state.waiters.append(continuation) }
                return state.pending <= 0
            }
            if ready { continuation.resume() }
        }
    }
}

/// Forces the process out if the drain takes too long or the operator signals again.
final class Watchdog: Sendable {
    private let timer: Mutex<any DispatchSourceTimer>

    init(timeout: Duration, signals: SignalStream, logger: Logger) {
        let timer = DispatchSource.makeTimerSource(queue: .global())
        let (seconds, attoseconds) = timeout.components
        let nanos = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
        timer.schedule(deadline: .now() + .nanoseconds(nanos))
        timer.setEventHandler {
            logger.critical("drain timed out; exiting")
            exit(1)
        }
        timer.resume()
        self.timer = Mutex(timer)
        signals.onNextSignal { sig in
            logger.critical("second signal during drain; exiting", metadata: ["signal": .int(Int(sig))])
            exit(1)
        }
    }

    func disarm() { timer.withLock { $0.cancel() } }
}
