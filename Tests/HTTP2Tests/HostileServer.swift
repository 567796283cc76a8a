import COpenSSL
import Foundation
import Synchronization

@testable import HTTP2

/// A TLS server on 127.0.0.1 (ALPN h2, the test certificate) that speaks raw HTTP/2 frames from a script, one thread
/// per connection: what a hostile provider can send and `HTTP2Server` never would.
final class HostileServer: Sendable {
    /// One accepted connection, used only on its own thread. Its socket has short timeouts, so that a script blocked
    /// on a peer that stopped reading notices `stop()`.
    final class Peer {
        let ssl: OpaquePointer
        private let server: HostileServer

        fileprivate init(ssl: OpaquePointer, server: HostileServer) {
            self.ssl = ssl
            self.server = server
        }

        /// Whether the server is being stopped.
        var stopping: Bool { server.stopped.load(ordering: .relaxed) }

        /// Writes all of `bytes`; false once the connection failed or the server stops.
        @discardableResult
        func write(_ bytes: [UInt8]) -> Bool {
            var offset = 0
            while offset < bytes.count {
                if stopping { return false }
                ERR_clear_error()
                let written = bytes.withUnsafeBytes { buffer in
                    SSL_write(ssl, buffer.baseAddress! + offset, Int32(bytes.count - offset))
                }
                if written > 0 {
                    offset += Int(written)
                    server.written.wrappingAdd(Int(written), ordering: .relaxed)
                    continue
                }
                let code = SSL_get_error(ssl, written)
                guard code == SSL_ERROR_WANT_WRITE || code == SSL_ERROR_WANT_READ else { return false }
            }
            return true
        }
    }

    /// The port it listens on.
    let port: Int
    /// Plaintext bytes written to clients so far.
    let written = Atomic<Int>(0)
    /// Connections accepted so far.
    let accepted = Atomic<Int>(0)
    fileprivate let stopped = Atomic<Bool>(false)
    private let listener: Int32
    /// Threads (the acceptor and one per connection) not finished yet.
    private let running = Atomic<Int>(0)

    /// Listens and runs `script` on every connection once its TLS handshake is done; the connection closes when the
    /// script returns.
    init(script: @escaping @Sendable (Peer) -> Void) throws {
        let tls = try TLSContext.server(Fixtures.material.server)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                bind(fd, generic, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, generic, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw TestFailure("bind failed")
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        running.wrappingAdd(1, ordering: .relaxed)
        let acceptor = Thread { [self] in
            acceptLoop(tls: tls, script: script)
            running.wrappingSubtract(1, ordering: .relaxed)
        }
        acceptor.name = "hostile-accept"
        acceptor.start()
    }

    /// Stops accepting and ends every script (at its next write or read); returns once their threads have ended.
    func stop() async {
        stopped.store(true, ordering: .relaxed)
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(30)
        while clock.now < deadline, running.load(ordering: .relaxed) > 0 {
            try? await Task.sleep(for: .milliseconds(20))
        }
        close(listener)
    }

    private func acceptLoop(tls: TLSContext, script: @escaping @Sendable (Peer) -> Void) {
        while !stopped.load(ordering: .relaxed) {
            var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 50) > 0 else { continue }
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { continue }
            accepted.wrappingAdd(1, ordering: .relaxed)
            running.wrappingAdd(1, ordering: .relaxed)
            let thread = Thread { [self] in
                serve(fd: fd, tls: tls, script: script)
                running.wrappingSubtract(1, ordering: .relaxed)
            }
            thread.name = "hostile-peer"
            thread.start()
        }
    }

    private func serve(fd: Int32, tls: TLSContext, script: (Peer) -> Void) {
        defer { close(fd) }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let ssl = tls.makeSSL() else { return }
        defer { SSL_free(ssl) }
        SSL_set_fd(ssl, fd)
        while true {
            if stopped.load(ordering: .relaxed) { return }
            ERR_clear_error()
            let result = SSL_accept(ssl)
            if result == 1 { break }
            let code = SSL_get_error(ssl, result)
            guard code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE else { return }
        }
        script(Peer(ssl: ssl, server: self))
    }

    /// An HTTP/2 frame: the 9-byte header (RFC 9113 §4.1) and `payload`.
    static func frame(type: UInt8, flags: UInt8 = 0, stream: UInt32 = 0, payload: [UInt8] = []) -> [UInt8] {
        let length = UInt32(payload.count)
        return [
            UInt8(truncatingIfNeeded: length >> 16), UInt8(truncatingIfNeeded: length >> 8),
            UInt8(truncatingIfNeeded: length), type, flags,
            UInt8(truncatingIfNeeded: stream >> 24) & 0x7F, UInt8(truncatingIfNeeded: stream >> 16),
            UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream),
        ] + payload
    }

    /// The server's connection preface: an empty SETTINGS frame.
    static let settings = frame(type: 0x4)
}
