import Foundation
import MarqueeCore
import PostgresClient

/// What one retention pass did (migration 0020's `marquee_apply_retention`).
public struct RetentionReport: Sendable, Equatable {
    /// Rows received before this day (UTC) are gone.
    public var cutoff: String
    public var partitionsCreated: Int
    public var partitionsDropped: Int
    public var defaultRowsDeleted: Int
    public var instancesPurged: Int
}

/// The daily retention pass: day partitions created ahead, those past the retention dropped, old instances purged.
/// The rules (which tables, which rows, once a day, one worker at a time) live in SQL, in migration 0020.
public struct RetentionStore: Sendable {
    let database: TenantDatabase

    public init(pool: PostgresPool) {
        database = TenantDatabase(pool: pool)
    }

    /// Runs the pass as of `now`, keeping `keepDays` days (0 keeps everything but still creates partitions ahead).
    /// nil when another worker is running it or it already ran on `now`'s day.
    public func apply(now: Date = Date(), keepDays: Int) async throws -> RetentionReport? {
        let rows = try await database.systemTransaction { connection in
            try connection.query("SELECT marquee_apply_retention(\(now), \(keepDays)::integer) AS summary")
        }
        guard case .object(let summary)? = try rows.first?.decode(JSONValue?.self, "summary") else { return nil }
        func count(_ key: String) -> Int { summary[key]?.intValue.map { Int($0) } ?? 0 }
        return RetentionReport(
            cutoff: summary["cutoff"]?.stringValue ?? "", partitionsCreated: count("partitions_created"),
            partitionsDropped: count("partitions_dropped"), defaultRowsDeleted: count("default_rows_deleted"),
            instancesPurged: count("instances_purged"))
    }
}
