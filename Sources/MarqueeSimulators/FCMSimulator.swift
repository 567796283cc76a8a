import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization

/// A local stand-in for Google's OAuth token endpoint and FCM HTTP v1: HTTP/2 over TLS with its own CA.
///
/// - `POST /token` (form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>`) verifies the
///   RS256 assertion of a configured service account and issues an opaque access token:
///   `{"access_token","expires_in","token_type":"Bearer"}`; errors are OAuth JSON with status 400.
/// - `POST /v1/projects/{project}/messages:send` checks the bearer token, the project and the message, and
///   answers `{"name":"projects/<p>/messages/<id>"}` or an FCM error (`{"error":{"code","message","status",
///   "details":[{"@type":"…FcmError","errorCode"}]}}`).
///
/// Inspection API on the same server:
///
/// - `GET /_sim/stats` → `{"accepted","last_accepted_at"?,"rejected":{"<errorCode>":N},"rejected_total","injected":{…},
///   "tokens_issued","tokens_active"}`
/// - `GET /_sim/messages?token=<t>` (alias `/_sim/pushes`) → `{"messages":[<record>…]}`
/// - `POST /_sim/reset` → forgets records, counters (including `tokens_issued`) and `times` counts
/// - `POST /_sim/expire-tokens` → every issued access token expires now → `{"expired":N}`
/// - `GET /_sim/faults`, `POST /_sim/faults` as for `APNsSimulator`
///
/// A record is `{"time","token","project_id","name","client_email","message"}`.
public final class FCMSimulator: Sendable {
    /// A service account the simulator trusts.
    public struct ServiceAccount: Sendable {
        /// `client_email`, the assertion's `iss`.
        public var clientEmail: String
        /// The Firebase project the account may send to.
        public var projectID: String
        /// The RSA public key of the account's private key.
        public var publicKey: RS256PublicKey

        /// Creates an account.
        public init(clientEmail: String, projectID: String, publicKey: RS256PublicKey) {
            self.clientEmail = clientEmail
            self.projectID = projectID
            self.publicKey = publicKey
        }
    }

    /// Simulator settings.
    public struct Configuration: Sendable {
        /// Numeric listen address (default `127.0.0.1`).
        public var host: String
        /// Listen port (default 2198; 0 picks a free one, see `port`).
        public var port: Int
        /// Where `start()` writes the CA certificate PEM; `nil` writes nothing.
        public var caOutputPath: String?
        /// JSONL file that every accepted message is appended to; `nil` keeps records in memory only.
        public var recordsPath: String?
        /// Trusted service accounts.
        public var accounts: [ServiceAccount]
        /// Fault rules, matched in order against the message's registration token.
        public var faults: [FaultRule]
        /// The `aud` an assertion must carry; `nil` accepts `https://oauth2.googleapis.com/token` and
        /// `https://<request authority>/token`.
        public var tokenURI: String?
        /// Lifetime of issued access tokens (`expires_in`, default 3600 s).
        public var accessTokenLifetime: TimeInterval
        /// Allowed clock difference for assertion `iat`/`exp` (default 60 s).
        public var clockSkew: TimeInterval
        /// Records kept in memory (default 100,000).
        public var memoryLimit: Int
        /// Seed of the PRNG behind `rate` rules; `nil` seeds randomly.
        public var randomSeed: UInt64?
        /// Server I/O threads (default 1).
        public var ioThreads: Int
        /// The clock for assertions, access-token expiry and records.
        public var now: @Sendable () -> Date

        /// Creates a configuration with the documented defaults.
        public init(
            host: String = "127.0.0.1", port: Int = 2198, caOutputPath: String? = nil, recordsPath: String? = nil,
            accounts: [ServiceAccount] = [], faults: [FaultRule] = [], tokenURI: String? = nil,
            accessTokenLifetime: TimeInterval = 3600, clockSkew: TimeInterval = 60, memoryLimit: Int = 100_000,
            randomSeed: UInt64? = nil, ioThreads: Int = 1, now: @escaping @Sendable () -> Date = { Date() }
        ) {
            self.host = host
            self.port = port
            self.caOutputPath = caOutputPath
            self.recordsPath = recordsPath
            self.accounts = accounts
            self.faults = faults
            self.tokenURI = tokenURI
            self.accessTokenLifetime = accessTokenLifetime
            self.clockSkew = clockSkew
            self.memoryLimit = memoryLimit
            self.randomSeed = randomSeed
            self.ioThreads = ioThreads
            self.now = now
        }
    }

    /// Parses an account file: `{"<client_email>": {"project_id": "…", "public_key": "<PEM>"}}`.
    public static func parseAccounts(json: String) throws -> [ServiceAccount] {
        guard let object = (try? JSONValue.parse(json))?.objectValue else {
            throw SimulatorError(.invalidConfiguration, "the FCM key file must be a JSON object keyed by client_email")
        }
        return try object.keys.sorted().map { email in
            let entry = object[email]!
            guard let project = entry["project_id"]?.stringValue, let pem = entry["public_key"]?.stringValue else {
                throw SimulatorError(
                    .invalidConfiguration, "FCM account \(email) needs project_id and public_key strings")
            }
            do {
                return ServiceAccount(clientEmail: email, projectID: project, publicKey: try RS256PublicKey(pem: pem))
            } catch {
                throw SimulatorError(
                    .invalidConfiguration, "FCM account \(email) has no usable RSA public key", details: "\(error)")
            }
        }
    }

    private let core: FCMCore
    private let host: SimulatorHost

    /// Creates the certificates and the server; nothing is bound before `start()`.
    public init(configuration: Configuration) throws {
        let core = try FCMCore(configuration)
        self.core = core
        host = try SimulatorHost(
            name: "FCM", host: configuration.host, port: configuration.port,
            caOutputPath: configuration.caOutputPath, ioThreads: configuration.ioThreads, responder: core.reply)
        core.server.withLock { $0 = host.server }
    }

    deinit {
        // breaks the server → handler → core → server cycle
        core.server.withLock { $0 = nil }
    }

    /// The CA certificate that signed the server certificate.
    public var caCertificatePEM: String { host.tls.caCertificatePEM }

    /// Writes the CA file and binds the port (once).
    public func start() throws { try host.start() }

    /// The bound port (after `start()`).
    public var port: Int { host.port }

    /// Starts if needed and serves until `stop()` or cancellation (then stops gracefully).
    public func run() async throws { try await host.run() }

    /// Stops gracefully (GOAWAY, in-flight streams finish).
    public func stop() async { await host.stop() }

    /// Kept records for `token` (or all), as in `/_sim/messages`.
    public func messages(token: String? = nil) -> [JSONValue] { core.recorder.records(token: token) }

    /// Counters, as in `/_sim/stats`.
    public var statistics: JSONValue { .object(core.statistics) }

    /// Access tokens issued since start (or the last reset).
    public var tokensIssued: Int { core.tokens.withLock { $0.issued } }

    /// Expires every issued access token now; returns how many were still valid.
    @discardableResult
    public func expireAccessTokens() -> Int { core.expireAll() }

    /// Holds the token endpoint's answers until `count` more requests have been answered 401 UNAUTHENTICATED, or
    /// `timeout` passes, whichever comes first (for tests: it makes "many sends meet the expired token before the
    /// refresh lands" a certainty instead of a race). The hold applies to the token requests that arrive while it
    /// is set; `releaseTokenIssuance()` lifts it.
    public func holdTokenIssuance(untilRejected count: Int, timeout: Duration = .seconds(5)) {
        let target = core.recorder.rejectedCount("UNAUTHENTICATED") + count
        core.tokenHold.withLock { $0 = (target, ContinuousClock.now + timeout) }
    }

    /// Lifts a hold set by `holdTokenIssuance(untilRejected:timeout:)`.
    public func releaseTokenIssuance() { core.tokenHold.withLock { $0 = nil } }

    /// Replaces the fault rules (and forgets their `times` counts).
    public func setFaults(_ rules: [FaultRule]) { core.faults.replace(rules) }

    /// Forgets records, counters and `times` counts (issued tokens stay valid).
    public func reset() { core.reset() }
}

/// The request handling of `FCMSimulator`.
final class FCMCore: Sendable {
    struct AccessToken {
        var clientEmail: String
        var projectID: String
        var expiresAt: Date
    }

    struct Tokens {
        var byValue: [String: AccessToken] = [:]
        var issued = 0
    }

    let accounts: [String: FCMSimulator.ServiceAccount]
    let configuration: FCMSimulator.Configuration
    let recorder: Recorder
    let faults: FaultInjector
    let tokens = Mutex(Tokens())
    /// While set, token requests wait until the UNAUTHENTICATED count reaches `rejected` or `until` passes.
    let tokenHold = Mutex<(rejected: Int, until: ContinuousClock.Instant)?>(nil)
    /// Set once after init (the server needs the handler first); only read for statistics.
    let server = Mutex<HTTP2Server?>(nil)

    init(_ configuration: FCMSimulator.Configuration) throws {
        self.configuration = configuration
        accounts = Dictionary(configuration.accounts.map { ($0.clientEmail, $0) }, uniquingKeysWith: { $1 })
        recorder = try Recorder(path: configuration.recordsPath, memoryLimit: configuration.memoryLimit)
        faults = FaultInjector(rules: configuration.faults, seed: configuration.randomSeed)
    }

    var statistics: [String: JSONValue] {
        var statistics = recorder.statistics
        let now = configuration.now()
        let (issued, active) = tokens.withLock { tokens in
            (tokens.issued, tokens.byValue.values.filter { $0.expiresAt > now }.count)
        }
        statistics["tokens_issued"] = .int(Int64(issued))
        statistics["tokens_active"] = .int(Int64(active))
        if let server = server.withLock({ $0 }) {
            statistics["connections"] = .int(Int64(server.openConnections))
        }
        return statistics
    }

    func expireAll() -> Int {
        let now = configuration.now()
        return tokens.withLock { tokens in
            var count = 0
            for (value, token) in tokens.byValue where token.expiresAt > now {
                tokens.byValue[value]?.expiresAt = now
                count += 1
            }
            return count
        }
    }

    func reset() {
        recorder.reset()
        faults.reset()
        tokens.withLock { $0.issued = 0 }
    }

    /// Answers a message on the connection's I/O thread, as the APNs simulator does; the token endpoint (which may
    /// be held), a fault's latency and the control endpoints run in a task.
    func reply(_ request: HTTP2ServerRequest) -> HTTP2ServerReply {
        let path = HTTPText.splitTarget(request.path).path
        if path.hasPrefix("/_sim/") { return .later { self.control(request) } }
        if path == "/token" {
            guard request.method == "POST" else {
                return .now(oauthError(OAuthRejection("invalid_request", "the token endpoint only accepts POST")))
            }
            return .later {
                await self.waitForTokenHold()
                return self.issueToken(request)
            }
        }
        guard request.method == "POST", let project = FCMValidator.projectID(path: request.path) else {
            return .now(fcmError(FCMRejection(404, "NOT_FOUND", errorCode: nil, "no such method or resource")))
        }
        return send(request, project: project)
    }

    private func waitForTokenHold() async {
        while let hold = tokenHold.withLock({ $0 }), ContinuousClock.now < hold.until,
            recorder.rejectedCount("UNAUTHENTICATED") < hold.rejected
        {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    private func issueToken(_ request: HTTP2ServerRequest) -> HTTP2ServerResponse {
        let now = configuration.now()
        var audiences = [String]()
        if let uri = configuration.tokenURI {
            audiences = [uri]
        } else {
            audiences = ["https://oauth2.googleapis.com/token"]
            if let authority = request.authority { audiences.append("https://\(authority)/token") }
        }
        let account: FCMSimulator.ServiceAccount
        do {
            account = try FCMValidator.verifyTokenRequest(
                body: request.body, contentType: request.header("content-type"), accounts: accounts,
                audiences: audiences, now: now, skew: configuration.clockSkew)
        } catch {
            return oauthError(error)
        }
        let value = "ya29.sim-" + SecureRandom.token(byteCount: 24)
        let lifetime = max(1, Int(configuration.accessTokenLifetime.rounded()))
        tokens.withLock { tokens in
            tokens.issued += 1
            // forget long-expired tokens so the table stays small
            if tokens.byValue.count > 10_000 {
                tokens.byValue = tokens.byValue.filter { $0.value.expiresAt > now }
            }
            tokens.byValue[value] = AccessToken(
                clientEmail: account.clientEmail, projectID: account.projectID,
                expiresAt: now + TimeInterval(lifetime))
        }
        return HTTPText.json(
            200,
            .object([
                "access_token": .string(value), "expires_in": .int(Int64(lifetime)), "token_type": .string("Bearer"),
            ]), headers: [("cache-control", "no-store")])
    }

    private func send(_ request: HTTP2ServerRequest, project: String) -> HTTP2ServerReply {
        let now = configuration.now()
        guard let bearer = HTTPText.bearerToken(request.header("authorization")) else {
            return .now(fcmError(.unauthenticated("the request has no OAuth 2 bearer token")))
        }
        guard let access = tokens.withLock({ $0.byValue[bearer] }) else {
            return .now(fcmError(.unauthenticated("the access token is not valid")))
        }
        guard access.expiresAt > now else {
            return .now(fcmError(.unauthenticated("the access token has expired")))
        }
        guard access.projectID == project else {
            return .now(
                fcmError(
                    FCMRejection(
                        403, "PERMISSION_DENIED", errorCode: "SENDER_ID_MISMATCH",
                        "the credential may not send to this project")))
        }
        let message: FCMAcceptedMessage
        do {
            message = try FCMValidator.message(request.body)
        } catch {
            return .now(fcmError(error))
        }
        guard let rule = faults.decide(token: message.token) else {
            return .now(accept(message, request, project: project, access: access, now: now))
        }
        return rule.reply {
            guard rule.action == .delay else {
                self.recorder.inject(rule.action)
                return self.injected(rule, bearer: bearer, now: now)
            }
            return self.accept(
                message, request, project: project, access: access, now: now, answering: rule.messageName)
        }
    }

    /// A valid message the fault rules let through: recorded, and its name returned (or a rule's `answering` name).
    private func accept(
        _ message: FCMAcceptedMessage, _ request: HTTP2ServerRequest, project: String, access: AccessToken, now: Date,
        answering: String? = nil
    ) -> HTTP2ServerResponse {
        if message.validateOnly {
            return HTTPText.json(200, .object(["name": .string("projects/\(project)/messages/fake_message_id")]))
        }
        let milliseconds = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
        let name = "projects/\(project)/messages/0:\(milliseconds)%\(Hex.encode(SecureRandom.bytes(8)))"
        let clientEmail = access.clientEmail
        // As the APNs simulator: the record keeps the request's bytes, parsed again when read.
        let token = message.token
        let body = request.body
        recorder.accept(token: token) {
            .object([
                "time": .string(HTTPText.timestamp(now)), "token": .string(token),
                "project_id": .string(project), "name": .string(name), "client_email": .string(clientEmail),
                "message": (try? JSONValue.parse(body))?["message"] ?? .null,
            ])
        }
        return HTTPText.json(200, .object(["name": .string(answering ?? name)]))
    }

    private func injected(_ rule: FaultRule, bearer: String, now: Date) -> HTTP2ServerResponse {
        let rejection: FCMRejection
        var headers: [(String, String)] = []
        switch rule.action {
        case .goAway:
            return .goAway(errorCode: .noError)
        case .expireToken:
            tokens.withLock { $0.byValue[bearer]?.expiresAt = now }
            rejection = .unauthenticated("the access token has expired")
        case .unregistered:
            rejection = FCMRejection(
                404, "NOT_FOUND", errorCode: "UNREGISTERED", "the registration token is no longer registered")
        case .foreignToken:
            rejection = FCMRejection(
                403, "PERMISSION_DENIED", errorCode: "SENDER_ID_MISMATCH",
                "the registration token belongs to another project")
        case .forbidden:
            rejection = FCMRejection(
                403, "PERMISSION_DENIED", errorCode: nil, "the sender may not send to this project")
        case .tooManyRequests:
            rejection = FCMRejection(
                429, "RESOURCE_EXHAUSTED", errorCode: "QUOTA_EXCEEDED", "the sending quota is exceeded")
            if let retryAfter = rule.retryAfterSeconds { headers.append(("retry-after", String(retryAfter))) }
        case .serviceUnavailable:
            rejection = FCMRejection(503, "UNAVAILABLE", errorCode: "UNAVAILABLE", "the service is unavailable")
            headers.append(("retry-after", String(rule.retryAfterSeconds ?? 1)))
        case .internalError, .delay:
            rejection = FCMRejection(500, "INTERNAL", errorCode: "INTERNAL", "an internal error occurred")
        }
        return fcmError(rejection, headers: headers, rule: rule)
    }

    private func fcmError(_ rejection: FCMRejection, headers: [(String, String)] = [], rule: FaultRule? = nil)
        -> HTTP2ServerResponse
    {
        recorder.reject(reason: rejection.reason)
        var headers = headers
        if rejection.httpStatus == 401 { headers.append(("www-authenticate", "Bearer realm=\"simulator\"")) }
        let body = rule?.hostile(rejection.json, headers: &headers) ?? rejection.json
        return HTTPText.json(rejection.httpStatus, body, headers: headers)
    }

    private func oauthError(_ rejection: OAuthRejection) -> HTTP2ServerResponse {
        recorder.reject(reason: "oauth." + rejection.error)
        return HTTPText.json(
            400,
            .object(["error": .string(rejection.error), "error_description": .string(rejection.description)]))
    }

    private func control(_ request: HTTP2ServerRequest) -> HTTP2ServerResponse {
        let (path, query) = HTTPText.splitTarget(request.path)
        switch (request.method, path) {
        case ("GET", "/_sim/stats"):
            return HTTPText.json(200, .object(statistics))
        case ("GET", "/_sim/messages"), ("GET", "/_sim/pushes"):
            return HTTPText.json(200, .object(["messages": .array(recorder.records(token: query["token"]))]))
        case ("POST", "/_sim/reset"):
            reset()
            return HTTPText.json(200, .object(["ok": .bool(true)]))
        case ("POST", "/_sim/expire-tokens"):
            return HTTPText.json(200, .object(["expired": .int(Int64(expireAll()))]))
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
