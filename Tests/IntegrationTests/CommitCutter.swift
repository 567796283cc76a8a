import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A TCP proxy in front of PostgreSQL that cuts one connection at its transaction's COMMIT, as a server restart, a
/// terminated backend or a network cut would: for tests of what a client makes of a commit whose answer it never read.
///
/// It reads the protocol only as far as two byte strings: the Parse message of a `COMMIT` (what libpq sends for it in
/// a pipeline) and the CommandComplete that answers one. Everything else goes through as it comes. Plain TCP only
/// (`url` disables TLS).
final class CommitCutter: Sendable {
    enum Cut: Sendable, Equatable {
        /// The COMMIT reaches the server and runs; its answer is dropped and both sides are closed.
        case afterCommit
        /// The COMMIT never reaches the server and the client's side is closed. The server's side is closed too (the
        /// transaction aborts), or held open (`holdServer`): the transaction stays in progress, as behind a network
        /// cut, until its backend is terminated.
        case beforeCommit(holdServer: Bool)
    }

    /// One proxied connection: its two sockets, closed only when the proxy closes (so that no descriptor is reused
    /// while a pump may still use it).
    private final class Link: Sendable {
        let client: Int32
        let server: Int32
        /// The COMMIT went through and its answer is to be dropped.
        let awaitingCommitAnswer = Atomic(false)
        /// The client's side is cut: nothing more goes to it.
        let clientCut = Atomic(false)

        init(client: Int32, server: Int32) {
            self.client = client
            self.server = server
        }

        func cut(holdServer: Bool = false) {
            clientCut.store(true, ordering: .sequentiallyConsistent)
            shutdown(client, Int32(SHUT_RDWR))
            if !holdServer { shutdown(server, Int32(SHUT_RDWR)) }
        }
    }

    private struct State {
        var armed: (cut: Cut, isolate: Bool)?
        var fired = false
        /// After an isolating cut: every connection cut, new ones refused.
        var isolated = false
        var links: [Link] = []
        var closed = false
    }

    static let commitParse: [UInt8] = [0x50, 0, 0, 0, 14, 0] + Array("COMMIT".utf8) + [0, 0, 0]
    static let commitComplete: [UInt8] = [0x43, 0, 0, 0, 11] + Array("COMMIT".utf8) + [0]

    /// `upstream` with this proxy's address instead of the server's.
    let url: String
    private let listener: Int32
    private let upstreamPort: UInt16
    private let state = Mutex(State())

    init(_ upstream: String) throws {
        guard var components = URLComponents(string: upstream), let port = components.port else {
            throw TestFailure("not a URL with a port: \(upstream)")
        }
        upstreamPort = UInt16(port)
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        self.listener = listener
        var address = Self.loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
        }
        guard bound == 0, listen(listener, 64) == 0 else { throw TestFailure("the proxy could not listen") }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        components.host = "127.0.0.1"
        components.port = Int(UInt16(bigEndian: address.sin_port))
        components.queryItems = (components.queryItems ?? []) + [URLQueryItem(name: "sslmode", value: "disable")]
        url = components.string!
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else {
                    if errno == EINTR { continue }
                    return
                }
                self.serve(client)
            }
        }
    }

    /// Cuts the next connection whose transaction commits, once. `isolate`: from then on the database cannot be
    /// reached through the proxy (every other connection is cut, and new ones are closed at once).
    func arm(_ cut: Cut, isolate: Bool = false) {
        state.withLock {
            $0.armed = (cut, isolate)
            $0.fired = false
        }
    }

    /// Whether the armed cut happened.
    var fired: Bool { state.withLock { $0.fired } }

    /// Stops listening and closes every connection (a held server side included: its transaction then aborts).
    func close() {
        let links = state.withLock {
            $0.closed = true
            return $0.links
        }
        shutdown(listener, Int32(SHUT_RDWR))
        for link in links { link.cut() }
    }

    private func serve(_ client: Int32) {
        let refused = state.withLock { $0.isolated || $0.closed }
        let server = refused ? -1 : socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = Self.loopback(port: upstreamPort)
        let connected =
            !refused
            && withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            } == 0
        guard connected else {
            Glibc.close(client)
            if server >= 0 { Glibc.close(server) }
            return
        }
        let link = Link(client: client, server: server)
        state.withLock { $0.links.append(link) }
        Thread.detachNewThread { [self] in self.pumpToServer(link) }
        Thread.detachNewThread { [self] in self.pumpToClient(link) }
    }

    /// The armed cut, taken once, when `bytes` hold `signature`.
    private func take(_ bytes: ArraySlice<UInt8>, _ signature: [UInt8]) -> (cut: Cut, isolate: Bool)? {
        guard Self.find(signature, in: bytes) != nil else { return nil }
        return state.withLock { state in
            guard let armed = state.armed, !state.fired else { return nil }
            state.fired = true
            state.armed = nil
            return armed
        }
    }

    private func isolate(except link: Link) {
        let others = state.withLock {
            $0.isolated = true
            return $0.links.filter { $0 !== link }
        }
        for other in others { other.cut() }
    }

    private func pumpToServer(_ link: Link) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = read(link.client, &buffer, buffer.count)
            guard count > 0 else { return link.cut(holdServer: link.clientCut.load(ordering: .sequentiallyConsistent)) }
            var chunk = buffer[0..<count]
            if let (cut, isolating) = take(chunk, Self.commitParse) {
                if isolating { isolate(except: link) }
                switch cut {
                case .afterCommit:
                    link.awaitingCommitAnswer.store(true, ordering: .sequentiallyConsistent)
                case .beforeCommit(let hold):
                    chunk = chunk[..<Self.find(Self.commitParse, in: chunk)!]
                    _ = Self.writeAll(link.server, chunk)
                    link.cut(holdServer: hold)
                    return
                }
            }
            guard Self.writeAll(link.server, chunk) else { return link.cut() }
        }
    }

    private func pumpToClient(_ link: Link) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = read(link.server, &buffer, buffer.count)
            guard count > 0 else { return link.cut() }
            let chunk = buffer[0..<count]
            if link.awaitingCommitAnswer.load(ordering: .sequentiallyConsistent),
                Self.find(Self.commitComplete, in: chunk) != nil
            {
                return link.cut()
            }
            if link.clientCut.load(ordering: .sequentiallyConsistent) { continue }  // a held server's output
            guard Self.writeAll(link.client, chunk) else { return link.cut() }
        }
    }

    private static func writeAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
        var rest = bytes
        while !rest.isEmpty {
            let written = rest.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { return false }
            rest = rest.dropFirst(written)
        }
        return true
    }

    private static func find(_ signature: [UInt8], in bytes: ArraySlice<UInt8>) -> Int? {
        guard bytes.count >= signature.count else { return nil }
        var start = bytes.startIndex
        while start <= bytes.endIndex - signature.count {
            if bytes[start..<start + signature.count].elementsEqual(signature) { return start }
            start += 1
        }
        return nil
    }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        return address
    }
}
