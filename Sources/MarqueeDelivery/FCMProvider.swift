import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Observability
import Synchronization

/// A tenant's FCM service account, as the worker needs it.
public struct FCMAccount: Sendable {
    public var projectID: String
    public var clientEmail: String
    public var privateKeyID: String?
    public var tokenURI: String
    /// `https://fcm.googleapis.com` or the credential's override.
    public var endpoint: String
    public var key: RS256PrivateKey

    public init(
        projectID: String, clientEmail: String, privateKeyID: String?, tokenURI: String, endpoint: String,
        key: RS256PrivateKey
    ) {
        self.projectID = projectID
        self.clientEmail = clientEmail
        self.privateKeyID = privateKeyID
        self.tokenURI = tokenURI
        self.endpoint = endpoint
        self.key = key
    }
}

/// OAuth2 access tokens for one service account (JWT-bearer grant), cached.
///
/// A refresh starts `refreshAhead` (5 minutes) before the token expires, in the background: senders go on with the
/// current token until `margin` (1 minute) before its expiry, and keep it when the refresh fails. Only a sender without
/// a usable token (none yet, about to expire, or the one FCM just rejected) waits, for the one exchange concurrent
/// senders share. After a failed exchange no other starts before `notBefore` (the endpoint's `Retry-After`, at least
/// `retryFloor`): a sender without a usable token meanwhile gets that failure at once, and a token endpoint in trouble
/// is asked once per credential and wait, not once per claim.
public final class FCMAccessTokens: Sendable {
    static let scope = "https://www.googleapis.com/auth/firebase.messaging"
    /// How long before its expiry a token is refreshed in the background.
    static let refreshAhead: TimeInterval = 300
    /// How long before its expiry a token is no longer used.
    static let margin: TimeInterval = 60
    /// The shortest wait after a failed exchange before the next.
    static let retryFloor: TimeInterval = 5

    private struct State {
        var token: String?
        var expires: Date = .distantPast
        /// Set while an exchange runs: the senders waiting for it (none for a refresh ahead of expiry).
        var refreshing: [CheckedContinuation<String, any Error>]?
        var issued = 0
        /// The last exchange failed: no other before `notBefore`, and senders without a usable token get `failure`.
        var notBefore: Date = .distantPast
        var failure: FCMAuthError?
    }

    let account: FCMAccount
    private let provider: FCMProvider
    private let now: @Sendable () -> Date
    private let state = Mutex(State())

    init(account: FCMAccount, provider: FCMProvider, now: @escaping @Sendable () -> Date = Date.init) {
        self.account = account
        self.provider = provider
        self.now = now
    }

    /// How many tokens this cache obtained (for tests and metrics).
    public var tokensIssued: Int { state.withLock { $0.issued } }

    /// Whether an exchange is running (for tests).
    var isRefreshing: Bool { state.withLock { $0.refreshing != nil } }

    private let proven = Atomic(false)

    /// Whether FCM has accepted a push sent with this credential (as loaded). Until then a SENDER_ID_MISMATCH blames
    /// the credential, after it the token (`FCMErrorCode.decide`).
    public var isProven: Bool { proven.load(ordering: .relaxed) }

    /// Notes that FCM accepted a push sent with this credential; true the first time only (then the caller records
    /// it: `DeliveryQueue.markFCMCredentialProven`).
    @discardableResult
    public func markProven() -> Bool {
        !proven.exchange(true, ordering: .relaxed)
    }

    /// A usable access token: the cached one while it has more than `margin` left and is not `rejected` (starting a
    /// refresh in the background within `refreshAhead` of its expiry); otherwise the shared exchange's, or, before
    /// `notBefore`, the last exchange's failure (`FCMAuthError`).
    public func token(rejecting rejected: String? = nil) async throws -> String {
        enum Next {
            case ready(String, refreshAhead: Bool)
            case failed(FCMAuthError)
            case wait
            case refresh
        }
        let current = now()
        return try await withCheckedThrowingContinuation { continuation in
            let next: Next = state.withLock { state in
                let mayExchange = state.refreshing == nil && current >= state.notBefore
                if let token = state.token, token != rejected {
                    let left = state.expires.timeIntervalSince(current)
                    if left > Self.margin {
                        let ahead = mayExchange && left <= Self.refreshAhead
                        if ahead { state.refreshing = [] }
                        return .ready(token, refreshAhead: ahead)
                    }
                }
                if state.refreshing != nil {
                    state.refreshing!.append(continuation)
                    return .wait
                }
                if current < state.notBefore, let failure = state.failure {
                    return .failed(failure.waiting(state.notBefore.timeIntervalSince(current)))
                }
                state.refreshing = [continuation]
                return .refresh
            }
            switch next {
            case .ready(let token, let ahead):
                continuation.resume(returning: token)
                // The refresh is shared by every later sender, so it must not die with whichever caller started it:
                // an unstructured task, not a child of the first caller.
                if ahead { Task { await self.refresh() } }
            case .failed(let failure): continuation.resume(throwing: failure)
            case .wait: break
            case .refresh: Task { await self.refresh() }
            }
        }
    }

    private func refresh() async {
        let result: Result<(String, Date), FCMAuthError>
        do {
            result = .success(try await provider.exchange(account, at: now()))
        } catch {
            result = .failure(error)
        }
        let current = now()
        let waiters = state.withLock { state in
            switch result {
            case .success(let (token, expires)):
                state.token = token
                state.expires = expires
                state.issued += 1
                state.notBefore = .distantPast
                state.failure = nil
            case .failure(let failure):
                // A token still valid is kept: senders use it until `margin` before its expiry.
                state.failure = failure
                state.notBefore = current.addingTimeInterval(failure.wait)
            }
            defer { state.refreshing = nil }
            return state.refreshing ?? []
        }
        for waiter in waiters { waiter.resume(with: result.map(\.0).mapError { $0 as any Error }) }
    }
}

/// An FCM token-exchange failure, already classified: the endpoint's answer (`OAuthTokenAnswer`), a transport failure
/// (`TransportFailure`, logged under the token endpoint's host) or an assertion that could not be signed.
public struct FCMAuthError: Error, Sendable, CustomStringConvertible {
    /// The token endpoint's HTTP status; nil when it did not answer.
    public var status: Int?
    /// What the delivery that needed the token should do.
    public var decision: DeliveryDecision
    public var description: String {
        (status.map { "token endpoint answered \($0)" } ?? "token exchange failed") + ": \(decision)"
    }

    /// How long no other exchange starts after this one: the endpoint's `Retry-After`, at least
    /// `FCMAccessTokens.retryFloor`.
    var wait: TimeInterval {
        guard case .retry(_, let retryAfter?) = decision else { return FCMAccessTokens.retryFloor }
        return max(retryAfter.inSeconds, FCMAccessTokens.retryFloor)
    }

    /// This failure given to a sender `left` seconds before the next exchange may start: a retry waits that long.
    func waiting(_ left: TimeInterval) -> FCMAuthError {
        guard case .retry(let reason, _) = decision else { return self }
        return FCMAuthError(
            status: status,
            decision: .retry(reason: reason, retryAfter: .milliseconds(Int64((max(left, 0) * 1000).rounded()))))
    }
}

/// Sends Android Live Update data messages through FCM HTTP v1 over the shared HTTP/2 pools.
public final class FCMProvider: Sendable {
    public typealias Configuration = ProviderClientConfiguration

    private let configuration: Configuration
    private let connections: ProviderConnections
    private let logger: Logger?

    public init(configuration: Configuration, logger: Logger? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.connections = ProviderConnections(configuration, name: "fcm")
    }

    /// An access-token cache for `account` (one per tenant credential; the worker keeps them).
    public func accessTokens(for account: FCMAccount, now: @escaping @Sendable () -> Date = Date.init)
        -> FCMAccessTokens
    {
        FCMAccessTokens(account: account, provider: self, now: now)
    }

    public var statistics: (connections: Int, streams: Int) { connections.statistics }

    /// The host, port and request path of an `https` URL; `hostNotAllowed` for anything else.
    static func target(_ url: String) throws -> (host: String, port: Int, path: String) {
        guard let components = URLComponents(string: url), components.scheme == "https", let host = components.host
        else { throw ProviderConnectionError.hostNotAllowed }
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        return (host, components.port ?? 443, path + (components.percentEncodedQuery.map { "?" + $0 } ?? ""))
    }

    /// The JWT-bearer exchange: an RS256 assertion for `account`, issued at `now` → an access token and its expiry.
    /// Every failure is classified here: a signing failure breaks the credential; a transport failure is retried and
    /// logged under the token endpoint's host.
    func exchange(_ account: FCMAccount, at now: Date) async throws(FCMAuthError) -> (String, Date) {
        let iat = Int64(now.timeIntervalSince1970)
        var header: [String: String] = [:]
        if let kid = account.privateKeyID { header["kid"] = kid }
        let assertion: String
        do {
            assertion = try JWT.sign(
                claims: [
                    "iss": .string(account.clientEmail), "scope": .string(FCMAccessTokens.scope),
                    "aud": .string(account.tokenURI), "iat": .int(iat), "exp": .int(iat + 3600),
                ], header: header, signer: account.key)
        } catch let error as CryptoError {
            throw FCMAuthError(status: nil, decision: .credentialBroken(reason: "signing failed: \(error.code)"))
        } catch {
            throw FCMAuthError(status: nil, decision: .credentialBroken(reason: "signing failed"))
        }
        let form =
            "grant_type=" + Self.formEncode("urn:ietf:params:oauth:grant-type:jwt-bearer") + "&assertion="
            + Self.formEncode(assertion)
        let target = try? Self.target(account.tokenURI)
        let response: HTTP2Response
        do {
            guard let target else { throw ProviderConnectionError.hostNotAllowed }
            response = try await connections.send(
                HTTP2Request(
                    method: "POST", path: target.path,
                    headers: [("content-type", "application/x-www-form-urlencoded")], body: Array(form.utf8),
                    timeout: configuration.requestTimeout),
                host: target.host, port: target.port)
        } catch {
            throw FCMAuthError(
                status: nil,
                decision: TransportFailure.decision(
                    error, provider: "fcm", host: target?.host ?? "", port: target?.port ?? 0, logger: logger))
        }
        switch OAuthTokenAnswer.decide(
            status: response.status, body: response.body, retryAfter: response.header("retry-after"),
            date: response.header("date"))
        {
        case .token(let token, let lifetime):
            return (token, Date(timeIntervalSince1970: Double(iat) + lifetime))
        case .failed(let decision):
            if decision == DeliveryReason.clockSkewed {
                ClockSkew.report(
                    provider: "fcm", host: target?.host ?? "", date: response.header("date"), logger: logger)
                throw FCMAuthError(status: response.status, decision: decision)
            }
            logger?.warning(
                "token endpoint refused the exchange",
                metadata: ["fcm.project": .string(account.projectID), "http.status": .int(response.status)])
            throw FCMAuthError(status: response.status, decision: decision)
        }
    }

    /// Sends one message. A 401 refreshes the access token once and retries; a second 401 breaks the credential.
    /// No message request outlives `deadline` (the delivery's send deadline), nor is one sent past it. (The token
    /// exchange, shared by concurrent senders, keeps its own timeout: it sends no push.)
    public func send(
        token: String, data: [String: String], ttlSeconds: Int, collapseKey: String?, via tokens: FCMAccessTokens,
        by deadline: ContinuousClock.Instant? = nil
    )
        async -> SendOutcome
    {
        let account = tokens.account
        let body = FCMMessage.body(token: token, data: data, ttlSeconds: ttlSeconds, collapseKey: collapseKey)
        do {
            let target = try Self.target(account.endpoint)
            let basePath = URLComponents(string: account.endpoint)?.percentEncodedPath ?? ""
            let path =
                (basePath.hasSuffix("/") ? String(basePath.dropLast()) : basePath)
                + "/v1/projects/\(account.projectID)/messages:send"
            // Checked before the token exchange too, so a refused endpoint never costs a token.
            guard configuration.allowedHosts.allows(host: target.host, port: target.port) else {
                throw ProviderConnectionError.hostNotAllowed
            }
            var accessToken = try await tokens.token()
            for attempt in 0..<2 {
                let response = try await connections.send(
                    HTTP2Request(
                        method: "POST", path: path,
                        headers: [("authorization", "Bearer " + accessToken), ("content-type", "application/json")],
                        body: body.bytes, timeout: configuration.requestTimeout),
                    host: target.host, port: target.port, by: deadline)
                let decision = FCMErrorCode.decide(
                    status: response.status, body: response.body, retryAfter: response.header("retry-after"),
                    credentialProven: tokens.isProven)
                if case .refreshProviderToken(let reason) = decision {
                    if attempt == 0 {
                        accessToken = try await tokens.token(rejecting: accessToken)
                        continue
                    }
                    return SendOutcome(.credentialBroken(reason: "\(reason) twice"), httpStatus: response.status)
                }
                return SendOutcome(decision, httpStatus: response.status)
            }
            return SendOutcome(.retry(reason: "token refresh loop", retryAfter: nil))
        } catch let error as FCMAuthError {
            // 400 invalid_grant and friends break the credential; 429, 5xx, transport failures and the like are
            // retried. (The status is the token endpoint's, not FCM's: not recorded as the delivery's.)
            return SendOutcome(error.decision)
        } catch {
            let target = try? Self.target(account.endpoint)
            return SendOutcome(
                TransportFailure.decision(
                    error, provider: "fcm", host: target?.host ?? "", port: target?.port ?? 0, logger: logger))
        }
    }

    static func formEncode(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? s
    }

    /// Closes every connection after in-flight requests finish; with `deadline`, those still in flight then fail and
    /// their connections close at once.
    public func shutdown(by deadline: ContinuousClock.Instant? = nil) async {
        await connections.shutdown(by: deadline)
    }
}
