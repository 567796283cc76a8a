import PostgresClient

/// Fresh statistics for the tables whose plans read sets by `= ANY` (migrations 0091 and 0093): the API's group
/// commit (each group's instances and their targets, up to 64 IDs) and a campaign-wide change's steps (10,000). Planned
/// on statistics taken while a table was nearly empty, such a read walked the tenant's whole table per statement (a
/// group's targets 419 ms instead of 1.5 ms after 100,000 token registrations; a change's step 13 s), until
/// autovacuum's analysis up to a minute later. One list, two rules:
/// - a change's step analyses those that have doubled since their statistics, before it plans
///   (`CampaignRunner.refreshStatistics`);
/// - every worker's once-a-second tick analyses those grown ten-fold (`DeliveryQueue.refreshTickStatistics`): once a
///   table has statistics from a thousand rows its estimates scale with its size, so the tick only has to catch a
///   table analysed near empty, and a start of 100,000 costs it two analyses of the instances, not one per doubling.
///
/// The queue has its own, tighter rule (`DeliveryQueue.refreshStatistics`).
enum PlannerStatistics {
    /// The tables the apps' registrations, an import, a start or its pushes fill in bursts: the instances, their
    /// activity tokens and devices, the people's devices and push-to-start tokens, the queue and today's history.
    static let tables = [
        "instances", "activity_tokens", "instance_devices", "devices", "push_to_start_tokens", "delivery_queue",
        "delivery_history",
    ]

    /// The growth since the last analysis (a multiple of what the planner believes) at which a change's step
    /// analyses a table.
    static let stepGrowth: Float = 2

    /// The growth at which the workers' tick does.
    static let tickGrowth: Float = 10

    /// `SELECT marquee_refresh_statistics(…)` over `tables` at `growth`: how many it analysed, as `analysed`; with
    /// `queue`, also the queue's own rule in the same statement (the tick's one round trip), as `queue`.
    static func query(growth: Float, queue: Bool = false) -> PostgresQuery {
        queue
            ? """
            SELECT marquee_refresh_queue_statistics() AS queue,
                   marquee_refresh_statistics(\(Self.tables)::regclass[], \(growth)::real) AS analysed
            """
            : "SELECT marquee_refresh_statistics(\(Self.tables)::regclass[], \(growth)::real) AS analysed"
    }
}
