/// An error raised by the server, by libpq, by the pool or while decoding a value.
///
/// `description` is safe to log: it names the error class, the SQLSTATE and the schema objects involved,
/// never SQL text, parameter values or the server's message (which may echo values). Everything else is in
/// `debugDescription`.
public struct PostgresError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What went wrong, in a form callers can switch on. New codes may be added over time.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A stable, human-readable name, e.g. `unique violation`.
        public let name: String

        init(_ name: String) {
            self.name = name
        }

        public var description: String { name }

        /// SQLSTATE 23505.
        public static let uniqueViolation = Code("unique violation")
        /// SQLSTATE 23503.
        public static let foreignKeyViolation = Code("foreign key violation")
        /// SQLSTATE 23514.
        public static let checkViolation = Code("check violation")
        /// SQLSTATE 23502.
        public static let notNullViolation = Code("not null violation")
        /// SQLSTATE 40001; safe to retry the whole transaction.
        public static let serializationFailure = Code("serialization failure")
        /// SQLSTATE 40P01; safe to retry the whole transaction.
        public static let deadlockDetected = Code("deadlock detected")
        /// SQLSTATE 22P02.
        public static let invalidTextRepresentation = Code("invalid text representation")
        /// SQLSTATE 57014: statement timeout or cancel request.
        public static let queryCanceled = Code("query canceled")
        /// SQLSTATE 42P01.
        public static let undefinedTable = Code("undefined table")
        /// SQLSTATE 42601.
        public static let syntaxError = Code("syntax error")
        /// The connection broke while a statement was running, or the server ended the session (an error of severity
        /// FATAL, e.g. 57P01 from `pg_terminate_backend` or a shutdown). The statement may or may not have been applied;
        /// after a COMMIT, `inDoubt` says which transaction to ask about, when known.
        public static let connectionLost = Code("connection lost")
        /// A new connection could not be established.
        public static let connectionFailed = Code("connection failed")
        /// No pooled connection became free within the acquire timeout.
        public static let poolTimeout = Code("pool timeout")
        /// The pool has been closed.
        public static let poolClosed = Code("pool closed")
        /// A result value could not be decoded into the requested Swift type.
        public static let decoding = Code("decoding")
        /// A Swift value could not be encoded for PostgreSQL (e.g. a JSON encoding failure).
        public static let encoding = Code("encoding")
        /// The connection string or another setting is invalid.
        public static let invalidConfiguration = Code("invalid configuration")
        /// The library was used in a way it does not support (e.g. COPY through `query`).
        public static let unsupported = Code("unsupported")
        /// Any other server error; see `sqlState`.
        public static let server = Code("server error")
    }

    /// The error class.
    public var code: Code
    /// The five-character SQLSTATE reported by the server, e.g. `"23505"`.
    public var sqlState: String?
    /// The constraint involved (`PG_DIAG_CONSTRAINT_NAME`), if any.
    public var constraint: String?
    /// The column involved (`PG_DIAG_COLUMN_NAME`), or the result column that failed to decode.
    public var column: String?
    /// The table involved (`PG_DIAG_TABLE_NAME`), if any.
    public var table: String?
    /// The schema involved (`PG_DIAG_SCHEMA_NAME`), if any.
    public var schema: String?
    /// The server's primary message. May contain values; only shown in `debugDescription`.
    public var serverMessage: String?
    /// The server's DETAIL field. May contain values; only shown in `debugDescription`.
    public var detail: String?
    /// The server's HINT field; only shown in `debugDescription`.
    public var hint: String?
    /// Client-side diagnostics (libpq messages, offending text). Only shown in `debugDescription`.
    public var underlying: String?
    /// A short, value-free explanation added by this library, e.g. "unexpected NULL". Part of `description`.
    public var context: String?
    /// With `connectionLost`: the transaction whose COMMIT was sent before the connection was lost, so that it may have
    /// committed (`PostgresConnection.pipelineTransaction(_:begin:identified:)`); nil when no COMMIT was in flight.
    public var inDoubt: InDoubtTransaction?

    /// Creates an error; mostly used by this module, public so callers and tests can build expected values.
    public init(
        code: Code, sqlState: String? = nil, context: String? = nil, underlying: String? = nil
    ) {
        self.code = code
        self.sqlState = sqlState
        self.context = context
        self.underlying = underlying
    }

    /// True for errors after which re-running the whole transaction may succeed (40001, 40P01).
    public var isTransactionRetryable: Bool {
        code == .serializationFailure || code == .deadlockDetected
    }

    public var description: String {
        var text = "PostgresError: \(code.name)"
        if let sqlState {
            text += " (\(sqlState))"
        }
        if let constraint {
            text += " on constraint \(constraint)"
        }
        if let table {
            text += " in table \(table)"
        }
        if let column {
            text += " column \(column)"
        }
        if let context {
            text += ": \(context)"
        }
        if let inDoubt {
            text += " (COMMIT in flight: transaction \(inDoubt.id), backend \(inDoubt.backendPID))"
        }
        return text
    }

    public var debugDescription: String {
        var text = description
        if let serverMessage {
            text += "; message: \(serverMessage)"
        }
        if let detail {
            text += "; detail: \(detail)"
        }
        if let hint {
            text += "; hint: \(hint)"
        }
        if let underlying {
            text += "; underlying: \(underlying)"
        }
        return text
    }

    /// Maps a SQLSTATE to the closest `Code`.
    public static func code(forSQLState state: String) -> Code {
        switch state {
        case "23505": return .uniqueViolation
        case "23503": return .foreignKeyViolation
        case "23514": return .checkViolation
        case "23502": return .notNullViolation
        case "40001": return .serializationFailure
        case "40P01": return .deadlockDetected
        case "22P02": return .invalidTextRepresentation
        case "57014": return .queryCanceled
        case "42P01": return .undefinedTable
        case "42601": return .syntaxError
        default:
            if state.hasPrefix("08") {
                return .connectionLost
            }
            return .server
        }
    }
}
