import Foundation
import Synchronization
import Testing

@testable import HTTP2

/// A one-way gate: `wait()` blocks (a thread, or a task) until `open()`.
private final class Latch: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    let waiting = Atomic<Int>(0)
    func wait() {
        waiting.wrappingAdd(1, ordering: .relaxed)
        semaphore.wait()
    }
    func open() { for _ in 0..<64 { semaphore.signal() } }
}

@Suite("Where a client connects and sends")
struct AddressFallbackTests {
    @Test(
        "a first address that refuses the connection is left for the next: localhost with ::1 first, served on 127.0.0.1"
    )
    func nextAddress() async throws {
        try await withServer { server in
            let port = server.boundPort
            // What getaddrinfo gives for localhost where ::1 sorts first; the server listens on 127.0.0.1 only.
            let addresses = try [resolve(host: "::1", port: port).get(), resolve(host: "127.0.0.1", port: port).get()]
                .flatMap { $0 }
            var configuration = Fixtures.clientConfiguration(port: port)
            configuration.host = "localhost"
            let client = try HTTP2Client(configuration, resolve: { _, _, _ in .success(addresses) })
            let response = try await client.send(HTTP2Request(method: "GET", path: "/fallback"))
            #expect(response.status == 200)
            #expect(response.header("x-path") == "/fallback")
            #expect(client.statistics.connectsTotal == 1)
            await client.shutdown()
        }
    }

    @Test("every address refused: the request fails with the connect failure")
    func noAddressAnswers() async throws {
        let addresses = try [resolve(host: "::1", port: 1).get(), resolve(host: "127.0.0.1", port: 1).get()]
            .flatMap { $0 }
        var configuration = Fixtures.clientConfiguration(port: 1)
        configuration.host = "localhost"
        configuration.requestTimeout = .seconds(2)
        let client = try HTTP2Client(configuration, resolve: { _, _, _ in .success(addresses) })
        await #expect(throws: HTTP2Error.self) { try await client.send(HTTP2Request(method: "GET", path: "/")) }
        await client.shutdown()
    }

    @Test("a request goes to the open connection, not to a second one still connecting, while the open one has streams")
    func openConnectionFirst() async throws {
        let slow = Latch()
        let dns = Latch()
        // Released whatever happens, so that the server and the client can stop.
        defer {
            slow.open()
            dns.open()
        }
        let handler: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { request in
            if request.path == "/slow" {
                await withCheckedContinuation { continuation in
                    DispatchQueue(label: "slow").async {
                        slow.wait()
                        continuation.resume()
                    }
                }
            }
            return HTTP2ServerResponse(status: 200, headers: [("x-path", request.path)], body: [])
        }
        try await withServer(handler: handler) { server in
            let port = server.boundPort
            let addresses = try resolve(host: "127.0.0.1", port: port).get()
            // The first connection resolves at once; the second's lookup hangs (slow DNS) until released.
            let lookups = Atomic<Int>(0)
            var configuration = Fixtures.clientConfiguration(port: port, connections: 2)
            configuration.host = "localhost"
            configuration.requestTimeout = .seconds(60)
            let client = try HTTP2Client(
                configuration,
                resolve: { _, _, _ in
                    if lookups.wrappingAdd(1, ordering: .relaxed).newValue > 1 { dns.wait() }
                    return .success(addresses)
                })
            #expect(try await client.send(HTTP2Request(method: "GET", path: "/first")).status == 200)
            // The open connection is busy with one request: the next opens the second connection beside it.
            let busy = Task { try await client.send(HTTP2Request(method: "GET", path: "/slow")) }
            let deadline = ContinuousClock.now + .seconds(30)
            while slow.waiting.load(ordering: .relaxed) < 1 && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(5))
            }
            try #require(slow.waiting.load(ordering: .relaxed) == 1)
            // Held by the connection being opened, it would wait for the lookup: 10 s, then time out.
            let next = try? await client.send(HTTP2Request(method: "GET", path: "/next", timeout: .seconds(10)))
            #expect(next?.header("x-path") == "/next", "answered by the open connection")
            #expect(dns.waiting.load(ordering: .relaxed) == 1, "while the second connection's lookup still hangs")
            slow.open()
            dns.open()
            _ = try await busy.value
            await client.shutdown()
        }
    }
}
