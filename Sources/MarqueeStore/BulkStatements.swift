import PostgresClient

/// Statements over a whole import or audience (up to 100,000 people an import, any number a campaign): they may run
/// longer than the usual statement timeout (`MARQUEE_DB_STATEMENT_TIMEOUT`, a minute by default) allows.
enum BulkStatements {
    /// Sets the transaction's statement timeout to what such a statement may take (15 minutes).
    static let timeout: PostgresQuery = "SELECT set_config('statement_timeout', '15min', true)"
}
