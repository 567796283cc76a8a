import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeDelivery
import MarqueeStore
import Observability
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeAPI

/// The problem the API answers `error` with (nil: a 500).
private func rendered(_ error: any Error) -> HTTPProblem? { problem(for: error) }

/// Channel management in process, against the real database: what the API makes of a database it cannot reach, and of
/// a key it cannot open.
@Suite("Channel recording (in process)")
struct ChannelRecordingTests {
    @Test(
        "channel management without the database is 503 database-unavailable; with a key that will not open, 409 apns-credential-unusable"
    )
    func notApple() async throws {
        let t = try await ChannelTests.tenant()
        let client = APNsChannelClient(configuration: .init(caFile: t.fixture.caFile))
        defer { Task { await client.shutdown() } }
        // Another master key under the same key ID: the tenant's sealed key does not open with it.
        let otherRing = try SealingKeyRing.fromBase64(Data(SecureRandom.bytes(32)).base64EncodedString())
        let pool = PostgresPool(
            try PostgresConfiguration(url: t.fixture.databaseURL), options: .init(maxConnections: 1))
        defer { pool.close() }
        let manager = APNsChannelManager(
            client: client, credentials: CredentialStore(database: TenantDatabase(pool: pool), keyRing: otherRing),
            keyRing: otherRing, logger: nil)
        let address = ChannelAddress(apnsChannelID: "dHJpcA==", bundleID: t.bundleID, environment: "sandbox")
        for operation in ["create", "delete"] {
            do {
                if operation == "create" {
                    _ = try await manager.create(tenant: t.tenant.uuid, storagePolicy: .none)
                } else {
                    try await manager.delete(tenant: t.tenant.uuid, address)
                }
                Issue.record("\(operation): no error")
            } catch {
                let answer = try #require(rendered(error), "\(operation): \(error)")
                #expect(answer.status == 409, "\(operation)")
                #expect(answer.type == Problems.typeBase + "apns-credential-unusable", "\(operation)")
            }
        }
        // A database that cannot be reached (nothing listens on its port).
        let gone = PostgresPool(
            try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:\(TestEnvironment.freePort())/marquee"),
            options: .init(maxConnections: 1))
        defer { gone.close() }
        let cut = APNsChannelManager(
            client: client, credentials: CredentialStore(database: TenantDatabase(pool: gone), keyRing: otherRing),
            keyRing: otherRing, logger: nil)
        do {
            _ = try await cut.create(tenant: t.tenant.uuid, storagePolicy: .none)
            Issue.record("no error without the database")
        } catch {
            #expect(error is PostgresError, "\(error)")
            let answer = try #require(rendered(error), "\(error)")
            #expect(answer.status == 503)
            #expect(answer.type == Problems.typeBase + "database-unavailable")
        }
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 0, "Apple was never asked")
    }
}
