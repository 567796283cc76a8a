import Foundation
import HTTPServer
import MarqueeAPI
import MarqueeStore
import Observability
import PostgresClient
import Testing

/// `marquee serve` as a real process against the real database.
@Suite("marquee serve")
struct ServeTests {
    /// A migrated database and a serving process on a free port.
    func startServe(databaseURL: String? = nil, migrate: Bool = true) async throws -> MarqueeProcess {
        let url: String
        if let databaseURL {
            url = databaseURL
        } else {
            url = try await TestEnvironment.makeDatabase()
        }
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        if migrate {
            let result = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
            try #require(result.status == 0, "\(result.output)")
        }
        let serve = try MarqueeProcess(["serve"], environment: env, port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        return serve
    }

    @Test("a statement past MARQUEE_DB_STATEMENT_TIMEOUT answers 503 database-timeout, and nothing is written")
    func statementTimeout() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        let migrated = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        try #require(migrated.status == 0, "\(migrated.output)")
        let serve = try MarqueeProcess(
            ["serve"], environment: env.merging(["MARQUEE_DB_STATEMENT_TIMEOUT": "1"]) { $1 },
            port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        let api = API(baseURL: serve.baseURL)
        let tenant = try await api.createTenant()
        // Another session holds the activity types table: the write waits for it, past the 1-second timeout.
        let lock = try await TableLock.take(url: url, table: "activity_types", mode: "ACCESS EXCLUSIVE")
        let blocked = try await api.call(
            "PUT", "/v1/activity_types/com.example.slow", key: tenant.app, json: ["attributes_type": "SlowAttributes"],
            timeout: 60)
        try await lock.release()
        #expect(blocked.status == 503, "\(blocked.text)")
        #expect(try blocked.json()["type"] as? String == "https://marquee.dev/problems/database-timeout")
        #expect(blocked.header("Retry-After") == "5")
        #expect(try await api.call("GET", "/v1/activity_types/com.example.slow", key: tenant.app).status == 404)
        // Without the lock the same request succeeds at once.
        let created = try await api.call(
            "PUT", "/v1/activity_types/com.example.slow", key: tenant.app, json: ["attributes_type": "SlowAttributes"])
        #expect(created.status == 201, "\(created.text)")
    }

    @Test("healthz, readyz and metrics answer; metrics count requests by route and status")
    func systemEndpoints() async throws {
        let serve = try await startServe()
        let health = try await HTTP.get(serve.baseURL + "/healthz")
        #expect(health.status == 200)
        #expect(try health.json()["status"] as? String == "ok")
        let ready = try await HTTP.get(serve.baseURL + "/readyz")
        #expect(ready.status == 200, "\(ready.text)")
        #expect(ready.header("X-Request-Id")?.isEmpty == false)

        // A request is counted once its answer has gone (libmicrohttpd's completion): the scrape may come first.
        var metrics = try await HTTP.get(serve.baseURL + "/metrics")
        try await eventually("the readyz request counted", timeout: .seconds(10)) {
            metrics = try await HTTP.get(serve.baseURL + "/metrics")
            return metrics.text.contains(#"marquee_http_request_duration_seconds_bucket{method="GET",route="/readyz""#)
        }
        #expect(metrics.status == 200)
        #expect(metrics.header("Content-Type")?.hasPrefix("text/plain") == true)
        #expect(metrics.text.contains("# TYPE marquee_http_requests_total counter"))
        #expect(
            metrics.text.contains(#"marquee_http_requests_total{method="GET",route="/healthz",status="200"}"#))
        #expect(metrics.text.contains("# TYPE marquee_http_request_duration_seconds histogram"))
        #expect(metrics.text.contains(#"marquee_http_request_duration_seconds_bucket{method="GET",route="/readyz""#))
        #expect(metrics.text.contains(#"marquee_http_body_rejections_total{reason="over_budget"} 0"#))
        #expect(metrics.text.contains("# TYPE marquee_http_buffered_body_bytes gauge"))
        // Any method token is passed through by the server; made-up ones share one label instead of one series each.
        for method in ["AAAA1", "AAAA2"] {
            _ = try await HTTP.send(method, serve.baseURL + "/healthz", body: nil)
        }
        try await eventually("made-up methods counted as OTHER") {
            let text = try await HTTP.get(serve.baseURL + "/metrics").text
            return text.contains(#"marquee_http_requests_total{method="OTHER","#)
        }
        let counted = try await HTTP.get(serve.baseURL + "/metrics").text
        #expect(!counted.contains("AAAA"))
        // The stall watch's probe runs every 500 ms from the start.
        try await eventually("a probe task measured") {
            let text = try await HTTP.get(serve.baseURL + "/metrics").text
            return text.contains("# TYPE marquee_runtime_task_start_lag_seconds histogram")
                && !text.contains("marquee_runtime_task_start_lag_seconds_count 0")
        }
    }

    @Test("readyz is 503 problem+json until migrations are applied")
    func readyNeedsMigrations() async throws {
        // `serve` logs in as marquee_app, a cluster-wide role that migration 0010 creates. On a fresh cluster this
        // test may run before any other has migrated a database: without the role, /readyz could only answer
        // database-unavailable. Another database is migrated first so that the role exists.
        let other = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: [
                "DATABASE_URL": try await TestEnvironment.makeDatabase(),
                "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
            ])
        try #require(other.status == 0, "\(other.output)")
        let url = try await TestEnvironment.makeDatabase()
        let serve = try await startServe(databaseURL: url, migrate: false)
        let before = try await HTTP.get(serve.baseURL + "/readyz")
        #expect(before.status == 503)
        #expect(before.header("Content-Type") == "application/problem+json")
        #expect(
            try before.json()["type"] as? String == "https://marquee.dev/problems/migrations-pending", "\(before.text)")
        let result = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory])
        #expect(result.status == 0)
        // The answer is shared for a second (SharedCheck): ready within it.
        try await eventually("ready after migrating", timeout: .seconds(10)) {
            try await HTTP.get(serve.baseURL + "/readyz").status == 200
        }
    }

    @Test("client mistakes are problem+json with the right status")
    func problems() async throws {
        let serve = try await startServe()
        let unknown = try await HTTP.get(serve.baseURL + "/no/such/path")
        #expect(unknown.status == 404)
        #expect(unknown.header("Content-Type") == "application/problem+json")
        let problem = try unknown.json()
        #expect((problem["type"] as? String)?.isEmpty == false)
        #expect(problem["status"] as? Int == 404)

        let wrongMethod = try await HTTP.send("DELETE", serve.baseURL + "/healthz", body: nil)
        #expect(wrongMethod.status == 405)
        #expect(wrongMethod.header("Content-Type") == "application/problem+json")

        // To a route that takes a body: a body to /healthz (GET only) is a 405, answered before the body is read.
        let huge = Data(repeating: UInt8(ascii: "a"), count: 2 << 20)
        let tooLarge = try await HTTP.send(
            "POST", serve.baseURL + "/v1/live_notifications/update", headers: ["Content-Type": "application/json"],
            body: huge)
        #expect(tooLarge.status == 413)
        #expect(tooLarge.header("Content-Type") == "application/problem+json")

        // A request target over 8 KiB, and header fields over 16 KiB: the server's problems, not the listener's HTML.
        let longTarget = try await HTTP.get(serve.baseURL + "/healthz?q=" + String(repeating: "a", count: 9_000))
        #expect(longTarget.status == 414)
        #expect(try longTarget.json()["type"] as? String == "https://marquee.dev/problems/uri-too-long")
        let largeHead = try await HTTP.get(
            serve.baseURL + "/healthz", headers: ["X-Large": String(repeating: "h", count: 17_000)])
        #expect(largeHead.status == 431)
        #expect(try largeHead.json()["type"] as? String == "https://marquee.dev/problems/header-fields-too-large")
        #expect(largeHead.header("Cache-Control") == "no-store")
    }

    @Test("MARQUEE_HTTP_IDLE_TIMEOUT closes a silent connection; MARQUEE_HTTP_CONNECTIONS holds others back until then")
    func listenerConnectionSettings() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        let migrated = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        try #require(migrated.status == 0, "\(migrated.output)")
        let settings = ["MARQUEE_HTTP_IDLE_TIMEOUT": "1", "MARQUEE_HTTP_CONNECTIONS": "1", "MARQUEE_HTTP_THREADS": "1"]
        let serve = try MarqueeProcess(
            ["serve"], environment: env.merging(settings) { $1 }, port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        let port = serve.port
        let outcome = try await withCheckedThrowingContinuation {
            (continuation: CheckedContinuation<(Int, Bool, Duration?, Int?), any Error>) in
            Thread {
                continuation.resume(
                    with: Result {
                        let clock = ContinuousClock()
                        let request = Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
                        // The only connection the listener takes: served, then kept alive and silent.
                        let held = try KeptAliveSocket(port: port)
                        try held.send(request)
                        let first = try held.readResponse().status
                        let idleSince = clock.now
                        // A second one waits in the backlog, unanswered while the first is open.
                        let waiting = try KeptAliveSocket(port: port)
                        try waiting.send(request)
                        let answeredWhileHeld = waiting.isReadable(within: .milliseconds(500))
                        // The idle timeout closes the first (1 s, at MHD's one-second granularity) ...
                        let closedAfter = held.waitForEnd(within: .seconds(10)) ? clock.now - idleSince : nil
                        // ... which lets the second in.
                        let second = try? waiting.readResponse().status
                        return (first, answeredWhileHeld, closedAfter, second)
                    })
            }.start()
        }
        let (first, answeredWhileHeld, closedAfter, second) = outcome
        #expect(first == 200)
        #expect(!answeredWhileHeld, "a second connection was served beyond MARQUEE_HTTP_CONNECTIONS=1")
        let idle = try #require(closedAfter, "the silent connection was not closed within 10 s")
        #expect(idle >= .milliseconds(500), "closed after \(idle)")
        #expect(second == 200)
    }

    @Test("SIGTERM stops the process cleanly")
    func sigtermDrains() async throws {
        let serve = try await startServe()
        #expect(try await HTTP.get(serve.baseURL + "/healthz").status == 200)
        serve.signal(SIGTERM)
        #expect(try await serve.waitForExit() == 0)
        #expect(serve.log.contains("\"msg\":\"stopped\""))
    }

    @Test("logs are JSON lines with request IDs and no raw paths")
    func accessLog() async throws {
        let serve = try await startServe()
        _ = try await HTTP.get(serve.baseURL + "/healthz", headers: ["X-Request-Id": "test-req-42"])
        _ = try await HTTP.get(serve.baseURL + "/secret-token-in-path-abc123")
        serve.signal(SIGTERM)
        _ = try await serve.waitForExit()
        let lines = serve.log.split(separator: "\n")
        #expect(!lines.isEmpty)
        for line in lines {
            #expect((try? JSONSerialization.jsonObject(with: Data(line.utf8))) != nil, "not JSON: \(line)")
        }
        #expect(
            lines.contains {
                $0.contains("\"request.id\":\"test-req-42\"") && $0.contains("\"http.route\":\"/healthz\"")
            })
        #expect(!serve.log.contains("secret-token-in-path-abc123"))
    }
}

/// Readiness across a PostgreSQL crash: the same process recovers by itself.
@Suite("Readiness across a database restart", .serialized)
struct DatabaseRestartTests {
    @Test("pg_ctl stop -m immediate gives 503; after restart 200 within 5 s, same process")
    func restart() async throws {
        let dir = NSTemporaryDirectory() + "marquee-restart-\(UUID().uuidString.prefix(8))"
        let script = TestEnvironment.repositoryRoot + "/Deploy/local/pg.sh"
        // A random port below the ephemeral range (32768+): while the cluster is down, no client socket, spawned
        // process (they bind ephemeral ports) or other cluster (pg.sh scans upwards from 55432) takes it.
        var port = Int.random(in: 20000...29999)
        while TestEnvironment.isListening(port: port) { port = Int.random(in: 20000...29999) }
        let start = try await runCommand("/bin/bash", [script, "start", dir, String(port)])
        try #require(start.status == 0, "\(start.output)")
        do {
            try await exercise(url: start.output, script: script, dir: dir)
        } catch {
            _ = try? await runCommand("/bin/bash", [script, "stop", dir])
            throw error
        }
        _ = try? await runCommand("/bin/bash", [script, "stop", dir])
    }

    func exercise(url output: String, script: String, dir: String) async throws {
        let url = output.trimmingCharacters(in: .whitespacesAndNewlines)
        let port = try #require(URLComponents(string: url)?.port)

        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        #expect(try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env).status == 0)
        let serve = try MarqueeProcess(["serve"], environment: env, port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        #expect(try await HTTP.get(serve.baseURL + "/readyz").status == 200)

        let stop = try await runCommand("/bin/bash", [script, "crash", dir])
        try #require(stop.status == 0, "\(stop.output)")
        // The answer is shared for a second (SharedCheck): unready within it.
        var down = try await HTTP.get(serve.baseURL + "/readyz")
        try await eventually("unready once PostgreSQL is down", timeout: .seconds(10)) {
            down = try await HTTP.get(serve.baseURL + "/readyz")
            return down.status == 503
        }
        #expect(down.header("Content-Type") == "application/problem+json")
        #expect(try down.json()["type"] as? String == "https://marquee.dev/problems/database-unavailable")

        let restarted = try await runCommand("/bin/bash", [script, "start", dir, String(port)])
        try #require(restarted.status == 0, "\(restarted.output)")
        let clock = ContinuousClock()
        let began = clock.now
        var status = 0
        while clock.now - began < .seconds(5) {
            status = (try? await HTTP.get(serve.baseURL + "/readyz").status) ?? 0
            if status == 200 { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(status == 200, "readyz did not recover within 5 s:\n\(serve.log)")
        #expect(serve.process.isRunning)
    }
}

/// `/readyz` in process, against a request pool the test exhausts.
@Suite("readiness")
struct ReadinessTests {
    @Test("readyz answers on a connection of its own while every request connection is taken")
    func readyWhilePoolBusy() async throws {
        let fixture = try await RegistryFixture.get()
        let pool = PostgresPool(
            try PostgresConfiguration(url: fixture.databaseURL), options: .init(maxConnections: 1))
        defer { pool.close() }
        var router = Router()
        SystemRoutes(
            pool: pool,
            migrator: Migrator(
                pool: pool, migrations: try MigrationFiles.load(directory: TestEnvironment.migrationsDirectory)),
            metrics: MetricsRegistry(), logger: Logger(label: "test", level: .critical)
        ).register(in: &router)
        guard case .matched(let readyz) = router.route(HTTPRequest(method: .GET, target: "/readyz")) else {
            Issue.record("no /readyz route")
            return
        }
        // A long request holds the pool's only connection.
        let (released, release) = AsyncStream.makeStream(of: Void.self)
        let (held, holding) = AsyncStream.makeStream(of: Void.self)
        let request = Task {
            try await pool.withConnection { _ in
                holding.yield()
                holding.finish()
                // Blocks this connection's own thread (never the cooperative pool) until the test is done.
                let done = DispatchSemaphore(value: 0)
                Task {
                    for await _ in released {}
                    done.signal()
                }
                done.wait()
            }
        }
        for await _ in held {}
        // Sharing the pool, the check waited out its acquire timeout and answered 503.
        let answer = try await readyz.handler(HTTPRequest(method: .GET, target: "/readyz"))
        #expect(answer.status == 200)
        release.finish()
        try await request.value
    }
}

/// A kept-alive client connection to 127.0.0.1 (blocking, 15 s socket timeouts), for the listener's connection tests.
final class KeptAliveSocket {
    let fd: Int32
    private var buffer: [UInt8] = []

    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket() failed") }
        var timeout = timeval(tv_sec: 15, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw TestFailure("connect to port \(port) failed (errno \(errno))") }
    }

    deinit { close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestFailure("send failed (errno \(errno))") }
            sent += n
        }
    }

    /// Reads one response with a `Content-Length` body.
    func readResponse() throws -> HTTP.Response {
        while !HTTP.isComplete(buffer) {
            var chunk = [UInt8](repeating: 0, count: 65_536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw TestFailure("connection ended before a whole response") }
            buffer += chunk[0..<n]
        }
        let response = try HTTP.parse(buffer)
        buffer = []
        return response
    }

    /// Whether something (data or the end) arrives within `timeout`.
    func isReadable(within timeout: Duration) -> Bool {
        var probe = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(
            &probe, 1, Int32(timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        ) > 0
    }

    /// Whether the server ends the connection (EOF or reset, nothing else read) within `timeout`.
    func waitForEnd(within timeout: Duration) -> Bool {
        guard isReadable(within: timeout) else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, 0) <= 0
    }
}
