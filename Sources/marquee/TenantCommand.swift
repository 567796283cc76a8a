import Crypto
import Foundation
import MarqueeAPI
import MarqueeCore
import MarqueeStore
import PostgresClient

/// `marquee tenant create|list` and `marquee key create|revoke|list|rotate`: the admin API's operations from a
/// shell, straight against the database (no running server needed).
struct TenantCommand {
    enum Action {
        case create(name: String)
        case list
        case keyCreate(tenant: UUID, kind: APIKeyKind)
        case keyRevoke(tenant: UUID, key: UUID)
        case keyRotate(tenant: UUID, key: UUID, grace: Int)
        case keyList(tenant: UUID)
    }

    var action: Action
    var json = false

    /// The options each subcommand takes, the one table of them: any other option, or one given twice, is a usage
    /// error before anything is done. An option a subcommand ignored would do something other than asked
    /// (`key revoke --grace-seconds 3600` revoking at once). Key commands print JSON with or without `--json`.
    static let options: [String: Set<String>] = [
        "tenant create": ["--name", "--json"],
        "tenant list": ["--json"],
        "key create": ["--tenant", "--kind", "--json"],
        "key list": ["--tenant", "--json"],
        "key revoke": ["--tenant", "--key", "--json"],
        "key rotate": ["--tenant", "--key", "--grace-seconds", "--json"],
    ]

    /// `group` is `tenant` or `key`.
    init(group: String, arguments: [String]) throws {
        var args = arguments
        guard !args.isEmpty else { throw UsageError("\(group): missing subcommand") }
        let sub = args.removeFirst()
        guard let allowed = Self.options["\(group) \(sub)"] else {
            throw UsageError("unknown command '\(group) \(sub)'")
        }
        var options: [String: String] = [:]
        while !args.isEmpty {
            let flag = args.removeFirst()
            guard allowed.contains(flag) else {
                throw UsageError(
                    "\(group) \(sub): unknown option '\(flag)' (it takes \(allowed.sorted().joined(separator: ", ")))")
            }
            guard options[flag] == nil else { throw UsageError("\(group) \(sub): \(flag) is given twice") }
            if flag == "--json" {
                options[flag] = ""
                json = true
            } else {
                guard !args.isEmpty else { throw UsageError("\(flag) needs a value") }
                options[flag] = args.removeFirst()
            }
        }
        func uuid(_ flag: String) throws -> UUID {
            guard let text = options[flag] else { throw UsageError("\(group) \(sub): \(flag) is required") }
            guard let id = UUID(uuidString: text) else { throw UsageError("\(flag) must be a UUID") }
            return id
        }
        switch (group, sub) {
        case ("tenant", "create"):
            guard let name = options["--name"] else { throw UsageError("tenant create: --name is required") }
            action = .create(name: name)
        case ("tenant", "list"):
            action = .list
        case ("key", "create"):
            guard let kind = options["--kind"].flatMap(APIKeyKind.init(rawValue:)) else {
                throw UsageError("key create: --kind app|sdk is required")
            }
            action = .keyCreate(tenant: try uuid("--tenant"), kind: kind)
        case ("key", "revoke"):
            action = .keyRevoke(tenant: try uuid("--tenant"), key: try uuid("--key"))
        case ("key", "rotate"):
            // Whole seconds, in range: a value not understood must not become an instant revocation.
            let text = options["--grace-seconds"] ?? "0"
            guard let grace = Int(text), TenantStore.rotationGraceSeconds.contains(grace) else {
                throw UsageError(
                    "key rotate: --grace-seconds must be whole seconds from 0 to "
                        + "\(TenantStore.rotationGraceSeconds.upperBound), not '\(text)'")
            }
            action = .keyRotate(tenant: try uuid("--tenant"), key: try uuid("--key"), grace: grace)
        case ("key", "list"):
            action = .keyList(tenant: try uuid("--tenant"))
        default:
            throw UsageError("unknown command '\(group) \(sub)'")
        }
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        var pgConfiguration = try PostgresConfiguration(url: try configuration.requireDatabaseURL())
        pgConfiguration.applicationName = "marquee-admin"
        let pool = PostgresPool(pgConfiguration, options: .init(maxConnections: 1))
        defer { pool.close() }
        let store = TenantStore(
            database: TenantDatabase(pool: pool), keyRing: try Startup.keyRing(configuration, command: "tenant"))
        do {
            switch action {
            case .create(let name):
                let created = try await store.create(name: name)
                if json {
                    print(Render.createdTenant(created).serialized())
                } else {
                    print("tenant  \(created.tenant.id.uuidString.lowercased())  \(created.tenant.name)")
                    print("app key \(created.appKey.text)")
                    print("sdk key \(created.sdkKey.text)")
                    print("(keys are shown once: store them now)")
                }
            case .list:
                let tenants = try await store.list()
                if json {
                    print(JSONValue.array(tenants.map(Render.tenant)).serialized())
                } else {
                    for t in tenants { print("\(t.id.uuidString.lowercased())\t\(t.name)") }
                }
            case .keyCreate(let tenant, let kind):
                try output(Render.issuedKey(try await store.createKey(tenant: tenant, kind: kind)))
            case .keyRevoke(let tenant, let key):
                try output(Render.key(try await store.revokeKey(tenant: tenant, key: key)))
            case .keyRotate(let tenant, let key, let grace):
                try output(
                    Render.issuedKey(try await store.rotateKey(tenant: tenant, key: key, grace: .seconds(grace))))
            case .keyList(let tenant):
                try output(.array(try await store.keys(tenant: tenant).map(Render.key)))
            }
        } catch let error as NotFound {
            throw UsageError("no such \(error.resource)")
        } catch let error as ValidationError {
            throw UsageError(error.description)
        }
    }

    func output(_ value: JSONValue) throws {
        print(value.serialized())
    }
}
