import CNGHTTP2
import COpenSSL
import Foundation

/// The socket, TLS and nghttp2 plumbing shared by client and server connections. Lives on one loop thread.
///
/// Reading feeds what `SSL_read` gives to `nghttp2_session_mem_recv`, until the socket would block or `readBudget`
/// bytes were taken in one call (the loop calls again on its next turn: the socket stays readable). Writing
/// gathers everything nghttp2 has queued (`nghttp2_session_mem_send`, up to `writeBatchLimit`) into one buffer and
/// hands it to `SSL_write`, so many frames share a TLS write.
class TLSConnection {
    static let readBufferSize = 64 * 1024
    /// Most plaintext bytes one `readAvailable` call takes in. A peer that sends faster than it is read (a hostile
    /// provider flooding cheap frames) would otherwise keep the call, and with it the loop thread, to itself: every
    /// other connection on the thread, their deadlines and the jobs handed to it would wait until the peer paused.
    static let readBudget = 256 * 1024
    static let writeBatchLimit = 1 << 20

    let id: Int
    let context: LoopContext
    var fd: Int32 = -1
    var ssl: OpaquePointer?
    var session: OpaquePointer?
    private var outbound: [UInt8] = []
    private var outboundOffset = 0
    private var watchingWritable = false
    private var registered = false
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(
        byteCount: TLSConnection.readBufferSize, alignment: 16)

    init(id: Int, context: LoopContext) {
        self.id = id
        self.context = context
    }

    deinit {
        releaseResources()
        readBuffer.deallocate()
    }

    /// Whether bytes are waiting for the socket.
    var hasPendingOutput: Bool { outboundOffset < outbound.count }

    func watch(_ handler: any LoopHandler, writable: Bool) {
        let events = EPOLLIN.rawValue | (writable ? EPOLLOUT.rawValue : 0)
        if !registered {
            registered = true
            watchingWritable = writable
            context.register(fd: fd, events: events, handler)
        } else if writable != watchingWritable {
            watchingWritable = writable
            context.modify(fd: fd, events: events)
        }
    }

    /// Advances the TLS handshake. `nil` while it is in progress or done (check `SSL_is_init_finished`).
    func continueHandshake(_ handler: any LoopHandler, client: Bool) -> (done: Bool, error: HTTP2Error?) {
        guard let ssl else { return (false, HTTP2Error(.tlsFailed, "no TLS session")) }
        ERR_clear_error()
        let result = SSL_do_handshake(ssl)
        if result == 1 { return (true, nil) }
        let code = SSL_get_error(ssl, result)
        switch code {
        case SSL_ERROR_WANT_READ:
            watch(handler, writable: false)
            return (false, nil)
        case SSL_ERROR_WANT_WRITE:
            watch(handler, writable: true)
            return (false, nil)
        default:
            let verify = SSL_get_verify_result(ssl)
            if client && verify != Int(X509_V_OK) {
                let reason = String(cString: X509_verify_cert_error_string(verify))
                return (
                    false,
                    HTTP2Error(
                        .certificateVerifyFailed, "the server certificate did not verify", details: reason)
                )
            }
            let details = code == SSL_ERROR_SYSCALL ? "errno: \(errnoText())" : openSSLErrors()
            return (false, HTTP2Error(.tlsFailed, "the TLS handshake failed", details: details))
        }
    }

    /// Whether ALPN selected `h2`.
    var negotiatedH2: Bool {
        guard let ssl else { return false }
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length == 2 else { return false }
        return data[0] == UInt8(ascii: "h") && data[1] == UInt8(ascii: "2")
    }

    /// Sends our SETTINGS and opens the connection window.
    func submitSettings(_ entries: [(Int32, UInt32)], connectionWindow: Int32) {
        guard let session else { return }
        let settings = entries.map { nghttp2_settings_entry(settings_id: $0.0, value: $0.1) }
        _ = settings.withUnsafeBufferPointer { buffer in
            nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), buffer.baseAddress, buffer.count)
        }
        _ = nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, connectionWindow)
    }

    /// Reads until the socket would block, or `readBudget` bytes were read and TLS holds none of the socket's bytes
    /// back (the epoll registration is level-triggered: what is left in the socket wakes the loop again, while bytes
    /// OpenSSL has already taken from it would not). Returns an error when the connection is over.
    func readAvailable(_ handler: any LoopHandler) -> HTTP2Error? {
        guard let ssl, let session else { return nil }
        let base = readBuffer.baseAddress!.assumingMemoryBound(to: UInt8.self)
        var taken = 0
        while taken < Self.readBudget || SSL_has_pending(ssl) == 1 {
            ERR_clear_error()
            let count = SSL_read(ssl, base, Int32(readBuffer.count))
            if count > 0 {
                let consumed = nghttp2_session_mem_recv(session, base, Int(count))
                if consumed < 0 {
                    return HTTP2Error(
                        .protocolError, "the peer violated HTTP/2",
                        details: String(cString: nghttp2_strerror(Int32(consumed))))
                }
                if self.session == nil { return nil }
                taken += Int(count)
                continue
            }
            let code = SSL_get_error(ssl, count)
            switch code {
            case SSL_ERROR_WANT_READ:
                return nil
            case SSL_ERROR_WANT_WRITE:
                watch(handler, writable: true)
                return nil
            case SSL_ERROR_ZERO_RETURN:
                return HTTP2Error(.connectionClosed, "the peer closed the connection")
            case SSL_ERROR_SYSCALL:
                let details = errno == 0 ? "end of file" : errnoText()
                return HTTP2Error(.connectionClosed, "the connection was lost", details: details)
            default:
                return HTTP2Error(.connectionClosed, "the TLS connection failed", details: openSSLErrors())
            }
        }
        return nil
    }

    /// Writes what nghttp2 has queued until done or the socket would block.
    func writeAvailable(_ handler: any LoopHandler) -> HTTP2Error? {
        guard let ssl, let session else { return nil }
        while true {
            if outboundOffset == outbound.count {
                outbound.removeAll(keepingCapacity: true)
                outboundOffset = 0
                while outbound.count < Self.writeBatchLimit {
                    var chunk: UnsafePointer<UInt8>?
                    let count = nghttp2_session_mem_send(session, &chunk)
                    if count < 0 {
                        return HTTP2Error(
                            .protocolError, "nghttp2 could not serialize frames",
                            details: String(cString: nghttp2_strerror(Int32(count))))
                    }
                    guard count > 0, let chunk else { break }
                    outbound.append(contentsOf: UnsafeBufferPointer(start: chunk, count: count))
                }
                if outbound.isEmpty {
                    watch(handler, writable: false)
                    return nil
                }
            }
            ERR_clear_error()
            let remaining = outbound.count - outboundOffset
            let offset = outboundOffset
            let written = outbound.withUnsafeBytes { buffer in
                SSL_write(ssl, buffer.baseAddress! + offset, Int32(remaining))
            }
            if written > 0 {
                outboundOffset += Int(written)
                continue
            }
            let code = SSL_get_error(ssl, written)
            switch code {
            case SSL_ERROR_WANT_WRITE:
                watch(handler, writable: true)
                return nil
            case SSL_ERROR_WANT_READ:
                return nil
            default:
                let details = code == SSL_ERROR_SYSCALL ? errnoText() : openSSLErrors()
                return HTTP2Error(.connectionClosed, "writing to the connection failed", details: details)
            }
        }
    }

    /// Whether nghttp2 has nothing more to read or write (both sides are done).
    var sessionFinished: Bool {
        guard let session else { return true }
        return nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0
            && !hasPendingOutput
    }

    /// Frees the session, the TLS object and the socket. Never call it from inside an nghttp2 callback.
    func releaseResources() {
        if let session {
            nghttp2_session_del(session)
            self.session = nil
        }
        if let ssl {
            SSL_free(ssl)
            self.ssl = nil
        }
        if fd >= 0 {
            if registered { context.unregister(fd: fd) }
            registered = false
            close(fd)
            fd = -1
        }
        outbound = []
        outboundOffset = 0
    }
}

func string(_ pointer: UnsafePointer<UInt8>?, _ length: Int) -> String {
    guard let pointer else { return "" }
    return String(decoding: UnsafeBufferPointer(start: pointer, count: length), as: UTF8.self)
}

/// Copies up to `length` bytes of `source` from `offset` into `buffer` for a data provider; sets EOF at the end.
func provideBody(
    _ source: [UInt8], offset: inout Int, buffer: UnsafeMutablePointer<UInt8>?, length: Int,
    flags: UnsafeMutablePointer<UInt32>?
) -> Int {
    let count = min(length, source.count - offset)
    if count > 0, let buffer {
        source.withUnsafeBufferPointer { bytes in
            buffer.update(from: bytes.baseAddress! + offset, count: count)
        }
        offset += count
    }
    if offset >= source.count { flags?.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
    return count
}

extension nghttp2_frame_type {
    var byte: UInt8 { UInt8(rawValue) }
}
