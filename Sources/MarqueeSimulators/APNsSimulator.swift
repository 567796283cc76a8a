import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization

/// A local stand-in for APNs: HTTP/2 over TLS with its own CA, checking what Apple checks for live-activity
/// pushes and answering with Apple's status codes and `{"reason": …}` bodies.
///
/// Accepted pushes are recorded (memory, counters and optionally a JSONL file). Fault rules inject 410, 429, 503,
/// 500 or GOAWAY. The same server answers an inspection API:
///
/// - `GET /_sim/stats` → `{"accepted":N,"last_accepted_at":T,"rejected":{"<reason>":N},"rejected_total":N,
///   "injected":{"<action>":N}}` (`last_accepted_at`: seconds since 1970, absent until a push was accepted)
/// - `GET /_sim/pushes?token=<t>` → `{"pushes":[<record>…]}` (all kept records without `token`)
/// - `POST /_sim/reset` → forgets records, counters and `times` counts
/// - `GET /_sim/faults` → `{"rules":[…]}`; `POST /_sim/faults` with a rule list replaces the rules
///
/// A record is `{"time","token","topic","push_type","priority","expiration"?,"apns_id","collapse_id"?,"key_id",
/// "team_id","payload"}`.
public final class APNsSimulator: Sendable {
    /// A provider signing key the simulator trusts.
    public struct SigningKey: Sendable {
        /// The key ID (`kid` of the provider token).
        public var keyID: String
        /// The team ID (`iss` of the provider token).
        public var teamID: String
        /// The P-256 public key.
        public var publicKey: ES256PublicKey
        /// Bundle IDs this team may push to; empty allows any bundle.
        public var bundleIDs: [String]

        /// Creates a key.
        public init(keyID: String, teamID: String, publicKey: ES256PublicKey, bundleIDs: [String] = []) {
            self.keyID = keyID
            self.teamID = teamID
            self.publicKey = publicKey
            self.bundleIDs = bundleIDs
        }
    }

    /// Simulator settings.
    public struct Configuration: Sendable {
        /// Numeric listen address (default `127.0.0.1`).
        public var host: String
        /// Listen port (default 2197; 0 picks a free one, see `port`).
        public var port: Int
        /// Where `start()` writes the CA certificate PEM; `nil` writes nothing (see `caCertificatePEM`).
        public var caOutputPath: String?
        /// JSONL file that every accepted push is appended to; `nil` keeps records in memory only.
        public var recordsPath: String?
        /// Trusted signing keys.
        public var keys: [SigningKey]
        /// Fault rules, matched in order.
        public var faults: [FaultRule]
        /// Oldest accepted provider token `iat` (default 3600 s).
        public var maxProviderTokenAge: TimeInterval
        /// How far `iat` may lie in the future (default 60 s).
        public var clockSkew: TimeInterval
        /// Records kept in memory for `/_sim/pushes` (default 100,000; older ones are dropped).
        public var memoryLimit: Int
        /// Seed of the PRNG behind `rate` rules; `nil` seeds randomly.
        public var randomSeed: UInt64?
        /// Server I/O threads (default 1).
        public var ioThreads: Int
        /// The clock used for provider-token checks and records.
        public var now: @Sendable () -> Date

        /// Creates a configuration with the documented defaults.
        public init(
            host: String = "127.0.0.1", port: Int = 2197, caOutputPath: String? = nil, recordsPath: String? = nil,
            keys: [SigningKey] = [], faults: [FaultRule] = [], maxProviderTokenAge: TimeInterval = 3600,
            clockSkew: TimeInterval = 60, memoryLimit: Int = 100_000, randomSeed: UInt64? = nil, ioThreads: Int = 1,
            now: @escaping @Sendable () -> Date = { Date() }
        ) {
            self.host = host
            self.port = port
            self.caOutputPath = caOutputPath
            self.recordsPath = recordsPath
            self.keys = keys
            self.faults = faults
            self.maxProviderTokenAge = maxProviderTokenAge
            self.clockSkew = clockSkew
            self.memoryLimit = memoryLimit
            self.randomSeed = randomSeed
            self.ioThreads = ioThreads
            self.now = now
        }
    }

    /// Parses a key file: `{"<kid>": {"team_id": "…", "public_key": "<PEM>", "bundle_ids": ["…"]}}`.
    public static func parseKeys(json: String) throws -> [SigningKey] {
        guard let object = (try? JSONValue.parse(json))?.objectValue else {
            throw SimulatorError(.invalidConfiguration, "the APNs key file must be a JSON object keyed by kid")
        }
        return try object.keys.sorted().map { keyID in
            let entry = object[keyID]!
            guard let teamID = entry["team_id"]?.stringValue, let pem = entry["public_key"]?.stringValue else {
                throw SimulatorError(
                    .invalidConfiguration, "APNs key \(keyID) needs team_id and public_key strings")
            }
            let publicKey: ES256PublicKey
            do {
                publicKey = try ES256PublicKey(pem: pem)
            } catch {
                throw SimulatorError(
                    .invalidConfiguration, "APNs key \(keyID) is not a P-256 public key", details: "\(error)")
            }
            var bundles: [String] = []
            if let list = entry["bundle_ids"], !list.isNull {
                guard let array = list.arrayValue?.compactMap(\.stringValue), array.count == list.arrayValue?.count
                else {
                    throw SimulatorError(.invalidConfiguration, "APNs key \(keyID): bundle_ids must be strings")
                }
                bundles = array
            }
            return SigningKey(keyID: keyID, teamID: teamID, publicKey: publicKey, bundleIDs: bundles)
        }
    }

    private let core: APNsCore
    private let host: SimulatorHost

    /// Creates the certificates and the server; nothing is bound before `start()`.
    public init(configuration: Configuration) throws {
        let core = try APNsCore(configuration)
        self.core = core
        host = try SimulatorHost(
            name: "APNs", host: configuration.host, port: configuration.port,
            caOutputPath: configuration.caOutputPath, ioThreads: configuration.ioThreads, responder: core.reply)
        core.server.withLock { $0 = host.server }
    }

    deinit {
        // breaks the server → handler → core → server cycle
        core.server.withLock { $0 = nil }
    }

    /// The CA certificate that signed the server certificate (trust it in clients).
    public var caCertificatePEM: String { host.tls.caCertificatePEM }

    /// Writes the CA file and binds the port (once).
    public func start() throws { try host.start() }

    /// The bound port (after `start()`).
    public var port: Int { host.port }

    /// Starts if needed and serves until `stop()` or cancellation (then stops gracefully).
    public func run() async throws { try await host.run() }

    /// Stops gracefully (GOAWAY, in-flight streams finish).
    public func stop() async { await host.stop() }

    /// Kept records for `token` (or all), as in `/_sim/pushes`.
    public func pushes(token: String? = nil) -> [JSONValue] { core.recorder.records(token: token) }

    /// Makes the simulated Apple forget a broadcast channel, as if it were deleted behind Marquee's back.
    @discardableResult
    public func forgetChannel(bundleID: String, channelID: String) -> Bool {
        core.channels.forget(bundleID: bundleID, channelID: channelID)
    }

    /// Counters, as in `/_sim/stats`.
    public var statistics: JSONValue { .object(core.recorder.statistics) }

    /// Replaces the fault rules (and forgets their `times` counts).
    public func setFaults(_ rules: [FaultRule]) { core.faults.replace(rules) }

    /// Forgets records, counters and `times` counts.
    public func reset() {
        core.recorder.reset()
        core.faults.reset()
    }
}

/// The request handling of `APNsSimulator`.
final class APNsCore: Sendable {
    let validator: APNsValidator
    let recorder: Recorder
    let faults: FaultInjector
    let channels = APNsChannelRegistry()
    let now: @Sendable () -> Date
    /// Set once after init (the server needs the handler first); only read for statistics.
    let server = Mutex<HTTP2Server?>(nil)

    init(_ configuration: APNsSimulator.Configuration) throws {
        validator = APNsValidator(
            keys: configuration.keys, maxTokenAge: configuration.maxProviderTokenAge,
            clockSkew: configuration.clockSkew)
        recorder = try Recorder(path: configuration.recordsPath, memoryLimit: configuration.memoryLimit)
        faults = FaultInjector(rules: configuration.faults, seed: configuration.randomSeed)
        now = configuration.now
    }

    /// Answers a push on the connection's I/O thread: validation, the fault rules and the record take microseconds.
    /// A fault's latency and the control endpoints (`/_sim/pushes` may serialize 100,000 records) run in a task.
    func reply(_ request: HTTP2ServerRequest) -> HTTP2ServerReply {
        if let answer = channels.answer(
            request, validator: validator, recorder: recorder, faults: faults, now: self.now())
        {
            return .now(answer)
        }
        if request.path.hasPrefix("/_sim/") { return .later { self.control(request) } }
        let now = self.now()
        let push: APNsAcceptedPush
        switch validator.validate(request, now: now) {
        case .failure(let rejection):
            recorder.reject(reason: rejection.reason)
            return .now(Self.error(rejection, apnsID: request.header("apns-id")))
        case .success(let accepted):
            push = accepted
        }
        guard let rule = faults.decide(token: push.token) else {
            return .now(accept(push, body: request.body, now: now))
        }
        return rule.reply { self.answer(push, body: request.body, now: now, after: rule) }
    }

    /// A push a fault rule matched: the fault's answer, or (a delay alone) the push accepted.
    private func answer(_ push: APNsAcceptedPush, body: [UInt8], now: Date, after rule: FaultRule)
        -> HTTP2ServerResponse
    {
        guard rule.action != .delay else { return accept(push, body: body, now: now) }
        recorder.inject(rule.action)
        return injected(rule, push: push, now: now)
    }

    private func accept(_ push: APNsAcceptedPush, body: [UInt8], now: Date) -> HTTP2ServerResponse {
        // The record keeps the payload's bytes, not its parsed tree (one allocation instead of one per node: a
        // simulator keeping 100,000 records grew by page faults that took a tenth of its CPU), parsed again when read.
        var copy = push
        copy.payload = .null
        let kept = copy
        recorder.accept(token: push.token) {
            var record: [String: JSONValue] = [
                "time": .string(HTTPText.timestamp(now)), "token": .string(kept.token), "topic": .string(kept.topic),
                "push_type": .string("liveactivity"), "priority": .int(Int64(kept.priority)),
                "apns_id": .string(kept.apnsID), "key_id": .string(kept.keyID), "team_id": .string(kept.teamID),
                // Accepted only after it parsed as an object.
                "payload": (try? JSONValue.parse(body)) ?? .null,
            ]
            if let expiration = kept.expiration { record["expiration"] = .int(expiration) }
            if let collapseID = kept.collapseID { record["collapse_id"] = .string(collapseID) }
            return .object(record)
        }
        return HTTP2ServerResponse(
            status: 200,
            headers: [("apns-id", push.apnsID), ("apns-unique-id", SecureRandom.uuid().lowercasedString)])
    }

    private func injected(_ rule: FaultRule, push: APNsAcceptedPush, now: Date) -> HTTP2ServerResponse {
        var headers = [("apns-id", push.apnsID)]
        switch rule.action {
        case .goAway:
            return .goAway(errorCode: .noError)
        case .unregistered:
            recorder.reject(reason: "Unregistered")
            let milliseconds = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
            let body = rule.hostile(
                .object(["reason": .string("Unregistered"), "timestamp": rule.timestamp ?? .int(milliseconds)]),
                headers: &headers)
            return HTTPText.json(410, body, headers: headers)
        default: break
        }
        // `delay` is handled by the caller.
        let (status, reason) = rule.action.apnsAnswer ?? (500, "InternalServerError")
        recorder.reject(reason: reason)
        if let retryAfter = rule.retryAfterSeconds, status == 429 || status == 503 {
            headers.append(("retry-after", String(retryAfter)))
        }
        let body = rule.hostile(.object(["reason": .string(reason)]), headers: &headers)
        return HTTPText.json(status, body, headers: headers)
    }

    static func error(_ rejection: APNsRejection, apnsID: String?) -> HTTP2ServerResponse {
        let id = apnsID.flatMap { UUID(text: $0) != nil ? $0 : nil } ?? SecureRandom.uuid().uuidString
        return HTTPText.json(
            rejection.status, .object(["reason": .string(rejection.reason)]),
            headers: [("apns-id", id), ("x-sim-detail", rejection.detail)])
    }

    private func control(_ request: HTTP2ServerRequest) -> HTTP2ServerResponse {
        let (path, query) = HTTPText.splitTarget(request.path)
        switch (request.method, path) {
        case ("GET", "/_sim/stats"):
            var statistics = recorder.statistics
            if let server = server.withLock({ $0 }) {
                statistics["connections"] = .int(Int64(server.openConnections))
            }
            return HTTPText.json(200, .object(statistics))
        case ("GET", "/_sim/pushes"):
            return HTTPText.json(200, .object(["pushes": .array(recorder.records(token: query["token"]))]))
        case ("POST", "/_sim/reset"):
            recorder.reset()
            faults.reset()
            return HTTPText.json(200, .object(["ok": .bool(true)]))
        case ("GET", "/_sim/faults"):
            return HTTPText.json(200, .object(["rules": .array(faults.rules.map(\.json))]))
        case ("POST", "/_sim/faults"):
            do {
                let rules = try FaultRule.parseRules(json: String(decoding: request.body, as: UTF8.self))
                faults.replace(rules)
                return HTTPText.json(200, .object(["rules": .int(Int64(rules.count))]))
            } catch {
                return HTTPText.json(400, .object(["error": .string("\(error)")]))
            }
        default:
            return HTTPText.json(404, .object(["error": .string("unknown simulator endpoint")]))
        }
    }
}

extension FaultRule.Action {
    /// The APNs status and reason of a failing action; nil for `goaway` and `delay`, which answer nothing of their
    /// own.
    var apnsAnswer: (status: Int, reason: String)? {
        switch self {
        case .goAway, .delay: nil
        case .unregistered: (410, "Unregistered")
        case .tooManyRequests: (429, "TooManyRequests")
        case .serviceUnavailable: (503, "ServiceUnavailable")
        case .internalError: (500, "InternalServerError")
        case .expireToken: (403, "ExpiredProviderToken")
        case .foreignToken: (400, "DeviceTokenNotForTopic")
        case .forbidden: (403, "InvalidProviderToken")
        }
    }
}
