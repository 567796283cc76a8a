import Crypto
import Foundation
import HTTP2
import Synchronization
import Testing

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Certificates made once per test process: a trusted CA (written to a file for `caFile`) and a server
/// certificate for `localhost` / `127.0.0.1`.
enum Fixtures {
    struct Material: Sendable {
        var ca: TestPKI.CertificateAuthority
        var caFile: String
        var server: TLSServerConfiguration
        var directory: String
    }

    static let material: Material = {
        let directory = NSTemporaryDirectory() + "http2-tests-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ca = try! TestPKI.makeCA(commonName: "HTTP2 Test CA")
        let caFile = directory + "/ca.pem"
        try! ca.certificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
        let (cert, key) = try! TestPKI.makeServerCertificate(
            ca: ca, commonName: "localhost", dnsNames: ["localhost"], ipAddresses: ["127.0.0.1"])
        return Material(
            ca: ca, caFile: caFile, server: TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key),
            directory: directory)
    }()

    static func clientConfiguration(
        port: Int, connections: Int = 1, caFile: String? = material.caFile
    ) -> HTTP2Client.Configuration {
        HTTP2Client.Configuration(
            host: "127.0.0.1", port: port, tls: TLSClientConfiguration(caFile: caFile), connections: connections,
            connectTimeout: .seconds(5), requestTimeout: .seconds(20))
    }
}

/// Echoes method, path and `x-` headers as headers, and the body as the body.
@Sendable func echo(_ request: HTTP2ServerRequest) async -> HTTP2ServerResponse {
    var headers: [(String, String)] = [("x-method", request.method), ("x-path", request.path)]
    for (name, value) in request.headers where name.hasPrefix("x-") { headers.append((name, value)) }
    return HTTP2ServerResponse(status: 200, headers: headers, body: request.body)
}

/// Starts a server on an ephemeral (or given) port, runs `body`, stops the server.
func withServer<R>(
    port: Int = 0, tls: TLSServerConfiguration = Fixtures.material.server, maxConcurrentStreams: Int = 1000,
    handler: @escaping @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = echo,
    _ body: (HTTP2Server) async throws -> R
) async throws -> R {
    try await withServer(
        HTTP2Server(port: port, tls: tls, maxConcurrentStreams: maxConcurrentStreams, handler: handler), body)
}

/// Starts a server whose responder answers on the I/O threads (or later), runs `body`, stops the server.
func withServer<R>(
    responder: @escaping @Sendable (HTTP2ServerRequest) -> HTTP2ServerReply,
    _ body: (HTTP2Server) async throws -> R
) async throws -> R {
    try await withServer(HTTP2Server(port: 0, tls: Fixtures.material.server, responder: responder), body)
}

private func withServer<R>(_ server: HTTP2Server, _ body: (HTTP2Server) async throws -> R) async throws -> R {
    try server.start()
    let runner = Task { try await server.run() }
    do {
        let result = try await body(server)
        await server.stop()
        try await runner.value
        return result
    } catch {
        await server.stop()
        _ = try? await runner.value
        throw error
    }
}

/// Waits until `condition` holds or `timeout` passes.
func eventually(timeout: Duration = .seconds(5), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}

/// A counter shared with handlers.
final class Counter: Sendable {
    private let value = Mutex(0)
    @discardableResult func increment() -> Int {
        value.withLock {
            $0 += 1
            return $0
        }
    }
    var current: Int { value.withLock { $0 } }
}

/// Runs a command to completion (posix_spawn + waitpid on a Dispatch thread), capturing its output.
func runCommand(_ executable: String, _ arguments: [String], timeoutSeconds: Int = 30) async throws -> (Int32, String) {
    let outputPath = Fixtures.material.directory + "/cmd-\(UUID().uuidString).log"
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    _ = spawnActionsAddCloseFrom(&actions, 3)  // no other test's sockets leak into the child
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard rc == 0 else { throw TestFailure("posix_spawn \(executable) failed: \(rc)") }
    let child = pid
    let status: Int32 = await withCheckedContinuation { continuation in
        // A serial queue of its own (an overcommitting thread): on Linux `DispatchQueue.global()`'s threads, one per
        // core, also run every Swift task, and a wait held there for a child's lifetime starved the test process.
        DispatchQueue(label: "test.waitpid").async {
            let deadline = Date().addingTimeInterval(TimeInterval(timeoutSeconds))
            var raw: Int32 = 0
            while true {
                let result = waitpid(child, &raw, WNOHANG)
                if result == child { break }
                if Date() > deadline {
                    kill(child, SIGKILL)
                    waitpid(child, &raw, 0)
                    break
                }
                usleep(10_000)
            }
            continuation.resume(returning: raw)
        }
    }
    let output = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
    try? FileManager.default.removeItem(atPath: outputPath)
    return (status, output)
}

/// A free TCP port on 127.0.0.1 (bound and released; racy but fine for tests).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw TestFailure("socket failed") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
            bind(fd, generic, length) == 0 && getsockname(fd, generic, &length) == 0
        }
    }
    guard bound else { throw TestFailure("bind failed") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether something accepts TCP connections on 127.0.0.1:port.
func isListening(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
        }
    }
}

/// A long-running child process (e.g. `openssl s_server`), killed by `stop()`.
final class Child: Sendable {
    let pid: pid_t

    init(_ executable: String, _ arguments: [String]) throws {
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        guard rc == 0 else { throw TestFailure("posix_spawn \(executable) failed: \(rc)") }
        self.pid = pid
    }

    func stop() async {
        let pid = self.pid
        kill(pid, SIGKILL)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            // A serial queue of its own (an overcommitting thread): on Linux `DispatchQueue.global()`'s threads, one per
            // core, also run every Swift task, and a wait held there for a child's lifetime starved the test process.
            DispatchQueue(label: "test.waitpid").async {
                var status: Int32 = 0
                waitpid(pid, &status, 0)
                continuation.resume()
            }
        }
    }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not export.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func spawnActionsAddCloseFrom(
    _ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32
) -> Int32
