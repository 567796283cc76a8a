import Foundation
import MarqueeStore
import Observability
import PostgresClient

/// Samples credential state into gauges at each scrape of the worker's `/metrics`: `marquee_credentials{provider,status}` for the fleet, and
/// `marquee_credential_broken{provider,tenant_id}` = seconds since the break, for at most `limit` tenants (the
/// oldest breaks), so that a tenant in trouble is named while the label set stays bounded.
public struct CredentialHealthSampler: Sendable {
    let pool: PostgresPool
    let limit: Int
    let credentials: Gauge
    let broken: Gauge

    public init(pool: PostgresPool, metrics: MetricsRegistry, limit: Int = 20) {
        self.pool = pool
        self.limit = limit
        credentials = metrics.gauge(
            "marquee_credentials", help: "Provider credentials by provider and status (ok, broken).",
            labels: ["provider", "status"])
        broken = metrics.gauge(
            "marquee_credential_broken",
            help: "Seconds since a tenant's credential was found broken; the oldest 20 breaks only.",
            labels: ["provider", "tenant_id"])
    }

    /// One sample now.
    public func sample(now: Date = Date()) async throws {
        let health = try await CredentialHealth.read(pool: pool, limit: limit)
        for (provider, statuses) in health.counts {
            for (status, count) in statuses { credentials.set(Double(count), [provider, status]) }
        }
        var ages: [LabelValues: Double] = [:]
        for credential in health.broken {
            ages[[credential.provider, credential.tenantID.uuidString.lowercased()]] = max(
                0, now.timeIntervalSince(credential.since))
        }
        broken.replaceAll(ages)
    }
}
