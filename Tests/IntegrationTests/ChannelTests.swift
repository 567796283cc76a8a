import Crypto
import Foundation
import HTTP2
import MarqueeCore
import MarqueeDelivery
import MarqueeSimulators
import PostgresClient
import Synchronization
import Testing

/// A database, an in-process APNs simulator, and `marquee serve` trusting the simulator's CA (channels are created at
/// Apple by the API process itself).
actor ChannelFixture {
    static let shared = ChannelFixture()

    struct Running: Sendable {
        let databaseURL: String
        let serve: MarqueeProcess
        let simulator: APNsSimulator
        let caFile: String
        let key: ES256PrivateKey
        let teamID = "TEAMCHAN12"
        let keyID = "KEYCHAN123"
        var api: API { API(baseURL: serve.baseURL) }
        var managementEndpoint: String { "https://127.0.0.1:\(simulator.port)" }

        /// Starts a worker process against this fixture (broadcasts go to the same simulator).
        func worker() throws -> MarqueeProcess {
            let port = TestEnvironment.freePort()
            return try MarqueeProcess(
                ["worker"],
                environment: [
                    "DATABASE_URL": databaseURL, "MARQUEE_CA_FILE": caFile, "MARQUEE_RETRY_INITIAL_MS": "200",
                    "MARQUEE_LOG_LEVEL": "info", "MARQUEE_METRICS_LISTEN": "127.0.0.1:\(port)",
                ], port: port)
        }

        /// A client of the simulator itself (its `/_sim/` inspection API and channel management).
        func simulatorClient() throws -> HTTP2Client {
            try HTTP2Client(
                .init(
                    host: "127.0.0.1", port: simulator.port, tls: TLSClientConfiguration(caFile: caFile),
                    connectTimeout: .seconds(5), requestTimeout: .seconds(20)))
        }

        /// Channels the simulator holds for `bundleID`.
        func channelsAtApple(_ bundleID: String) async throws -> Int {
            let client = try simulatorClient()
            defer { Task { await client.shutdown() } }
            let response = try await client.send(HTTP2Request(method: "GET", path: "/_sim/channels"))
            return Int(try JSONValue.parse(response.body)["channels"]?[bundleID]?.intValue ?? 0)
        }

        /// Sets the simulator's channel limit for `bundleID`.
        func limitChannels(_ bundleID: String, to limit: Int) async throws {
            let client = try simulatorClient()
            defer { Task { await client.shutdown() } }
            let body = JSONValue.object(["bundle_id": .string(bundleID), "limit": .int(Int64(limit))])
            let response = try await client.send(HTTP2Request(method: "POST", path: "/_sim/channels", body: body.bytes))
            guard response.status == 200 else { throw TestFailure("set limit: \(response.status)") }
        }
    }

    private var starting: Task<Running, any Error>?

    static func get() async throws -> Running { try await shared.running() }

    func running() async throws -> Running {
        if let starting { return try await starting.value }
        let task = Task { try await Self.start() }
        starting = task
        return try await task.value
    }

    private static func start() async throws -> Running {
        let key = ES256PrivateKey.generate()
        let caFile = NSTemporaryDirectory() + "chan-ca-\(UUID().uuidString).pem"
        let simulator = try APNsSimulator(
            configuration: .init(
                port: 0, caOutputPath: caFile,
                keys: [.init(keyID: "KEYCHAN123", teamID: "TEAMCHAN12", publicKey: key.publicKey)]))
        try simulator.start()
        // Handlers run inside `run()`; it serves for the life of the test process.
        Task.detached { try? await simulator.run() }
        let url = try await TestEnvironment.makeDatabase()
        let env = [
            "DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
            "MARQUEE_CA_FILE": caFile,
        ]
        let migrate = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        guard migrate.status == 0 else { throw TestFailure("migrate: \(migrate.output)") }
        let serve = try MarqueeProcess(["serve"], environment: env, port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        return Running(databaseURL: url, serve: serve, simulator: simulator, caFile: caFile, key: key)
    }
}

@Suite("Broadcast channels (APNs channel management)")
struct ChannelTests {
    struct Tenant {
        var fixture: ChannelFixture.Running
        var tenant: TestTenant
        var type: String
        var bundleID: String
        var api: API { fixture.api }

        func create(_ policy: String = "most_recent", type: String? = nil, headers: [String: String] = [:])
            async throws -> HTTP.Response
        {
            try await api.call(
                "POST", "/v1/channels", key: tenant.app,
                json: ["activity_type": type ?? self.type, "storage_policy": policy], headers: headers)
        }
    }

    /// A tenant with an APNs credential whose management host is the simulator, and one activity type.
    static func tenant(signer: ES256PrivateKey? = nil) async throws -> Tenant {
        let fixture = try await ChannelFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        let bundleID = "com.example.c" + Fake.hex(8)
        let creds = try await api.call(
            "PUT", "/v1/credentials/apns", key: tenant.app,
            json: [
                "team_id": fixture.teamID, "key_id": fixture.keyID,
                "private_key": (signer ?? fixture.key).pkcs8PEM, "bundle_id": bundleID, "environment": "sandbox",
                "management_endpoint": fixture.managementEndpoint, "endpoint": fixture.managementEndpoint,
            ])
        guard creds.status == 200 else { throw TestFailure("credentials: \(creds.text)") }
        let type = Fake.activityType()
        let defined = try await api.call(
            "PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "ScoreAttributes"])
        guard defined.status == 201 else { throw TestFailure("activity type: \(defined.text)") }
        return Tenant(fixture: fixture, tenant: tenant, type: type, bundleID: bundleID)
    }

    @Test("create, list, read and delete: the channel exists at Apple exactly while Marquee has it")
    func lifecycle() async throws {
        let t = try await Self.tenant()
        let created = try await t.create("most_recent")
        #expect(created.status == 201, "\(created.text)")
        let body = try created.json()
        let id = try #require(body.string("channel_id"))
        let apnsID = try #require(body.string("apns_channel_id"))
        #expect(!apnsID.isEmpty)
        #expect(body.string("storage_policy") == "most_recent")
        #expect(body.string("activity_type") == t.type)
        #expect(body.string("environment") == "sandbox")
        #expect(body.string("bundle_id") == t.bundleID)
        #expect(body.string("status") == "active")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)

        let other = try await t.create("none")
        #expect(other.status == 201, "\(other.text)")
        let otherID = try #require(try other.json().string("channel_id"))

        let read = try await t.api.call("GET", "/v1/channels/\(id)", key: t.tenant.app)
        #expect(read.status == 200)
        #expect(try read.json().string("apns_channel_id") == apnsID)

        // Newest first, one page at a time.
        let first = try await t.api.call("GET", "/v1/channels?limit=1", key: t.tenant.app).json()
        #expect(first.array("data").map { $0.string("channel_id") } == [otherID])
        let cursor = try #require(first.string("next_cursor"))
        let second = try await t.api.call("GET", "/v1/channels?limit=1&cursor=\(cursor)", key: t.tenant.app).json()
        #expect(second.array("data").map { $0.string("channel_id") } == [id])
        #expect(second["next_cursor"] is NSNull)
        let filtered = try await t.api.call(
            "GET", "/v1/channels?activity_type=\(Fake.activityType())", key: t.tenant.app
        ).json()
        #expect(filtered.array("data").isEmpty)

        let deleted = try await t.api.call("DELETE", "/v1/channels/\(id)", key: t.tenant.app)
        #expect(deleted.status == 204, "\(deleted.text)")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
        // Each request to Apple is logged with its apns-request-id; the provider token never is.
        let log = t.fixture.serve.log
        #expect(log.contains("apns.request_id") && log.contains("channel.create") && log.contains("channel.delete"))
        #expect(!log.contains("bearer ") && !log.contains("eyJ"))
        expectProblem(try await t.api.call("GET", "/v1/channels/\(id)", key: t.tenant.app), 404, "not-found")
        expectProblem(try await t.api.call("DELETE", "/v1/channels/\(id)", key: t.tenant.app), 404, "not-found")
        expectProblem(try await t.api.call("GET", "/v1/channels/not-a-ulid", key: t.tenant.app), 404, "not-found")
        let left = try await t.api.call("GET", "/v1/channels", key: t.tenant.app).json()
        #expect(left.array("data").map { $0.string("channel_id") } == [otherID])
    }

    @Test("a channel Apple no longer knows is still deleted locally")
    func deleteForgottenChannel() async throws {
        let t = try await Self.tenant()
        let created = try await t.create()
        let body = try created.json()
        let id = try #require(body.string("channel_id"))
        let apnsID = try #require(body.string("apns_channel_id"))
        // Deleted at Apple behind Marquee's back, with the channel client itself.
        let client = APNsChannelClient(
            configuration: .init(caFile: t.fixture.caFile, allowedHosts: .init("127.0.0.1")!))
        let target = APNsChannelTarget(
            host: "127.0.0.1", port: t.fixture.simulator.port, bundleID: t.bundleID,
            tokens: ProviderTokenCache(teamID: t.fixture.teamID, keyID: t.fixture.keyID, key: t.fixture.key))
        try await client.delete(target, channelID: apnsID)
        await client.shutdown()
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 0)

        let deleted = try await t.api.call("DELETE", "/v1/channels/\(id)", key: t.tenant.app)
        #expect(deleted.status == 204, "\(deleted.text)")
        expectProblem(try await t.api.call("GET", "/v1/channels/\(id)", key: t.tenant.app), 404, "not-found")
    }

    @Test("the channel client reads and lists over HTTP/2, and maps Apple's errors")
    func client() async throws {
        let fixture = try await ChannelFixture.get()
        let bundleID = "com.example.k" + Fake.hex(8)
        let client = APNsChannelClient(configuration: .init(caFile: fixture.caFile, allowedHosts: .init("127.0.0.1")!))
        defer { Task { await client.shutdown() } }
        let target = APNsChannelTarget(
            host: "127.0.0.1", port: fixture.simulator.port, bundleID: bundleID,
            tokens: ProviderTokenCache(teamID: fixture.teamID, keyID: fixture.keyID, key: fixture.key))
        let a = try await client.create(target, storagePolicy: .none)
        let b = try await client.create(target, storagePolicy: .mostRecent)
        #expect(try await client.read(target, channelID: a).storagePolicy == ChannelStoragePolicy.none)
        #expect(try await client.read(target, channelID: b).storagePolicy == .mostRecent)
        #expect(Set(try await client.list(target)) == [a, b])
        try await client.delete(target, channelID: a)
        #expect(try await client.list(target) == [b])
        await #expect(throws: ChannelManagementError(.channelNotFound)) {
            _ = try await client.read(target, channelID: a)
        }
        await #expect(throws: ChannelManagementError(.channelNotFound)) {
            try await client.delete(target, channelID: a)
        }
        // An expired provider token is refreshed once, and the request retried.
        let clock = Mutex(Date().addingTimeInterval(-7200))
        let stale = APNsChannelTarget(
            host: "127.0.0.1", port: fixture.simulator.port, bundleID: bundleID,
            tokens: ProviderTokenCache(
                teamID: fixture.teamID, keyID: fixture.keyID, key: fixture.key,
                now: {
                    clock.withLock { date in
                        defer { date = Date() }
                        return date
                    }
                }))
        #expect(try await client.list(stale) == [b])
        #expect(try #require(stale.tokens.issuedAt) > Date().addingTimeInterval(-600))
        // A host outside the allowlist is never connected to.
        let strict = APNsChannelClient(configuration: .init(caFile: fixture.caFile))
        await #expect(throws: ChannelManagementError(.unreachable(reason: "endpoint_not_allowed"))) {
            _ = try await strict.list(target)
        }
        await strict.shutdown()
    }

    @Test("Apple's limit is a 422 naming 10,000 channels; nothing is recorded")
    func limit() async throws {
        let t = try await Self.tenant()
        try await t.fixture.limitChannels(t.bundleID, to: 1)
        #expect(try await t.create().status == 201)
        let refused = try await t.create()
        expectProblem(refused, 422, "channel-limit-reached")
        #expect(try refused.json().string("apns_reason") == "CannotCreateChannelConfig")
        #expect(try refused.json().string("detail")?.contains("10000") == true)
        let list = try await t.api.call("GET", "/v1/channels", key: t.tenant.app).json()
        #expect(list.array("data").count == 1)
    }

    @Test("Apple refusing is a 502 naming Apple's reason")
    func refusal() async throws {
        // A key Apple (the simulator) does not know signs the provider token.
        let t = try await Self.tenant(signer: ES256PrivateKey.generate())
        let refused = try await t.create()
        expectProblem(refused, 502, "apns-refused")
        #expect(try refused.json().string("apns_reason") == "InvalidProviderToken")
        #expect(try refused.json().string("apns_status") == "403")
        #expect(try refused.json().string("detail")?.contains("InvalidProviderToken") == true)
        let list = try await t.api.call("GET", "/v1/channels", key: t.tenant.app).json()
        #expect(list.array("data").isEmpty)
    }

    @Test("client mistakes: unknown activity type, bad storage policy, no credential, unknown fields")
    func mistakes() async throws {
        let t = try await Self.tenant()
        expectProblem(try await t.create(type: Fake.activityType()), 422, "invalid-field", field: "activity_type")
        expectProblem(try await t.create("everything"), 422, "invalid-field", field: "storage_policy")
        expectProblem(
            try await t.api.call("POST", "/v1/channels", key: t.tenant.app, json: ["storage_policy": "none"]), 422,
            "missing-field", field: "activity_type")
        expectProblem(
            try await t.api.call(
                "POST", "/v1/channels", key: t.tenant.app,
                json: ["activity_type": t.type, "storage_policy": "none", "push_type": "Alert"]), 422, "invalid-field",
            field: "push_type")
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 0)
        // Without an APNs credential there is no Apple to ask.
        let bare = try await t.api.createTenant()
        _ = try await t.api.call(
            "PUT", "/v1/activity_types/\(t.type)", key: bare.app, json: ["attributes_type": "ScoreAttributes"])
        expectProblem(
            try await t.api.call(
                "POST", "/v1/channels", key: bare.app, json: ["activity_type": t.type, "storage_policy": "none"]),
            409, "apns-credential-required")
        // The sdk key cannot manage channels.
        expectProblem(
            try await t.api.call(
                "POST", "/v1/channels", key: t.tenant.sdk, json: ["activity_type": t.type, "storage_policy": "none"]),
            403, "forbidden")
    }

    @Test("management_endpoint: shown back, https only, and under MARQUEE_PROVIDER_HOSTS")
    func managementEndpoint() async throws {
        let t = try await Self.tenant()
        let creds = try await t.api.call("GET", "/v1/credentials/apns", key: t.tenant.app).json()
        #expect(creds.string("management_endpoint") == t.fixture.managementEndpoint)
        var body: [String: Any] = [
            "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
            "bundle_id": t.bundleID, "environment": "sandbox",
        ]
        body["management_endpoint"] = "https://api-manage-broadcast.evil.example:2195"
        expectProblem(
            try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: body), 422,
            "endpoint-not-allowed", field: "management_endpoint")
        body["management_endpoint"] = "http://127.0.0.1:2195"
        expectProblem(
            try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: body), 422, "invalid-field",
            field: "management_endpoint")
        // Apple's management hosts are allowed by default (and here, listed explicitly by the test servers).
        body["management_endpoint"] = "https://api-manage-broadcast.sandbox.push.apple.com:2195"
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: body).status == 200)
    }

    @Test("an Idempotency-Key replays the first answer and creates one channel at Apple")
    func idempotency() async throws {
        let t = try await Self.tenant()
        let key = "chan-" + Fake.hex(8)
        let first = try await t.create(headers: ["Idempotency-Key": key])
        #expect(first.status == 201, "\(first.text)")
        let again = try await t.create(headers: ["Idempotency-Key": key])
        #expect(again.status == 201)
        #expect(again.header("Idempotent-Replayed") == "true")
        #expect(try again.json().string("channel_id") == (try first.json().string("channel_id")))
        #expect(try await t.fixture.channelsAtApple(t.bundleID) == 1)
        expectProblem(
            try await t.create("none", headers: ["Idempotency-Key": key]), 422, "invalid-field",
            field: "Idempotency-Key")
    }

    @Test("tenants see and delete only their own channels")
    func isolation() async throws {
        let a = try await Self.tenant()
        let b = try await Self.tenant()
        let created = try await a.create()
        let id = try #require(try created.json().string("channel_id"))
        let apnsID = try #require(try created.json().string("apns_channel_id"))
        expectProblem(try await b.api.call("GET", "/v1/channels/\(id)", key: b.tenant.app), 404, "not-found")
        expectProblem(try await b.api.call("DELETE", "/v1/channels/\(id)", key: b.tenant.app), 404, "not-found")
        let listed = try await b.api.call("GET", "/v1/channels", key: b.tenant.app)
        #expect(!listed.text.contains(id) && !listed.text.contains(apnsID))
        #expect(try await a.fixture.channelsAtApple(a.bundleID) == 1)
        #expect(try await a.api.call("GET", "/v1/channels/\(id)", key: a.tenant.app).status == 200)
    }
}
