import CNGHTTP2
import COpenSSL
import Foundation
import Synchronization

/// A request assembled by a server connection.
final class ServerStream {
    var method = ""
    var path = ""
    var authority: String?
    var scheme: String?
    var headers: [(String, String)] = []
    var body: [UInt8] = []
    var dispatched = false
    var responseBody: [UInt8] = []
    var responseOffset = 0
}

/// A server HTTP/2 connection on a loop thread.
final class ServerConnection: TLSConnection, LoopHandler {
    private enum Phase {
        case handshaking
        case open
        /// HTTP/2 is done both ways and our FIN is sent; the peer's late bytes are read and dropped (`linger`).
        case lingering
        case closed
    }

    /// How long a finished connection keeps reading what the peer still sends before it closes.
    static let lingerTimeout = Duration.seconds(2)

    let core: ServerCore
    private var phase = Phase.handshaking
    private var streams: [Int32: ServerStream] = [:]
    private var goAwayLastStreamID: Int32?
    private var fatal = false
    private let acceptedAt: ContinuousClock.Instant
    private var lingerUntil: ContinuousClock.Instant?

    init(fd: Int32, core: ServerCore, context: LoopContext) {
        self.core = core
        acceptedAt = context.now
        super.init(id: makeObjectID(), context: context)
        self.fd = fd
    }

    func start() {
        context.add(id: id, self)
        core.connectionOpened()
        guard let ssl = core.tls.makeSSL() else {
            teardown()
            return
        }
        self.ssl = ssl
        SSL_set_fd(ssl, fd)
        SSL_set_accept_state(ssl)
        watch(self, writable: false)
        handshake()
    }

    /// Graceful stop: GOAWAY with the last processed stream; close once the rest finished.
    func beginShutdown() {
        guard phase == .open, let session else {
            teardown()
            return
        }
        let last = nghttp2_session_get_last_proc_stream_id(session)
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, NGHTTP2_NO_ERROR.rawValue, nil, 0)
        goAwayLastStreamID = min(goAwayLastStreamID ?? last, last)
        context.markDirty(self)
    }

    /// Answers (or fails) a stream when its handler returns.
    func respond(streamID: Int32, _ response: HTTP2ServerResponse) {
        guard phase == .open, let session, let stream = streams[streamID] else { return }
        if let last = goAwayLastStreamID, streamID > last { return }
        switch response.kind {
        case .response(let status, let headers, let body):
            let fields = HeaderBlock(status: status, headers: headers, bodyCount: body.count)
            stream.responseBody = body
            _ = fields.withNameValues { nva, count -> Int32 in
                if body.isEmpty {
                    return nghttp2_submit_response(session, streamID, nva, count, nil)
                }
                var provider = nghttp2_data_provider()
                provider.read_callback = serverReadBody
                return nghttp2_submit_response(session, streamID, nva, count, &provider)
            }
        case .reset(let code):
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, code.rawValue)
        case .goAway(let code):
            // Every stream received so far has gone (or is going) to a handler, so each of them is "processed":
            // GOAWAY names the highest of them and they all still get their answers. Only this stream was not
            // processed: REFUSED_STREAM tells the client so, and it is safe to send again on a new connection.
            // (Naming a lower stream would make the client retry streams whose handlers already ran.)
            let last = nghttp2_session_get_last_proc_stream_id(session)
            nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, code.rawValue, nil, 0)
            goAwayLastStreamID = min(goAwayLastStreamID ?? last, last)
            nghttp2_submit_rst_stream(
                session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, HTTP2ErrorCode.refusedStream.rawValue)
        }
        context.markDirty(self)
    }

    // MARK: LoopHandler

    func handleEvent(_ events: UInt32) {
        switch phase {
        case .handshaking:
            handshake()
        case .open:
            if readAvailable(self) != nil {
                fatal = true
                teardown()
                return
            }
            context.markDirty(self)
        case .lingering:
            drain()
        case .closed:
            break
        }
    }

    func flush() {
        guard phase == .open else { return }
        if writeAvailable(self) != nil {
            fatal = true
            teardown()
            return
        }
        if sessionFinished { linger() }
    }

    func tick(now: ContinuousClock.Instant) {
        if phase == .handshaking && now - acceptedAt > .seconds(10) { teardown() }
        if phase == .lingering, let lingerUntil, now >= lingerUntil { teardown() }
    }

    /// HTTP/2 is done both ways (after a GOAWAY, say), but the peer may still have frames in flight: requests above
    /// the GOAWAY's last stream. Closed now with those unread, the socket would answer with RST, and an RST can discard
    /// the GOAWAY from the peer's receive buffer before the peer reads it; the peer would then see a failed write and
    /// could not know its requests went unprocessed. So: close_notify, then FIN, then read and drop until the peer
    /// closes or `lingerTimeout` passes, then close.
    private func linger() {
        guard phase == .open, let ssl, fd >= 0 else {
            teardown()
            return
        }
        SSL_shutdown(ssl)
        Glibc.shutdown(fd, Int32(SHUT_WR))
        phase = .lingering
        lingerUntil = context.now + Self.lingerTimeout
        watch(self, writable: false)
        drain()
    }

    /// Reads and drops what the peer sends while lingering; closes at its end of file (or an error).
    private func drain() {
        var scratch = [UInt8](repeating: 0, count: 16 * 1024)
        while phase == .lingering {
            let count = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 { continue }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            teardown()
        }
    }

    func terminate() {
        if phase == .open, let session {
            nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR.rawValue)
            _ = writeAvailable(self)
        }
        teardown()
    }

    // MARK: Setup

    private func handshake() {
        let (done, error) = continueHandshake(self, client: false)
        if error != nil {
            teardown()
            return
        }
        guard done else { return }
        guard negotiatedH2, makeSession() else {
            teardown()
            return
        }
        phase = .open
        watch(self, writable: false)
        context.markDirty(self)
        // data may already be buffered inside TLS
        handleEvent(EPOLLIN.rawValue)
    }

    private func makeSession() -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, serverOnBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, serverOnHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, serverOnData)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, serverOnFrame)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, serverOnStreamClose)
        var session: OpaquePointer?
        let user = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_server_new(&session, callbacks, user) == 0, let session else { return false }
        self.session = session
        submitSettings(
            [
                (Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), UInt32(core.maxConcurrentStreams)),
                (Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), UInt32(core.initialWindowSize)),
            ], connectionWindow: Int32(clamping: core.initialWindowSize * 4))
        return true
    }

    private func teardown() {
        guard phase != .closed else { return }
        if phase == .open, let ssl, !fatal { SSL_shutdown(ssl) }
        phase = .closed
        releaseResources()
        streams.removeAll()
        context.remove(id: id)
        core.connectionClosed()
    }

    // MARK: nghttp2 callbacks

    fileprivate func onBeginHeaders(_ frame: UnsafePointer<nghttp2_frame>) {
        guard frame.pointee.hd.type == NGHTTP2_HEADERS.byte, frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
        else { return }
        streams[frame.pointee.hd.stream_id] = ServerStream()
    }

    fileprivate func onHeader(streamID: Int32, name: UnsafePointer<UInt8>?, _ nameLength: Int, value: String) {
        guard let stream = streams[streamID], !stream.dispatched else { return }
        let name = string(name, nameLength)
        switch name {
        case ":method": stream.method = value
        case ":path": stream.path = value
        case ":authority": stream.authority = value
        case ":scheme": stream.scheme = value
        default:
            if !name.hasPrefix(":") { stream.headers.append((name, value)) }
        }
    }

    fileprivate func onData(streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int) {
        guard let data, let stream = streams[streamID] else { return }
        stream.body.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
    }

    fileprivate func onFrame(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        guard header.type == NGHTTP2_HEADERS.byte || header.type == NGHTTP2_DATA.byte,
            header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0,
            let stream = streams[header.stream_id], !stream.dispatched
        else { return }
        // A GOAWAY already submitted (perhaps by an answer given earlier in this same read) names a lower last
        // stream: this one is unprocessed, and its client sends it again on a new connection.
        if let last = goAwayLastStreamID, header.stream_id > last { return }
        stream.dispatched = true
        let request = HTTP2ServerRequest(
            method: stream.method, path: stream.path, authority: stream.authority, scheme: stream.scheme,
            headers: stream.headers, body: stream.body, connectionID: id, streamID: header.stream_id)
        stream.body = []
        switch core.responder(request) {
        case .now(let response):
            // Inside nghttp2's receive callback: submitting is allowed there, and the answer goes out with the
            // connection's next flush.
            respond(streamID: header.stream_id, response)
        case .later(let work):
            core.submit(ServerJob(work: work, streamID: header.stream_id, loop: context.loop, connectionID: id))
        }
    }

    fileprivate func onStreamClose(streamID: Int32) {
        streams.removeValue(forKey: streamID)
    }

    fileprivate func readBody(
        streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int, _ flags: UnsafeMutablePointer<UInt32>?
    ) -> Int {
        guard let stream = streams[streamID] else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        return provideBody(
            stream.responseBody, offset: &stream.responseOffset, buffer: buffer, length: length, flags: flags)
    }
}

private func connection(_ user: UnsafeMutableRawPointer?) -> ServerConnection {
    Unmanaged<ServerConnection>.fromOpaque(user!).takeUnretainedValue()
}

private func serverOnBeginHeaders(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ user: UnsafeMutableRawPointer?
) -> Int32 {
    if let frame { connection(user).onBeginHeaders(frame) }
    return 0
}

private func serverOnHeader(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
    _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
    _ user: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    connection(user).onHeader(
        streamID: frame.pointee.hd.stream_id, name: name, nameLength, value: string(value, valueLength))
    return 0
}

private func serverOnData(
    _ session: OpaquePointer?, _ flags: UInt8, _ streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int,
    _ user: UnsafeMutableRawPointer?
) -> Int32 {
    connection(user).onData(streamID: streamID, data, length)
    return 0
}

private func serverOnFrame(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ user: UnsafeMutableRawPointer?
) -> Int32 {
    if let frame { connection(user).onFrame(frame) }
    return 0
}

private func serverOnStreamClose(
    _ session: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32, _ user: UnsafeMutableRawPointer?
) -> Int32 {
    connection(user).onStreamClose(streamID: streamID)
    return 0
}

private func serverReadBody(
    _ session: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
    _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
    _ user: UnsafeMutableRawPointer?
) -> Int {
    connection(user).readBody(streamID: streamID, buffer, length, flags)
}

/// Accepts connections and hands them to the server's loops round-robin.
final class Listener: LoopHandler {
    let fd: Int32
    let core: ServerCore
    let context: LoopContext
    let id = makeObjectID()
    private var next = 0
    private var closed = false

    init(fd: Int32, core: ServerCore, context: LoopContext) {
        self.fd = fd
        self.core = core
        self.context = context
    }

    func start() {
        context.add(id: id, self)
        context.register(fd: fd, events: EPOLLIN.rawValue, self)
    }

    func handleEvent(_ events: UInt32) {
        while !closed {
            let client = accept(fd, nil, nil)
            if client < 0 { break }
            _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            var one: Int32 = 1
            setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let loops = core.loops
            let loop = loops[next % loops.count]
            next &+= 1
            let core = self.core
            if loop === context.loop {
                ServerConnection(fd: client, core: core, context: context).start()
            } else if !loop.execute({ context in ServerConnection(fd: client, core: core, context: context).start() }) {
                Glibc.close(client)
            }
        }
    }

    func flush() {}

    func tick(now: ContinuousClock.Instant) {}

    func terminate() { stop() }

    func stop() {
        guard !closed else { return }
        closed = true
        context.unregister(fd: fd)
        Glibc.close(fd)
        context.remove(id: id)
    }
}
