import Foundation
import PostgresClient
import Synchronization
import Testing

/// Raised when the test database is not configured; tests fail (never skip) with this message.
struct TestSetupError: Error, CustomStringConvertible {
    var description: String
}

enum TestDatabase {
    /// The configuration from `DATABASE_URL`. Throws (failing the test loudly) if it is missing.
    static func configuration(application: String? = nil) throws -> PostgresConfiguration {
        guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty else {
            throw TestSetupError(
                description: "DATABASE_URL is not set: PostgresClientTests need a running PostgreSQL, e.g. "
                    + "DATABASE_URL=postgresql://postgres@127.0.0.1:55432/marquee")
        }
        var configuration = try PostgresConfiguration(url: url)
        configuration.applicationName = application
        return configuration
    }

    /// A pool on the test database.
    static func pool(
        application: String? = nil, options: PostgresPool.Configuration = .init(maxConnections: 4)
    ) throws -> PostgresPool {
        PostgresPool(try configuration(application: application), options: options)
    }

    /// A name unique to this test run, usable as table, channel or application name.
    static func uniqueName(_ prefix: String) -> String {
        prefix + "_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
    }

    /// Open backends with this application name, counted from another session.
    static func backendCount(_ pool: PostgresPool, application: String) async throws -> Int {
        let rows = try await pool.query(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = \(application)")
        return try rows[0].decode(Int.self, "n")
    }

    /// Terminates every backend with this application name; returns how many were terminated.
    @discardableResult
    static func terminateBackends(_ pool: PostgresPool, application: String) async throws -> Int {
        let rows = try await pool.query(
            """
            SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n
            FROM pg_stat_activity WHERE application_name = \(application)
            """)
        return try rows[0].decode(Int.self, "n")
    }
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
func eventually(
    timeout: Duration = .seconds(5), every interval: Duration = .milliseconds(25),
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() {
            return true
        }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}

/// A Mutex-protected value that concurrent test closures can share by reference.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>

    init(_ value: Value) {
        mutex = Mutex(value)
    }

    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R {
        mutex.withLock { body(&$0) }
    }

    var value: Value { mutex.withLock { $0 } }
}
