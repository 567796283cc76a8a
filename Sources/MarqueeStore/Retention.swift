import Foundation
import MarqueeCore
import PostgresClient

/// What one retention pass did (`marquee_retention_pass`, migrations 0080, 0082 and 0099).
public struct RetentionReport: Sendable, Equatable {
    /// Rows received before this day (UTC) are gone.
    public var cutoff: String
    public var partitionsCreated: Int
    public var partitionsDropped: Int
    /// Partitions due to be created or dropped that were left for a later pass: their table's locks were not
    /// granted within the lock timeout (a long reader of the table). A pass that skipped any is run again at the
    /// next tick, until one completes.
    public var partitionsSkipped: Int
    /// The tables whose partition work was left for later.
    public var skippedTables: [String]
    public var defaultRowsDeleted: Int
    public var instancesPurged: Int
    /// Push-to-start tokens retired (rotated, or refused by APNs) before the cutoff, deleted (migration 0082).
    public var retiredTokensPurged: Int
}

/// The daily retention pass: day partitions created ahead, those past the retention dropped, old instances and
/// retired push-to-start tokens purged. The rules (which tables, which rows, once a day, one worker at a time, how
/// long a step may wait for a lock, what a day is and what time it is) live in SQL, in migrations 0020, 0080, 0082 and
/// 0099.
public struct RetentionStore: Sendable {
    /// How the pass meets the workers' locks.
    public struct Options: Sendable {
        /// How long one partition step (create or drop, each in its own transaction) waits for its locks; meanwhile
        /// the table's other lock requests queue behind it. Default 2 s.
        public var lockTimeout: Duration
        /// Attempts per step, with a pause of `lockTimeout` × attempt between them, before the table is left for a
        /// later pass. Default 3.
        public var attempts: Int

        public init(lockTimeout: Duration = .seconds(2), attempts: Int = 3) {
            self.lockTimeout = lockTimeout
            self.attempts = attempts
        }
    }

    let pool: PostgresPool
    let options: Options

    public init(pool: PostgresPool, options: Options = .init()) {
        self.pool = pool
        self.options = options
    }

    /// Runs the pass as of `now`, keeping `keepDays` days (0 keeps everything but still creates partitions ahead).
    /// `now` nil, as workers call it: the database's clock, never this host's (a host whose clock runs ahead would
    /// drop partitions and purge rows early); tests pass a time of their own. nil when another worker is running it
    /// or a complete pass already ran on that day.
    public func apply(now: Date? = nil, keepDays: Int) async throws -> RetentionReport? {
        let lockTimeout = Self.milliseconds(options.lockTimeout)
        let attempts = options.attempts
        // A shutdown cancels the pass (its statement, through libpq): the steps it committed stay, the rest waits
        // for the next pass, and the worker exits in its drain time.
        let rows = try await pool.withCancellableConnection { connection in
            // The pass commits step by step, so it is called outside any transaction, where a per-transaction role
            // switch (`enterSystem`) cannot reach: the session switches to marquee_system for the call and back
            // after it (the worker's sessions start as marquee_system, so for them this changes nothing). The pass
            // holds a session-level advisory lock while it runs and releases it on its way out; if it failed
            // half-way, the release here frees it before the connection goes back to the pool.
            // The pass is one CALL of many short transactions, each step bounded by its lock timeout: no statement
            // timeout (a worker's sessions have one) may cut it at a fixed length whatever the tables' sizes.
            try connection.execute("SET ROLE marquee_system")
            try connection.execute("SET statement_timeout TO 0")
            defer {
                _ = try? connection.execute("SELECT marquee_retention_release()")
                _ = try? connection.execute("RESET statement_timeout")
                _ = try? connection.execute("RESET ROLE")
            }
            return try connection.query(
                """
                CALL marquee_retention_pass(\(now)::timestamptz, \(keepDays)::integer, NULL,
                                            \(lockTimeout)::bigint * interval '1 millisecond', \(attempts)::integer)
                """)
        }
        guard case .object(let summary)? = try rows.first?.decode(JSONValue?.self, "p_summary") else { return nil }
        func count(_ key: String) -> Int { summary[key]?.intValue.map { Int($0) } ?? 0 }
        return RetentionReport(
            cutoff: summary["cutoff"]?.stringValue ?? "", partitionsCreated: count("partitions_created"),
            partitionsDropped: count("partitions_dropped"), partitionsSkipped: count("partitions_skipped"),
            skippedTables: summary["skipped_tables"]?.arrayValue?.compactMap(\.stringValue) ?? [],
            defaultRowsDeleted: count("default_rows_deleted"), instancesPurged: count("instances_purged"),
            retiredTokensPurged: count("retired_tokens_purged"))
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
