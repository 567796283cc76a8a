/// The protocol logic of one client connection: stream capacity from the peer's settings, the queue of requests
/// waiting for a stream, GOAWAY and REFUSED_STREAM retries, per-request deadlines, PING keep-alive and idle close.
///
/// It does no I/O. Every input returns `ConnectionAction`s that the socket layer carries out. `Payload` is whatever
/// the I/O layer needs per request (the request and its continuation); the machine never looks inside it.
struct ConnectionStateMachine<Payload> {
    /// Limits and timers.
    struct Configuration {
        /// Requests allowed to wait for a free stream on this connection.
        var maxQueued: Int = 100_000
        /// How often a request may be retried after GOAWAY or REFUSED_STREAM.
        var maxRetries: Int = 3
        /// Time allowed for TCP connect plus TLS handshake.
        var connectTimeout: Duration = .seconds(10)
        /// PING interval while connected; `nil` disables keep-alive.
        var pingInterval: Duration? = .seconds(60)
        /// Time allowed for a PING acknowledgement before the connection counts as dead; also the time a closing
        /// connection gets to hand its last frames to the peer before it is torn down regardless.
        var pingTimeout: Duration = .seconds(10)
        /// Time without streams after which the connection closes itself; `nil` keeps it open.
        var idleTimeout: Duration? = .seconds(300)
        /// Concurrency assumed until the peer's SETTINGS arrive (RFC 9113 recommends at least 100).
        var initialMaxConcurrentStreams: Int = 100
    }

    /// One request as the machine tracks it.
    struct Entry {
        /// The I/O layer's data.
        var payload: Payload
        /// When the request fails with `timeout`; `nil` for none.
        var deadline: ContinuousClock.Instant?
        /// How many times it has been retried already.
        var retries: Int = 0
    }

    /// Why the machine wants the connection closed.
    enum CloseReason: Equatable {
        /// No streams for `idleTimeout`; close with GOAWAY(NO_ERROR).
        case idle
        /// No PING acknowledgement within `pingTimeout`.
        case pingTimeout
        /// GOAWAY received and every remaining stream finished.
        case drained
        /// TCP/TLS setup did not finish within `connectTimeout`.
        case connectTimeout
        /// The owner asked for it.
        case shutdown
        /// A close above was asked for `pingTimeout` ago and the connection is still there: the peer has not taken
        /// the final frames (it stopped reading). Tear it down without them.
        case flushTimeout
    }

    /// Connection phases.
    enum State: Equatable {
        /// Waiting for a backoff delay before connecting.
        case waiting(until: ContinuousClock.Instant)
        /// TCP connect and TLS handshake in progress.
        case connecting(deadline: ContinuousClock.Instant)
        /// Ready; streams can be opened.
        case active
        /// GOAWAY received: no new streams, the remaining ones finish.
        case draining
        /// Gone.
        case closed
    }

    let configuration: Configuration
    private(set) var state: State
    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS (or the initial assumption).
    private(set) var peerMaxConcurrentStreams: Int
    private var queue: [Entry?] = []
    private var queueHead = 0
    /// Live entries in `queue`.
    private(set) var queuedCount = 0
    private var inFlight: [Int32: Entry] = [:]
    /// `startStream` actions handed out but not yet confirmed with `streamStarted`/`streamStartFailed`.
    private var starting = 0
    private var pingSentAt: ContinuousClock.Instant?
    private var nextPingAt: ContinuousClock.Instant?
    private var idleSince: ContinuousClock.Instant?
    /// When a connection told to close (gracefully, after flushing) is torn down anyway; nil when none is pending.
    private var closeDeadline: ContinuousClock.Instant?
    /// Whether `.detach` was handed out: the pool routes nothing new here.
    private var detached = false
    /// Whether the connection ever became active.
    private(set) var didConnect = false

    /// Streams open or being opened.
    var activeCount: Int { inFlight.count + starting }

    /// Whether no request is queued or in flight.
    var isEmpty: Bool { activeCount == 0 && queuedCount == 0 }

    /// A machine that connects at once, or after `notBefore` (a backoff delay).
    init(configuration: Configuration, now: ContinuousClock.Instant, notBefore: ContinuousClock.Instant? = nil) {
        self.configuration = configuration
        self.peerMaxConcurrentStreams = configuration.initialMaxConcurrentStreams
        if let notBefore, notBefore > now {
            state = .waiting(until: notBefore)
        } else {
            state = .connecting(deadline: now + configuration.connectTimeout)
        }
    }

    /// Whether the I/O layer should start connecting right away (otherwise a later `tick` says `.connect`).
    var shouldConnectNow: Bool {
        if case .connecting = state { return true }
        return false
    }

    // MARK: Connection events

    /// TCP and TLS are up and ALPN selected h2.
    mutating func connected(now: ContinuousClock.Instant) -> [ConnectionAction<Payload>] {
        guard case .connecting = state else { return [] }
        state = .active
        didConnect = true
        if let interval = configuration.pingInterval { nextPingAt = now + interval }
        var actions: [ConnectionAction<Payload>] = []
        startQueued(into: &actions)
        markIdleIfEmpty(now: now)
        return actions
    }

    /// The peer's SETTINGS arrived.
    mutating func peerSettingsChanged(maxConcurrentStreams: Int) -> [ConnectionAction<Payload>] {
        peerMaxConcurrentStreams = max(0, maxConcurrentStreams)
        var actions: [ConnectionAction<Payload>] = []
        startQueued(into: &actions)
        return actions
    }

    /// The socket or TLS failed, or the peer closed the connection. In-flight requests fail (they may have been
    /// processed); queued ones are retried elsewhere if the connection had been up, or fail with `error` if it never
    /// came up (a connect failure).
    mutating func connectionLost(_ error: HTTP2Error) -> [ConnectionAction<Payload>] {
        if state == .closed { return [] }
        let wasUp = didConnect
        state = .closed
        var actions: [ConnectionAction<Payload>] = []
        for streamID in inFlight.keys.sorted() {
            let entry = inFlight.removeValue(forKey: streamID)!
            actions.append(.fail(entry, error.processed(true)))
        }
        for entry in drainQueue() {
            actions.append(wasUp ? .retry(entry) : .fail(entry, error.processed(false)))
        }
        return actions
    }

    /// The owner closes the connection (client shutdown). Anything left fails with `shutdown`.
    mutating func close(now: ContinuousClock.Instant) -> [ConnectionAction<Payload>] {
        if state == .closed { return [] }
        let error = HTTP2Error(.shutdown, "the client is shutting down")
        var actions = connectionLost(error)
        closing(.shutdown, now: now, into: &actions)
        return actions
    }

    /// GOAWAY from the peer: streams above `lastStreamID` were not processed and are retried (bounded), streams at or
    /// below it finish normally, queued requests move to another connection, and no new stream opens here.
    mutating func goAwayReceived(
        lastStreamID: Int32, errorCode: HTTP2ErrorCode, now: ContinuousClock.Instant
    ) -> [ConnectionAction<Payload>] {
        switch state {
        case .closed: return []
        case .waiting, .connecting, .active, .draining: break
        }
        var actions: [ConnectionAction<Payload>] = []
        detach(into: &actions)
        state = .draining
        let error = HTTP2Error(.goAway, "the server sent GOAWAY", wireCode: errorCode)
        for streamID in inFlight.keys.sorted() where streamID > lastStreamID {
            let entry = inFlight.removeValue(forKey: streamID)!
            actions.append(retryOrFail(entry, error))
        }
        for entry in drainQueue() { actions.append(.retry(entry)) }
        closeIfDrained(now: now, into: &actions)
        return actions
    }

    /// A PING acknowledgement arrived.
    mutating func pingAcknowledged(now: ContinuousClock.Instant) {
        pingSentAt = nil
        if let interval = configuration.pingInterval { nextPingAt = now + interval }
    }

    // MARK: Requests and streams

    /// A new (or retried) request for this connection.
    mutating func enqueue(_ entry: Entry, now: ContinuousClock.Instant) -> [ConnectionAction<Payload>] {
        // The deadline first: a request past it fails here, rather than being handed back to the pool to come round
        // again (and again, while the pool still routes to this connection).
        if let deadline = entry.deadline, deadline <= now {
            return [.fail(entry, HTTP2Error(.timeout, "the request deadline passed before it was sent"))]
        }
        switch state {
        case .closed, .draining:
            return [.retry(entry)]
        case .waiting, .connecting, .active:
            break
        }
        idleSince = nil
        if state == .active && queuedCount == 0 && activeCount < peerMaxConcurrentStreams {
            starting += 1
            return [.startStream(entry)]
        }
        guard queuedCount < configuration.maxQueued else {
            return [.fail(entry, HTTP2Error(.queueFull, "too many requests are waiting for a stream"))]
        }
        queue.append(entry)
        queuedCount += 1
        return []
    }

    /// The I/O layer opened the stream for a `startStream` entry.
    mutating func streamStarted(_ entry: Entry, streamID: Int32) {
        starting -= 1
        inFlight[streamID] = entry
    }

    /// The I/O layer could not open the stream for a `startStream` entry.
    mutating func streamStartFailed(
        _ entry: Entry, _ error: HTTP2Error, now: ContinuousClock.Instant
    ) -> [ConnectionAction<Payload>] {
        starting -= 1
        var actions: [ConnectionAction<Payload>] = [.fail(entry, error.processed(false))]
        afterStreamEnded(now: now, into: &actions)
        return actions
    }

    /// The connection has used up its stream IDs (2^31 - 1 of them: nghttp2 refuses the request with
    /// STREAM_ID_NOT_AVAILABLE): like a GOAWAY of our own, the request and the queued ones go to another connection
    /// (nothing of them was sent), the streams in flight finish, and then it closes. Left open, every request routed
    /// here failed at once, and, never busy, it drew most of the pool's traffic.
    mutating func streamIDsExhausted(_ entry: Entry, now: ContinuousClock.Instant) -> [ConnectionAction<Payload>] {
        starting -= 1
        var actions: [ConnectionAction<Payload>] = []
        detach(into: &actions)
        if state != .closed { state = .draining }
        actions.append(.retry(entry))
        for queued in drainQueue() { actions.append(.retry(queued)) }
        closeIfDrained(now: now, into: &actions)
        return actions
    }

    /// A stream closed: `noError` completes it, REFUSED_STREAM retries it, anything else fails it. Unknown streams
    /// (already timed out or retried) are ignored.
    mutating func streamClosed(
        streamID: Int32, errorCode: HTTP2ErrorCode, now: ContinuousClock.Instant, failing error: HTTP2Error? = nil
    ) -> [ConnectionAction<Payload>] {
        guard let entry = inFlight.removeValue(forKey: streamID) else { return [] }
        var actions: [ConnectionAction<Payload>] = []
        switch errorCode {
        case _ where error != nil:
            // We reset the stream ourselves (e.g. its response grew past the limit): fail it with our reason.
            actions.append(.fail(entry, error!))
        case .noError:
            actions.append(.succeed(entry, streamID: streamID))
        case .refusedStream:
            let error = HTTP2Error(.streamReset, "the server refused the stream", wireCode: errorCode)
            actions.append(retryOrFail(entry, error))
        default:
            let error = HTTP2Error(
                .streamReset, "the server reset the stream", mayHaveBeenProcessed: true, wireCode: errorCode)
            actions.append(.fail(entry, error))
        }
        afterStreamEnded(now: now, into: &actions)
        return actions
    }

    // MARK: Time

    /// Deadlines, PING scheduling and timeout, idle close, connect timeout and backoff waiting.
    mutating func tick(now: ContinuousClock.Instant) -> [ConnectionAction<Payload>] {
        var actions: [ConnectionAction<Payload>] = []
        switch state {
        case .closed:
            // A close waits for the output to drain; a peer with a zero window would hold the socket, the session
            // and up to a write batch of output forever.
            if let deadline = closeDeadline, now >= deadline {
                closeDeadline = nil
                return [.close(.flushTimeout)]
            }
            return []
        case .waiting(let until):
            if now >= until {
                state = .connecting(deadline: now + configuration.connectTimeout)
                actions.append(.connect)
            }
        case .connecting(let deadline):
            if now >= deadline {
                actions = connectionLost(HTTP2Error(.connectFailed, "connect timed out"))
                closing(.connectTimeout, now: now, into: &actions)
                return actions
            }
        case .active, .draining:
            if let sentAt = pingSentAt, now - sentAt >= configuration.pingTimeout {
                actions = connectionLost(HTTP2Error(.connectionClosed, "the server stopped answering PING"))
                closing(.pingTimeout, now: now, into: &actions)
                return actions
            }
            if state == .active, pingSentAt == nil, let due = nextPingAt, now >= due {
                pingSentAt = now
                nextPingAt = nil
                actions.append(.sendPing)
            }
        }
        expireDeadlines(now: now, into: &actions)
        if state == .active, isEmpty, let since = idleSince, let idle = configuration.idleTimeout,
            now - since >= idle
        {
            state = .closed
            closing(.idle, now: now, into: &actions)
        }
        return actions
    }

    // MARK: Helpers

    private mutating func expireDeadlines(now: ContinuousClock.Instant, into actions: inout [ConnectionAction<Payload>])
    {
        var expired: [Int32] = []
        for (streamID, entry) in inFlight {
            if let deadline = entry.deadline, deadline <= now { expired.append(streamID) }
        }
        for streamID in expired.sorted() {
            let entry = inFlight.removeValue(forKey: streamID)!
            actions.append(.resetStream(streamID: streamID, errorCode: .cancel))
            actions.append(
                .fail(entry, HTTP2Error(.timeout, "no response before the deadline", mayHaveBeenProcessed: true)))
        }
        if queuedCount > 0 {
            for index in queueHead..<queue.count {
                guard let entry = queue[index], let deadline = entry.deadline, deadline <= now else { continue }
                queue[index] = nil
                queuedCount -= 1
                actions.append(.fail(entry, HTTP2Error(.timeout, "the request waited for a stream past its deadline")))
            }
            compactQueue()
        }
        if !expired.isEmpty { afterStreamEnded(now: now, into: &actions) }
    }

    private func retryOrFail(_ entry: Entry, _ error: HTTP2Error) -> ConnectionAction<Payload> {
        guard entry.retries < configuration.maxRetries else { return .fail(entry, error.processed(false)) }
        var retried = entry
        retried.retries += 1
        return .retry(retried)
    }

    private mutating func afterStreamEnded(
        now: ContinuousClock.Instant, into actions: inout [ConnectionAction<Payload>]
    ) {
        switch state {
        case .active:
            startQueued(into: &actions)
            markIdleIfEmpty(now: now)
        case .draining:
            closeIfDrained(now: now, into: &actions)
        case .waiting, .connecting, .closed:
            break
        }
    }

    private mutating func closeIfDrained(now: ContinuousClock.Instant, into actions: inout [ConnectionAction<Payload>])
    {
        if state == .draining && activeCount == 0 {
            state = .closed
            closing(.drained, now: now, into: &actions)
        }
    }

    /// Hands out `.detach` once: from here on the pool sends new requests elsewhere.
    private mutating func detach(into actions: inout [ConnectionAction<Payload>]) {
        if !detached {
            detached = true
            actions.append(.detach)
        }
    }

    /// Asks for the close (the state is `.closed` already): the pool stops routing here first, and a connection that
    /// cannot flush its last frames within `pingTimeout` is torn down by `tick` (`flushTimeout`).
    private mutating func closing(
        _ reason: CloseReason, now: ContinuousClock.Instant, into actions: inout [ConnectionAction<Payload>]
    ) {
        detach(into: &actions)
        actions.append(.close(reason))
        closeDeadline = now + configuration.pingTimeout
    }

    private mutating func markIdleIfEmpty(now: ContinuousClock.Instant) {
        if isEmpty && idleSince == nil { idleSince = now }
    }

    private mutating func startQueued(into actions: inout [ConnectionAction<Payload>]) {
        guard state == .active else { return }
        while queuedCount > 0 && activeCount < peerMaxConcurrentStreams {
            guard let entry = popQueue() else { break }
            starting += 1
            actions.append(.startStream(entry))
        }
    }

    private mutating func popQueue() -> Entry? {
        while queueHead < queue.count {
            let entry = queue[queueHead]
            queue[queueHead] = nil
            queueHead += 1
            if let entry {
                queuedCount -= 1
                compactQueue()
                return entry
            }
        }
        compactQueue()
        return nil
    }

    private mutating func compactQueue() {
        if queuedCount == 0 {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
        } else if queueHead > 1024 && queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    private mutating func drainQueue() -> [Entry] {
        var entries: [Entry] = []
        entries.reserveCapacity(queuedCount)
        for index in queueHead..<queue.count {
            if let entry = queue[index] { entries.append(entry) }
        }
        queue.removeAll()
        queueHead = 0
        queuedCount = 0
        return entries
    }
}

/// What the I/O layer must do for a `ConnectionStateMachine`.
enum ConnectionAction<Payload> {
    /// Start TCP connect + TLS (after a backoff wait).
    case connect
    /// Open a stream for the request, then report `streamStarted` or `streamStartFailed`.
    case startStream(ConnectionStateMachine<Payload>.Entry)
    /// The stream finished without error: deliver its response.
    case succeed(ConnectionStateMachine<Payload>.Entry, streamID: Int32)
    /// Fail the request.
    case fail(ConnectionStateMachine<Payload>.Entry, HTTP2Error)
    /// Hand the request back to the pool for another (or a fresh) connection.
    case retry(ConnectionStateMachine<Payload>.Entry)
    /// Send RST_STREAM.
    case resetStream(streamID: Int32, errorCode: HTTP2ErrorCode)
    /// Send a PING.
    case sendPing
    /// Tell the pool to stop routing new requests here (GOAWAY received); the connection keeps draining.
    case detach
    /// Close the connection (after flushing what is pending; at once for `pingTimeout` and `flushTimeout`).
    case close(ConnectionStateMachine<Payload>.CloseReason)
}

/// Exponential backoff with jitter for reconnects: the n-th consecutive failure waits a random time between half and
/// all of `min(maximum, initial * 2^(n-1))`.
struct Backoff {
    /// Delay after the first failure.
    var initial: Duration
    /// Upper bound.
    var maximum: Duration
    /// Consecutive failures so far.
    private(set) var failures = 0

    init(initial: Duration, maximum: Duration) {
        self.initial = initial
        self.maximum = maximum
    }

    /// The un-jittered delay for the current failure count (zero before the first failure).
    var ceiling: Duration {
        guard failures > 0 else { return .zero }
        var delay = initial
        for _ in 1..<min(failures, 62) {
            delay *= 2
            if delay >= maximum { return maximum }
        }
        return min(delay, maximum)
    }

    /// Records a failure and returns how long to wait before the next attempt.
    mutating func fail(using generator: inout some RandomNumberGenerator) -> Duration {
        failures += 1
        let ceiling = self.ceiling
        let fraction = Double.random(in: 0.5...1.0, using: &generator)
        return ceiling * fraction
    }

    /// A connection succeeded: start over.
    mutating func reset() { failures = 0 }
}

extension ConnectionStateMachine.Entry: Sendable where Payload: Sendable {}
