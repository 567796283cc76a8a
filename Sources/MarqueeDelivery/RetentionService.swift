import Foundation
import MarqueeStore
import Observability

/// Runs the retention pass (migrations 0020, 0080) every hour in each worker; the SQL makes it once a day and one worker
/// at a time, so a pool of any size does the work once. Failures are logged and tried again at the next tick, and so
/// is a pass that left partitions for later because a long reader held their table.
public struct RetentionService: Sendable {
    public struct Configuration: Sendable {
        /// Days of events, metrics, delivery history and finished instances kept; 0 keeps everything.
        public var keepDays: Int
        /// How often a worker asks.
        public var interval: Duration
        public init(keepDays: Int, interval: Duration = .seconds(3600)) {
            self.keepDays = keepDays
            self.interval = interval
        }
    }

    let store: RetentionStore
    let configuration: Configuration
    let logger: Logger
    let runs: Counter
    let dropped: Counter
    let skipped: Counter
    let purged: Counter

    public init(store: RetentionStore, configuration: Configuration, metrics: MetricsRegistry, logger: Logger) {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        runs = metrics.counter(
            "marquee_retention_runs_total",
            help: "Retention passes by outcome: ran (this worker did the day's pass), skipped (done already or "
                + "running elsewhere), failed.", labels: ["outcome"])
        dropped = metrics.counter(
            "marquee_retention_partitions_dropped_total", help: "Day partitions dropped by retention.")
        skipped = metrics.counter(
            "marquee_retention_partitions_skipped_total",
            help: "Day partitions retention left for a later pass: their table's locks were not granted in time.")
        purged = metrics.counter(
            "marquee_retention_instances_purged_total", help: "Finished instances purged by retention.")
    }

    /// One pass as of `now`, by default the database's clock (RetentionStore.apply); what it did, or nil when skipped.
    @discardableResult
    public func runOnce(now: Date? = nil) async -> RetentionReport? {
        do {
            guard let report = try await store.apply(now: now, keepDays: configuration.keepDays) else {
                runs.inc(labels: "skipped")
                return nil
            }
            runs.inc(labels: "ran")
            dropped.inc(Double(report.partitionsDropped))
            skipped.inc(Double(report.partitionsSkipped))
            purged.inc(Double(report.instancesPurged))
            let metadata: LogMetadata = [
                "retention.cutoff": .string(report.cutoff),
                "retention.partitions_created": .int(report.partitionsCreated),
                "retention.partitions_dropped": .int(report.partitionsDropped),
                "retention.partitions_skipped": .int(report.partitionsSkipped),
                "retention.skipped_tables": .string(report.skippedTables.joined(separator: ",")),
                "retention.default_rows_deleted": .int(report.defaultRowsDeleted),
                "retention.instances_purged": .int(report.instancesPurged),
                "retention.retired_tokens_purged": .int(report.retiredTokensPurged),
            ]
            if report.partitionsSkipped > 0 {
                logger.warning("retention pass left partitions for later (their table was locked)", metadata: metadata)
            } else {
                logger.info("retention pass", metadata: metadata)
            }
            return report
        } catch {
            if Task.isCancelled {
                // Cut short by a shutdown: not a failure, and the next pass (any worker's) finishes it.
                logger.info("retention pass cut short by shutdown")
                return nil
            }
            runs.inc(labels: "failed")
            logger.error("retention pass failed", metadata: ["error": .string(String(describing: error))])
            return nil
        }
    }

    /// Until cancelled: a pass at start, then one every interval.
    public func run() async {
        while !Task.isCancelled {
            await runOnce()
            try? await Task.sleep(for: configuration.interval)
        }
    }
}
