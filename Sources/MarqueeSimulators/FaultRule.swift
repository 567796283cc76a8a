import MarqueeCore
import Synchronization

/// A failure-injection rule of the APNs and FCM simulators.
///
/// Rules are matched in order against each request that passed validation; the first one that applies decides.
/// A rule applies when the device token starts with `tokenPrefix` (any token when `nil`), the per-token `times`
/// budget is not used up, and a random draw falls below `rate` (always when `nil`).
///
/// JSON form (a list, or an object `{"rules": [...]}`):
///
/// ```json
/// [{"token_prefix": "dead", "action": "unregistered"},
///  {"token_prefix": "flaky", "action": "service_unavailable", "times": 1, "retry_after": 2},
///  {"rate": 0.05, "action": "too_many_requests", "latency_ms": 20}]
/// ```
///
/// Actions: `unregistered` (APNs 410 / FCM 404 UNREGISTERED), `too_many_requests` or `quota_exceeded` (APNs 429 /
/// FCM 429 QUOTA_EXCEEDED), `service_unavailable` or `unavailable` (503), `internal` or `internal_server_error`
/// (500), `goaway` (GOAWAY on the connection; the stream counts as unprocessed), `expire_token` (FCM: the access
/// token of the request expires now and the request gets 401), `foreign_token` (another app's token: APNs 400
/// DeviceTokenNotForTopic / FCM 403 SENDER_ID_MISMATCH), `forbidden` (the key refused: APNs 403 InvalidProviderToken
/// / FCM 403 PERMISSION_DENIED), `delay` (only `latency_ms`, then normal handling).
///
/// APNs broadcasts match rules with their channel ID as the token; a matching rule answers with its action's status
/// and reason at once (`goaway`, `delay`, latency and the hostile fields apply to device pushes only).
///
/// Hostile answers, to test that a tenant's endpoint cannot hurt the worker: `retry_after_header` sends that text
/// verbatim as `Retry-After` (any status; e.g. `"1e16"`, `"-1"`, `"NaN"`), `timestamp` replaces an APNs 410's
/// `timestamp` with any JSON value (e.g. `1e17`, `-1`, `"soon"`), `body_padding` adds that many bytes to the
/// error body (an oversized answer), and `message_name` (FCM, with `delay`) is the accepted message's `name` answered
/// instead of the real one (e.g. one holding a NUL).
public struct FaultRule: Sendable, Hashable {
    /// What a matching rule does.
    public enum Action: String, Sendable, Hashable, CaseIterable {
        /// APNs 410 Unregistered; FCM 404 UNREGISTERED.
        case unregistered
        /// APNs 429 TooManyRequests; FCM 429 QUOTA_EXCEEDED.
        case tooManyRequests = "too_many_requests"
        /// APNs 503 ServiceUnavailable; FCM 503 UNAVAILABLE.
        case serviceUnavailable = "service_unavailable"
        /// APNs 500 InternalServerError; FCM 500 INTERNAL.
        case internalError = "internal"
        /// GOAWAY on the request's connection (the request is not processed).
        case goAway = "goaway"
        /// FCM only: the request's access token expires now; the request is answered 401 UNAUTHENTICATED.
        case expireToken = "expire_token"
        /// No failure: wait `latencyMilliseconds`, then handle the request normally.
        case delay
        /// The token belongs to another app: APNs 400 DeviceTokenNotForTopic; FCM 403 SENDER_ID_MISMATCH (another
        /// Firebase project's token).
        case foreignToken = "foreign_token"
        /// The sender's key is refused for this request: APNs 403 InvalidProviderToken (as Apple answers a key
        /// limited to another environment or topic, or revoked); FCM 403 PERMISSION_DENIED.
        case forbidden

        /// Parses an action name, accepting the aliases listed on `FaultRule`.
        public init?(name: String) {
            switch name.lowercased() {
            case "quota_exceeded", "429": self = .tooManyRequests
            case "unavailable", "503": self = .serviceUnavailable
            case "internal_server_error", "500": self = .internalError
            case "410", "404": self = .unregistered
            case "go_away": self = .goAway
            default:
                guard let action = Action(rawValue: name.lowercased()) else { return nil }
                self = action
            }
        }
    }

    /// Tokens this rule applies to (`token_prefix`); `nil` applies to every token.
    public var tokenPrefix: String?
    /// The probability (0...1) that an otherwise matching request is hit (`rate`); `nil` means always.
    public var rate: Double?
    /// What happens (`action`).
    public var action: Action
    /// Only the first `times` matching requests per token are hit (`times`); `nil` means no limit.
    public var times: Int?
    /// Delay before answering (`latency_ms`), also applied with a failure action.
    public var latencyMilliseconds: Int?
    /// The `retry-after` header, in seconds, for 429 and 503 (`retry_after`).
    public var retryAfterSeconds: Int?
    /// A `retry-after` header sent verbatim with any failure (`retry_after_header`), hostile values included.
    public var retryAfterHeader: String?
    /// The `timestamp` of an APNs 410 body, any JSON value (`timestamp`).
    public var timestamp: JSONValue?
    /// Extra bytes in the error body (`body_padding`), for oversized answers.
    public var bodyPadding: Int?
    /// FCM, with `delay`: the `name` answered for the accepted message instead of its real one (`message_name`).
    public var messageName: String?

    /// Creates a rule.
    public init(
        tokenPrefix: String? = nil, rate: Double? = nil, action: Action, times: Int? = nil,
        latencyMilliseconds: Int? = nil, retryAfterSeconds: Int? = nil, retryAfterHeader: String? = nil,
        timestamp: JSONValue? = nil, bodyPadding: Int? = nil, messageName: String? = nil
    ) {
        self.tokenPrefix = tokenPrefix
        self.rate = rate
        self.action = action
        self.times = times
        self.latencyMilliseconds = latencyMilliseconds
        self.retryAfterSeconds = retryAfterSeconds
        self.retryAfterHeader = retryAfterHeader
        self.timestamp = timestamp
        self.bodyPadding = bodyPadding
        self.messageName = messageName
    }

    /// Parses a rule list (a JSON array, or an object with a `rules` array). Throws `invalidConfiguration`.
    public static func parseRules(json: String) throws -> [FaultRule] {
        let document: JSONValue
        do {
            document = try JSONValue.parse(json)
        } catch {
            throw SimulatorError(.invalidConfiguration, "fault rules are not JSON", details: "\(error)")
        }
        return try parseRules(document)
    }

    static func parseRules(_ document: JSONValue) throws -> [FaultRule] {
        let list: [JSONValue]
        if let array = document.arrayValue {
            list = array
        } else if let array = document["rules"]?.arrayValue {
            list = array
        } else {
            throw SimulatorError(.invalidConfiguration, "fault rules must be a JSON array or {\"rules\": [...]}")
        }
        return try list.enumerated().map { index, value in try FaultRule(json: value, index: index) }
    }

    init(json: JSONValue, index: Int) throws {
        func fail(_ message: String) -> SimulatorError {
            SimulatorError(.invalidConfiguration, "fault rule \(index): \(message)")
        }
        guard let object = json.objectValue else { throw fail("must be an object") }
        let known: Set = [
            "token_prefix", "rate", "action", "times", "latency_ms", "retry_after", "retry_after_header", "timestamp",
            "body_padding", "message_name",
        ]
        if let unknown = object.keys.sorted().first(where: { !known.contains($0) }) {
            throw fail("unknown field '\(unknown)'")
        }
        guard let name = object["action"]?.stringValue else { throw fail("needs an 'action' string") }
        guard let action = Action(name: name) else { throw fail("unknown action '\(name)'") }
        self.action = action
        if let value = object["token_prefix"], !value.isNull {
            guard let prefix = value.stringValue else { throw fail("'token_prefix' must be a string") }
            tokenPrefix = prefix
        }
        if let value = object["rate"], !value.isNull {
            guard let rate = value.doubleValue, (0...1).contains(rate) else {
                throw fail("'rate' must be a number from 0 to 1")
            }
            self.rate = rate
        }
        func count(_ key: String) throws -> Int? {
            guard let value = object[key], !value.isNull else { return nil }
            guard let number = value.intValue, number >= 0, number <= Int64(Int32.max) else {
                throw fail("'\(key)' must be a non-negative integer")
            }
            return Int(number)
        }
        times = try count("times")
        latencyMilliseconds = try count("latency_ms")
        retryAfterSeconds = try count("retry_after")
        if let value = object["retry_after_header"], !value.isNull {
            guard let text = value.stringValue else { throw fail("'retry_after_header' must be a string") }
            retryAfterHeader = text
        }
        if let value = object["timestamp"], !value.isNull { timestamp = value }
        bodyPadding = try count("body_padding")
        if let value = object["message_name"], !value.isNull {
            guard let text = value.stringValue else { throw fail("'message_name' must be a string") }
            messageName = text
        }
    }

    /// The rule as JSON, in the form `parseRules` reads.
    public var json: JSONValue {
        var object: [String: JSONValue] = ["action": .string(action.rawValue)]
        if let tokenPrefix { object["token_prefix"] = .string(tokenPrefix) }
        if let rate { object["rate"] = .double(rate) }
        if let times { object["times"] = .int(Int64(times)) }
        if let latencyMilliseconds { object["latency_ms"] = .int(Int64(latencyMilliseconds)) }
        if let retryAfterSeconds { object["retry_after"] = .int(Int64(retryAfterSeconds)) }
        if let retryAfterHeader { object["retry_after_header"] = .string(retryAfterHeader) }
        if let timestamp { object["timestamp"] = timestamp }
        if let bodyPadding { object["body_padding"] = .int(Int64(bodyPadding)) }
        if let messageName { object["message_name"] = .string(messageName) }
        return .object(object)
    }
}

/// Applies fault rules: first match wins, `times` counted per rule and token, `rate` drawn from a seedable PRNG.
final class FaultInjector: Sendable {
    private struct State {
        var rules: [FaultRule]
        /// Hits per rule index and token, for `times`.
        var hits: [Int: [String: Int]] = [:]
        var random: SplitMix64
    }

    private let state: Mutex<State>

    init(rules: [FaultRule], seed: UInt64? = nil) {
        state = Mutex(State(rules: rules, random: SplitMix64(seed: seed ?? UInt64.random(in: .min ... .max))))
    }

    var rules: [FaultRule] { state.withLock { $0.rules } }

    /// Replaces the rules and forgets the `times` counts.
    func replace(_ rules: [FaultRule]) {
        state.withLock { state in
            state.rules = rules
            state.hits = [:]
        }
    }

    /// Forgets the `times` counts.
    func reset() {
        state.withLock { $0.hits = [:] }
    }

    /// The rule that hits a request for `token`, if any, counting the hit.
    func decide(token: String) -> FaultRule? {
        state.withLock { state in
            for (index, rule) in state.rules.enumerated() {
                if let prefix = rule.tokenPrefix, !token.hasPrefix(prefix) { continue }
                let used = state.hits[index]?[token] ?? 0
                if let times = rule.times, used >= times { continue }
                if let rate = rule.rate, Double.random(in: 0..<1, using: &state.random) >= rate { continue }
                state.hits[index, default: [:]][token] = used + 1
                return rule
            }
            return nil
        }
    }
}

/// A small deterministic PRNG (SplitMix64) so that rate-based rules can be reproduced with a seed.
struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension FaultRule {
    /// Applies the hostile extras to an injected error answer: a verbatim `retry-after` and body padding.
    func hostile(_ body: JSONValue, headers: inout [(String, String)]) -> JSONValue {
        if let retryAfterHeader {
            headers.removeAll { $0.0 == "retry-after" }
            headers.append(("retry-after", retryAfterHeader))
        }
        guard let bodyPadding, bodyPadding > 0, case .object(var object) = body else { return body }
        object["padding"] = .string(String(repeating: "x", count: bodyPadding))
        return .object(object)
    }
}
