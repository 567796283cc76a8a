import Foundation
import MarqueeCore
import MarqueeSimulators
import Observability
import ProcessLifecycle

/// `marquee simulate apns|fcm`: runs the local APNs or FCM simulator until SIGTERM/SIGINT.
///
/// Configuration comes from the environment:
///
/// | Variable | Meaning | Default |
/// |---|---|---|
/// | `MARQUEE_SIM_LISTEN` | `host:port` to listen on (numeric host; `[::1]:port` for IPv6) | `127.0.0.1:2197` (apns), `127.0.0.1:2198` (fcm) |
/// | `MARQUEE_SIM_CA_OUT` | where the generated CA certificate (PEM) is written for clients to trust | `.data/sim-ca.pem` |
/// | `MARQUEE_SIM_RECORDS` | JSONL file each accepted push/message is appended to | none (memory only) |
/// | `MARQUEE_SIM_KEYS` | path to the key file (or inline JSON): apns `{"<kid>": {"team_id", "public_key", "bundle_ids"}}`, fcm `{"<client_email>": {"project_id", "public_key"}}` | none (every token is refused) |
/// | `MARQUEE_SIM_FAULTS` | fault rules as JSON, or `@path` to a file (see `FaultRule`) | none |
/// | `MARQUEE_SIM_TOKEN_URI` | fcm: the `aud` assertions must carry | `https://oauth2.googleapis.com/token` or `https://<authority>/token` |
/// | `MARQUEE_SIM_TOKEN_LIFETIME` | fcm: `expires_in` of issued access tokens, seconds | `3600` |
/// | `MARQUEE_SIM_SEED` | seed for `rate` rules (reproducible runs) | random |
/// | `MARQUEE_SIM_IO_THREADS` | server I/O threads | `1` |
///
/// The CA file is rewritten on every start (a new CA each run). Logs are JSON lines on stderr; the first says where
/// the simulator listens and where the CA is.
struct SimulateCommand {
    enum Kind: String {
        case apns
        case fcm
    }

    let kind: Kind
    let environment: [String: String]

    init(arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        guard let first = arguments.first, let kind = Kind(rawValue: first) else {
            throw UsageError("simulate: expected 'apns' or 'fcm'")
        }
        if arguments.count > 1 { throw UsageError("simulate: unknown option '\(arguments[1])'") }
        self.kind = kind
        self.environment = environment
    }

    func run() async throws {
        let logger = Logger(
            label: "marquee.simulate", level: LogLevel(string: environment["MARQUEE_LOG_LEVEL"] ?? "") ?? .info)
        var problems: [MarqueeConfiguration.Problem] = []
        let defaultPort = kind == .apns ? 2197 : 2198
        let listen = Self.listenAddress(environment["MARQUEE_SIM_LISTEN"], defaultPort: defaultPort)
        if listen == nil {
            problems.append(.init(variable: "MARQUEE_SIM_LISTEN", reason: "must be host:port with a numeric host"))
        }
        let caPath = environment["MARQUEE_SIM_CA_OUT"].flatMap { $0.isEmpty ? nil : $0 } ?? ".data/sim-ca.pem"
        let recordsPath = environment["MARQUEE_SIM_RECORDS"].flatMap { $0.isEmpty ? nil : $0 }
        var seed: UInt64?
        if let text = environment["MARQUEE_SIM_SEED"], !text.isEmpty {
            seed = UInt64(text)
            if seed == nil {
                problems.append(.init(variable: "MARQUEE_SIM_SEED", reason: "must be an unsigned integer"))
            }
        }
        var ioThreads = 1
        if let text = environment["MARQUEE_SIM_IO_THREADS"], !text.isEmpty {
            if let n = Int(text), (1...64).contains(n) {
                ioThreads = n
            } else {
                problems.append(.init(variable: "MARQUEE_SIM_IO_THREADS", reason: "must be an integer in 1...64"))
            }
        }
        var lifetime: TimeInterval = 3600
        if let text = environment["MARQUEE_SIM_TOKEN_LIFETIME"], !text.isEmpty {
            if let seconds = Int(text), seconds > 0 {
                lifetime = TimeInterval(seconds)
            } else {
                problems.append(.init(variable: "MARQUEE_SIM_TOKEN_LIFETIME", reason: "must be a positive integer"))
            }
        }
        var faults: [FaultRule] = []
        do {
            if let text = try Self.readValue(environment["MARQUEE_SIM_FAULTS"], fileMarker: "@") {
                faults = try FaultRule.parseRules(json: text)
            }
        } catch {
            problems.append(.init(variable: "MARQUEE_SIM_FAULTS", reason: "\(error)"))
        }
        var keysJSON: String?
        do {
            keysJSON = try Self.readValue(environment["MARQUEE_SIM_KEYS"], fileMarker: nil)
        } catch {
            problems.append(.init(variable: "MARQUEE_SIM_KEYS", reason: "\(error)"))
        }

        let simulator: any SimulatorService
        var keyCount = 0
        do {
            switch kind {
            case .apns:
                let keys = try keysJSON.map { try APNsSimulator.parseKeys(json: $0) } ?? []
                keyCount = keys.count
                simulator = try APNsSimulator(
                    configuration: .init(
                        host: listen?.host ?? "127.0.0.1", port: listen?.port ?? defaultPort, caOutputPath: caPath,
                        recordsPath: recordsPath, keys: keys, faults: faults, randomSeed: seed, ioThreads: ioThreads))
            case .fcm:
                let accounts = try keysJSON.map { try FCMSimulator.parseAccounts(json: $0) } ?? []
                keyCount = accounts.count
                let tokenURI = environment["MARQUEE_SIM_TOKEN_URI"].flatMap { $0.isEmpty ? nil : $0 }
                simulator = try FCMSimulator(
                    configuration: .init(
                        host: listen?.host ?? "127.0.0.1", port: listen?.port ?? defaultPort, caOutputPath: caPath,
                        recordsPath: recordsPath, accounts: accounts, faults: faults, tokenURI: tokenURI,
                        accessTokenLifetime: lifetime, randomSeed: seed, ioThreads: ioThreads))
            }
        } catch let error as SimulatorError where error.code == .invalidConfiguration {
            problems.append(.init(variable: "MARQUEE_SIM_KEYS", reason: error.description))
            throw ConfigurationError(problems: problems)
        }
        if !problems.isEmpty { throw ConfigurationError(problems: problems) }
        if keyCount == 0 {
            logger.warning(
                "no keys configured (MARQUEE_SIM_KEYS); every provider token or assertion will be refused",
                metadata: ["sim.kind": .string(kind.rawValue)])
        }

        try simulator.start()
        logger.info(
            "simulator listening",
            metadata: [
                "sim.kind": .string(kind.rawValue), "listen": .string("\(listen!.host):\(simulator.port)"),
                "sim.ca_file": .string(caPath), "sim.records": .string(recordsPath ?? ""),
                "sim.keys": .int(keyCount), "sim.fault_rules": .int(faults.count),
            ])
        try await ServiceGroup(
            services: [("simulator.\(kind.rawValue)", CancellingService { try await simulator.run() })],
            configuration: .init(drainTimeout: .seconds(15)), logger: logger
        ).run()
        logger.info("simulator stopped", metadata: ["sim.kind": .string(kind.rawValue)])
    }

    /// Parses `host:port`, `[v6]:port` or `:port` (host `127.0.0.1`).
    static func listenAddress(_ text: String?, defaultPort: Int) -> (host: String, port: Int)? {
        guard let text, !text.isEmpty else { return ("127.0.0.1", defaultPort) }
        var host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                return nil
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        if host.isEmpty { host = "127.0.0.1" }
        guard let port = Int(portText), (0...65_535).contains(port) else { return nil }
        return (String(host), port)
    }

    /// The value itself, or the contents of the file it names. With `fileMarker` only values starting with the
    /// marker are paths; without it, values starting with `{` or `[` are inline JSON and anything else is a path.
    static func readValue(_ value: String?, fileMarker: String?) throws -> String? {
        guard let value, !value.isEmpty else { return nil }
        let path: String
        if let fileMarker {
            guard value.hasPrefix(fileMarker) else { return value }
            path = String(value.dropFirst(fileMarker.count))
        } else {
            let trimmed = value.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("{") || trimmed.hasPrefix("[") { return value }
            path = value
        }
        do {
            return try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw SimulatorError(.ioFailed, "cannot read \(path)", details: "\(error)")
        }
    }
}

/// What `SimulateCommand` needs from either simulator.
protocol SimulatorService: Sendable {
    func start() throws
    var port: Int { get }
    func run() async throws
}

extension APNsSimulator: SimulatorService {}
extension FCMSimulator: SimulatorService {}
