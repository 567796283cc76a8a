import PostgresClient

/// Statements over a whole import or audience (up to 100,000 people an import, any number a campaign): they may run
/// longer than the usual statement timeout (`MARQUEE_DB_STATEMENT_TIMEOUT`, a minute by default) allows.
enum BulkStatements {
    /// What such a statement may take: 15 minutes. The worker's liveness allows its campaign runner as much more
    /// (`CampaignRunner.longestStatement`).
    static let statementTimeout = Duration.seconds(15 * 60)

    /// Sets the transaction's statement timeout to `statementTimeout`.
    static let timeout: PostgresQuery =
        "SELECT set_config('statement_timeout', \(String(statementTimeout.components.seconds * 1000)), true)"

    /// `statementTimeout` in words, for the reasons it gives.
    static var timeoutDescription: String { "\(statementTimeout.components.seconds / 60) minutes" }
}
