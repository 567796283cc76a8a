import Foundation
import PostgresClient
import Testing

/// The API's request rate limits through a real `marquee serve` (the shared fixture: the default limits, the key
/// cache off, so a settings change shows at once): a tenant's own limit, per kind of key, per tenant.
@Suite("Request rate limits")
struct RequestLimitTests {
    /// Calls `request` until it is answered 429 (each before it must be a 200); returns that answer and how many went
    /// through. A request takes a token and a token comes back each second at the tests' rates: far fewer than 100
    /// requests must find the bucket empty, however slowly this machine answers them.
    static func firstRefusal(_ request: () async throws -> HTTP.Response) async throws -> (HTTP.Response, Int) {
        for allowed in 0..<100 {
            let response = try await request()
            if response.status == 429 { return (response, allowed) }
            #expect(response.status == 200, "\(response.text)")
        }
        throw TestFailure("no request was refused")
    }

    @Test("over its sdk-key rate a tenant gets 429 rate-limited with Retry-After; its app key and other tenants go on")
    func overTheLimit() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let limited = try await api.createTenant()
        let other = try await api.createTenant()

        // One a second, so a burst of 10 (the default MARQUEE_RATE_LIMIT_BURST).
        let patched = try await api.call(
            "PATCH", "/v1/settings", key: limited.app, json: ["sdk_requests_per_second": 1])
        #expect(patched.status == 200, "\(patched.text)")
        #expect(try patched.json()["sdk_requests_per_second"] as? Int == 1)
        #expect(try patched.json()["app_requests_per_second"] as? Int == 1000, "the default")

        let (response, allowed) = try await Self.firstRefusal {
            try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: limited.sdk, json: [String: Any]())
        }
        #expect(allowed >= 10, "the burst went through first")
        expectProblem(response, 429, "rate-limited")
        let retryAfter = try #require(response.header("Retry-After").flatMap { Int($0) })
        #expect(retryAfter >= 1)
        #expect(!response.text.contains(limited.sdk), "the key is never echoed")

        // The same tenant's app key, and another tenant's sdk key, are not held back.
        #expect(try await api.call("GET", "/v1/settings", key: limited.app).status == 200)
        for _ in 0..<20 {
            let put = try await api.call("PUT", "/v1/people/\(Fake.id("p"))", key: other.sdk, json: [String: Any]())
            #expect(put.status == 200, "\(put.text)")
        }
        // Operational endpoints are never limited (they take no key).
        for path in ["/healthz", "/readyz", "/metrics"] {
            #expect(try await HTTP.get(fixture.serve.baseURL + path).status == 200, "\(path)")
        }

        // Counted by kind, and logged once with the tenant and the key's ID, never the key.
        let metrics = try await HTTP.get(fixture.serve.baseURL + "/metrics").text
        let counted = metrics.split(separator: "\n").first {
            $0.hasPrefix(#"marquee_http_rate_limited_total{kind="sdk"}"#)
        }
        #expect(counted.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) } ?? 0 >= 1, "\(metrics)")
        let line = fixture.serve.log.split(separator: "\n").first {
            $0.contains(#""msg":"request rate limited""#) && $0.contains(limited.id.lowercased())
        }
        #expect(line?.contains(#""api_key.kind":"sdk""#) == true, "\(line ?? "no log line")")
        #expect(!fixture.serve.log.contains(limited.sdk))

        // null restores the default: the sdk key goes on (as soon as its bucket, refilling at 1000 a second, allows).
        let restored = try await api.call(
            "PATCH", "/v1/settings", key: limited.app, json: ["sdk_requests_per_second": NSNull()])
        #expect(try restored.json()["sdk_requests_per_second"] as? Int == 1000, "\(restored.text)")
        var status = 0
        let deadline = ContinuousClock.now + .seconds(30)
        while status != 200, ContinuousClock.now < deadline {
            status = try await api.call(
                "PUT", "/v1/people/\(Fake.id("p"))", key: limited.sdk, json: [String: Any]()
            ).status
        }
        #expect(status == 200)
    }

    @Test("a batch of events takes a token per event: batching does not multiply a tenant's sdk rate")
    func batchesTakeATokenPerEvent() async throws {
        let fixture = try await RegistryFixture.get()
        let api = fixture.api
        let tenant = try await api.createTenant()
        // One a second: a bucket of 10. The first batch of 10 empties it; the next needs 10 s of refill.
        let patched = try await api.call("PATCH", "/v1/settings", key: tenant.app, json: ["sdk_requests_per_second": 1])
        #expect(patched.status == 200, "\(patched.text)")
        func batch(_ people: [String]) async throws -> HTTP.Response {
            try await api.call(
                "POST", "/v1/batch",
                json: ["batch": people.map { CompatIngestTests.event("identify", userId: $0) }],
                headers: ["Authorization": tenant.basicSDK])
        }
        let first = (0..<10).map { _ in Fake.id("p") }
        let accepted = try await batch(first)
        #expect(accepted.status == 200, "\(accepted.text)")
        let second = (0..<10).map { _ in Fake.id("p") }
        let refused = try await batch(second)
        expectProblem(refused, 429, "rate-limited")
        #expect(try #require(refused.header("Retry-After").flatMap { Int($0) }) >= 1)
        let stored = try await fixture.pool.count(
            "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(tenant.uuid) AND id = ANY(\(first + second))")
        #expect(stored == 10, "the first batch only")
    }

    @Test(
        "behind a trusted proxy, one client address over its sdk share gets 429; other addresses and app keys go on")
    func perClientAddress() async throws {
        let fixture = try await RegistryFixture.get()
        let serve = try MarqueeProcess(
            ["serve"],
            environment: [
                "DATABASE_URL": fixture.databaseURL, "MARQUEE_TRUSTED_PROXIES": "127.0.0.0/8, ::1",
                "MARQUEE_RATE_LIMIT_SDK_PER_ADDRESS": "1", "MARQUEE_RATE_LIMIT_BURST": "30",
            ], port: TestEnvironment.freePort())
        try await serve.waitUntilServing()
        defer { serve.signal(SIGKILL) }
        let api = API(baseURL: serve.baseURL)
        let tenant = try await api.createTenant()
        // The proxy (this test, on 127.0.0.1) appends the address it got the request from; what the client wrote to
        // its left is not believed.
        func put(forwardedFor: String) async throws -> HTTP.Response {
            try await api.call(
                "PUT", "/v1/people/\(Fake.id("p"))", key: tenant.sdk, json: [String: Any](),
                headers: ["X-Forwarded-For": forwardedFor])
        }
        let (response, allowed) = try await Self.firstRefusal {
            try await put(forwardedFor: "198.51.100.1, 203.0.113.9")
        }
        #expect(allowed >= 30, "the burst went through first")
        expectProblem(response, 429, "rate-limited")
        #expect(try response.json()["scope"] as? String == "client_address", "\(response.text)")
        #expect(response.header("Retry-After").flatMap { Int($0) } ?? 0 >= 1)
        // Writing another address to the left does not help that client: its bucket (empty, one token back a second)
        // refuses it again after as many requests as seconds went by, where a bucket of its own would let 30 through.
        let (_, spoofed) = try await Self.firstRefusal { try await put(forwardedFor: "198.51.100.77, 203.0.113.9") }
        #expect(spoofed < 15, "\(spoofed) went through")
        // Another client, behind the same proxy, is not held back; nor is the tenant's app key.
        for _ in 0..<3 { #expect(try await put(forwardedFor: "203.0.113.10").status == 200) }
        for _ in 0..<10 {
            let settings = try await api.call(
                "GET", "/v1/settings", key: tenant.app, headers: ["X-Forwarded-For": "203.0.113.9"])
            #expect(settings.status == 200)
        }
        // Counted and logged with the client's address; the access log names the client, not the proxy.
        let metrics = try await HTTP.get(serve.baseURL + "/metrics").text
        let counted = metrics.split(separator: "\n").first {
            $0.hasPrefix("marquee_http_rate_limited_addresses_total ")
        }
        #expect(counted.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) } ?? 0 >= 2, "\(metrics)")
        #expect(serve.log.contains(#""rate_limit.client_address":"203.0.113.9""#))
        let access = serve.log.split(separator: "\n").first { $0.contains(#""client.address":"203.0.113.10""#) }
        #expect(access?.contains(#""network.peer.address":"127.0.0.1""#) == true, "\(access ?? "no access line")")
        #expect(!serve.log.contains(tenant.sdk))
    }

    @Test("a tenant's request rates are 1 to 1,000,000 a second, or null")
    func validation() async throws {
        let fixture = try await RegistryFixture.get()
        let tenant = try await fixture.api.createTenant()
        for (field, value) in [
            ("app_requests_per_second", 0), ("sdk_requests_per_second", 1_000_001), ("app_requests_per_second", -5),
        ] {
            expectProblem(
                try await fixture.api.call("PATCH", "/v1/settings", key: tenant.app, json: [field: value]),
                422, "invalid-field", field: field)
        }
        // Above the operator's limit (the default 1,000 here): refused, the tenant may only lower it.
        expectProblem(
            try await fixture.api.call(
                "PATCH", "/v1/settings", key: tenant.app, json: ["app_requests_per_second": 5000]),
            422, "invalid-field", field: "app_requests_per_second")
        let set = try await fixture.api.call(
            "PATCH", "/v1/settings", key: tenant.app, json: ["app_requests_per_second": 500])
        #expect(try set.json()["app_requests_per_second"] as? Int == 500, "\(set.text)")
        let read = try await fixture.api.call("GET", "/v1/settings", key: tenant.app)
        #expect(try read.json()["app_requests_per_second"] as? Int == 500, "\(read.text)")
        #expect(try read.json()["sdk_requests_per_second"] as? Int == 1000, "\(read.text)")
        // The sdk key may not change them.
        expectProblem(
            try await fixture.api.call(
                "PATCH", "/v1/settings", key: tenant.sdk, json: ["sdk_requests_per_second": 1_000_000]),
            403, "forbidden")
    }
}
