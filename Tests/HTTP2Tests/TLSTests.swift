import Crypto
import Foundation
import HTTP2
import Testing

@Suite("HTTP2 TLS verification and ALPN", .serialized)
struct TLSTests {
    private func sendOnce(_ configuration: HTTP2Client.Configuration) async throws -> HTTP2Response {
        let client = try HTTP2Client(configuration)
        do {
            // The bound only stops a hung test: a refused certificate fails at once, and on a loaded 2-core machine
            // (the whole suite beside) an accepted one took over 5 s once.
            let response = try await client.send(HTTP2Request(method: "GET", path: "/", timeout: .seconds(30)))
            await client.shutdown()
            return response
        } catch {
            await client.shutdown()
            throw error
        }
    }

    @Test("a certificate from an untrusted CA is rejected")
    func untrustedCA() async throws {
        let otherCA = try TestPKI.makeCA(commonName: "Untrusted CA")
        let (cert, key) = try TestPKI.makeServerCertificate(ca: otherCA)
        let tls = TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key)
        try await withServer(tls: tls) { server in
            let error = await #expect(throws: HTTP2Error.self) {
                try await sendOnce(Fixtures.clientConfiguration(port: server.boundPort))
            }
            #expect(error?.code == .certificateVerifyFailed)
            #expect(error?.mayHaveBeenProcessed == false)
        }
    }

    @Test("our CA is not trusted without caFile")
    func caFileRequired() async throws {
        try await withServer { server in
            let error = await #expect(throws: HTTP2Error.self) {
                try await sendOnce(Fixtures.clientConfiguration(port: server.boundPort, caFile: nil))
            }
            #expect(error?.code == .certificateVerifyFailed)
            // with the CA file it is accepted
            let response = try await sendOnce(Fixtures.clientConfiguration(port: server.boundPort))
            #expect(response.status == 200)
        }
    }

    @Test("a host name or IP address mismatch is rejected")
    func nameMismatch() async throws {
        let (cert, key) = try TestPKI.makeServerCertificate(
            ca: Fixtures.material.ca, commonName: "other.example", dnsNames: ["other.example"], ipAddresses: [])
        let tls = TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key)
        try await withServer(tls: tls) { server in
            // IP address check: the certificate has no IP SAN for 127.0.0.1
            let byIP = await #expect(throws: HTTP2Error.self) {
                try await sendOnce(Fixtures.clientConfiguration(port: server.boundPort))
            }
            #expect(byIP?.code == .certificateVerifyFailed)
            // DNS name check
            var configuration = Fixtures.clientConfiguration(port: server.boundPort)
            configuration.tls.serverName = "wrong.example"
            let byName = await #expect(throws: HTTP2Error.self) { try await sendOnce(configuration) }
            #expect(byName?.code == .certificateVerifyFailed)
            // the right name passes
            configuration.tls.serverName = "other.example"
            let response = try await sendOnce(configuration)
            #expect(response.status == 200)
        }
    }

    @Test("a TLS server without h2 ALPN fails with alpnMismatch")
    func alpnMismatch() async throws {
        let directory = Fixtures.material.directory
        let certFile = directory + "/s_server-cert.pem"
        let keyFile = directory + "/s_server-key.pem"
        try Fixtures.material.server.certificateChainPEM.write(toFile: certFile, atomically: true, encoding: .utf8)
        try Fixtures.material.server.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        let port = try freePort()
        let child = try Child(
            "/usr/bin/openssl",
            ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", certFile, "-key", keyFile, "-www", "-quiet"])
        #expect(await eventually { isListening(port) })
        let error = await #expect(throws: HTTP2Error.self) {
            try await sendOnce(Fixtures.clientConfiguration(port: port))
        }
        await child.stop()
        #expect(error?.code == .alpnMismatch)
    }

    @Test("connecting to a closed port fails with connectFailed")
    func connectRefused() async throws {
        let port = try freePort()
        let error = await #expect(throws: HTTP2Error.self) {
            try await sendOnce(Fixtures.clientConfiguration(port: port))
        }
        #expect(error?.code == .connectFailed)
        #expect(error?.mayHaveBeenProcessed == false)
    }

    @Test("bad server key material and a missing CA file are configuration errors")
    func badConfiguration() throws {
        let server = HTTP2Server(
            port: 0, tls: TLSServerConfiguration(certificateChainPEM: "nope", privateKeyPEM: "nope")
        ) { _ in HTTP2ServerResponse(status: 200) }
        let serverError = #expect(throws: HTTP2Error.self) { try server.start() }
        #expect(serverError?.code == .invalidConfiguration)
        let clientError = #expect(throws: HTTP2Error.self) {
            _ = try HTTP2Client(Fixtures.clientConfiguration(port: 443, caFile: "/nonexistent/ca.pem"))
        }
        #expect(clientError?.code == .invalidConfiguration)
    }
}

@Suite("HTTP2Server interoperability with nghttp2-client tools", .serialized)
struct InteropTests {
    @Test("h2load: 20,000 requests over 4 connections, 100 streams each, 0 failed")
    func h2load() async throws {
        let body = Array("ok".utf8)
        let handler: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { _ in
            HTTP2ServerResponse(status: 200, body: body)
        }
        try await withServer(handler: handler) { server in
            let (status, output) = try await runCommand(
                "/usr/bin/h2load", ["-n", "20000", "-c", "4", "-m", "100", "https://127.0.0.1:\(server.boundPort)/x"],
                timeoutSeconds: 180)
            let summary = output.split(separator: "\n").filter {
                $0.hasPrefix("finished in") || $0.hasPrefix("requests:")
            }
            print("h2load: " + summary.joined(separator: " | "))
            #expect(status == 0)
            #expect(output.contains("20000 succeeded, 0 failed, 0 errored, 0 timeout"))
        }
    }

    @Test("side by side: HTTP2Client and h2load against the same server (20,000 requests, 4 x 100 streams)")
    func throughputSideBySide() async throws {
        let body = Array("ok".utf8)
        let handler: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { _ in
            HTTP2ServerResponse(status: 200, body: body)
        }
        try await withServer(handler: handler) { server in
            let client = try HTTP2Client(Fixtures.clientConfiguration(port: server.boundPort, connections: 4))
            _ = try await client.send(HTTP2Request(method: "GET", path: "/warm-up"))
            let total = 20_000
            let workers = 400
            let started = ContinuousClock.now
            let succeeded = try await withThrowingTaskGroup(of: Int.self) { group in
                for worker in 0..<workers {
                    group.addTask {
                        var ok = 0
                        for _ in stride(from: worker, to: total, by: workers) {
                            let response = try await client.send(HTTP2Request(method: "GET", path: "/x"))
                            if response.status == 200 && response.body == body { ok += 1 }
                        }
                        return ok
                    }
                }
                return try await group.reduce(0, +)
            }
            let seconds = (ContinuousClock.now - started) / .seconds(1)
            await client.shutdown()
            #expect(succeeded == total)
            let (status, output) = try await runCommand(
                "/usr/bin/h2load", ["-n", "20000", "-c", "4", "-m", "100", "https://127.0.0.1:\(server.boundPort)/x"],
                timeoutSeconds: 180)
            #expect(status == 0)
            let h2load = output.split(separator: "\n").first { $0.hasPrefix("finished in") } ?? "?"
            print("HTTP2Client: \(Int(Double(total) / seconds)) req/s; h2load: \(h2load)")
        }
    }

    @Test("nghttp GET returns the body")
    func nghttp() async throws {
        let handler: @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse = { request in
            HTTP2ServerResponse(
                status: 200, headers: [("content-type", "text/plain")],
                body: Array("hello \(request.method) \(request.path)".utf8))
        }
        try await withServer(handler: handler) { server in
            let (status, output) = try await runCommand(
                "/usr/bin/nghttp", ["https://127.0.0.1:\(server.boundPort)/greeting"], timeoutSeconds: 10)
            #expect(status == 0)
            #expect(output.contains("hello GET /greeting"))
        }
    }
}
