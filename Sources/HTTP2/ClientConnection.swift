import CNGHTTP2
import COpenSSL
import Foundation
import Synchronization

/// What a client connection keeps per request. A class: entries are copied through the state machine's actions and
/// tables several times per request, and one reference is one retain where the request's fields were six.
final class ClientPayload: Sendable {
    /// The request's header list, built by the sender so that the loop thread only hands it to nghttp2.
    let headers: HeaderBlock
    let body: [UInt8]
    let continuation: CheckedContinuation<HTTP2Response, any Error>

    init(headers: HeaderBlock, body: [UInt8], continuation: CheckedContinuation<HTTP2Response, any Error>) {
        self.headers = headers
        self.body = body
        self.continuation = continuation
    }
}

typealias ClientEntry = ConnectionStateMachine<ClientPayload>.Entry
typealias ClientAction = ConnectionAction<ClientPayload>

/// A resolved socket address.
struct ResolvedAddress: Sendable, Equatable {
    var bytes: [UInt8]
    var family: Int32
}

/// One stream's request body and the response being assembled.
final class ClientStream {
    let body: [UInt8]
    var bodyOffset = 0
    var status: Int?
    var headers: [(String, String)] = []
    var responseBody: [UInt8] = []
    /// Set once the response outgrew the limit and the stream was reset.
    var tooLarge = false
    /// The response's header list size so far, as RFC 7541 §4.1 counts it (name, value and 32 bytes per field).
    var headerBytes = 0
    /// Header fields received so far.
    var headerFields = 0

    init(body: [UInt8]) { self.body = body }
}

/// A client HTTP/2 connection on a loop thread: carries out its `ConnectionStateMachine`'s actions over a
/// non-blocking TLS socket.
final class ClientConnection: TLSConnection, LoopHandler {
    /// Header fields kept per response, with or without a size limit: each costs a tuple of two Swift strings, and
    /// APNs and Google answer with a few dozen at most.
    static let maxResponseHeaderFields = 256

    private enum Phase {
        case waiting
        case resolving
        case connecting
        case handshaking
        case open
        case closed
    }

    let handle: ConnectionHandle
    let core: ClientCore
    private var machine: ConnectionStateMachine<ClientPayload>
    private var phase = Phase.waiting
    private var streams: [Int32: ClientStream] = [:]
    /// The stream found by the last `stream(_:)`: a response's header and data callbacks come for one stream in a row.
    private var lastStream: (id: Int32, stream: ClientStream)?
    private var closeReason: ConnectionStateMachine<ClientPayload>.CloseReason?
    private var failure: HTTP2Error?
    private var publishedActive = 0
    private var publishedQueued = 0
    private var reportedOpen = false
    /// The resolved addresses not tried yet: a TCP connect that fails goes on to the next (a host with an IPv6
    /// address that does not answer, and an IPv4 one that does).
    private var untried: [ResolvedAddress] = []

    init(handle: ConnectionHandle, core: ClientCore, notBefore: ContinuousClock.Instant?, context: LoopContext) {
        self.handle = handle
        self.core = core
        self.machine = ConnectionStateMachine(
            configuration: core.machineConfiguration, now: context.now, notBefore: notBefore)
        super.init(id: handle.id, context: context)
    }

    func start() {
        context.add(id: id, self)
        if machine.shouldConnectNow { beginConnect() }
    }

    func enqueue(_ entry: ClientEntry) {
        run(machine.enqueue(entry, now: context.now))
    }

    /// Client shutdown: GOAWAY and close.
    func closeForShutdown() {
        run(machine.close(now: context.now))
    }

    // MARK: LoopHandler

    func handleEvent(_ events: UInt32) {
        switch phase {
        case .connecting:
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
            if error != 0 {
                connectNext(after: HTTP2Error(.connectFailed, "the TCP connection failed", details: errnoText(error)))
            } else {
                startTLS()
            }
        case .handshaking:
            handshake()
        case .open:
            if let error = readAvailable(self) {
                lose(error)
                return
            }
            context.markDirty(self)
        case .waiting, .resolving, .closed:
            break
        }
    }

    func flush() {
        if phase == .open, let error = writeAvailable(self) {
            lose(error)
            return
        }
        if closeReason != nil && (phase != .open || !hasPendingOutput || failure != nil) {
            teardown()
        } else if phase == .open && sessionFinished {
            teardown()
        }
    }

    func tick(now: ContinuousClock.Instant) {
        run(machine.tick(now: now))
    }

    func terminate() {
        run(machine.close(now: context.now))
        if phase == .open, let session {
            nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR.rawValue)
            _ = writeAvailable(self)
        }
        teardown()
    }

    // MARK: Connecting

    private func beginConnect() {
        phase = .resolving
        let host = core.configuration.host
        let port = core.configuration.port
        let special = core.configuration.allowsSpecialAddresses
        let loop = context.loop
        let id = self.id
        let resolve = core.resolve
        if isIPAddress(host) {
            connected(to: resolve(host, port, special))
            return
        }
        // getaddrinfo blocks, for seconds when DNS is slow: on a serial queue of its own (Dispatch's overcommitting
        // threads), not `DispatchQueue.global()`, whose threads (one per core) on Linux also run every Swift task.
        DispatchQueue(label: "http2.resolve").async {
            let result = resolve(host, port, special)
            loop.execute { context in
                (context.object(id: id) as? ClientConnection)?.connected(to: result)
            }
        }
    }

    private func connected(to result: Result<[ResolvedAddress], HTTP2Error>) {
        guard phase == .resolving else { return }
        switch result {
        case .success(let addresses):
            untried = addresses
            connectNext(after: HTTP2Error(.connectFailed, "the host has no address"))
        case .failure(let error):
            lose(error)
        }
    }

    /// Connects to the next address not tried yet, closing the socket of the last one; when none is left, the
    /// connection is lost with `error` (the last address's failure). Only TCP failures go on to the next address: a
    /// TLS failure is the server's answer.
    private func connectNext(after error: HTTP2Error) {
        releaseResources()
        guard !untried.isEmpty else {
            lose(error)
            return
        }
        let address = untried.removeFirst()
        let socketType = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        fd = socket(address.family, socketType, 0)
        guard fd >= 0 else {
            connectNext(after: HTTP2Error(.connectFailed, "cannot create a socket", details: errnoText()))
            return
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let result = address.bytes.withUnsafeBytes { raw in
            connect(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        if result == 0 {
            startTLS()
        } else if errno == EINPROGRESS {
            phase = .connecting
            watch(self, writable: true)
        } else {
            connectNext(after: HTTP2Error(.connectFailed, "the TCP connection failed", details: errnoText()))
        }
    }

    private func startTLS() {
        guard let ssl = core.tls.makeSSL() else {
            lose(HTTP2Error(.tlsFailed, "cannot create a TLS session", details: openSSLErrors()))
            return
        }
        self.ssl = ssl
        SSL_set_fd(ssl, fd)
        SSL_set_connect_state(ssl)
        let name = core.configuration.tls.serverName ?? core.configuration.host
        let parameters = SSL_get0_param(ssl)
        if isIPAddress(name) {
            X509_VERIFY_PARAM_set1_ip_asc(parameters, name)
        } else {
            _ = copenssl_SSL_set_tlsext_host_name(ssl, name)
            X509_VERIFY_PARAM_set_hostflags(parameters, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
            X509_VERIFY_PARAM_set1_host(parameters, name, 0)
        }
        phase = .handshaking
        watch(self, writable: true)
        handshake()
    }

    private func handshake() {
        let (done, error) = continueHandshake(self, client: true)
        if let error {
            lose(error)
            return
        }
        guard done else { return }
        guard negotiatedH2 else {
            lose(HTTP2Error(.alpnMismatch, "the server did not select h2 with ALPN"))
            return
        }
        guard makeSession() else {
            lose(HTTP2Error(.protocolError, "cannot create an nghttp2 session"))
            return
        }
        phase = .open
        watch(self, writable: false)
        reportedOpen = true
        core.connectionReady(handle)
        run(machine.connected(now: .now))
        context.markDirty(self)
    }

    private func makeSession() -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, clientOnHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, clientOnData)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, clientOnFrame)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, clientOnStreamClose)
        var session: OpaquePointer?
        let user = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_client_new(&session, callbacks, user) == 0, let session else { return false }
        self.session = session
        submitSettings(
            Self.settings(core.configuration),
            connectionWindow: Int32(clamping: core.configuration.initialWindowSize * 4))
        return true
    }

    /// The SETTINGS the client sends: no push, its stream window and, with a size limit, SETTINGS_MAX_HEADER_LIST_SIZE
    /// (the limit `onHeader` enforces, so that a well-behaved server knows it before it answers).
    static func settings(_ configuration: HTTP2Client.Configuration) -> [(Int32, UInt32)] {
        var settings: [(Int32, UInt32)] = [
            (Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), 0),
            (Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), UInt32(configuration.initialWindowSize)),
        ]
        if let limit = configuration.maxResponseBodySize {
            settings.append((Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), UInt32(clamping: limit)))
        }
        return settings
    }

    // MARK: Actions

    private func run(_ actions: [ClientAction]) {
        var work = actions
        var index = 0
        while index < work.count {
            let action = work[index]
            index += 1
            switch action {
            case .connect:
                beginConnect()
            case .startStream(let entry):
                work.append(contentsOf: submit(entry))
            case .succeed(let entry, let streamID):
                let stream = removeStream(streamID)
                if let stream, let status = stream.status {
                    let response = HTTP2Response(status: status, headers: stream.headers, body: stream.responseBody)
                    finish(entry, .success(response))
                } else {
                    let error = HTTP2Error(
                        .protocolError, "the stream ended without a response", mayHaveBeenProcessed: true)
                    finish(entry, .failure(error))
                }
            case .fail(let entry, let error):
                finish(entry, .failure(error))
            case .retry(let entry):
                handle.outstanding.wrappingSubtract(1, ordering: .relaxed)
                core.dispatch(entry)
            case .resetStream(let streamID, let code):
                if let session {
                    nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, code.rawValue)
                    context.markDirty(self)
                }
            case .sendPing:
                if let session {
                    nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
                    context.markDirty(self)
                }
            case .detach:
                core.detach(handle)
            case .close(let reason):
                if closeReason == nil { closeReason = reason }
                switch reason {
                case .pingTimeout:
                    failure = HTTP2Error(.connectionClosed, "PING timeout")
                case .flushTimeout:
                    // A failure makes `flush` tear down with output still pending (and skip SSL_shutdown, which
                    // would write to the peer that stopped reading).
                    failure = failure ?? HTTP2Error(.connectionClosed, "the peer stopped reading before the close")
                case .idle, .drained, .connectTimeout, .shutdown:
                    if phase == .open, let session {
                        nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR.rawValue)
                    }
                }
                context.markDirty(self)
            }
        }
        publishStatistics()
    }

    private func submit(_ entry: ClientEntry) -> [ClientAction] {
        guard let session else {
            return machine.streamStartFailed(entry, HTTP2Error(.connectionClosed, "no session"), now: .now)
        }
        let body = entry.payload.body
        let stream = ClientStream(body: body)
        let streamID = entry.payload.headers.withNameValues { nva, count -> Int32 in
            if body.isEmpty {
                return nghttp2_submit_request(session, nil, nva, count, nil, nil)
            }
            var provider = nghttp2_data_provider()
            provider.read_callback = clientReadBody
            return nghttp2_submit_request(session, nil, nva, count, &provider, nil)
        }
        if streamID == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE.rawValue {
            return machine.streamIDsExhausted(entry, now: .now)
        }
        guard streamID > 0 else {
            let error = HTTP2Error(
                .protocolError, "nghttp2 refused the request", details: String(cString: nghttp2_strerror(streamID)))
            return machine.streamStartFailed(entry, error, now: .now)
        }
        machine.streamStarted(entry, streamID: streamID)
        streams[streamID] = stream
        context.markDirty(self)
        return []
    }

    private func finish(_ entry: ClientEntry, _ result: Result<HTTP2Response, HTTP2Error>) {
        handle.outstanding.wrappingSubtract(1, ordering: .relaxed)
        core.finish(entry, result)
    }

    private func publishStatistics() {
        let active = machine.activeCount
        let queued = machine.queuedCount
        if active != publishedActive {
            core.activeStreams.wrappingAdd(active - publishedActive, ordering: .relaxed)
            publishedActive = active
        }
        if queued != publishedQueued {
            core.queuedRequests.wrappingAdd(queued - publishedQueued, ordering: .relaxed)
            publishedQueued = queued
        }
    }

    private func lose(_ error: HTTP2Error) {
        guard phase != .closed else { return }
        failure = failure ?? error
        core.detach(handle)
        run(machine.connectionLost(error))
        teardown()
    }

    private func teardown() {
        guard phase != .closed else { return }
        core.detach(handle)
        run(machine.connectionLost(failure ?? HTTP2Error(.connectionClosed, "the connection closed")))
        if phase == .open, let ssl, failure == nil { SSL_shutdown(ssl) }
        phase = .closed
        releaseResources()
        streams.removeAll()
        lastStream = nil
        context.remove(id: id)
        publishStatistics()
        let failedToConnect = !machine.didConnect && (failure != nil || closeReason == .connectTimeout)
        let failedAfterConnect = machine.didConnect && failure != nil
        core.connectionClosed(
            handle, wasOpen: reportedOpen, failedToConnect: failedToConnect, failedAfterConnect: failedAfterConnect)
    }

    // MARK: nghttp2 callbacks (via the free functions below)

    private func stream(_ id: Int32) -> ClientStream? {
        if let last = lastStream, last.id == id { return last.stream }
        guard let found = streams[id] else { return nil }
        lastStream = (id, found)
        return found
    }

    private func removeStream(_ id: Int32) -> ClientStream? {
        if lastStream?.id == id { lastStream = nil }
        return streams.removeValue(forKey: id)
    }

    /// `name` is ASCII: nghttp2 checks response header names before this callback.
    fileprivate func onHeader(streamID: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        guard let stream = stream(streamID), !stream.tooLarge else { return }
        // Headers count against the same limit as the body, 32 bytes a field besides name and value (RFC 7541 §4.1),
        // and their number is capped: counting only names and values, a hostile server could send tens of thousands
        // of empty fields per stream, each kept as a tuple of strings.
        stream.headerBytes += name.count + value.count + 32
        stream.headerFields += 1
        if stream.headerFields > Self.maxResponseHeaderFields
            || core.configuration.maxResponseBodySize.map({ stream.headerBytes > $0 }) == true
        {
            refuseOversized(stream, streamID: streamID)
            return
        }
        let value = String(decoding: value, as: UTF8.self)
        if name.first == UInt8(ascii: ":") {
            if name.elementsEqual(":status".utf8) { stream.status = Int(value) }
        } else {
            stream.headers.append((String(decoding: name, as: UTF8.self), value))
        }
    }

    fileprivate func onData(streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int) {
        guard let data, let stream = stream(streamID), !stream.tooLarge else { return }
        if let limit = core.configuration.maxResponseBodySize, stream.responseBody.count + length > limit {
            refuseOversized(stream, streamID: streamID)
            return
        }
        stream.responseBody.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
    }

    /// Resets a stream whose response outgrew the limit; it then fails with `responseTooLarge`.
    private func refuseOversized(_ stream: ClientStream, streamID: Int32) {
        stream.tooLarge = true
        stream.responseBody = []
        stream.headers = []
        if let session {
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_CANCEL.rawValue)
            context.markDirty(self)
        }
    }

    fileprivate func onFrame(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        switch header.type {
        case NGHTTP2_SETTINGS.byte where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0:
            guard let session else { return }
            let limit = nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
            run(machine.peerSettingsChanged(maxConcurrentStreams: Int(min(limit, UInt32(Int32.max)))))
        case NGHTTP2_PING.byte where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
            machine.pingAcknowledged(now: .now)
        case NGHTTP2_GOAWAY.byte:
            core.goAwaysTotal.wrappingAdd(1, ordering: .relaxed)
            let goAway = frame.pointee.goaway
            run(
                machine.goAwayReceived(
                    lastStreamID: goAway.last_stream_id, errorCode: HTTP2ErrorCode(rawValue: goAway.error_code),
                    now: context.now))
        default:
            break
        }
    }

    fileprivate func onStreamClose(streamID: Int32, errorCode: UInt32) {
        let tooLarge =
            stream(streamID)?.tooLarge == true
            ? HTTP2Error(.responseTooLarge, "the response body exceeded the limit", mayHaveBeenProcessed: true) : nil
        run(
            machine.streamClosed(
                streamID: streamID, errorCode: HTTP2ErrorCode(rawValue: errorCode), now: context.now, failing: tooLarge)
        )
        _ = removeStream(streamID)
    }

    fileprivate func readBody(
        streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int, _ flags: UnsafeMutablePointer<UInt32>?
    ) -> Int {
        guard let stream = stream(streamID) else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        return provideBody(stream.body, offset: &stream.bodyOffset, buffer: buffer, length: length, flags: flags)
    }
}

private func connection(_ user: UnsafeMutableRawPointer?) -> ClientConnection {
    Unmanaged<ClientConnection>.fromOpaque(user!).takeUnretainedValue()
}

private func clientOnHeader(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
    _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
    _ user: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    connection(user).onHeader(
        streamID: frame.pointee.hd.stream_id,
        name: UnsafeBufferPointer(start: name, count: name == nil ? 0 : nameLength),
        value: UnsafeBufferPointer(start: value, count: value == nil ? 0 : valueLength))
    return 0
}

private func clientOnData(
    _ session: OpaquePointer?, _ flags: UInt8, _ streamID: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int,
    _ user: UnsafeMutableRawPointer?
) -> Int32 {
    connection(user).onData(streamID: streamID, data, length)
    return 0
}

private func clientOnFrame(
    _ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ user: UnsafeMutableRawPointer?
) -> Int32 {
    guard let frame else { return 0 }
    connection(user).onFrame(frame)
    return 0
}

private func clientOnStreamClose(
    _ session: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32, _ user: UnsafeMutableRawPointer?
) -> Int32 {
    connection(user).onStreamClose(streamID: streamID, errorCode: errorCode)
    return 0
}

private func clientReadBody(
    _ session: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
    _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
    _ user: UnsafeMutableRawPointer?
) -> Int {
    connection(user).readBody(streamID: streamID, buffer, length, flags)
}

/// Resolves `host:port` (blocking; called off the loop thread for names) to its addresses, in getaddrinfo's order.
/// With `allowsSpecialAddresses` false, only public addresses are kept, and none is an `addressRefused` error.
func resolve(host: String, port: Int, allowsSpecialAddresses: Bool = true) -> Result<[ResolvedAddress], HTTP2Error> {
    var hints = addrinfo()
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
    hints.ai_flags = AI_NUMERICSERV
    var list: UnsafeMutablePointer<addrinfo>?
    let status = getaddrinfo(host, String(port), &hints, &list)
    guard status == 0, list != nil else {
        return .failure(
            HTTP2Error(.connectFailed, "cannot resolve the host", details: String(cString: gai_strerror(status))))
    }
    defer { freeaddrinfo(list) }
    var addresses: [ResolvedAddress] = []
    var next = list
    while let entry = next {
        next = entry.pointee.ai_next
        let bytes = [UInt8](UnsafeRawBufferPointer(start: entry.pointee.ai_addr, count: Int(entry.pointee.ai_addrlen)))
        let address = ResolvedAddress(bytes: bytes, family: entry.pointee.ai_family)
        if (allowsSpecialAddresses || !address.isSpecialPurpose) && !addresses.contains(address) {
            addresses.append(address)
        }
    }
    guard !addresses.isEmpty else {
        return .failure(HTTP2Error(.addressRefused, "the host resolves only to special-purpose addresses"))
    }
    return .success(addresses)
}

extension ResolvedAddress {
    /// The raw IP address (4 or 16 bytes) inside the socket address.
    var ipBytes: [UInt8] {
        if family == AF_INET, bytes.count >= 8 { return Array(bytes[4..<8]) }
        if family == AF_INET6, bytes.count >= 24 { return Array(bytes[8..<24]) }
        return []
    }

    /// Whether the address is loopback, private, link-local, unspecified, shared, multicast, reserved or otherwise
    /// not a public unicast address (IPv4-mapped IPv6 addresses are judged as IPv4).
    var isSpecialPurpose: Bool { isSpecialPurposeIP(ipBytes) }
}

/// Whether a 4- or 16-byte IP address is special-purpose (see `ResolvedAddress.isSpecialPurpose`); anything else is.
func isSpecialPurposeIP(_ ip: [UInt8]) -> Bool {
    if ip.count == 4 {
        let (a, b) = (ip[0], ip[1])
        return a == 0 || a == 10 || a == 127 || a >= 224  // this network, private, loopback, multicast, reserved
            || (a == 100 && b >= 64 && b <= 127)  // shared address space (CGNAT)
            || (a == 169 && b == 254)  // link-local
            || (a == 172 && b >= 16 && b <= 31)  // private
            || (a == 192 && b == 168)  // private
            || (a == 192 && b == 0 && (ip[2] == 0 || ip[2] == 2))  // IETF protocol assignments, TEST-NET-1
            || (a == 198 && (b == 18 || b == 19))  // benchmarking
            || (a == 198 && b == 51 && ip[2] == 100) || (a == 203 && b == 0 && ip[2] == 113)  // TEST-NET-2/3
    }
    guard ip.count == 16 else { return true }
    if ip[0..<10].allSatisfy({ $0 == 0 }) && ip[10] == 0xff && ip[11] == 0xff {
        return isSpecialPurposeIP(Array(ip[12..<16]))  // IPv4-mapped
    }
    if ip[0..<15].allSatisfy({ $0 == 0 }) { return true }  // :: and ::1
    if ip[0..<12].allSatisfy({ $0 == 0 }) { return true }  // IPv4-compatible (deprecated)
    if ip[0] & 0xfe == 0xfc { return true }  // unique local fc00::/7
    if ip[0] == 0xfe && ip[1] & 0xc0 == 0x80 { return true }  // link-local fe80::/10
    if ip[0] == 0xfe && ip[1] & 0xc0 == 0xc0 { return true }  // site-local fec0::/10
    if ip[0] == 0xff { return true }  // multicast
    if ip[0] == 0x20 && ip[1] == 0x01 && ip[2] == 0x0d && ip[3] == 0xb8 { return true }  // documentation
    if ip[0] == 0x00 && ip[1] == 0x64 && ip[2] == 0xff && ip[3] == 0x9b { return true }  // NAT64 64:ff9b::/96
    if ip[0] == 0x20 && ip[1] == 0x02 { return true }  // 6to4 (embeds any IPv4)
    if ip[0] == 0x20 && ip[1] == 0x01 && ip[2] == 0x00 && ip[3] == 0x00 { return true }  // Teredo
    return false
}
