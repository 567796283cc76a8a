import Foundation
import Testing

/// The API's request rate limits through a real `marquee serve` (the shared fixture: the default limits, the key
/// cache off, so a settings change shows at once): a tenant's own limit, per kind of key, per tenant.
@Suite("Request rate limits")
struct RequestLimitTests {
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

        // Each request takes a token and a token comes back each second: far fewer than 100 requests must find the
        // bucket empty, however slowly this machine answers them.
        var refused: HTTP.Response?
        var allowed = 0
        for _ in 0..<100 {
            let response = try await api.call(
                "PUT", "/v1/people/\(Fake.id("p"))", key: limited.sdk, json: [String: Any]())
            if response.status == 429 {
                refused = response
                break
            }
            #expect(response.status == 200, "\(response.text)")
            allowed += 1
        }
        let response = try #require(refused, "no request was refused")
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
