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

    /// A fresh, empty database; dropped by `drop`.
    static func makeDatabase(base: String = databaseURL) async throws -> String {
        let name = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(20)
        let admin = PostgresPool(try PostgresConfiguration(url: base), options: .init(maxConnections: 1))
        defer { admin.close() }
        try await admin.execute(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"))
        return url(database: String(name), base: base)
    }

    /// A free TCP port on 127.0.0.1 (bound, then released).
    static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
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

func runCommand(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws
    -> CommandResult
{
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { _, new in new }
    process.environment = env
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return CommandResult(status: process.terminationStatus, output: String(decoding: data, as: UTF8.self))
}

/// A `marquee` child process (e.g. `serve`), its output captured to a file.
final class MarqueeProcess: Sendable {
    let process: Process
    let logPath: String
    let port: Int

    init(_ arguments: [String], environment: [String: String], port: Int) throws {
        self.port = port
        logPath = NSTemporaryDirectory() + "marquee-\(UUID().uuidString).log"
        FileManager.default.createFile(atPath: logPath, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: TestEnvironment.marqueeBinary)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env["MARQUEE_LISTEN"] = "127.0.0.1:\(port)"
        env["MARQUEE_MIGRATIONS_DIR"] = TestEnvironment.migrationsDirectory
        env.merge(environment) { _, new in new }
        process.environment = env
        let log = FileHandle(forWritingAtPath: logPath)!
        process.standardOutput = log
        process.standardError = log
        try process.run()
        self.process = process
    }

    var baseURL: String { "http://127.0.0.1:\(port)" }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

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

    func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

    /// Waits for the process to exit and returns its status.
    func waitForExit(timeout: Duration = .seconds(20)) async throws -> Int32 {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while process.isRunning {
            if clock.now > deadline {
                process.terminate()
                throw TestFailure("marquee did not exit in time")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        return process.terminationStatus
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(atPath: logPath)
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A tiny HTTP/1.1 client on URLSession.
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

    static let session: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 10
        return URLSession(configuration: configuration)
    }()

    static func get(_ url: String, headers: [String: String] = [:]) async throws -> Response {
        try await send("GET", url, headers: headers, body: nil)
    }

    static func send(_ method: String, _ url: String, headers: [String: String] = [:], body: Data?) async throws
        -> Response
    {
        var request = URLRequest(url: URL(string: url)!)
        request.httpMethod = method
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        request.httpBody = body
        let (data, response) = try await session.data(for: request)
        let http = response as! HTTPURLResponse
        var fields: [String: String] = [:]
        for (key, value) in http.allHeaderFields {
            fields[String(describing: key)] = String(describing: value)
        }
        return Response(status: http.statusCode, headers: fields, body: data)
    }
}
