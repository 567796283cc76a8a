import CLibPQ
import Foundation
import Synchronization

/// One notification received by a `PostgresListener`.
public struct PostgresNotification: Sendable, Hashable {
    /// The channel it was sent on.
    public var channel: String
    /// The payload (empty if none was given).
    public var payload: String
    /// The process ID of the sending backend.
    public var pid: Int32

    /// Creates a notification.
    public init(channel: String, payload: String, pid: Int32) {
        self.channel = channel
        self.payload = payload
        self.pid = pid
    }
}

/// LISTENs on channels over a dedicated connection and delivers notifications as an `AsyncStream`.
///
/// `run()` owns the connection on its own thread: it waits on the socket with `poll` (no busy loop), pings
/// the server when idle for `keepaliveInterval`, and after the connection breaks reconnects with exponential
/// backoff (50 ms doubling to 5 s) and LISTENs again. Notifications sent while disconnected are lost, so
/// consumers should treat a notification as a wake-up and re-check state (e.g. poll once on a timer too).
///
/// ```swift
/// let listener = PostgresListener(config, channels: ["deliveries"])
/// // in a service group: try await listener.run()
/// for await note in listener.notifications { … }
/// // elsewhere: try await pool.notify(channel: "deliveries", payload: "42")
/// ```
public final class PostgresListener: Sendable {
    private struct Control {
        var cancelled = false
        var started = false
        var listening = false
        var connections = 0
    }

    private let configuration: PostgresConfiguration
    /// The channels listened on.
    public let channels: [String]
    /// How long the socket may be silent before a keepalive ping. Default 10 s.
    public let keepaliveInterval: Duration
    /// Notifications, in arrival order. Buffers the newest 10,000 if nobody consumes; finishes when `run()`
    /// returns.
    public let notifications: AsyncStream<PostgresNotification>
    private let continuation: AsyncStream<PostgresNotification>.Continuation
    private let control = Mutex(Control())
    /// A self-pipe that wakes the listener thread on cancellation.
    private let wakeReader: Int32
    private let wakeWriter: Int32

    /// Creates a listener; nothing happens until `run()`.
    public init(
        _ configuration: PostgresConfiguration, channels: [String], keepaliveInterval: Duration = .seconds(10)
    ) {
        self.configuration = configuration
        self.channels = channels
        self.keepaliveInterval = keepaliveInterval
        (notifications, continuation) = AsyncStream.makeStream(
            of: PostgresNotification.self, bufferingPolicy: .bufferingNewest(10_000))
        var descriptors: [Int32] = [-1, -1]
        if pipe(&descriptors) == 0 {
            // Non-blocking, and close-on-exec so that processes spawned meanwhile do not inherit it.
            for fd in descriptors {
                _ = fcntl(fd, F_SETFL, O_NONBLOCK)
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            }
        }
        wakeReader = descriptors[0]
        wakeWriter = descriptors[1]
    }

    deinit {
        continuation.finish()
        if wakeReader >= 0 {
            close(wakeReader)
        }
        if wakeWriter >= 0 {
            close(wakeWriter)
        }
    }

    /// True while connected with all LISTENs in place.
    public var isListening: Bool { control.withLock { $0.listening } }

    /// How many times a connection has been established and LISTENs issued (1 after the first connect).
    public var connectionCount: Int { control.withLock { $0.connections } }

    /// Listens until the calling task is cancelled, then closes the connection, finishes `notifications` and
    /// returns. Can be called once; a second call returns immediately.
    public func run() async throws {
        let first = control.withLock { control in
            defer { control.started = true }
            return !control.started
        }
        guard first else { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                let thread = Thread {
                    self.loop()
                    done.resume()
                }
                thread.name = "postgres.listener"
                thread.start()
            }
        } onCancel: {
            self.stop()
        }
        continuation.finish()
    }

    private func stop() {
        control.withLock { $0.cancelled = true }
        var byte: UInt8 = 1
        _ = write(wakeWriter, &byte, 1)
    }

    private var isCancelled: Bool { control.withLock { $0.cancelled } }

    // MARK: Listener thread

    private func loop() {
        let initialBackoff = 0.05
        var backoff = initialBackoff
        while !isCancelled {
            let connection: PostgresConnection
            do {
                connection = try PostgresConnection(connecting: configuration)
                for channel in channels {
                    try connection.execute(PostgresQuery(unsafeSQL: "LISTEN " + PostgresIdentifier.quote(channel)))
                }
            } catch {
                guard sleep(seconds: backoff) else { return }
                backoff = min(backoff * 2, 5)
                continue
            }
            backoff = initialBackoff
            control.withLock { control in
                control.listening = true
                control.connections += 1
            }
            serve(connection)
            control.withLock { $0.listening = false }
        }
    }

    /// Waits for notifications until the connection breaks or the listener is stopped.
    private func serve(_ connection: PostgresConnection) {
        let socket = PQsocket(connection.handle)
        let timeout = Int32(max(1, keepaliveInterval.timeInterval * 1000))
        while !isCancelled {
            deliver(connection)
            var descriptors = [
                pollfd(fd: socket, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&descriptors, 2, timeout)
            if ready < 0 {
                if errno == EINTR {
                    continue
                }
                return
            }
            if descriptors[1].revents != 0 {
                drainWakePipe()
                continue
            }
            if ready == 0 {
                guard connection.validate(forcePing: true, discardingNotifications: false) else { return }
                continue
            }
            if PQconsumeInput(connection.handle) == 0 || connection.isBroken {
                deliver(connection)
                return
            }
        }
    }

    private func deliver(_ connection: PostgresConnection) {
        while let notification = PQnotifies(connection.handle) {
            let note = PostgresNotification(
                channel: String(cString: notification.pointee.relname),
                payload: notification.pointee.extra.map { String(cString: $0) } ?? "",
                pid: notification.pointee.be_pid)
            PQfreemem(notification)
            continuation.yield(note)
        }
    }

    /// Sleeps, waking early on stop. Returns false if stopped.
    private func sleep(seconds: Double) -> Bool {
        var descriptor = pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0)
        _ = poll(&descriptor, 1, Int32(seconds * 1000))
        return !isCancelled
    }

    private func drainWakePipe() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(wakeReader, &buffer, buffer.count) > 0 {}
    }
}
