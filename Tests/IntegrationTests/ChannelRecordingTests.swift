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

/// A stand-in for Apple's channel management that answers the same channel ID (in `environment`) to every create,
/// as a confused or hostile management host might, and records what it is asked to delete (refusing it when told).
private final class RepeatingManager: BroadcastChannelManaging {
    let bundleID: String
    let environment: String
    let refusesDeletes: Bool
    let channelID = Data(SecureRandom.bytes(24)).base64EncodedString()
    private let deleted = Mutex<[String]>([])
    var deletes: [String] { deleted.withLock { $0 } }

    init(bundleID: String, environment: String = "sandbox", refusesDeletes: Bool = false) {
        self.bundleID = bundleID
        self.environment = environment
        self.refusesDeletes = refusesDeletes
    }

    func create(tenant: UUID, storagePolicy: ChannelStoragePolicy) async throws -> ChannelAddress {
        ChannelAddress(apnsChannelID: channelID, bundleID: bundleID, environment: environment)
    }

    func delete(tenant: UUID, _ channel: ChannelAddress) async throws {
        deleted.withLock { $0.append(channel.apnsChannelID) }
        if refusesDeletes { throw ChannelManagementError(.unreachable(reason: "timeout")) }
    }
}

/// Log lines, kept.
private final class Lines: Sendable {
    private let lines = Mutex<[String]>([])
    var all: [String] { lines.withLock { $0 } }
    var logger: Logger {
        Logger(label: "test", level: .info, sink: LogSink { line in self.lines.withLock { $0.append(line) } })
    }
}

/// The problem the API answers `error` with (nil: a 500).
private func rendered(_ error: any Error) -> HTTPProblem? { problem(for: error) }

/// Recording channels in process, against the real database: what the API makes of a management host's repeated ID,
/// of a database it cannot reach, and of a key it cannot open.
@Suite("Channel recording (in process)")
struct ChannelRecordingTests {
    static func routes(
        _ databaseURL: String, manager: any BroadcastChannelManaging,
        logger: Logger = Logger(label: "test", level: .critical)
    ) throws -> (ChannelRoutes, PostgresPool) {
        let pool = PostgresPool(try PostgresConfiguration(url: databaseURL), options: .init(maxConnections: 2))
        let database = TenantDatabase(pool: pool)
        let authenticator = Authenticator(
            tenants: TenantStore(database: database, keyRing: try SealingKeyRing.fromBase64(MarqueeProcess.masterKey)),
            adminToken: nil, cacheTTL: .seconds(600))
        let routes = ChannelRoutes(
            authenticator: authenticator, store: ChannelStore(database: database), manager: manager,
            logger: logger, now: { Date() })
        return (routes, pool)
    }

    @Test("a channel ID the management host answered before is a 502 invalid_channel_id; the live channel is kept")
    func repeatedChannelID() async throws {
        let t = try await ChannelTests.tenant()
        let manager = RepeatingManager(bundleID: t.bundleID)
        let (routes, pool) = try Self.routes(t.fixture.databaseURL, manager: manager)
        defer { pool.close() }
        let first = try await routes.open(tenant: t.tenant.uuid, activityType: t.type, policy: .none)
        #expect(first.apnsChannelID == manager.channelID)

        // Through the route, with an Idempotency-Key, and as a campaign opens one.
        let request = HTTPRequest(
            method: .POST, target: "/v1/channels",
            headers: ["Content-Type": "application/json", "Idempotency-Key": "dup-" + Fake.hex(8)],
            body: Array(#"{"activity_type":"\#(t.type)","storage_policy":"none"}"#.utf8))
        let principal = Principal(tenantID: t.tenant.uuid, keyID: UUID(), kind: .app)
        for attempt in ["create", "open"] {
            do {
                if attempt == "create" {
                    _ = try await routes.create(request, principal)
                } else {
                    _ = try await routes.open(tenant: t.tenant.uuid, activityType: t.type, policy: .none)
                }
                Issue.record("\(attempt): a repeated channel ID was recorded")
            } catch {
                let answer = try #require(rendered(error), "\(attempt): \(error)")
                #expect(answer.status == 502, "\(attempt)")
                #expect(answer.type == Problems.typeBase + "apns-refused", "\(attempt)")
                #expect(answer.extensions["apns_reason"] == "invalid_channel_id", "\(attempt)")
            }
        }
        #expect(manager.deletes.isEmpty, "the ID is the recorded channel's: never deleted at Apple")
        let listed = try await t.api.call("GET", "/v1/channels", key: t.tenant.app).json()
        #expect(listed.array("data").compactMap { $0.string("channel_id") } == [ULID(uuid: first.id).description])
        // Nothing was stored for the Idempotency-Key: a retry asks Apple again.
        do {
            _ = try await routes.create(request, principal)
            Issue.record("the retry was answered from a stored record")
        } catch {
            #expect(rendered(error)?.status == 502)
        }
    }

    @Test("a channel created at Apple that could not be recorded nor deleted again is logged with its ID")
    func undoLogged() async throws {
        let t = try await ChannelTests.tenant()
        // An environment the table refuses: recording fails after Apple created the channel.
        let manager = RepeatingManager(bundleID: t.bundleID, environment: "staging", refusesDeletes: true)
        let lines = Lines()
        let (routes, pool) = try Self.routes(t.fixture.databaseURL, manager: manager, logger: lines.logger)
        defer { pool.close() }
        await #expect(throws: PostgresError.self) {
            _ = try await routes.open(tenant: t.tenant.uuid, activityType: t.type, policy: .none)
        }
        #expect(manager.deletes == [manager.channelID], "deleted again")
        let logged = lines.all.filter { $0.contains("could not be deleted there") }
        #expect(logged.count == 1, "\(lines.all)")
        #expect(logged.first?.contains(manager.channelID) == true)
        #expect(logged.first?.contains(t.bundleID) == true)
    }

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
