import Foundation
import Testing

@testable import HTTP2

@Suite("A host with several addresses")
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
}
