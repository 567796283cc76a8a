import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Observability
import Synchronization
import Testing

@testable import MarqueeDelivery

/// What `ExpiringAPNs` answers with, and how often it was asked.
private final class Answers: Sendable {
    let requests = Atomic<Int>(0)
    let date = Mutex<String?>(nil)
}

/// A TLS HTTP/2 server on loopback that refuses every push with 403 ExpiredProviderToken, with a `date` header as set.
private final class ExpiringAPNs: Sendable {
    let server: HTTP2Server
    let caFile: String
    private let answers = Answers()
    private let runner: Mutex<Task<Void, Never>?> = Mutex(nil)

    var requests: Int { answers.requests.load(ordering: .relaxed) }

    init() throws {
        let directory = NSTemporaryDirectory() + "apns-clock-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ca = try TestPKI.makeCA(commonName: "Expiring APNs CA")
        caFile = directory + "/ca.pem"
        try ca.certificatePEM.write(toFile: caFile, atomically: true, encoding: .utf8)
        let (cert, key) = try TestPKI.makeServerCertificate(ca: ca)
        let body = Array(#"{"reason":"ExpiredProviderToken"}"#.utf8)
        let answers = self.answers
        server = HTTP2Server(
            port: 0, tls: TLSServerConfiguration(certificateChainPEM: cert, privateKeyPEM: key),
            handler: { _ in
                answers.requests.wrappingAdd(1, ordering: .relaxed)
                var headers = [("content-type", "application/json")]
                if let date = answers.date.withLock({ $0 }) { headers.append(("date", date)) }
                return HTTP2ServerResponse(status: 403, headers: headers, body: body)
            })
        try server.start()
        let server = self.server
        runner.withLock { $0 = Task { try? await server.run() } }
    }

    func answer(date: String?) { answers.date.withLock { $0 = date } }

    func stop() async {
        await server.stop()
        await runner.withLock { $0 }?.value
    }
}

/// Log lines, kept for the test to read.
private final class Lines: Sendable {
    let lines = Mutex<[String]>([])
    var logger: Logger { Logger(label: "test", sink: LogSink { line in self.lines.withLock { $0.append(line) } }) }
    var all: [String] { lines.withLock { $0 } }
}

@Suite("A wrong clock never breaks an APNs credential")
struct APNsClockSkewTests {
    static func httpDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: date)
    }

    @Test("ExpiredProviderToken again on the token signed moments ago is the clock's: retried, logged, not broken")
    func expiredTwice() async throws {
        let apple = try ExpiringAPNs()
        let lines = Lines()
        let provider = APNsProvider(
            configuration: .init(
                caFile: apple.caFile, connectionsPerHost: 1,
                allowedHosts: ProviderHosts(entries: [.init(host: "127.0.0.1", port: apple.server.boundPort)])),
            logger: lines.logger)
        // Old enough to be replaced at once: the first refusal gets a fresh token, the second is on that one.
        let tokens = ProviderTokenCache(
            teamID: "TEAM123456", keyID: "KEY1234567", key: ES256PrivateKey.generate(), minimumAge: .zero)
        let target = APNsTarget(host: "127.0.0.1", port: apple.server.boundPort, tokens: tokens)
        let push = APNsPush(
            token: "ab12", topic: "com.example.app.push-type.liveactivity", priority: 10, expiration: 0,
            apnsID: UUID(), payload: Array("{}".utf8))
        let outcome = await provider.send(push, to: target)
        #expect(outcome == SendOutcome(.retry(reason: "clock_skew", retryAfter: nil), httpStatus: 403))
        #expect(apple.requests == 2, "refused, refreshed once, refused again")
        #expect(lines.all.contains { $0.contains("clock disagrees") && $0.contains(#""level":"error""#) })

        // With APNs' Date ten minutes off, the first refusal says so: no token update is spent on a replacement.
        apple.answer(date: Self.httpDate(Date().addingTimeInterval(600)))
        let skewed = await provider.send(push, to: target)
        #expect(skewed == SendOutcome(.retry(reason: "clock_skew", retryAfter: nil), httpStatus: 403))
        #expect(apple.requests == 3)
        #expect(lines.all.contains { $0.contains(#""clock.skew_seconds""#) })
        await provider.shutdown()
        await apple.stop()
    }
}
