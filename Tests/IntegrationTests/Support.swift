import Foundation
import PostgresClient
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// What `make test` provides. A missing database is a failure, never a skip.
enum TestEnvironment {
    static var databaseURL: String {
        guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty else {
            fatalError("DATABASE_URL is not set: run the integration tests through `make test`")
        }
        return url
    }

    /// The `marquee` binary built for these tests.
    static var marqueeBinary: String {
        if let path = ProcessInfo.processInfo.environment["MARQUEE_BIN"], !path.isEmpty { return path }
        return FileManager.default.currentDirectoryPath + "/.build/debug/marquee"
    }

    static var repositoryRoot: String { FileManager.default.currentDirectoryPath }
    static var migrationsDirectory: String { repositoryRoot + "/Migrations" }

    /// `DATABASE_URL` with another database name.
    static func url(database: String, base: String = databaseURL) -> String {
        guard var components = URLComponents(string: base) else { fatalError("DATABASE_URL must be a URI in tests") }
        components.path = "/" + database
        return components.string!
    }

    /// `url` for the `marquee_app` login role (migration 0010) instead of its owner: what `serve` and `worker` use.
    /// The test cluster trusts local connections, so no password is needed.
    static func appURL(_ url: String) -> String {
        guard var components = URLComponents(string: url) else { fatalError("DATABASE_URL must be a URI in tests") }
        components.user = "marquee_app"
        components.password = nil
        return components.string!
    }

    /// A fresh, empty database; dropped by `drop`.
    static func makeDatabase(base: String = databaseURL) async throws -> String {
        let name = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(20)
        let admin = PostgresPool(try PostgresConfiguration(url: base), options: .init(maxConnections: 1))
        defer { admin.close() }
        try await admin.execute(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"))
        return url(database: String(name), base: base)
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port`.
    static func isListening(port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        let result = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return result == 0
    }

    /// A free TCP port on 127.0.0.1 (bound, then released).
    static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return Int(UInt16(bigEndian: addr.sin_port))
    }
}

/// Runs a command to completion and returns its exit status and output.
struct CommandResult {
    var status: Int32
    var output: String
}

/// A child process started with posix_spawn, its output going to a file.
///
/// Foundation's `Process.waitUntilExit` was seen to hang on Linux when children exit while many tests run; `waitpid`
/// is used instead, on a Dispatch thread so that Swift's cooperative threads never block on it.
final class Subprocess: Sendable {
    let pid: pid_t
    let outputPath: String
    private let exitStatus = Mutex<Int32?>(nil)

    init(_ executable: String, _ arguments: [String], environment: [String: String], outputPath: String) throws {
        self.outputPath = outputPath
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { _, new in new }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Nothing else is inherited: a socket a concurrent test holds open (and then closes) must not stay open in
        // a child that outlives it, or its peer never sees the close.
        _ = spawnActionsAddCloseFrom(&actions, 3)
        // Children start with default signal handling and nothing blocked, whatever thread spawns them (Dispatch
        // threads block some signals, and a child would inherit that mask and ignore SIGTERM).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in [SIGTERM, SIGINT, SIGPIPE] { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard rc == 0 else { throw TestFailure("posix_spawn \(executable) failed: \(rc)") }
        self.pid = pid
    }

    var output: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }

    /// Non-blocking: whether the child is still running (reaps it if it has exited).
    var isRunning: Bool {
        exitStatus.withLock { status in
            if status != nil { return false }
            var raw: Int32 = 0
            let r = waitpid(pid, &raw, WNOHANG)
            if r == pid {
                status = Self.decode(raw)
                return false
            }
            return r == 0
        }
    }

    /// The exit status once the child has exited (128 + signal for a signal).
    var terminationStatus: Int32? {
        _ = isRunning
        return exitStatus.withLock { $0 }
    }

    /// Waits for the child to exit, off the cooperative pool.
    func wait() async -> Int32 {
        if let status = terminationStatus { return status }
        let pid = self.pid
        let raw: Int32 = await withCheckedContinuation { continuation in
            // A serial queue of its own (an overcommitting thread): on Linux `DispatchQueue.global()`'s threads, one per
            // core, also run every Swift task, and a wait held there for a child's lifetime starved the test process.
            DispatchQueue(label: "test.waitpid").async {
                var raw: Int32 = 0
                while waitpid(pid, &raw, 0) == -1 && errno == EINTR {}
                continuation.resume(returning: raw)
            }
        }
        let status = Self.decode(raw)
        exitStatus.withLock { if $0 == nil { $0 = status } }
        return exitStatus.withLock { $0! }
    }

    func signal(_ sig: Int32) { kill(pid, sig) }

    static func decode(_ raw: Int32) -> Int32 {
        let signal = raw & 0x7F
        return signal == 0 ? (raw >> 8) & 0xFF : 128 + signal
    }
}

func runCommand(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) async throws
    -> CommandResult
{
    let path = NSTemporaryDirectory() + "cmd-\(UUID().uuidString).log"
    defer { try? FileManager.default.removeItem(atPath: path) }
    let child = try Subprocess(executable, arguments, environment: environment, outputPath: path)
    let status = await child.wait()
    return CommandResult(status: status, output: child.output)
}

/// A `marquee` child process (e.g. `serve`), its output captured to a file.
final class MarqueeProcess: Sendable {
    let process: Subprocess
    let port: Int

    /// A master key for test processes (32 zero bytes would do, but a random one catches key-handling bugs).
    static let masterKey = Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
    static let adminToken = "test-admin-token-0123456789"

    /// `serve` and `worker` connect as `marquee_app`, as in production (the owner's `DATABASE_URL` is rewritten),
    /// unless `asOwner` keeps the given URL (to test that they refuse it).
    init(_ arguments: [String], environment: [String: String], port: Int, asOwner: Bool = false) throws {
        self.port = port
        var env: [String: String] = [
            "MARQUEE_LISTEN": "127.0.0.1:\(port)", "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
            "MARQUEE_MASTER_KEY": Self.masterKey, "MARQUEE_ADMIN_TOKEN": Self.adminToken,
            // Revocation must be visible at once in tests; the cache itself is exercised separately.
            "MARQUEE_KEY_CACHE_SECONDS": "0",
            // Without the cache every request looks its key up: the lookups a client address may make are not under
            // test here (KeyCacheTests.lookupsPerAddress), and every test talks from 127.0.0.1.
            "MARQUEE_KEY_LOOKUPS_PER_ADDRESS": "0",
            // A shared server on a loaded 2-core CI machine was seen to stall for 8 s as a whole (no request read,
            // none answered; the other servers kept going) and then fail every request that had waited for a pooled
            // connection meanwhile with the pool's 5-second timeout. Waits beyond 5 s are not under test here.
            "MARQUEE_DB_ACQUIRE_TIMEOUT": "30",
            // Apple's and Google's hosts plus the simulators on loopback (any port): credentials may point there, in
            // serve and worker alike.
            "MARQUEE_PROVIDER_HOSTS":
                "api.push.apple.com,api.sandbox.push.apple.com,api-manage-broadcast.push.apple.com,"
                + "api-manage-broadcast.sandbox.push.apple.com,fcm.googleapis.com,oauth2.googleapis.com,127.0.0.1",
        ]
        env.merge(environment) { _, new in new }
        if !asOwner, ["serve", "worker"].contains(arguments.first ?? "") {
            env["DATABASE_URL"] = TestEnvironment.appURL(env["DATABASE_URL"] ?? TestEnvironment.databaseURL)
        }
        process = try Subprocess(
            TestEnvironment.marqueeBinary, arguments, environment: env,
            outputPath: NSTemporaryDirectory() + "marquee-\(UUID().uuidString).log")
        // Fixtures are never deinitialised, and a test process that dies runs no atexit handlers: a watchdog kills
        // this process once the test process is gone (and leaves, killing nothing, when this one ended first).
        let test = getpid()
        let child = process.pid
        _ = try? Subprocess(
            "/bin/sh",
            [
                "-c",
                "while kill -0 \(test) 2>/dev/null && kill -0 \(child) 2>/dev/null; do sleep 1; done; "
                    + "kill -0 \(test) 2>/dev/null || kill -9 \(child) 2>/dev/null",
            ],
            environment: [:], outputPath: "/dev/null")
    }

    var baseURL: String { "http://127.0.0.1:\(port)" }
    var log: String { process.output }

    /// Waits until `/healthz` answers.
    func waitUntilServing(timeout: Duration = .seconds(20)) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while clock.now < deadline {
            if !process.isRunning { throw TestFailure("marquee exited early:\n\(log)") }
            if let response = try? await HTTP.get(baseURL + "/healthz"), response.status == 200 { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw TestFailure("marquee did not start serving:\n\(log)")
    }

    func signal(_ sig: Int32) { process.signal(sig) }

    /// Waits for the process to exit and returns its status.
    func waitForExit(timeout: Duration = .seconds(20)) async throws -> Int32 {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while process.isRunning {
            if clock.now > deadline {
                process.signal(SIGKILL)
                throw TestFailure("marquee did not exit in time")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        return process.terminationStatus ?? -1
    }

    deinit {
        if process.isRunning {
            process.signal(SIGKILL)
            var raw: Int32 = 0
            waitpid(process.pid, &raw, 0)
        }
        try? FileManager.default.removeItem(atPath: process.outputPath)
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A tiny HTTP/1.1 client over plain sockets.
enum HTTP {
    struct Response: Sendable {
        var status: Int
        var headers: [String: String]
        var body: Data
        var text: String { String(decoding: body, as: UTF8.self) }
        func header(_ name: String) -> String? {
            headers.first { $0.key.lowercased() == name.lowercased() }?.value
        }
        func json() throws -> [String: Any] {
            guard let object = try JSONSerialization.jsonObject(with: body) as? [String: Any] else {
                throw TestFailure("not a JSON object: \(text)")
            }
            return object
        }
    }

    static func get(_ url: String, headers: [String: String] = [:]) async throws -> Response {
        try await send("GET", url, headers: headers, body: nil)
    }

    /// One request on its own TCP connection (`Connection: close`), with blocking socket I/O on a dedicated thread
    /// and a 15 s socket timeout (or `timeout`). (URLSession on Linux was seen to leave an await hanging under heavy
    /// load; this client cannot: every failure is a thrown error.)
    static func send(
        _ method: String, _ url: String, headers: [String: String] = [:], body: Data?, timeout: Int = 15
    ) async throws -> Response {
        guard let components = URLComponents(string: url), let host = components.host, let port = components.port
        else { throw TestFailure("bad test URL \(url)") }
        let target = components.percentEncodedPath + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
        var head =
            "\(method) \(target.isEmpty ? "/" : target) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        let request = Array(head.utf8) + (body.map { Array($0) } ?? [])
        let raw = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8], any Error>) in
            let thread = Thread {
                continuation.resume(
                    with: Result { try exchange(host: host, port: port, request: request, timeout: timeout) })
            }
            thread.start()
        }
        return try parse(raw)
    }

    static func exchange(host: String, port: Int, request: [UInt8], timeout seconds: Int = 15) throws -> [UInt8] {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket() failed") }
        defer { close(fd) }
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr(host == "localhost" ? "127.0.0.1" : host)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw TestFailure("connect to \(host):\(port) failed (errno \(errno))") }
        var sent = 0
        while sent < request.count {
            let n = request[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            // A server may answer (e.g. 413 on Content-Length alone) and stop reading before the whole body is
            // sent: then read the answer it wrote.
            if n < 0 && errno == EPIPE { break }
            guard n > 0 else { throw TestFailure("send failed (errno \(errno))") }
            sent += n
        }
        var response: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { break }
            guard n > 0 else { throw TestFailure("recv failed (errno \(errno))") }
            response.append(contentsOf: chunk[0..<n])
            // Some servers (chromedriver) answer `Connection: close` and keep the connection open: a response whose
            // Content-Length has arrived in full is complete.
            if isComplete(response) { break }
        }
        return response
    }

    /// Whether `raw` holds a whole response with a `Content-Length` body.
    static func isComplete(_ raw: [UInt8]) -> Bool {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard raw.count >= 4, let end = (0...(raw.count - 4)).first(where: { Array(raw[$0..<$0 + 4]) == separator })
        else { return false }
        let head = String(decoding: raw[0..<end], as: UTF8.self).lowercased()
        guard let line = head.components(separatedBy: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
            let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
        else { return false }
        return raw.count - (end + 4) >= length
    }

    static func parse(_ raw: [UInt8]) throws -> Response {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = (0..<max(0, raw.count - 3)).first(where: { Array(raw[$0..<$0 + 4]) == separator }) else {
            throw TestFailure("incomplete HTTP response (\(raw.count) bytes)")
        }
        let headText = String(decoding: raw[0..<end], as: UTF8.self)
        var lines = headText.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { throw TestFailure("bad status line") }
        var fields: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields[String(line[..<colon])] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        var body = Array(raw[(end + 4)...])
        if let te = fields.first(where: { $0.key.lowercased() == "transfer-encoding" })?.value,
            te.lowercased() == "chunked"
        {
            body = try dechunk(body)
        } else if let length = fields.first(where: { $0.key.lowercased() == "content-length" }).flatMap({
            Int($0.value)
        }),
            length <= body.count
        {
            body = Array(body[0..<length])
        }
        return Response(status: status, headers: fields, body: Data(body))
    }

    static func dechunk(_ bytes: [UInt8]) throws -> [UInt8] {
        var out: [UInt8] = []
        var index = 0
        while index < bytes.count {
            guard let lineEnd = (index..<bytes.count - 1).first(where: { bytes[$0] == 13 && bytes[$0 + 1] == 10 })
            else {
                break
            }
            let sizeText = String(decoding: bytes[index..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
            guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else {
                throw TestFailure("bad chunk size")
            }
            if size == 0 { break }
            let start = lineEnd + 2
            guard start + size <= bytes.count else { throw TestFailure("truncated chunk") }
            out.append(contentsOf: bytes[start..<start + size])
            index = start + size + 2
        }
        return out
    }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not export.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func spawnActionsAddCloseFrom(
    _ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32
) -> Int32

/// Another session holding `table` in lock `mode` (e.g. `SHARE`, `ACCESS EXCLUSIVE`) until `release()`: a psql
/// process whose transaction sleeps. `take` returns once PostgreSQL has granted the lock.
struct TableLock: Sendable {
    let url: String
    let table: String
    /// pg_locks' name of the mode: `ACCESS EXCLUSIVE` → `AccessExclusiveLock`.
    let lockName: String
    let holder: Task<CommandResult, any Error>

    static func take(url: String, table: String, mode: String) async throws -> TableLock {
        let holder = Task {
            try await runCommand(
                "/usr/bin/psql",
                ["-X", "-q", url, "-c", "BEGIN; LOCK TABLE \(table) IN \(mode) MODE; SELECT pg_sleep(300)"])
        }
        let lockName = mode.split(separator: " ").map { $0.prefix(1) + $0.dropFirst().lowercased() }.joined() + "Lock"
        let lock = TableLock(url: url, table: table, lockName: lockName, holder: holder)
        let deadline = ContinuousClock.now + .seconds(60)
        while try await lock.holders() == 0 {
            guard ContinuousClock.now < deadline else { throw TestFailure("\(mode) lock on \(table) not granted") }
            try await Task.sleep(for: .milliseconds(10))
        }
        return lock
    }

    /// Ends the holding session (its transaction rolls back) and waits for psql.
    func release() async throws {
        try await withPool { pool in
            _ = try await pool.query(
                """
                SELECT pg_terminate_backend(pid) FROM pg_locks
                WHERE relation = \(table)::regclass AND mode = \(lockName) AND granted
                """)
        }
        _ = try await holder.value
    }

    private func holders() async throws -> Int {
        try await withPool { pool in
            let rows = try await pool.query(
                """
                SELECT count(*)::int AS n FROM pg_locks
                WHERE relation = \(table)::regclass AND mode = \(lockName) AND granted
                """)
            return try rows[0].decode(Int.self, "n")
        }
    }

    private func withPool<T>(_ body: (PostgresPool) async throws -> T) async throws -> T {
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        return try await body(pool)
    }
}
