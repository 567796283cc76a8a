import Foundation
import Synchronization
import Testing

@testable import HTTP2

/// Limits that keep a hostile server (a tenant's endpoint) from costing the client more than it allows.
@Suite("HTTP2 client limits against hostile servers", .serialized)
struct ClientLimitsTests {
    @Test("a response body over the limit resets the stream and fails with responseTooLarge; the connection lives")
    func bodyCap() async throws {
        let sized: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { request in
            let size = Int(request.path.dropFirst()) ?? 0
            return HTTP2ServerResponse(status: 200, headers: [], body: [UInt8](repeating: 0x41, count: size))
        }
        try await withServer(handler: sized) { server in
            var configuration = Fixtures.clientConfiguration(port: server.boundPort)
            configuration.maxResponseBodySize = 64 << 10
            let client = try HTTP2Client(configuration)
            let small = try await client.send(HTTP2Request(method: "GET", path: "/65536"))
            #expect(small.body.count == 65_536)
            do {
                _ = try await client.send(HTTP2Request(method: "GET", path: "/1048576"))
                Issue.record("an oversized body was accepted")
            } catch let error as HTTP2Error {
                #expect(error.code == .responseTooLarge)
            }
            let after = try await client.send(HTTP2Request(method: "GET", path: "/10"))
            #expect(after.body.count == 10)
            #expect(client.statistics.connectsTotal == 1)
            await client.shutdown()
        }
    }

    @Test("a header list over the limit fails the same way")
    func headerCap() async throws {
        let noisy: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { request in
            let count = Int(request.path.dropFirst()) ?? 0
            let headers = (0..<count).map { ("x-h\($0)", String(repeating: "v", count: 100)) }
            return HTTP2ServerResponse(status: 200, headers: headers, body: [])
        }
        try await withServer(handler: noisy) { server in
            var configuration = Fixtures.clientConfiguration(port: server.boundPort)
            configuration.maxResponseBodySize = 4096
            let client = try HTTP2Client(configuration)
            #expect(try await client.send(HTTP2Request(method: "GET", path: "/10")).header("x-h9") != nil)
            do {
                _ = try await client.send(HTTP2Request(method: "GET", path: "/100"))
                Issue.record("an oversized header list was accepted")
            } catch let error as HTTP2Error {
                #expect(error.code == .responseTooLarge)
            }
            #expect(try await client.send(HTTP2Request(method: "GET", path: "/1")).status == 200)
            await client.shutdown()
        }
    }

    @Test("empty header fields cost 32 bytes each against the limit, and more than 256 fail even without a limit")
    func emptyHeaderFields() async throws {
        let empty: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { request in
            let count = Int(request.path.dropFirst()) ?? 0
            return HTTP2ServerResponse(status: 200, headers: (0..<count).map { ("x-\($0)", "") }, body: [])
        }
        try await withServer(handler: empty) { server in
            var limited = Fixtures.clientConfiguration(port: server.boundPort)
            limited.maxResponseBodySize = 4096
            let client = try HTTP2Client(limited)
            // 100 fields: 3,590 bytes with the overhead; 200: 7,290, though their names and values come to 890.
            #expect(try await client.send(HTTP2Request(method: "GET", path: "/100")).header("x-99") == "")
            do {
                _ = try await client.send(HTTP2Request(method: "GET", path: "/200"))
                Issue.record("200 empty fields passed a 4096-byte header limit")
            } catch let error as HTTP2Error {
                #expect(error.code == .responseTooLarge)
            }
            await client.shutdown()

            let unlimited = try HTTP2Client(Fixtures.clientConfiguration(port: server.boundPort))
            #expect(try await unlimited.send(HTTP2Request(method: "GET", path: "/250")).header("x-249") == "")
            do {
                _ = try await unlimited.send(HTTP2Request(method: "GET", path: "/1000"))
                Issue.record("1000 header fields were kept")
            } catch let error as HTTP2Error {
                #expect(error.code == .responseTooLarge)
            }
            #expect(try await unlimited.send(HTTP2Request(method: "GET", path: "/1")).status == 200)
            await unlimited.shutdown()
        }
    }

    @Test("a peer flooding frames faster than they are read does not hold the shared I/O thread")
    func floodDoesNotHoldTheThread() async throws {
        // PRIORITY frames (RFC 9113 §6.3: allowed in any stream state, never answered, not flow-controlled) for a
        // stream that is not open, as fast as TLS carries them: the client reads far slower than they come.
        let priority = HostileServer.frame(type: 0x2, stream: 1001, payload: [0, 0, 0, 0, 15])
        let burst = Array(repeatElement(priority, count: 1170).joined())
        let hostile = try HostileServer { peer in
            peer.write(HostileServer.settings + HostileServer.frame(type: 0x4, flags: 0x1))
            while peer.write(burst) {}
        }
        try await withServer { server in
            // Two pools on one I/O thread, as the worker's pools of one provider are.
            let threads = try HTTP2ClientThreads(count: 1, name: "flood-test")
            let bystander = try HTTP2Client(Fixtures.clientConfiguration(port: server.boundPort), threads: threads)
            #expect(try await bystander.send(HTTP2Request(path: "/")).status == 200)
            let flooded = try HTTP2Client(Fixtures.clientConfiguration(port: hostile.port), threads: threads)
            let victim = Outcome()
            let victimTask = Task {
                do {
                    _ = try await flooded.send(HTTP2Request(path: "/", timeout: .seconds(2)))
                    victim.set("answered")
                } catch let error as HTTP2Error where error.code == .timeout {
                    victim.set("timeout")
                } catch {
                    victim.set("\(error)")
                }
            }
            // The flood is on (the client reads it: a thread held by it stays held while it lasts).
            #expect(await eventually(timeout: .seconds(60)) { hostile.written.load(ordering: .relaxed) > 16 << 20 })

            // While it lasts, the thread still serves the other pool and the flooded request's deadline.
            let other = Outcome()
            let otherTask = Task {
                do {
                    other.set("\(try await bystander.send(HTTP2Request(path: "/", timeout: .seconds(15))).status)")
                } catch {
                    other.set("\(error)")
                }
            }
            #expect(await eventually(timeout: .seconds(20)) { other.value != nil }, "the other pool's request waited")
            #expect(other.value == "200")
            #expect(await eventually(timeout: .seconds(20)) { victim.value != nil }, "the deadline did not fire")
            #expect(victim.value == "timeout")
            #expect(hostile.accepted.load(ordering: .relaxed) == 1)

            await hostile.stop()  // the flood ends (and a thread held by it is let go)
            await otherTask.value
            await victimTask.value
            await flooded.shutdown()
            await bystander.shutdown()
            await threads.shutdown()
        }
    }

    @Test("the header limit is sent as SETTINGS_MAX_HEADER_LIST_SIZE (0x6), and none without a limit")
    func advertisedHeaderLimit() {
        var configuration = Fixtures.clientConfiguration(port: 443)
        #expect(!ClientConnection.settings(configuration).contains { $0.0 == 0x6 })
        configuration.maxResponseBodySize = 64 << 10
        let settings = ClientConnection.settings(configuration)
        #expect(settings.contains { $0.0 == 0x6 && $0.1 == 64 << 10 })
        #expect(settings.contains { $0.0 == 0x2 && $0.1 == 0 })  // no push, as before
    }

    @Test("with special addresses refused, loopback is not connected to, literal or by name")
    func specialAddressesRefused() async throws {
        try await withServer { server in
            for host in ["127.0.0.1", "localhost"] {
                var configuration = Fixtures.clientConfiguration(port: server.boundPort)
                configuration.host = host
                configuration.allowsSpecialAddresses = false
                let client = try HTTP2Client(configuration)
                do {
                    _ = try await client.send(HTTP2Request(method: "GET", path: "/"))
                    Issue.record("\(host) was connected to")
                } catch let error as HTTP2Error {
                    #expect(error.code == .addressRefused)
                    #expect(!error.description.contains("127.0.0.1"))
                }
                #expect(client.statistics.connectsTotal == 0)
                await client.shutdown()
            }
        }
    }

    @Test("special-purpose addresses are recognised, public ones are not")
    func classification() {
        func v4(_ text: String) -> [UInt8] {
            var address = in_addr()
            inet_pton(AF_INET, text, &address)
            return withUnsafeBytes(of: &address) { Array($0) }
        }
        func v6(_ text: String) -> [UInt8] {
            var address = in6_addr()
            inet_pton(AF_INET6, text, &address)
            return withUnsafeBytes(of: &address) { Array($0) }
        }
        for special in [
            "0.0.0.0", "127.0.0.1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254",
            "100.64.0.1", "224.0.0.1", "255.255.255.255", "192.0.0.8", "198.18.0.1",
        ] {
            #expect(isSpecialPurposeIP(v4(special)), "\(special)")
        }
        for special in [
            "::", "::1", "fc00::1", "fd12:3456::1", "fe80::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
            "2001:db8::1", "64:ff9b::7f00:1", "2002:7f00:1::1",
        ] {
            #expect(isSpecialPurposeIP(v6(special)), "\(special)")
        }
        for public_ in ["17.188.143.34", "142.250.185.74", "172.32.0.1", "8.8.8.8", "100.128.0.1"] {
            #expect(!isSpecialPurposeIP(v4(public_)), "\(public_)")
        }
        for public_ in ["2620:149:a44::1", "2a00:1450:4001:82b::200a", "::ffff:8.8.8.8"] {
            #expect(!isSpecialPurposeIP(v6(public_)), "\(public_)")
        }
        #expect(isSpecialPurposeIP([1, 2, 3]))
    }
}

/// What a request came to, set once from its task and read by the test.
private final class Outcome: Sendable {
    private let state = Mutex<String?>(nil)
    func set(_ value: String) { state.withLock { $0 = $0 ?? value } }
    var value: String? { state.withLock { $0 } }
}
