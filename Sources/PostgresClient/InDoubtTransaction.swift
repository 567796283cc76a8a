/// A transaction whose COMMIT was sent on a connection that was then lost: it may have committed, and only the server
/// can say whether it did (`PostgresConnection.status(of:)`, asked on another connection).
public struct InDoubtTransaction: Sendable, Hashable {
    /// Its transaction ID (`pg_current_xact_id()`: 64 bits, never reused).
    public var id: UInt64
    /// The server process that ran it (`pg_stat_activity.pid`), which may still hold it open.
    public var backendPID: Int32

    public init(id: UInt64, backendPID: Int32) {
        self.id = id
        self.backendPID = backendPID
    }
}

/// What the server knows of a transaction (`pg_xact_status`).
public enum TransactionStatus: String, Sendable, Hashable {
    case committed
    case aborted
    /// Still open: its backend has not yet read the COMMIT, is committing, or has not noticed the connection is gone.
    case inProgress = "in progress"
}

extension PostgresConnection {
    /// Whether `transaction` committed (`pg_xact_status`); nil when the server no longer knows (a transaction older
    /// than the commit log it keeps, hundreds of millions of transactions ago).
    public func status(of transaction: InDoubtTransaction) throws -> TransactionStatus? {
        let rows = try query("SELECT pg_xact_status(\(String(transaction.id))::xid8) AS status")
        guard let text = try rows.first?.decode(String?.self, "status") else { return nil }
        guard let status = TransactionStatus(rawValue: text) else {
            throw PostgresError(code: .decoding, context: "unknown transaction status", underlying: text)
        }
        return status
    }

    /// Ends the server process still holding `transaction` open (`pg_terminate_backend`), and waits up to `timeout`
    /// for it to exit: the transaction then aborts, unless its commit was already under way (it completes). Only the
    /// process whose transaction it is, not another that took its process ID. Returns whether it exited in time.
    public func terminate(_ transaction: InDoubtTransaction, waiting timeout: Duration) throws -> Bool {
        let milliseconds = Int(
            timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        let rows = try query(
            """
            SELECT pg_terminate_backend(pid, \(max(milliseconds, 1))::bigint) AS terminated FROM pg_stat_activity
            WHERE pid = \(Int(transaction.backendPID))::int AND backend_xid = \(String(transaction.id))::xid8::xid
            """)
        return try rows.first?.decode(Bool.self, "terminated") ?? false
    }
}
