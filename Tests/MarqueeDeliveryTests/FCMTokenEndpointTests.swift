import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Observability
import Synchronization
import Testing

@testable import MarqueeDelivery

/// What the fake token endpoint answers next, and how often it was asked.
private final class Script: Sendable {
    let answer = Mutex<(status: Int, headers: [(String, String)], body: String)>((200, [], "{}"))
    let exchanges = Atomic<Int>(0)
}

/// A TLS HTTP/2 server on loopback that answers the OAuth2 token endpoint as scripted and `messages:send` with 200.
private final class FakeGoogle: Sendable {
    let server: HTTP2Server
    let caFile: String
    private let script = Script()
    private let runner: Mutex<Task<Void, Never>?> = Mutex(nil)

    init() throws {
        let directory = NSTemporaryDirectory() + "fcm-token-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ca = try TestPKI.makeCA(commonName: "Fake Google CA")
        caFile = directory + "/ca.pem"
        try ca.certificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
        let (cert, key) = try TestPKI.makeServerCertificate(ca: ca)
        let script = self.script
        let sent = Array(#"{"name":"projects/p/messages/1"}"#.utf8)
        server = HTTP2Server(
            port: 0, tls: TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key),
            handler: { request in
                guard request.path == "/token" else { return HTTP2ServerResponse(status: 200, headers: [], body: sent) }
                script.exchanges.wrappingAdd(1, ordering: .relaxed)
                let (status, headers, body) = script.answer.withLock { $0 }
                return HTTP2ServerResponse(status: status, headers: headers, body: Array(body.utf8))
            })
        try server.start()
        let server = self.server
        runner.withLock { $0 = Task { try? await server.run() } }
    }

    func answer(_ status: Int, _ body: String, headers: [(String, String)] = []) {
        script.answer.withLock { $0 = (status, headers, body) }
    }

    var exchangeCount: Int { script.exchanges.load(ordering: .relaxed) }

    func stop() async {
        await server.stop()
        await runner.withLock { $0 }?.value
    }
}

/// A clock the test moves, from now.
private final class Clock: Sendable {
    let now = Mutex(Date())
    func advance(_ seconds: TimeInterval) { now.withLock { $0 = $0.addingTimeInterval(seconds) } }
    var read: @Sendable () -> Date { { self.now.withLock { $0 } } }
}

/// Waits until `condition` holds, for at most 10 s.
private func eventually(_ condition: () -> Bool) async throws {
    let deadline = ContinuousClock.now + .seconds(10)
    while !condition() {
        guard ContinuousClock.now < deadline else { throw CancellationError() }
        try await Task.sleep(for: .milliseconds(5))
    }
}

@Suite("FCM token endpoint: passing failures are retried, only a rejection breaks the credential", .serialized)
struct FCMTokenEndpointTests {
    private func provider(
        _ google: FakeGoogle, tokenURI: String? = nil, logger: Logger? = nil,
        now: @escaping @Sendable () -> Date = Date.init
    ) throws -> (FCMProvider, FCMAccessTokens) {
        let provider = FCMProvider(
            configuration: .init(
                caFile: google.caFile, connectionsPerHost: 1, requestTimeout: .seconds(20),
                allowedHosts: ProviderHosts(entries: [.init(host: "127.0.0.1")])),
            logger: logger)
        let base = "https://127.0.0.1:\(google.server.boundPort)"
        let account = FCMAccount(
            projectID: "p", clientEmail: "a@p.iam.gserviceaccount.com", privateKeyID: "k",
            tokenURI: tokenURI ?? base + "/token", endpoint: base, key: try RS256PrivateKey.generate())
        return (provider, provider.accessTokens(for: account, now: now))
    }

    private func send(_ provider: FCMProvider, _ tokens: FCMAccessTokens) async -> DeliveryDecision {
        await provider.send(token: "t", data: ["k": "v"], ttlSeconds: 60, collapseKey: nil, via: tokens).decision
    }

    @Test("429 (hostile Retry-After), 503 and 500 from the token endpoint are retried; then a token works")
    func passing() async throws {
        let google = try FakeGoogle()
        let clock = Clock()
        let (provider, tokens) = try provider(google, now: clock.read)
        google.answer(429, #"{"error":"rate_limited"}"#, headers: [("retry-after", "1e16")])
        #expect(await send(provider, tokens) == .retry(reason: "oauth_unavailable", retryAfter: .seconds(3600)))
        clock.advance(3600)
        google.answer(503, "<html>busy</html>", headers: [("retry-after", "2")])
        #expect(await send(provider, tokens) == .retry(reason: "oauth_unavailable", retryAfter: .seconds(2)))
        clock.advance(FCMAccessTokens.retryFloor)
        google.answer(500, "")
        #expect(await send(provider, tokens) == .retry(reason: "oauth_unavailable", retryAfter: nil))
        clock.advance(FCMAccessTokens.retryFloor)
        google.answer(200, #"{"access_token":"ya29.ok","expires_in":1e17,"token_type":"Bearer"}"#)
        #expect(await send(provider, tokens) == .sent(providerID: "projects/p/messages/1"))
        #expect(google.exchangeCount == 4)
        await provider.shutdown()
        await google.stop()
    }

    @Test("a failed exchange is not repeated before its Retry-After: senders without a token get its failure at once")
    func notBefore() async throws {
        let google = try FakeGoogle()
        let clock = Clock()
        let (provider, tokens) = try provider(google, now: clock.read)
        google.answer(503, "", headers: [("retry-after", "30")])
        #expect(await send(provider, tokens) == .retry(reason: "oauth_unavailable", retryAfter: .seconds(30)))
        clock.advance(10)
        #expect(await send(provider, tokens) == .retry(reason: "oauth_unavailable", retryAfter: .seconds(20)))
        #expect(google.exchangeCount == 1, "the endpoint in trouble was not asked again before its Retry-After")
        clock.advance(20)
        google.answer(200, #"{"access_token":"ya29.ok","expires_in":3600}"#)
        #expect(await send(provider, tokens) == .sent(providerID: "projects/p/messages/1"))
        #expect(google.exchangeCount == 2)
        await provider.shutdown()
        await google.stop()
    }

    @Test("a token still valid is kept when its refresh fails, refreshed ahead without making senders wait")
    func keptWhileValid() async throws {
        let google = try FakeGoogle()
        let clock = Clock()
        let (provider, tokens) = try provider(google, now: clock.read)
        google.answer(200, #"{"access_token":"ya29.first","expires_in":600}"#)
        #expect(try await tokens.token() == "ya29.first")
        google.answer(503, "", headers: [("retry-after", "30")])
        // 299 s left: refreshed in the background, the current token used meanwhile (and kept: the refresh fails).
        clock.advance(301)
        #expect(try await tokens.token() == "ya29.first")
        try await eventually { google.exchangeCount == 2 && !tokens.isRefreshing }
        #expect(try await tokens.token() == "ya29.first")
        #expect(google.exchangeCount == 2, "not again before the Retry-After")
        // Past it, the next sender starts another refresh, which lands.
        clock.advance(31)
        google.answer(200, #"{"access_token":"ya29.second","expires_in":600}"#)
        #expect(try await tokens.token() == "ya29.first")
        try await eventually { google.exchangeCount == 3 && !tokens.isRefreshing }
        #expect(try await tokens.token() == "ya29.second")
        // A token within a minute of its expiry is not used: with the endpoint failing, the sender gets the failure.
        google.answer(503, "")
        clock.advance(541)
        await #expect(throws: FCMAuthError.self) { try await tokens.token() }
        await provider.shutdown()
        await google.stop()
    }

    @Test("a transport failure of the exchange is logged under the token endpoint's host and port, not FCM's")
    func exchangeFailureLogged() async throws {
        let google = try FakeGoogle()
        let lines = Mutex<[String]>([])
        let logger = Logger(label: "test", sink: LogSink { line in lines.withLock { $0.append(line) } })
        // Nothing listens on port 1.
        let (provider, tokens) = try provider(google, tokenURI: "https://127.0.0.1:1/token", logger: logger)
        #expect(await send(provider, tokens) == .retry(reason: "transport_error", retryAfter: nil))
        let logged = lines.withLock { $0 }.filter { $0.contains("provider request failed") }
        #expect(logged.count == 1)
        #expect(logged.allSatisfy { $0.contains(#""provider.port":1"#) }, "\(logged)")
        #expect(google.exchangeCount == 0)
        await provider.shutdown()
        await google.stop()
    }

    @Test("400 invalid_grant and 401 invalid_client break the credential, with a fixed reason")
    func rejected() async throws {
        let google = try FakeGoogle()
        let clock = Clock()
        let (provider, tokens) = try provider(google, now: clock.read)
        google.answer(400, #"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#)
        #expect(await send(provider, tokens) == .credentialBroken(reason: "oauth_invalid_grant"))
        clock.advance(FCMAccessTokens.retryFloor)
        google.answer(401, #"{"error":"invalid_client"}"#)
        #expect(await send(provider, tokens) == .credentialBroken(reason: "oauth_invalid_client"))
        await provider.shutdown()
        await google.stop()
    }

    @Test("Google's 400 invalid_grant about iat/exp is this host's clock: retried as clock_skew, not broken")
    func clockSkew() async throws {
        let google = try FakeGoogle()
        let (provider, tokens) = try provider(google)
        google.answer(
            400,
            #"{"error":"invalid_grant","error_description":"Invalid JWT: Token must be a short-lived token (60 "#
                + #"minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."}"#)
        #expect(await send(provider, tokens) == .retry(reason: "clock_skew", retryAfter: nil))
        await provider.shutdown()
        await google.stop()
    }

    @Test("an oversized token-endpoint answer is a transport error, retried")
    func oversized() async throws {
        let google = try FakeGoogle()
        let (provider, tokens) = try provider(google)
        google.answer(200, #"{"access_token":""# + String(repeating: "x", count: 200_000) + #""}"#)
        #expect(await send(provider, tokens) == .retry(reason: "transport_error", retryAfter: nil))
        await provider.shutdown()
        await google.stop()
    }

    @Test("a token_uri outside the allowlist is never connected to")
    func tokenURIRefused() async throws {
        let google = try FakeGoogle()
        let provider = FCMProvider(configuration: .init(caFile: google.caFile))
        let base = "https://127.0.0.1:\(google.server.boundPort)"
        let tokens = provider.accessTokens(
            for: FCMAccount(
                projectID: "p", clientEmail: "a@p.iam.gserviceaccount.com", privateKeyID: nil,
                tokenURI: base + "/token", endpoint: "https://fcm.googleapis.com", key: try RS256PrivateKey.generate()))
        #expect(await send(provider, tokens) == .credentialBroken(reason: "endpoint_not_allowed"))
        #expect(google.exchangeCount == 0)
        await provider.shutdown()
        await google.stop()
    }
}
