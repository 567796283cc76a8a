import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Observability
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeDelivery

/// Requests held, and the gate that releases them.
private final class Gate: Sendable {
    let held = Atomic<Int>(0)
    let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        held.wrappingAdd(1, ordering: .relaxed)
        await withCheckedContinuation { continuation in
            let open = state.withLock { state in
                if !state.open { state.waiters.append(continuation) }
                return state.open
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// A TLS HTTP/2 server on loopback that issues access tokens at once and holds every `messages:send` until released.
private final class SlowGoogle: Sendable {
    let server: HTTP2Server
    let caFile: String
    let gate = Gate()
    private let runner: Mutex<Task<Void, Never>?> = Mutex(nil)

    init() throws {
        let directory = NSTemporaryDirectory() + "fcm-slow-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ca = try TestPKI.makeCA(commonName: "Slow Google CA")
        caFile = directory + "/ca.pem"
        try ca.certificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
        let (cert, key) = try TestPKI.makeServerCertificate(ca: ca)
        let token = Array(#"{"access_token":"ya29.slow","expires_in":3600}"#.utf8)
        let sent = Array(#"{"name":"projects/p/messages/1"}"#.utf8)
        let gate = self.gate
        server = HTTP2Server(
            port: 0, tls: TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key),
            handler: { request in
                guard request.path != "/token" else {
                    return HTTP2ServerResponse(status: 200, headers: [], body: token)
                }
                await gate.wait()
                return HTTP2ServerResponse(status: 200, headers: [], body: sent)
            })
        try server.start()
        let server = self.server
        runner.withLock { $0 = Task { try? await server.run() } }
    }

    func stop() async {
        gate.open()
        await server.stop()
        await runner.withLock { $0 }?.value
    }
}

@Suite("A delivery's send deadline bounds its provider requests")
struct SendByTests {
    @Test("a request's timeout is cut to the time left before the deadline; none is left past it")
    func timeoutWithinDeadline() {
        let now = ContinuousClock.now
        #expect(ProviderConnections.timeout(.seconds(30), by: now + .seconds(45), now: now) == .seconds(30))
        #expect(ProviderConnections.timeout(.seconds(30), by: now + .seconds(2), now: now) == .seconds(2))
        #expect(ProviderConnections.timeout(.seconds(30), by: now, now: now) == nil)
        #expect(ProviderConnections.timeout(.seconds(30), by: now - .seconds(1), now: now) == nil)
    }

    @Test("a message request still unanswered at the deadline ends then, not after the 30 s request timeout")
    func requestEndsAtDeadline() async throws {
        let google = try SlowGoogle()
        let provider = FCMProvider(
            configuration: .init(
                caFile: google.caFile, connectionsPerHost: 1, requestTimeout: .seconds(30),
                allowedHosts: ProviderHosts(entries: [.init(host: "127.0.0.1", port: google.server.boundPort)])))
        let base = "https://127.0.0.1:\(google.server.boundPort)"
        let tokens = provider.accessTokens(
            for: FCMAccount(
                projectID: "p", clientEmail: "a@p.iam.gserviceaccount.com", privateKeyID: "k",
                tokenURI: base + "/token", endpoint: base, key: try RS256PrivateKey.generate()))
        // The access token first (its exchange is not what the deadline bounds here), then a deadline a loaded
        // machine still reaches the message request well before: the request ends at it, not after its 30 s.
        _ = try await tokens.token()
        let clock = ContinuousClock()
        let began = clock.now
        let outcome = await provider.send(
            token: "t", data: ["k": "v"], ttlSeconds: 60, collapseKey: nil, via: tokens, by: began + .seconds(5))
        #expect(outcome.decision == .retry(reason: "timeout", retryAfter: nil))
        #expect(clock.now - began < .seconds(20), "ended by the deadline: \(clock.now - began)")
        #expect(google.gate.held.load(ordering: .relaxed) == 1)
        // Past the deadline nothing is sent at all.
        let late = await provider.send(
            token: "t", data: ["k": "v"], ttlSeconds: 60, collapseKey: nil, via: tokens, by: clock.now)
        #expect(late.decision == .retry(reason: "deadline", retryAfter: nil))
        #expect(google.gate.held.load(ordering: .relaxed) == 1)
        await provider.shutdown()
        await google.stop()
    }

    @Test("at the shutdown cutoff the providers' requests are closed before the sends are given up; none starts after")
    func cutoffClosesRequests() async throws {
        let google = try SlowGoogle()
        let provider = FCMProvider(
            configuration: .init(
                caFile: google.caFile, connectionsPerHost: 1, requestTimeout: .seconds(30),
                allowedHosts: ProviderHosts(entries: [.init(host: "127.0.0.1", port: google.server.boundPort)])))
        let base = "https://127.0.0.1:\(google.server.boundPort)"
        let tokens = provider.accessTokens(
            for: FCMAccount(
                projectID: "p", clientEmail: "a@p.iam.gserviceaccount.com", privateKeyID: "k",
                tokenURI: base + "/token", endpoint: base, key: try RS256PrivateKey.generate()))
        // A worker that never runs (nothing connects to its database): only its shutdown cutoff is used.
        let worker = DeliveryWorker(
            pool: PostgresPool(try PostgresConfiguration(url: "postgresql://nobody@127.0.0.1:1/none")),
            listenerConfiguration: try PostgresConfiguration(url: "postgresql://nobody@127.0.0.1:1/none"),
            apns: APNsProvider(configuration: .init()), fcm: provider,
            keyRing: try SealingKeyRing(current: (id: "k1", key: [UInt8](repeating: 7, count: 32))),
            configuration: .init(workerID: "test", drainTimeout: .milliseconds(200)), metrics: MetricsRegistry(),
            logger: Logger(label: "test", sink: .discard))
        // The access token first (the connection is then open), then a push in flight (its deadline far away), held
        // by the provider.
        _ = try await tokens.token()
        let clock = ContinuousClock()
        let inFlight = Task {
            await provider.send(
                token: "t", data: ["k": "v"], ttlSeconds: 60, collapseKey: nil, via: tokens,
                by: clock.now + .seconds(60))
        }
        let deadline = clock.now + .seconds(60)
        while google.gate.held.load(ordering: .relaxed) < 1 && clock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        try #require(google.gate.held.load(ordering: .relaxed) == 1)
        worker.beginShutdown()
        #expect(await worker.sendsEnd(after: .seconds(60)) == "shutdown")
        // The sends still out are recorded as retries now. The provider answering later changes nothing: the request
        // was closed before, so the push is not also sent by this worker while another takes the retry.
        google.gate.open()
        #expect(await inFlight.value.decision == .retry(reason: "shutdown", retryAfter: nil))
        // Nor does a send that was on its way (a token exchange answered late) start a request after the cutoff.
        let late = await provider.send(
            token: "t", data: ["k": "v"], ttlSeconds: 60, collapseKey: nil, via: tokens, by: clock.now + .seconds(60))
        #expect(late.decision == .retry(reason: "shutdown", retryAfter: nil))
        #expect(google.gate.held.load(ordering: .relaxed) == 1, "no request reached the provider after the cutoff")
        await provider.shutdown()
        await google.stop()
    }
}
