import Crypto
import Foundation
import HTTPServer
import MarqueeAPI
import MarqueeStore
import Observability
import PostgresClient
import Synchronization
import Testing

/// Children started by the shared fixture, killed when the test process exits (static objects are never
/// deinitialised, so `MarqueeProcess.deinit` does not run for them).
private let fixtureChildren = Mutex<[pid_t]>([])

private func killFixtureChildren() {
    for pid in fixtureChildren.withLock({ $0 }) {
        kill(pid, SIGKILL)
        var raw: Int32 = 0
        waitpid(pid, &raw, 0)
    }
}

/// One migrated database and one `marquee serve` shared by the registry suites, started on first use.
///
/// Each test creates its own tenants, so tests do not see each other's data and can run in parallel.
actor RegistryFixture {
    static let shared = RegistryFixture()

    /// What the tests use: the server, the database and in-process stores on the same database and master key.
    struct Running: Sendable {
        let databaseURL: String
        let serve: MarqueeProcess
        let pool: PostgresPool
        let tenants: TenantStore
        let registry: RegistryStore

        var api: API { API(baseURL: serve.baseURL) }

        /// A second `marquee serve` on this database with the key cache on (300 s; the shared one runs without it),
        /// for tests of what a change invalidates on the process that made it. The caller stops it.
        func serveCachingKeys() async throws -> MarqueeProcess {
            let serve = try MarqueeProcess(
                ["serve"], environment: ["DATABASE_URL": databaseURL, "MARQUEE_KEY_CACHE_SECONDS": "300"],
                port: TestEnvironment.freePort())
            try await serve.waitUntilServing()
            return serve
        }

        /// The environment `marquee` subcommands need to work on this database.
        var environment: [String: String] {
            [
                "DATABASE_URL": databaseURL, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
                "MARQUEE_MASTER_KEY": MarqueeProcess.masterKey,
            ]
        }
    }

    private var starting: Task<Running, any Error>?

    /// The running fixture (started once; later callers share it).
    static func get() async throws -> Running { try await shared.running() }

    /// A second fixture, for tests that hold a worker's claim open while they call the API: in the shared one, a test
    /// that alters `deliveries` (a trigger created and dropped) queues its lock behind the open claim, every other
    /// statement on the table queues behind it, and the API call the claim waits for never returns. Also for tests
    /// that order one write after another by a lock: a batch another test fails would reorder them.
    static let holding = RegistryFixture()

    func running() async throws -> Running {
        if let starting { return try await starting.value }
        let task = Task { try await Self.start() }
        starting = task
        return try await task.value
    }

    /// Starts `marquee serve` on a free port; a port taken by someone else in the meantime gets another try.
    private static func startServe(environment: [String: String]) async throws -> MarqueeProcess {
        var attempt = 1
        while true {
            let serve = try MarqueeProcess(["serve"], environment: environment, port: TestEnvironment.freePort())
            fixtureChildren.withLock { $0.append(serve.process.pid) }
            do {
                try await serve.waitUntilServing()
                return serve
            } catch  where attempt < 3 && !serve.process.isRunning {
                fixtureChildren.withLock { $0.removeAll { $0 == serve.process.pid } }
                attempt += 1
            }
        }
    }

    private static func start() async throws -> Running {
        let url = try await TestEnvironment.makeDatabase()
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory]
        let migrate = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        guard migrate.status == 0 else { throw TestFailure("marquee migrate failed:\n\(migrate.output)") }
        atexit { killFixtureChildren() }
        let serve = try await startServe(environment: env)
        // Shared by every registry suite running in parallel, some of whose tests hold a connection while a row lock
        // keeps it waiting: room for all of them, with a longer wait than production's on a loaded machine.
        let pool = PostgresPool(
            try PostgresConfiguration(url: url), options: .init(maxConnections: 12, acquireTimeout: .seconds(30)))
        let keyRing = try SealingKeyRing.fromBase64(MarqueeProcess.masterKey)
        let database = TenantDatabase(pool: pool)
        return Running(
            databaseURL: url, serve: serve, pool: pool, tenants: TenantStore(database: database, keyRing: keyRing),
            registry: RegistryStore(database: database))
    }
}

/// A tenant created through the admin API for one test.
struct TestTenant: Sendable {
    let id: String
    let name: String
    let app: String
    let sdk: String

    var uuid: UUID { UUID(uuidString: id)! }
    /// `Authorization: Basic base64(<sdk key>:)`, as the Customer.io SDK sends it.
    var basicSDK: String { "Basic " + Data((sdk + ":").utf8).base64EncodedString() }
}

/// Typed calls to the serving process.
struct API: Sendable {
    let baseURL: String

    /// Sends `json` (serialised with JSONSerialization) or raw `body`, with `Authorization: Bearer <key>`.
    func call(
        _ method: String, _ path: String, key: String? = nil, json: Any? = nil, body: Data? = nil,
        contentType: String? = nil, headers extra: [String: String] = [:], timeout: Int = 15
    ) async throws -> HTTP.Response {
        var headers = extra
        if let key { headers["Authorization"] = "Bearer " + key }
        var payload = body
        if let json {
            payload = try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys])
            headers["Content-Type"] = "application/json"
        }
        if let contentType { headers["Content-Type"] = contentType }
        return try await HTTP.send(method, baseURL + path, headers: headers, body: payload, timeout: timeout)
    }

    /// `POST /admin/v1/tenants`.
    func createTenant(_ name: String = "tenant-" + UUID().uuidString.prefix(8)) async throws -> TestTenant {
        let response = try await call(
            "POST", "/admin/v1/tenants", key: MarqueeProcess.adminToken, json: ["name": name])
        guard response.status == 201 else { throw TestFailure("create tenant: \(response.status) \(response.text)") }
        let object = try response.json()
        guard let id = object["id"] as? String, let keys = object["keys"] as? [String: Any],
            let app = keys["app"] as? String, let sdk = keys["sdk"] as? String
        else { throw TestFailure("create tenant: unexpected body \(response.text)") }
        return TestTenant(id: id, name: name, app: app, sdk: sdk)
    }

    /// The IDs of `tenant`'s app and sdk keys (the first of each kind the admin API lists).
    func keyIDs(_ tenant: TestTenant) async throws -> (app: String, sdk: String) {
        let keys = try await call("GET", "/admin/v1/tenants/\(tenant.id)/keys", key: MarqueeProcess.adminToken)
            .json().array("keys")
        guard let app = keys.first(where: { $0.string("kind") == "app" })?.string("id"),
            let sdk = keys.first(where: { $0.string("kind") == "sdk" })?.string("id")
        else { throw TestFailure("keys of \(tenant.id): \(keys)") }
        return (app, sdk)
    }
}

/// Random test values.
enum Fake {
    /// A random lowercase hex string (an APNs token by default).
    static func hex(_ count: Int = 64) -> String {
        let digits = Array("0123456789abcdef")
        return String((0..<count).map { _ in digits[Int.random(in: 0..<16)] })
    }

    /// An FCM-looking registration token.
    static func fcm() -> String { "fcm:" + UUID().uuidString + "-" + hex(40) }

    static func id(_ prefix: String) -> String { prefix + "-" + UUID().uuidString.lowercased().prefix(12) }

    /// A reverse-DNS activity type identifier.
    static func activityType() -> String { "com.example.t" + hex(8) }
}

/// Asserts that `response` is a problem+json with this status, `type` slug and `field`, and a non-empty `detail`.
func expectProblem(
    _ response: HTTP.Response, _ status: Int, _ slug: String, field: String? = nil, _ comment: String? = nil,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    let context = "\(comment.map { "\($0): " } ?? "")\(response.status) \(response.text)"
    #expect(response.status == status, "\(context)", sourceLocation: sourceLocation)
    #expect(
        response.header("Content-Type") == "application/problem+json", "\(context)", sourceLocation: sourceLocation)
    let object = (try? response.json()) ?? [:]
    #expect(
        object["type"] as? String == HTTPProblem.typeBase + slug, "\(context)", sourceLocation: sourceLocation)
    #expect((object["detail"] as? String)?.isEmpty == false, "\(context)", sourceLocation: sourceLocation)
    #expect(object["status"] as? Int == status, "\(context)", sourceLocation: sourceLocation)
    if let field {
        #expect(object["field"] as? String == field, "\(context)", sourceLocation: sourceLocation)
    }
}

/// `[String: Any]` navigation for decoded responses.
extension Dictionary where Key == String, Value == Any {
    func object(_ key: String) -> [String: Any]? { self[key] as? [String: Any] }
    func array(_ key: String) -> [[String: Any]] { self[key] as? [[String: Any]] ?? [] }
    func string(_ key: String) -> String? { self[key] as? String }
}

extension PostgresPool {
    /// A count from a `SELECT count(*)::int AS n …` query.
    func count(_ query: PostgresQuery) async throws -> Int {
        let rows = try await self.query(query)
        return try rows[0].decode(Int.self, "n")
    }

    /// Gives an instance's queued deliveries an outcome, as a worker's record does: they leave the queue for the
    /// history (migration 0057), recorded `ago` before now.
    func recordOutcome(
        tenant: UUID, instance: String, status: String, reason: String? = nil, httpStatus: Int? = nil,
        ago: String = "0 seconds"
    ) async throws {
        try await transaction { c in
            let moved = try c.query(
                """
                WITH gone AS (
                    DELETE FROM delivery_queue q WHERE q.tenant_id = \(tenant) AND q.instance_id = \(instance)
                    RETURNING q
                )
                INSERT INTO delivery_history
                SELECT h.* FROM gone, marquee_history_row(gone.q, \(status)::text, true, NULL::text, \(httpStatus)::int,
                                                         \(reason)::text) h
                RETURNING id
                """
            ).map { try $0.decode(UUID.self, "id") }
            // The test's clock, not the workers' rule: the owner may move what no role may update.
            try c.execute(
                """
                UPDATE delivery_history
                SET recorded_at = recorded_at - \(ago)::interval, sent_at = sent_at - \(ago)::interval
                WHERE tenant_id = \(tenant) AND id = ANY(\(moved)::uuid[])
                """)
        }
    }
}

/// The routes `MarqueeAPI.register` adds, read from an in-process router.
///
/// Read from the router's own listing (`Router.registered`). Every route read is routed back through the router to
/// prove it is real.
struct RegisteredRoutes {
    let router: Router
    /// `METHOD pattern`, e.g. `GET /v1/people/{id}`.
    let all: Set<String>

    init() throws {
        let pool = PostgresPool(
            try PostgresConfiguration(url: TestEnvironment.url(database: "unused_by_route_listing")),
            options: .init(maxConnections: 1))
        var router = Router()
        MarqueeAPI(
            pool: pool, migrator: Migrator(pool: pool, migrations: []),
            keyRing: try SealingKeyRing.fromBase64(MarqueeProcess.masterKey), adminToken: "x", requestLimits: .off,
            metrics: MetricsRegistry(), logger: Logger(label: "test", level: .critical)
        ).register(in: &router)
        self.router = router
        var all: Set<String> = []
        for route in router.registered { all.insert(route.method.rawValue + " " + route.pattern) }
        self.all = all
    }

    /// The route pattern a request would reach, as `METHOD pattern` (nil when nothing matches).
    func resolve(_ method: String, _ path: String) -> String? {
        let rawPath = path.split(separator: "?", maxSplits: 1).first.map(String.init) ?? path
        guard
            case .matched(let match) = router.route(HTTPRequest(method: HTTPMethod(rawValue: method), target: rawPath))
        else { return nil }
        return method + " " + match.pattern
    }
}
