import Testing

@testable import HTTP2

private typealias Machine = ConnectionStateMachine<Int>
private typealias Action = ConnectionAction<Int>

private let start = ContinuousClock.now

private func at(_ seconds: Double) -> ContinuousClock.Instant { start + .milliseconds(Int(seconds * 1000)) }

private func entry(_ id: Int, deadline: Double? = nil) -> Machine.Entry {
    Machine.Entry(payload: id, deadline: deadline.map(at))
}

private func configuration(
    maxQueued: Int = 10, pingInterval: Duration? = .seconds(10), idleTimeout: Duration? = .seconds(60)
) -> Machine.Configuration {
    var configuration = Machine.Configuration()
    configuration.maxQueued = maxQueued
    configuration.maxRetries = 2
    configuration.connectTimeout = .seconds(5)
    configuration.pingInterval = pingInterval
    configuration.pingTimeout = .seconds(2)
    configuration.idleTimeout = idleTimeout
    configuration.initialMaxConcurrentStreams = 100
    return configuration
}

private func started(_ actions: [Action]) -> [Int] {
    actions.compactMap { if case .startStream(let entry) = $0 { entry.payload } else { nil } }
}

private func retried(_ actions: [Action]) -> [Int] {
    actions.compactMap { if case .retry(let entry) = $0 { entry.payload } else { nil } }
}

private func failed(_ actions: [Action]) -> [(Int, HTTP2Error)] {
    actions.compactMap { if case .fail(let entry, let error) = $0 { (entry.payload, error) } else { nil } }
}

private func closeReason(_ actions: [Action]) -> Machine.CloseReason? {
    for action in actions { if case .close(let reason) = action { return reason } }
    return nil
}

/// An active machine whose peer allows `limit` concurrent streams; streams started get IDs 1, 3, 5…
private struct Harness {
    var machine: Machine
    var nextStreamID: Int32 = 1
    var streamOf: [Int: Int32] = [:]

    init(limit: Int, configuration: Machine.Configuration = configuration()) {
        machine = Machine(configuration: configuration, now: at(0))
        _ = machine.connected(now: at(0))
        _ = machine.peerSettingsChanged(maxConcurrentStreams: limit)
    }

    /// Confirms every `startStream` in `actions` and returns the started payloads.
    @discardableResult
    mutating func confirm(_ actions: [Action]) -> [Int] {
        var payloads: [Int] = []
        for action in actions {
            guard case .startStream(let entry) = action else { continue }
            machine.streamStarted(entry, streamID: nextStreamID)
            streamOf[entry.payload] = nextStreamID
            nextStreamID += 2
            payloads.append(entry.payload)
        }
        return payloads
    }

    @discardableResult
    mutating func send(_ id: Int, deadline: Double? = nil, now: Double = 0) -> [Action] {
        let actions = machine.enqueue(entry(id, deadline: deadline), now: at(now))
        confirm(actions)
        return actions
    }
}

@Suite("ConnectionStateMachine")
struct ConnectionStateMachineTests {
    @Test("streams open up to the peer's limit; the rest queue and start as streams finish")
    func capacityAndQueueing() {
        var harness = Harness(limit: 2)
        #expect(started(harness.send(1)) == [1])
        #expect(started(harness.send(2)) == [2])
        #expect(harness.send(3).isEmpty)
        #expect(harness.send(4).isEmpty)
        #expect(harness.machine.activeCount == 2)
        #expect(harness.machine.queuedCount == 2)

        let finished = harness.machine.streamClosed(streamID: harness.streamOf[1]!, errorCode: .noError, now: at(1))
        #expect(finished.contains { if case .succeed(let entry, _) = $0 { entry.payload == 1 } else { false } })
        #expect(harness.confirm(finished) == [3])
        #expect(harness.machine.queuedCount == 1)

        // a larger limit from SETTINGS starts the rest at once
        let more = harness.machine.peerSettingsChanged(maxConcurrentStreams: 10)
        #expect(harness.confirm(more) == [4])
        #expect(harness.machine.queuedCount == 0)
    }

    @Test("requests queue while connecting and start once connected")
    func queueWhileConnecting() {
        var machine = Machine(configuration: configuration(), now: at(0))
        #expect(machine.shouldConnectNow)
        #expect(machine.enqueue(entry(1), now: at(0)).isEmpty)
        #expect(machine.enqueue(entry(2), now: at(0)).isEmpty)
        #expect(started(machine.connected(now: at(0.1))) == [1, 2])
    }

    @Test("a full queue rejects with queueFull")
    func queueFull() {
        var harness = Harness(limit: 1, configuration: configuration(maxQueued: 2))
        harness.send(1)
        harness.send(2)
        harness.send(3)
        let rejected = failed(harness.send(4))
        #expect(rejected.count == 1)
        #expect(rejected.first?.1.code == .queueFull)
        #expect(rejected.first?.1.mayHaveBeenProcessed == false)
    }

    @Test("GOAWAY: streams above last_stream_id and queued requests are retried, the others finish, then close")
    func goAwaySplitsStreams() {
        var harness = Harness(limit: 3)
        for id in 1...5 { harness.send(id) }  // streams 1, 3, 5 in flight; 4 and 5 queued
        #expect(harness.machine.activeCount == 3)

        let actions = harness.machine.goAwayReceived(lastStreamID: 3, errorCode: .noError, now: at(0))
        #expect(actions.contains { if case .detach = $0 { true } else { false } })
        #expect(Set(retried(actions)) == [3, 4, 5])  // payload 3 had stream 5
        #expect(failed(actions).isEmpty)
        #expect(closeReason(actions) == nil)
        #expect(harness.machine.state == .draining)

        // no new streams on a draining connection
        #expect(retried(harness.machine.enqueue(entry(6), now: at(1))) == [6])

        // streams 1 and 3 finish normally, then the connection closes
        let first = harness.machine.streamClosed(streamID: 1, errorCode: .noError, now: at(1))
        #expect(closeReason(first) == nil)
        let second = harness.machine.streamClosed(streamID: 3, errorCode: .noError, now: at(1))
        #expect(second.contains { if case .succeed(let entry, _) = $0 { entry.payload == 2 } else { false } })
        #expect(closeReason(second) == .drained)
        #expect(harness.machine.state == .closed)

        // nghttp2 later reports the refused stream 5: ignored, it was retried already
        #expect(harness.machine.streamClosed(streamID: 5, errorCode: .refusedStream, now: at(1)).isEmpty)
    }

    @Test("stream IDs used up: the request and the queued ones go elsewhere, the streams in flight finish, then close")
    func streamIDsExhausted() {
        var harness = Harness(limit: 2)
        for id in 1...4 { harness.send(id) }  // 1 and 2 in flight, 3 and 4 queued
        // Stream 1 ends; the machine starts queued 3, and nghttp2 has no stream ID left for it.
        let ended = harness.machine.streamClosed(streamID: 1, errorCode: .noError, now: at(1))
        let next = ended.compactMap { if case .startStream(let entry) = $0 { entry } else { nil } }
        #expect(next.map(\.payload) == [3])
        let actions = harness.machine.streamIDsExhausted(next[0], now: at(1))
        #expect(actions.contains { if case .detach = $0 { true } else { false } })
        #expect(Set(retried(actions)) == [3, 4])
        #expect(failed(actions).isEmpty)
        #expect(harness.machine.state == .draining)
        #expect(retried(harness.machine.enqueue(entry(5), now: at(1))) == [5], "no new streams here")
        // Stream 3 (payload 2) finishes normally, then the connection closes.
        let last = harness.machine.streamClosed(streamID: 3, errorCode: .noError, now: at(2))
        #expect(last.contains { if case .succeed(let entry, _) = $0 { entry.payload == 2 } else { false } })
        #expect(closeReason(last) == .drained)
    }

    @Test("GOAWAY retries are bounded")
    func goAwayRetryBound() {
        var harness = Harness(limit: 10)
        var retriedEntry = entry(1)
        retriedEntry.retries = 2  // maxRetries is 2
        harness.confirm(harness.machine.enqueue(retriedEntry, now: at(0)))
        let actions = harness.machine.goAwayReceived(lastStreamID: 0, errorCode: .noError, now: at(0))
        let failures = failed(actions)
        #expect(failures.count == 1)
        #expect(failures.first?.1.code == .goAway)
        #expect(failures.first?.1.mayHaveBeenProcessed == false)
        #expect(closeReason(actions) == .drained)
    }

    @Test("REFUSED_STREAM is retried with a retry count; other resets fail as possibly processed")
    func refusedStream() {
        var harness = Harness(limit: 10)
        harness.send(1)
        harness.send(2)
        let refused = harness.machine.streamClosed(streamID: 1, errorCode: .refusedStream, now: at(1))
        let retriedEntries = refused.compactMap { if case .retry(let entry) = $0 { entry } else { nil } }
        #expect(retriedEntries.map(\.payload) == [1])
        #expect(retriedEntries.first?.retries == 1)

        let reset = failed(harness.machine.streamClosed(streamID: 3, errorCode: .internalError, now: at(1)))
        #expect(reset.first?.0 == 2)
        #expect(reset.first?.1.code == .streamReset)
        #expect(reset.first?.1.mayHaveBeenProcessed == true)
        #expect(reset.first?.1.wireCode == .internalError)
    }

    @Test("deadlines: in-flight streams are reset and fail as possibly processed; queued ones fail as unsent")
    func deadlines() {
        var harness = Harness(limit: 1)
        harness.send(1, deadline: 1)
        harness.send(2, deadline: 1)
        harness.send(3, deadline: 10)
        #expect(harness.machine.tick(now: at(0.5)).filter { if case .sendPing = $0 { false } else { true } }.isEmpty)

        let actions = harness.machine.tick(now: at(1))
        #expect(actions.contains { if case .resetStream(1, .cancel) = $0 { true } else { false } })
        let failures = failed(actions)
        #expect(failures.map(\.0).sorted() == [1, 2])
        #expect(failures.allSatisfy { $0.1.code == .timeout })
        #expect(failures.first { $0.0 == 1 }?.1.mayHaveBeenProcessed == true)
        #expect(failures.first { $0.0 == 2 }?.1.mayHaveBeenProcessed == false)
        #expect(harness.confirm(actions) == [3])
    }

    @Test("PING every interval; a missing acknowledgement kills the connection")
    func pingScheduling() {
        var harness = Harness(limit: 10)
        harness.send(1)
        #expect(!harness.machine.tick(now: at(9)).contains { if case .sendPing = $0 { true } else { false } })
        #expect(harness.machine.tick(now: at(10)).contains { if case .sendPing = $0 { true } else { false } })
        // only one PING outstanding
        #expect(!harness.machine.tick(now: at(11)).contains { if case .sendPing = $0 { true } else { false } })
        harness.machine.pingAcknowledged(now: at(11))
        #expect(!harness.machine.tick(now: at(20)).contains { if case .sendPing = $0 { true } else { false } })
        #expect(harness.machine.tick(now: at(21)).contains { if case .sendPing = $0 { true } else { false } })

        let dead = harness.machine.tick(now: at(23))
        #expect(closeReason(dead) == .pingTimeout)
        let failures = failed(dead)
        #expect(failures.first?.0 == 1)
        #expect(failures.first?.1.code == .connectionClosed)
        #expect(failures.first?.1.mayHaveBeenProcessed == true)
        #expect(harness.machine.state == .closed)
    }

    @Test("an idle connection closes after idleTimeout; activity resets the timer")
    func idleClose() {
        var harness = Harness(limit: 10, configuration: configuration(pingInterval: nil, idleTimeout: .seconds(5)))
        #expect(closeReason(harness.machine.tick(now: at(4))) == nil)
        harness.send(1, now: 4)
        #expect(closeReason(harness.machine.tick(now: at(6))) == nil)  // busy
        _ = harness.machine.streamClosed(streamID: 1, errorCode: .noError, now: at(7))
        #expect(closeReason(harness.machine.tick(now: at(11))) == nil)
        #expect(closeReason(harness.machine.tick(now: at(12))) == .idle)
        #expect(retried(harness.machine.enqueue(entry(2), now: at(12))) == [2])
    }

    @Test("a close the peer never lets flush (it stopped reading) ends anyway: flushTimeout after pingTimeout, once")
    func flushTimeout() {
        var harness = Harness(limit: 10)
        harness.send(1)
        _ = harness.machine.goAwayReceived(lastStreamID: 1, errorCode: .noError, now: at(1))
        #expect(closeReason(harness.machine.streamClosed(streamID: 1, errorCode: .noError, now: at(1))) == .drained)
        // The I/O layer now waits for its output to drain; with a zero window it never does.
        #expect(harness.machine.tick(now: at(2.9)).isEmpty)  // pingTimeout is 2 s here
        #expect(closeReason(harness.machine.tick(now: at(3))) == .flushTimeout)
        #expect(harness.machine.tick(now: at(10)).isEmpty)

        var idle = Harness(limit: 10, configuration: configuration(pingInterval: nil, idleTimeout: .seconds(5)))
        #expect(closeReason(idle.machine.tick(now: at(5))) == .idle)
        #expect(closeReason(idle.machine.tick(now: at(7))) == .flushTimeout)

        var shutdown = Harness(limit: 10)
        #expect(closeReason(shutdown.machine.close(now: at(1))) == .shutdown)
        #expect(closeReason(shutdown.machine.tick(now: at(3))) == .flushTimeout)
    }

    @Test("a closing connection is detached before it closes; a request past its deadline fails there, not bounces")
    func closeDetaches() {
        func detachesBeforeClosing(_ actions: [Action]) -> Bool {
            let detach = actions.firstIndex { if case .detach = $0 { true } else { false } }
            let close = actions.firstIndex { if case .close = $0 { true } else { false } }
            guard let detach, let close else { return false }
            return detach < close
        }
        var idle = Harness(limit: 10, configuration: configuration(pingInterval: nil, idleTimeout: .seconds(5)))
        #expect(detachesBeforeClosing(idle.machine.tick(now: at(5))))
        var shutdown = Harness(limit: 10)
        #expect(detachesBeforeClosing(shutdown.machine.close(now: at(1))))

        // Still routed here (a job queued before the detach): past its deadline it fails with timeout; handing it
        // back would send it round the pool again.
        let late = idle.machine.enqueue(entry(1, deadline: 4), now: at(6))
        #expect(retried(late).isEmpty)
        #expect(failed(late).first?.1.code == .timeout)
        #expect(retried(idle.machine.enqueue(entry(2, deadline: 20), now: at(6))) == [2])
        var draining = Harness(limit: 10)
        draining.send(3)
        _ = draining.machine.goAwayReceived(lastStreamID: 1, errorCode: .noError, now: at(1))
        #expect(failed(draining.machine.enqueue(entry(4, deadline: 1), now: at(2))).first?.1.code == .timeout)
    }

    @Test("connection loss fails in-flight requests and retries queued ones; a connect failure fails them")
    func connectionLoss() {
        var harness = Harness(limit: 1)
        harness.send(1)
        harness.send(2)
        let lost = harness.machine.connectionLost(HTTP2Error(.connectionClosed, "gone"))
        #expect(failed(lost).map(\.0) == [1])
        #expect(failed(lost).first?.1.mayHaveBeenProcessed == true)
        #expect(retried(lost) == [2])

        var connecting = Machine(configuration: configuration(), now: at(0))
        _ = connecting.enqueue(entry(3), now: at(0))
        let refused = connecting.connectionLost(HTTP2Error(.connectFailed, "refused"))
        #expect(failed(refused).map(\.0) == [3])
        #expect(failed(refused).first?.1.code == .connectFailed)
        #expect(failed(refused).first?.1.mayHaveBeenProcessed == false)
    }

    @Test("backoff waiting, then connect; connect timeout fails the queue")
    func waitingAndConnectTimeout() {
        var machine = Machine(configuration: configuration(), now: at(0), notBefore: at(1))
        #expect(!machine.shouldConnectNow)
        _ = machine.enqueue(entry(1), now: at(0))
        #expect(machine.tick(now: at(0.5)).isEmpty)
        #expect(machine.tick(now: at(1)).contains { if case .connect = $0 { true } else { false } })
        let timedOut = machine.tick(now: at(6))
        #expect(closeReason(timedOut) == .connectTimeout)
        #expect(failed(timedOut).first?.1.code == .connectFailed)
    }

    @Test("backoff doubles from the initial delay up to the cap, with jitter in [half, full]")
    func backoffGrowth() {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(1))
        var generator = SystemRandomNumberGenerator()
        var ceilings: [Duration] = []
        for _ in 0..<6 {
            let delay = backoff.fail(using: &generator)
            ceilings.append(backoff.ceiling)
            #expect(delay >= backoff.ceiling / 2 && delay <= backoff.ceiling)
        }
        #expect(
            ceilings == [
                .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .seconds(1),
                .seconds(1),
            ])
        backoff.reset()
        #expect(backoff.ceiling == .zero)
        _ = backoff.fail(using: &generator)
        #expect(backoff.ceiling == .milliseconds(100))
    }
}
