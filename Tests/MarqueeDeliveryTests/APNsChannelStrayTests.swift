import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeDelivery

/// The channel IDs a host was asked to delete.
private final class Deletes: Sendable {
    let ids = Mutex<[String]>([])
}

/// A management host that creates every channel with the ID it is given (whatever its form) and records deletes.
private final class ChannelHost: Sendable {
    let server: HTTP2Server
    let caFile: String
    private let deleted = Deletes()
    private let runner: Mutex<Task<Void, Never>?> = Mutex(nil)
    var deletes: [String] { deleted.ids.withLock { $0 } }

    init(channelID: String) throws {
        let directory = NSTemporaryDirectory() + "apns-stray-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ca = try TestPKI.makeCA(commonName: "Stray Channel CA")
        caFile = directory + "/ca.pem"
        try ca.certificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
        let (cert, key) = try TestPKI.makeServerCertificate(ca: ca)
        let deleted = self.deleted
        server = HTTP2Server(
            port: 0, tls: TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key),
            handler: { request in
                if request.method == "DELETE" {
                    let id = request.headers.first { $0.0 == "apns-channel-id" }?.1 ?? ""
                    deleted.ids.withLock { $0.append(id) }
                    return HTTP2ServerResponse(status: 204, headers: [])
                }
                return HTTP2ServerResponse(status: 201, headers: [("apns-channel-id", channelID)])
            })
        try server.start()
        let server = self.server
        runner.withLock { $0 = Task { try? await server.run() } }
    }

    func stop() async {
        await server.stop()
        await runner.withLock { $0 }?.value
    }
}

@Suite("A channel created with an ID this server will not record")
struct APNsChannelStrayTests {
    @Test("is deleted again when its ID can be sent back; the create fails with invalid_channel_id either way")
    func strayDeleted() async throws {
        for (id, sentBack) in [
            ("bad.id~0123", true), ("with space", false), (String(repeating: "x", count: 9000), false),
        ] {
            let host = try ChannelHost(channelID: id)
            let client = APNsChannelClient(
                configuration: .init(
                    caFile: host.caFile,
                    allowedHosts: ProviderHosts(entries: [.init(host: "127.0.0.1", port: host.server.boundPort)])))
            let target = APNsChannelTarget(
                host: "127.0.0.1", port: host.server.boundPort, bundleID: "com.example.app",
                tokens: ProviderTokenCache(teamID: "TEAM123456", keyID: "KEY1234567", key: .generate()))
            await #expect(throws: ChannelManagementError(.refused(status: 201, reason: "invalid_channel_id"))) {
                _ = try await client.create(target, storagePolicy: .none)
            }
            #expect(host.deletes == (sentBack ? [id] : []), "\(id.prefix(20))")
            await client.shutdown()
            await host.stop()
        }
    }
}
