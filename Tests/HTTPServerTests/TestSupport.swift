import Foundation
import Synchronization
import Testing

@testable import HTTPServer

/// A response read off a raw socket.
struct RawResponse: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: [UInt8]

    var text: String { String(decoding: body, as: UTF8.self) }

    func problem() throws -> HTTPProblem {
        try JSONDecoder().decode(HTTPProblem.self, from: Data(body))
    }

    func json<T: Decodable>(_ type: T.Type) throws -> T {
        try JSONDecoder().decode(T.self, from: Data(body))
    }
}

struct ClientError: Error, CustomStringConvertible {
    var description: String
    var errno: Int32 = 0
}

/// A tiny blocking HTTP/1.1 client over a TCP socket, for tests. Use it only from `onThread`, never on the
/// cooperative pool (the server's handlers need those threads).
final class RawConnection {
    let fd: Int32
    private var buffer: [UInt8] = []

    /// Connects to 127.0.0.1:`port`, from `source` (another loopback address, e.g. `127.0.0.2`) when given.
    init(port: Int, timeoutSeconds: Int = 15, source: String? = nil) throws {
        // Close-on-exec: a child process another test spawns meanwhile must not inherit the socket and keep the
        // connection open after this test closes it.
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ClientError(description: "socket() failed", errno: errno) }
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard bound == 0 else { throw ClientError(description: "bind(\(source)) failed", errno: errno) }
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        if result != 0 {
            let code = errno
            // no close() here: the object is fully initialized, so deinit runs and closes the socket
            throw ClientError(description: "connect() failed: \(String(cString: strerror(code)))", errno: code)
        }
    }

    deinit { Glibc.close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if sent <= 0 {
                let code = errno
                throw ClientError(description: "send() failed: \(String(cString: strerror(code)))", errno: code)
            }
            offset += sent
        }
    }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Sends a request with `Content-Length` when there is a body.
    func sendRequest(
        _ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []
    ) throws {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if !body.isEmpty || ["POST", "PUT", "PATCH"].contains(method) { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try send(Array(head.utf8) + body)
    }

    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count < 0 { throw ClientError(description: "recv() failed", errno: errno) }
        if count == 0 { return false }
        buffer += chunk[0..<count]
        return true
    }

    /// Reads one response. `head` says the request was HEAD (no body follows).
    func readResponse(head: Bool = false) throws -> RawResponse {
        let separator: [UInt8] = [13, 10, 13, 10]
        var headerEnd: Int?
        while headerEnd == nil {
            if let index = Self.find(separator, in: buffer) {
                headerEnd = index
            } else if try !fill() {
                throw ClientError(description: "connection closed before response headers")
            }
        }
        let headText = String(decoding: buffer[0..<headerEnd!], as: UTF8.self)
        buffer.removeFirst(headerEnd! + 4)
        var lines = headText.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else {
            throw ClientError(description: "bad status line")
        }
        var headers = HTTPHeaders()
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.add(
                String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var body: [UInt8] = []
        if !head && status != 204 && status != 304 {
            if let length = headers["Content-Length"].flatMap({ Int($0) }) {
                while buffer.count < length {
                    if try !fill() { throw ClientError(description: "connection closed inside body") }
                }
                body = Array(buffer[0..<length])
                buffer.removeFirst(length)
            } else {
                while try fill() {}
                body = buffer
                buffer = []
            }
        }
        return RawResponse(status: status, headers: headers, body: body)
    }

    /// True if the peer closed the connection (reads EOF) within the receive timeout.
    func isClosedByPeer() -> Bool {
        (try? fill()) == false
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for start in 0...(haystack.count - needle.count)
        where haystack[start..<start + needle.count].elementsEqual(needle) {
            return start
        }
        return nil
    }

    /// Sends a chunked body of `count` chunks of `size` bytes and its last chunk, stopping at the first send that fails:
    /// a server that refuses the body as soon as it passes a limit answers and closes the connection midway.
    func sendChunks(_ count: Int, of size: Int) {
        let chunk = Array(String(size, radix: 16).utf8) + [13, 10] + [UInt8](repeating: 0x61, count: size) + [13, 10]
        for _ in 0..<count {
            guard (try? send(chunk)) != nil else { return }
        }
        try? send("0\r\n\r\n")
    }

    /// Sends `byte` every 100 ms until the server ends the connection without an answer (true) or `limit` passes
    /// since `started` (false): a slow client, which only the server's read deadline can cut off.
    func trickle(_ byte: String, from started: ContinuousClock.Instant, for limit: Duration) -> Bool {
        let clock = ContinuousClock()
        while clock.now - started < limit {
            guard (try? send(byte)) != nil else { return true }
            var probe = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&probe, 1, 100) > 0 {
                return (try? readResponse()) == nil  // EOF or reset, no answer
            }
        }
        return false
    }
}

/// Runs blocking work on a fresh thread so the cooperative pool stays free for the server's handlers.
func onThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do { continuation.resume(returning: try work()) } catch { continuation.resume(throwing: error) }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
}

/// Polls `condition` every 5 ms until it holds or `timeout` has passed, and says whether it held. Blocking: for work
/// on `onThread`.
func waitUntil(timeout: Duration = .seconds(10), _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        if ContinuousClock.now >= deadline { return false }
        usleep(5_000)
    }
    return true
}

/// One request on a fresh connection.
func request(
    _ port: Int, _ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []
) async throws -> RawResponse {
    try await onThread {
        let connection = try RawConnection(port: port)
        try connection.sendRequest(method, target, headers: headers, body: body)
        return try connection.readResponse(head: method == "HEAD")
    }
}

/// Collects access-log records.
final class RecordSink: Sendable {
    private let records = Mutex<[AccessLogRecord]>([])

    var all: [AccessLogRecord] { records.withLock { $0 } }

    func append(_ record: AccessLogRecord) { records.withLock { $0.append(record) } }

    /// Waits (briefly) until at least `count` records arrived; the callback runs after the response is sent.
    func waitFor(_ count: Int) async -> [AccessLogRecord] {
        for _ in 0..<400 {
            let current = all
            if current.count >= count { return current }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return all
    }
}

/// A counter shared with handlers.
final class Counter: Sendable {
    private let state = Mutex<(current: Int, peak: Int, total: Int)>((0, 0, 0))
    func enter() {
        state.withLock {
            $0.current += 1
            $0.total += 1
            $0.peak = max($0.peak, $0.current)
        }
    }
    func leave() { state.withLock { $0.current -= 1 } }
    var peak: Int { state.withLock { $0.peak } }
    var total: Int { state.withLock { $0.total } }
}

/// Starts a server on an ephemeral port, runs `body`, stops the server.
func withServer(
    _ router: Router,
    configure: (inout HTTPServer.Configuration) -> Void = { _ in },
    records: RecordSink? = nil,
    _ body: (HTTPServer) async throws -> Void
) async throws {
    var configuration = HTTPServer.Configuration(port: 0, threadCount: 2, drainTimeout: .seconds(5))
    configure(&configuration)
    var callback: (@Sendable (AccessLogRecord) -> Void)?
    if let records {
        callback = { records.append($0) }
    }
    let server = HTTPServer(configuration: configuration, router: router, onRequestCompleted: callback)
    try server.start()
    do {
        try await body(server)
    } catch {
        await server.stop()
        throw error
    }
    await server.stop()
}

struct Person: Codable, Equatable {
    var name: String
    var age: Int
}
