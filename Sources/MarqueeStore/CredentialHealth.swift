import Foundation
import PostgresClient

/// Credential state across tenants, for the workers' gauges: counts by provider and status, and the tenants whose
/// credential is broken (at most `limit`, oldest break first, so a label set stays bounded however many break).
public struct CredentialHealth: Sendable, Equatable {
    public struct Broken: Sendable, Equatable {
        public var provider: String
        public var tenantID: UUID
        public var since: Date
    }

    /// (provider, status) → credentials.
    public var counts: [String: [String: Int]]
    public var broken: [Broken]

    /// Reads it as marquee_system (the worker's role).
    public static func read(pool: PostgresPool, limit: Int) async throws -> CredentialHealth {
        try await TenantDatabase(pool: pool).systemTransaction { connection in
            let credentials = """
                SELECT 'apns' AS provider, tenant_id, status, updated_at FROM apns_credentials
                UNION ALL
                SELECT 'fcm', tenant_id, status, updated_at FROM fcm_credentials
                """
            var counts: [String: [String: Int]] = ["apns": ["ok": 0, "broken": 0], "fcm": ["ok": 0, "broken": 0]]
            for row in try connection.query(
                PostgresQuery(
                    unsafeSQL: "SELECT provider, status, count(*)::int AS n FROM (\(credentials)) c GROUP BY 1, 2"))
            {
                counts[try row.decode(String.self, "provider"), default: [:]][try row.decode(String.self, "status")] =
                    try row.decode(Int.self, "n")
            }
            let broken = try connection.query(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT provider, tenant_id, updated_at FROM (\(credentials)) c WHERE status = 'broken'
                        ORDER BY updated_at, tenant_id LIMIT \(max(0, limit))
                        """)
            ).map {
                Broken(
                    provider: try $0.decode(String.self, "provider"), tenantID: try $0.decode(UUID.self, "tenant_id"),
                    since: try $0.decode(Date.self, "updated_at"))
            }
            return CredentialHealth(counts: counts, broken: broken)
        }
    }
}
