import Foundation
import HTTP2
import Synchronization
import Testing

@Suite("HTTP2 client and server over TLS")
struct ClientServerTests {
    @Test("a request is echoed")
    func singleRequest() async throws {
        try await withServer { server in
            let client = try HTTP2Client(Fixtures.clientConfiguration(port: server.boundPort))
            let response = try await client.send(
                HTTP2Request(path: "/echo", headers: [("X-Test", "yes")], body: Array("hello".utf8)))
            #expect(response.status == 200)
            #expect(response.header("x-test") == "yes")
            #expect(response.header("x-method") == "POST")
            #expect(response.header("x-path") == "/echo")
            #expect(String(decoding: response.body, as: UTF8.self) == "hello")
            await client.shutdown()
        }
    }
}
