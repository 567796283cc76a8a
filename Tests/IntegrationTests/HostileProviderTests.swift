import Crypto
import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Testing

/// A tenant chooses its endpoint (within the operator's allowlist), so whatever it answers is hostile. Tests in the
/// serialized APNs delivery suite, because they set the shared simulator's fault rules and run a worker.
extension DeliveryTests {
    @Test("hostile answers (huge/NaN Retry-After, absurd 410 timestamps, 1 MiB bodies) never stop the worker")
    func hostileAnswers() async throws {
        let hostile = try await Self.tenant()
        let other = try await Self.tenant()
        let simulator = hostile.fixture.simulator
        simulator.setFaults([
            .init(tokenPrefix: "bad0", action: .tooManyRequests, retryAfterHeader: "1e16"),
            .init(tokenPrefix: "bad1", action: .unregistered, timestamp: .double(1e17)),
            .init(tokenPrefix: "bad2", action: .unregistered, timestamp: .int(.max)),
            .init(tokenPrefix: "bad3", action: .serviceUnavailable, retryAfterHeader: "NaN", bodyPadding: 1 << 20),
            .init(tokenPrefix: "bad4", action: .tooManyRequests, retryAfterHeader: "-1e300"),
            .init(tokenPrefix: "bad5", action: .unregistered, timestamp: .double(-1e300)),
            .init(tokenPrefix: "bad6", action: .tooManyRequests, retryAfterHeader: "Fri, 31 Dec 9999 23:59:59 GMT"),
            .init(tokenPrefix: "bad7", action: .unregistered, timestamp: .string("1e17")),
        ])
        defer { simulator.setFaults([]) }
        let worker = try hostile.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let prefixes = (0..<8).map { "bad\($0)" }
        var devices: [String: String] = [:]
        for prefix in prefixes { devices[prefix] = try await hostile.iphone(tokenPrefix: prefix).0 }
        let instance = Fake.id("hostile")
        #expect(try await hostile.start(instance).status == 200)

        // Every hostile delivery is attempted and its outcome recorded (attempts count from the claim, so wait for
        // the outcome: a final status, or a reason on a retry).
        let recorded: ([String: Any]) -> Bool = { $0.string("status") != "queued" || $0.string("reason") != nil }
        let clock = ContinuousClock()
        var rows: [[String: Any]] = []
        let deadline = clock.now + .seconds(30)
        while clock.now < deadline {
            rows = try await hostile.deliveries(instance)
            if rows.count == prefixes.count, rows.allSatisfy(recorded) { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        try #require(rows.count == prefixes.count && rows.allSatisfy(recorded), "\(rows)")
        #expect(worker.process.isRunning, "the worker survived: \(worker.log.suffix(2000))")

        // Deliveries show the device ID masked to its ends.
        func row(_ prefix: String) -> [String: Any]? {
            let device = devices[prefix] ?? ""
            return rows.first { $0.string("device_token") == device.prefix(4) + "…" + device.suffix(4) }
        }
        let now = Date()
        for prefix in ["bad1", "bad2", "bad5", "bad7"] {
            #expect(row(prefix)?.string("status") == "undeliverable", "\(prefix): \(row(prefix) ?? [:])")
            #expect(row(prefix)?.string("reason") == "Unregistered")
        }
        for prefix in ["bad0", "bad4", "bad6"] {
            #expect(row(prefix)?.string("status") == "queued", "\(prefix): \(row(prefix) ?? [:])")
            #expect(row(prefix)?.string("reason") == "TooManyRequests")
            // At most an hour away, whatever the header said (plus the backoff's own ceiling, far below it).
            let next = (row(prefix)?.string("next_attempt_at")).flatMap(Self.parseTime)
            if let next { #expect(next.timeIntervalSince(now) <= 3600 + 60, "\(prefix): \(next)") }
        }
        #expect(row("bad3")?.string("status") == "queued")
        #expect(row("bad3")?.string("reason") == "transport_error", "an oversized body is a transport error")

        // Another tenant's push goes out within seconds, on the same worker.
        let (_, token) = try await other.iphone()
        let otherInstance = Fake.id("bystander")
        let began = clock.now
        #expect(try await other.start(otherInstance).status == 200)
        let settled: [[String: Any]]
        do {
            settled = try await other.settled(otherInstance, count: 1, timeout: .seconds(20))
        } catch {
            // What the worker met on the way (its failures' details are logged, never stored).
            let failures = worker.log.split(separator: "\n").filter { $0.contains("provider request failed") }
            throw TestFailure("\(error); the worker's last failures: \(failures.suffix(4).joined(separator: "\n"))")
        }
        #expect(settled[0].string("status") == "sent")
        #expect(clock.now - began < .seconds(10), "sent on time: \(clock.now - began)")
        #expect(simulator.pushes(token: token).count == 1)
        #expect(worker.process.isRunning)
        let health = try await HTTP.get("http://127.0.0.1:\(worker.port)/healthz")
        #expect(health.status == 200, "the worker still answers")
    }

    @Test("an endpoint outside MARQUEE_PROVIDER_HOSTS is refused at upload (422) and, written in SQL, by the worker")
    func endpointAllowlist() async throws {
        let t = try await Self.tenant()
        var apns: [String: Any] = [
            "team_id": t.fixture.teamID, "key_id": t.fixture.keyID, "private_key": t.fixture.key.pkcs8PEM,
            "bundle_id": "com.example.app", "environment": "sandbox",
        ]
        for endpoint in ["https://10.0.0.1", "https://169.254.169.254:443", "https://api.push.apple.com.evil.test"] {
            apns["endpoint"] = endpoint
            let r = try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: apns)
            #expect(r.status == 422, "\(endpoint)")
            #expect(r.header("content-type")?.hasPrefix("application/problem+json") == true)
            let problem = try r.json()
            #expect(problem.string("type") == "https://marquee.dev/problems/endpoint-not-allowed")
            #expect(problem.string("field") == "endpoint")
        }
        var fcm = RegistryTests.serviceAccount(pem: try RS256PrivateKey.generate().pkcs8PEM)
        fcm["token_uri"] = "https://127.0.0.2:9/token"
        let refused = try await t.api.call(
            "PUT", "/v1/credentials/fcm", key: t.tenant.app, json: ["service_account": fcm])
        #expect(refused.status == 422)
        #expect(try refused.json().string("field") == "service_account.token_uri")

        // A row written around the API: the worker does not connect, and pauses the tenant with a fixed reason.
        apns["endpoint"] = "https://127.0.0.1:\(t.fixture.simulator.port)"
        #expect(try await t.api.call("PUT", "/v1/credentials/apns", key: t.tenant.app, json: apns).status == 200)
        let changed = try await t.fixture.pool.execute(
            "UPDATE apns_credentials SET endpoint = 'https://10.255.255.1:5432' WHERE tenant_id = \(t.tenant.uuid)")
        #expect(changed == 1)
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let (_, token) = try await t.iphone()
        let instance = Fake.id("refused")
        _ = try await t.start(instance)
        let clock = ContinuousClock()
        let deadline = clock.now + .seconds(20)
        var credential: [String: Any] = [:]
        while clock.now < deadline {
            credential = try await t.api.call("GET", "/v1/credentials/apns", key: t.tenant.app).json()
            if credential.string("status") == "broken" { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(credential.string("status") == "broken", "\(credential)")
        #expect(credential.string("status_reason") == "endpoint_not_allowed")
        #expect(try await t.deliveries(instance).allSatisfy { $0.string("status") != "sent" })
        #expect(t.fixture.simulator.pushes(token: token).isEmpty)
    }
}
