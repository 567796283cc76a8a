import Foundation
import Synchronization

/// A TCP relay on 127.0.0.1 to the test database that a test can freeze: frozen, it passes no byte either way while
/// every connection stays open, as a database gone quiet behind a middlebox (the kernel acknowledges what the client
/// sends, so neither its statement timeouts nor its TCP keepalives end the wait). Each connection is two threads
/// copying bytes; they end when either side closes.
final class FreezableRelay: Sendable {
    /// A value the relay's threads share.
    private final class Shared<Value: Sendable>: Sendable {
        let value: Mutex<Value>
        init(_ value: Value) { self.value = Mutex(value) }
    }

    let port: Int
    private let listener: Int32
    private let frozen = Shared(false)

    /// Listens on a free port and relays to 127.0.0.1:`targetPort`.
    init(to targetPort: Int) throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = Self.loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
        }
        guard bound == 0, Glibc.listen(listener, 64) == 0 else {
            close(listener)
            throw TestFailure("the relay could not listen (errno \(errno))")
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
        let frozen = frozen
        Thread.detachNewThread {
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }  // closed
                let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                var target = Self.loopback(port: targetPort)
                let connected = withUnsafePointer(to: &target) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                guard connected == 0 else {
                    close(client)
                    close(server)
                    continue
                }
                // Each direction's thread shuts the other side's writing down when its own side ends; the second
                // to end closes both.
                let ended = Shared(0)
                for (from, to) in [(client, server), (server, client)] {
                    Thread.detachNewThread {
                        Self.copy(from: from, to: to, frozen: frozen)
                        shutdown(to, Int32(SHUT_WR))
                        if ended.value.withLock({
                            $0 += 1
                            return $0
                        }) == 2 {
                            close(client)
                            close(server)
                        }
                    }
                }
            }
        }
    }

    /// Stops passing bytes (what a thread already read waits with it).
    func freeze() { frozen.value.withLock { $0 = true } }

    /// Passes bytes again.
    func thaw() { frozen.value.withLock { $0 = false } }

    /// Stops accepting connections (those open end with their peers).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    /// `url` with its port replaced by the relay's.
    func url(for url: String) -> String {
        var components = URLComponents(string: url)!
        components.port = port
        return components.string!
    }

    private static func copy(from: Int32, to: Int32, frozen: Shared<Bool>) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(from, $0.baseAddress, $0.count) }
            guard count > 0 else { return }
            // A helper thread, not a test waiting: it checks every 10 ms whether it may pass the bytes on.
            while frozen.value.withLock({ $0 }) { usleep(10_000) }
            var sent = 0
            while sent < count {
                let n = buffer.withUnsafeBytes { write(to, $0.baseAddress! + sent, count - sent) }
                guard n > 0 else { return }
                sent += n
            }
        }
    }

    private static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }
}
