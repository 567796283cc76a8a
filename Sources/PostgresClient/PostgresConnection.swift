import CLibPQ
import Foundation

/// Holds the notice handler that libpq's notice callback forwards to.
final class NoticeSink {
    let handler: (@Sendable (String) -> Void)?

    init(handler: (@Sendable (String) -> Void)?) {
        self.handler = handler
    }
}

/// libpq notice processor: a nonisolated free function; `context` is an unretained `NoticeSink`.
private func postgresNoticeProcessor(_ context: UnsafeMutableRawPointer?, _ message: UnsafePointer<CChar>?) {
    guard let context, let message else { return }
    let sink = Unmanaged<NoticeSink>.fromOpaque(context).takeUnretainedValue()
    sink.handler?(String(cString: message))
}

/// Transaction isolation levels.
public enum IsolationLevel: Sendable, Hashable {
    case readCommitted
    case repeatableRead
    case serializable

    var sql: String {
        switch self {
        case .readCommitted: return "READ COMMITTED"
        case .repeatableRead: return "REPEATABLE READ"
        case .serializable: return "SERIALIZABLE"
        }
    }
}

/// Cancels what one connection is running, from any thread (libpq's `PQcancel`, which opens a connection of its own
/// to ask the server). A cancel arriving between statements cancels nothing, or the next statement.
public final class StatementCanceller: @unchecked Sendable {
    // PGcancel is documented safe to use from another thread than its connection's; it is freed once, in deinit.
    private let cancel: OpaquePointer

    init?(_ connection: OpaquePointer) {
        guard let cancel = PQgetCancel(connection) else { return nil }
        self.cancel = cancel
    }

    deinit { PQfreeCancel(cancel) }

    /// Asks the server to cancel the statement running now; false when the request could not be sent.
    @discardableResult
    public func cancelStatement() -> Bool {
        var message = [CChar](repeating: 0, count: 256)
        return PQcancel(cancel, &message, Int32(message.count)) == 1
    }
}

/// One libpq connection. Every call blocks the calling thread until the server answers.
///
/// Not thread-safe and not `Sendable`: use it from one thread at a time, normally inside a
/// `PostgresPool.withConnection` closure, which runs on a dedicated thread.
public final class PostgresConnection {
    let handle: OpaquePointer
    private let noticeSink: Unmanaged<NoticeSink>

    /// A canceller for this connection's statements, usable from any thread (nil if libpq cannot make one).
    public func canceller() -> StatementCanceller? { StatementCanceller(handle) }
    /// The last error a statement on this connection raised.
    private(set) var lastError: PostgresError?

    /// Statements with binds are prepared once per connection (by SQL text and parameter types) and then only
    /// executed: planning a complex statement can cost more than running it.
    private struct StatementKey: Hashable {
        var sql: String
        var types: [UInt32]
    }
    private var statements: [StatementKey: String] = [:]
    private var statementCounter = 0
    /// Prepared statements kept per connection; beyond it they are all deallocated and prepared afresh.
    static let statementCacheLimit = 256

    /// Size of the chunks COPY hands to `PQputCopyData`.
    static let copyChunkSize = 64 * 1024

    /// Opens a connection, blocking the calling thread (up to `connectTimeout`).
    /// Do not call this on Swift's cooperative thread pool; the pool and listener call it on their own threads.
    ///
    /// - Throws: `PostgresError` with code `.connectionFailed`.
    public init(connecting configuration: PostgresConfiguration) throws {
        let parameters = configuration.connectionParameters()
        let keys = parameters.map { strdup($0.key) }
        let values = parameters.map { strdup($0.value) }
        defer {
            for pointer in keys + values {
                free(pointer)
            }
        }
        let keyPointers: [UnsafePointer<CChar>?] = keys.map { UnsafePointer($0) } + [nil]
        let valuePointers: [UnsafePointer<CChar>?] = values.map { UnsafePointer($0) } + [nil]
        guard let handle = PQconnectdbParams(keyPointers, valuePointers, 0) else {
            throw PostgresError(code: .connectionFailed, context: "libpq could not allocate a connection")
        }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle))
            PQfinish(handle)
            throw PostgresError(
                code: .connectionFailed, context: "could not connect to \(configuration.host ?? "default host")",
                underlying: message.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        self.handle = handle
        self.noticeSink = Unmanaged.passRetained(NoticeSink(handler: configuration.noticeHandler))
        PQsetNoticeProcessor(handle, postgresNoticeProcessor, noticeSink.toOpaque())
    }

    deinit {
        PQfinish(handle)
        noticeSink.release()
    }

    /// The server process ID serving this connection (as in `pg_stat_activity.pid`).
    public var backendPID: Int32 { PQbackendPID(handle) }

    /// The server version as an integer, e.g. 150004.
    public var serverVersion: Int { Int(PQserverVersion(handle)) }

    /// True once libpq has seen the connection break. A broken connection never recovers.
    public var isBroken: Bool { PQstatus(handle) != CONNECTION_OK }

    /// True while inside a transaction block (including a failed one).
    public var isInTransaction: Bool {
        let status = PQtransactionStatus(handle)
        return status == PQTRANS_INTRANS || status == PQTRANS_INERROR
    }

    // MARK: Statements

    /// Runs a statement and returns its rows. Without binds, the text may hold several statements
    /// (the last one's result is returned).
    @discardableResult
    public func query(_ query: PostgresQuery) throws -> PostgresRows {
        let result = try run(query)
        defer { PQclear(result) }
        return Self.rows(from: result)
    }

    /// `password` as the server stores it for `user` (a SCRAM-SHA-256 verifier, or whatever `password_encryption`
    /// asks for), computed here by libpq: `ALTER ROLE … PASSWORD` can then be sent without the password itself, which
    /// the server would otherwise receive, and may log (`log_statement`, auditing, `pg_stat_statements`), in clear.
    public func encryptedPassword(_ password: String, user: String) throws -> String {
        guard let encrypted = PQencryptPasswordConn(handle, password, user, nil) else {
            throw record(connectionError(context: "could not encrypt the password"))
        }
        defer { PQfreemem(encrypted) }
        return String(cString: encrypted)
    }

    /// Runs a statement and returns the number of affected rows.
    @discardableResult
    public func execute(_ query: PostgresQuery) throws -> Int {
        let result = try run(query)
        defer { PQclear(result) }
        return Self.affectedRows(result)
    }

    /// Runs `body` between `BEGIN` and `COMMIT`; on a throw it rolls back and rethrows. No retries (the pool's
    /// `transaction` retries). If a statement failed inside `body` and `body` swallowed the error, the
    /// transaction is rolled back and that error is thrown rather than committing nothing silently.
    public func transaction<T>(
        isolation: IsolationLevel = .readCommitted, _ body: (PostgresConnection) throws -> T
    ) throws -> T {
        try execute(PostgresQuery(unsafeSQL: "BEGIN ISOLATION LEVEL \(isolation.sql)"))
        do {
            let value = try body(self)
            switch PQtransactionStatus(handle) {
            case PQTRANS_INTRANS:
                try execute("COMMIT")
            case PQTRANS_INERROR:
                throw lastError
                    ?? PostgresError(
                        code: .server, sqlState: "25P02", context: "transaction aborted by an earlier error")
            default:
                throw PostgresError(code: .unsupported, context: "the transaction body ended the transaction itself")
            }
            return value
        } catch {
            rollbackQuietly()
            throw error
        }
    }

    func rollbackQuietly() {
        guard PQstatus(handle) == CONNECTION_OK, isInTransaction, let result = PQexec(handle, "ROLLBACK") else {
            return
        }
        PQclear(result)
    }

    /// The name of `query`'s prepared statement on this connection, preparing it the first time. A full cache is
    /// emptied first (`DEALLOCATE ALL`), unless `mayReset` is false (`prepare(_:)` makes room beforehand).
    private func preparedStatement(_ query: PostgresQuery, mayReset: Bool = true) throws -> String {
        let key = StatementKey(sql: query.sql, types: query.binds.map(\.oid))
        if let name = statements[key] { return name }
        if mayReset, statements.count >= Self.statementCacheLimit { resetStatements() }
        statementCounter += 1
        let name = "marquee_\(statementCounter)"
        let result = key.types.withUnsafeBufferPointer { types in
            PQprepare(handle, name, query.sql, Int32(types.count), types.baseAddress)
        }
        guard let result else { throw record(connectionError(context: "no result from server")) }
        defer { PQclear(result) }
        guard PQresultStatus(result) == PGRES_COMMAND_OK else { throw record(error(from: result)) }
        statements[key] = name
        return name
    }

    /// Forgets a prepared statement whose cached plan the server refused after a schema change (0A000), so that
    /// the next use prepares it again.
    private func forgetStatement(_ query: PostgresQuery, after error: PostgresError) {
        guard error.sqlState == "0A000" else { return }
        let key = StatementKey(sql: query.sql, types: query.binds.map(\.oid))
        if let name = statements.removeValue(forKey: key), !isInTransaction,
            let result = PQexec(handle, "DEALLOCATE \(name)")
        {
            PQclear(result)
        }
    }

    /// Sends one statement and returns its successful result (caller clears it).
    private func run(_ query: PostgresQuery) throws -> OpaquePointer {
        let result: OpaquePointer?
        if query.binds.isEmpty {
            result = PQexec(handle, query.sql)
        } else {
            try Self.refuseNUL(query.binds)
            let name = try preparedStatement(query)
            result = Self.withBinds(query.binds) { count, _, values, lengths, formats in
                PQexecPrepared(handle, name, count, values, lengths, formats, 0)
            }
        }
        guard let result else {
            throw record(connectionError(context: "no result from server"))
        }
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            return result
        case PGRES_COPY_IN, PGRES_COPY_OUT, PGRES_COPY_BOTH:
            PQclear(result)
            abandonCopy()
            throw record(PostgresError(code: .unsupported, context: "COPY through query(); use copyFrom"))
        default:
            let error = self.error(from: result)
            PQclear(result)
            forgetStatement(query, after: error)
            throw record(error)
        }
    }

    private func record(_ error: PostgresError) -> PostgresError {
        lastError = error
        return error
    }

    private func abandonCopy() {
        _ = PQputCopyEnd(handle, "not supported by this client")
        while let result = PQgetResult(handle) {
            PQclear(result)
        }
    }

    /// Sends a notification (`pg_notify`); inside a transaction it is delivered on commit.
    public func notify(channel: String, payload: String = "") throws {
        try execute("SELECT pg_notify(\(channel), \(payload))")
    }

    // MARK: COPY

    /// Bulk-loads rows with `COPY table (columns) FROM STDIN` in text format and returns the number of rows
    /// copied. Values are escaped for COPY (backslash, tab, newline, CR; NULL as `\N`; bytea as hex) and sent in
    /// 64 KiB chunks. `table` may be schema-qualified; table and column names are quoted.
    ///
    /// - Throws: `PostgresError`; on a server-side error nothing is copied.
    public func copyFrom(table: String, columns: [String], rows: some Sequence<[PostgresBind]>) throws -> Int {
        var sql = "COPY " + PostgresIdentifier.quoteQualified(table)
        if !columns.isEmpty {
            sql += " (" + columns.map(PostgresIdentifier.quote).joined(separator: ", ") + ")"
        }
        sql += " FROM STDIN"
        guard let start = PQexec(handle, sql) else {
            throw record(connectionError(context: "no result from server"))
        }
        guard PQresultStatus(start) == PGRES_COPY_IN else {
            let error = self.error(from: start)
            PQclear(start)
            throw record(error)
        }
        PQclear(start)

        var buffer: [UInt8] = []
        buffer.reserveCapacity(Self.copyChunkSize + 4096)
        do {
            for row in rows {
                guard columns.isEmpty || row.count == columns.count else {
                    throw PostgresError(
                        code: .encoding, context: "COPY row has \(row.count) fields, expected \(columns.count)")
                }
                for (position, field) in row.enumerated() {
                    if position > 0 {
                        buffer.append(0x09)
                    }
                    try PostgresCopyText.appendField(field, to: &buffer)
                }
                buffer.append(0x0A)
                if buffer.count >= Self.copyChunkSize {
                    try sendCopyData(buffer)
                    buffer.removeAll(keepingCapacity: true)
                }
            }
            if !buffer.isEmpty {
                try sendCopyData(buffer)
            }
        } catch {
            abandonCopy()
            throw record(error as? PostgresError ?? PostgresError(code: .encoding, underlying: "\(error)"))
        }
        guard PQputCopyEnd(handle, nil) == 1 else {
            throw record(connectionError(context: "COPY end failed"))
        }
        var copied = 0
        var failure: PostgresError?
        while let result = PQgetResult(handle) {
            if PQresultStatus(result) == PGRES_COMMAND_OK {
                copied = Self.affectedRows(result)
            } else if failure == nil {
                failure = self.error(from: result)
            }
            PQclear(result)
        }
        if let failure {
            throw record(failure)
        }
        return copied
    }

    private func sendCopyData(_ buffer: [UInt8]) throws {
        let status = buffer.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                PQputCopyData(handle, chars.baseAddress, Int32(chars.count))
            }
        }
        guard status == 1 else {
            throw connectionError(context: "COPY data could not be sent")
        }
    }

    // MARK: Pipeline

    /// Sends all `queries` at once in libpq pipeline mode (one round trip) and returns one result per query.
    ///
    /// Each query is followed by its own sync point, so each runs in its own implicit transaction unless the
    /// pipeline runs inside an explicit one (`transaction`), in which case a failure makes the later queries fail
    /// with "current transaction is aborted" (25P02). COPY is not allowed in a pipeline.
    ///
    /// - Throws: only if the pipeline could not be sent at all; per-query errors are in the results.
    public func pipeline(_ queries: [PostgresQuery]) throws -> [Result<PostgresRows, PostgresError>] {
        try pipeline(queries, syncEach: true)
    }

    /// Runs `queries` in one transaction, in one round trip: `begin`, the queries and COMMIT, pipelined with a single
    /// sync point (the server answers once, not once per statement). Returns each query's rows once committed; if
    /// any statement (COMMIT included) fails, rolls back and throws the first error.
    public func pipelineTransaction(_ queries: [PostgresQuery], begin: PostgresQuery = "BEGIN") throws
        -> [PostgresRows]
    {
        try pipelineTransaction(queries, begin: begin, identified: false)
    }

    /// `pipelineTransaction`, and when `identified`, a transaction that can be asked about if its connection is lost.
    ///
    /// Its ID (`pg_current_xact_id()`, which assigns one) is read first, flushed by the server at once, and COMMIT is
    /// sent only once that answer has arrived: while the server runs `queries`, so that it costs a round trip only when
    /// they take less. A connection lost before COMMIT's answer (a server restart, a network cut,
    /// `pg_terminate_backend`) throws `connectionLost` with `inDoubt` when COMMIT had been sent (the transaction may
    /// have committed: ask `status(of:)` on another connection), and without it when it had not (nothing committed).
    public func pipelineTransaction(_ queries: [PostgresQuery], begin: PostgresQuery = "BEGIN", identified: Bool)
        throws -> [PostgresRows]
    {
        let results: [Result<PostgresRows, PostgresError>]
        var inDoubt: InDoubtTransaction?
        if identified {
            (results, inDoubt) = try identifiedPipeline(queries, begin: begin)
        } else {
            results = try pipeline([begin] + queries + ["COMMIT"], syncEach: false)
        }
        for result in results {
            if case .failure(var error) = result {
                _ = try? execute("ROLLBACK")
                if error.code == .connectionLost { error.inDoubt = inDoubt }
                throw error
            }
        }
        return results.dropFirst(identified ? 2 : 1).dropLast().map { try! $0.get() }
    }

    /// `begin`, the transaction's ID, `queries` and COMMIT, each one's result; COMMIT is sent once the ID has been read
    /// (`pipelineTransaction(_:begin:identified:)`). Also returns the transaction if COMMIT was sent.
    private func identifiedPipeline(_ queries: [PostgresQuery], begin: PostgresQuery) throws -> (
        [Result<PostgresRows, PostgresError>], InDoubtTransaction?
    ) {
        let head: [PostgresQuery] = [begin, "SELECT pg_current_xact_id()::text AS xid"]
        let body = head + queries
        let pid = backendPID  // libpq forgets it once the connection is broken
        let names = try prepare(body)
        guard PQenterPipelineMode(handle) == 1 else {
            throw record(connectionError(context: "could not enter pipeline mode"))
        }
        defer { _ = PQexitPipelineMode(handle) }
        // The server flushes its answers up to the ID at once (a flush request), before running `queries`.
        try send(body, names: names, syncEach: false, syncAtEnd: false, flushAfter: head.count - 1)
        var results = read(head.count, syncEach: false, syncAtEnd: false)
        let id = try? results[1].get().first?.decode(String.self, "xid")
        let lost = { (error: PostgresError) in
            [Result<PostgresRows, PostgresError>](repeating: .failure(error), count: queries.count + 1)
        }
        if isBroken {
            // COMMIT was not sent: the transaction can never commit.
            results += lost(connectionError(context: "connection lost during pipeline"))
            return (results, nil)
        }
        let transaction = id.flatMap(UInt64.init).map { InDoubtTransaction(id: $0, backendPID: pid) }
        do {
            try send(["COMMIT"], names: [nil], syncEach: false, syncAtEnd: true)
        } catch var error as PostgresError {
            // Some of COMMIT may have been sent, and the connection cannot serve again (its pipeline is unfinished:
            // the pool discards it). Whatever stopped the send (the connection lost, or a flush that timed out while
            // the server waited on a lock, the connection still up), the outcome is in doubt: as a plain error, the
            // caller would have written again what may have committed.
            error.code = .connectionLost
            results += lost(error)
            return (results, transaction)
        }
        results += read(queries.count + 1, syncEach: false, syncAtEnd: true)
        return (results, transaction)
    }

    /// Runs `queries` in one round trip with a single sync point after the last, and returns their rows; throws the
    /// first statement's error (the server skipped the rest). Unlike `pipelineTransaction` it neither begins nor ends
    /// a transaction: `queries` may open one (`BEGIN` first) and leave it open, or end an open one (`COMMIT` last).
    /// After a failure inside an explicit transaction, that transaction is aborted: the caller rolls it back.
    public func pipelined(_ queries: [PostgresQuery]) throws -> [PostgresRows] {
        try pipeline(queries, syncEach: false).map { try $0.get() }
    }

    /// `syncEach`: a sync point after every statement (each in its own implicit transaction unless inside an
    /// explicit one), or one after the last (after an error the server skips everything up to it: those queries
    /// answer "skipped").
    private func pipeline(_ queries: [PostgresQuery], syncEach: Bool) throws -> [Result<PostgresRows, PostgresError>] {
        guard !queries.isEmpty else { return [] }
        let names = try prepare(queries)
        guard PQenterPipelineMode(handle) == 1 else {
            throw record(connectionError(context: "could not enter pipeline mode"))
        }
        defer { _ = PQexitPipelineMode(handle) }
        try send(queries, names: names, syncEach: syncEach, syncAtEnd: true)
        return read(queries.count, syncEach: syncEach, syncAtEnd: true)
    }

    /// Forgets every prepared statement of this connection, on the server too.
    private func resetStatements() {
        if let result = PQexec(handle, "DEALLOCATE ALL") { PQclear(result) }
        statements.removeAll()
    }

    /// Each query's prepared statement, nil for one without binds. Statements are prepared before a pipeline starts
    /// (one round trip each, the first time only). Room for the new ones is made before any name is handed out: a
    /// reset between two of them (`DEALLOCATE ALL`) would drop a statement named earlier for the same pipeline, which
    /// then failed with 26000 (prepared statement does not exist).
    private func prepare(_ queries: [PostgresQuery]) throws -> [String?] {
        for query in queries { try Self.refuseNUL(query.binds) }
        let new = Set(
            queries.lazy.filter { !$0.binds.isEmpty }.map { StatementKey(sql: $0.sql, types: $0.binds.map(\.oid)) }
        ).filter { statements[$0] == nil }
        if !new.isEmpty, statements.count + new.count > Self.statementCacheLimit { resetStatements() }
        return try queries.map { $0.binds.isEmpty ? nil : try preparedStatement($0, mayReset: false) }
    }

    /// Queues `queries` in pipeline mode and sends them: a sync point after each (`syncEach`) or after the last
    /// (`syncAtEnd`), and a flush request after the query at `flushAfter` (the server sends its answers so far).
    private func send(
        _ queries: [PostgresQuery], names: [String?], syncEach: Bool, syncAtEnd: Bool, flushAfter: Int? = nil
    ) throws {
        do {
            guard PQsetnonblocking(handle, 1) == 0 else {
                throw connectionError(context: "could not switch to non-blocking mode")
            }
            defer { _ = PQsetnonblocking(handle, 0) }
            for (position, (query, name)) in zip(queries, names).enumerated() {
                let sent = Self.withBinds(query.binds) { count, types, values, lengths, formats in
                    if let name {
                        return PQsendQueryPrepared(handle, name, count, values, lengths, formats, 0)
                    }
                    return PQsendQueryParams(handle, query.sql, count, types, values, lengths, formats, 0)
                }
                let last = position == queries.count - 1
                let synced = syncEach || (syncAtEnd && last) ? PQpipelineSync(handle) == 1 : true
                let flushed = position == flushAfter ? PQsendFlushRequest(handle) == 1 : true
                guard sent == 1, synced, flushed else {
                    throw connectionError(context: "could not queue a pipelined statement")
                }
            }
            try flushAll()
        } catch {
            throw record(error as? PostgresError ?? connectionError(context: "\(error)"))
        }
    }

    /// Reads the results of `count` queries sent by `send` with the same `syncEach` and `syncAtEnd`.
    private func read(_ count: Int, syncEach: Bool, syncAtEnd: Bool) -> [Result<PostgresRows, PostgresError>] {
        var results: [Result<PostgresRows, PostgresError>] = []
        results.reserveCapacity(count)
        for position in 0..<count {
            if isBroken {
                results.append(.failure(connectionError(context: "connection lost during pipeline")))
                continue
            }
            guard let result = PQgetResult(handle) else {
                results.append(.failure(connectionError(context: "missing pipeline result")))
                continue
            }
            switch PQresultStatus(result) {
            case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
                results.append(.success(Self.rows(from: result)))
            case PGRES_PIPELINE_ABORTED:
                results.append(
                    .failure(PostgresError(code: .server, context: "skipped after an earlier pipeline error")))
            default:
                results.append(.failure(record(error(from: result))))
            }
            PQclear(result)
            if !syncEach, !(syncAtEnd && position == count - 1) {
                // Drain to the end of this query's results (NULL); the sync point comes after the last query.
                while !isBroken, let next = PQgetResult(handle) { PQclear(next) }
                continue
            }
            // Drain to this query's sync point: NULL, then PGRES_PIPELINE_SYNC.
            var emptyResults = 0
            while !isBroken {
                guard let next = PQgetResult(handle) else {
                    emptyResults += 1
                    if emptyResults > 1 {
                        break
                    }
                    continue
                }
                let isSync = PQresultStatus(next) == PGRES_PIPELINE_SYNC
                PQclear(next)
                if isSync {
                    break
                }
            }
        }
        return results
    }

    /// Flushes libpq's output buffer in non-blocking mode, reading input meanwhile so the server can never
    /// block on a full socket while we block writing to it.
    private func flushAll() throws {
        while true {
            let status = PQflush(handle)
            if status == 0 {
                return
            }
            guard status > 0 else {
                throw connectionError(context: "flush failed")
            }
            var descriptor = pollfd(fd: PQsocket(handle), events: Int16(POLLIN | POLLOUT), revents: 0)
            let ready = poll(&descriptor, 1, 30_000)
            guard ready > 0 else {
                throw connectionError(context: "socket not writable")
            }
            if descriptor.revents & Int16(POLLIN) != 0, PQconsumeInput(handle) == 0 {
                throw connectionError(context: "read failed during flush")
            }
        }
    }

    // MARK: Health

    /// What a free (no round trip) look at an idle connection found.
    enum IdleState {
        /// Nothing arrived while idle.
        case quiet
        /// Something arrived (a terminated backend's FATAL message, a notice, …); only a round trip can tell
        /// whether the connection still works, because EOF may not have been read yet.
        case hadInput
        /// libpq already knows the connection is broken.
        case broken
    }

    /// Polls the socket without blocking and reads whatever the server sent while the connection was idle.
    /// Pooled connections discard stray notifications (nobody would read them); the listener keeps them.
    func checkIdle(discardingNotifications: Bool = true) -> IdleState {
        guard PQstatus(handle) == CONNECTION_OK else { return .broken }
        var descriptor = pollfd(fd: PQsocket(handle), events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, 0) > 0 else { return .quiet }
        guard PQconsumeInput(handle) == 1 else { return .broken }
        while discardingNotifications, let notification = PQnotifies(handle) {
            PQfreemem(notification)
        }
        return PQstatus(handle) == CONNECTION_OK ? .hadInput : .broken
    }

    /// Checks an idle connection: free if nothing arrived, else (or if `force`) an empty-query round trip.
    func validate(forcePing force: Bool, discardingNotifications: Bool = true) -> Bool {
        switch checkIdle(discardingNotifications: discardingNotifications) {
        case .broken:
            return false
        case .quiet where !force:
            return true
        case .quiet, .hadInput:
            guard let result = PQexec(handle, "") else { return false }
            defer { PQclear(result) }
            return PQresultStatus(result) == PGRES_EMPTY_QUERY && PQstatus(handle) == CONNECTION_OK
        }
    }

    /// Makes the connection ready for the next user: rolls back a leftover transaction. Returns false if the
    /// connection must be discarded.
    func resetForReuse() -> Bool {
        guard PQstatus(handle) == CONNECTION_OK, PQpipelineStatus(handle) == PQ_PIPELINE_OFF else { return false }
        switch PQtransactionStatus(handle) {
        case PQTRANS_IDLE:
            return true
        case PQTRANS_INTRANS, PQTRANS_INERROR:
            rollbackQuietly()
            return PQtransactionStatus(handle) == PQTRANS_IDLE
        default:
            return false
        }
    }

    // MARK: Errors

    /// Builds an error from a failed result, classifying it as `.connectionLost` if the connection broke or the
    /// server ended the session.
    func error(from result: OpaquePointer) -> PostgresError {
        func field(_ code: Character) -> String? {
            guard let value = PQresultErrorField(result, Int32(code.asciiValue!)) else { return nil }
            return String(cString: value)
        }
        let sqlState = field("C")
        var error = PostgresError(
            code: sqlState.map(PostgresError.code(forSQLState:)) ?? .server, sqlState: sqlState)
        error.serverMessage = field("M")
        error.detail = field("D")
        error.hint = field("H")
        error.constraint = field("n")
        error.table = field("t")
        error.column = field("c")
        error.schema = field("s")
        if sqlState == nil, let message = PQresultErrorMessage(result) {
            error.underlying = String(cString: message).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        // A FATAL error ends the session (the server closes the connection after it), though libpq may not have
        // read that far yet: 57P01 from `pg_terminate_backend` or a shutdown, 25P03 idle in transaction, …
        let severity = field("V")
        if PQstatus(handle) != CONNECTION_OK || severity == "FATAL" || severity == "PANIC" {
            error.code = .connectionLost
        }
        return error
    }

    func connectionError(context: String) -> PostgresError {
        let message = String(cString: PQerrorMessage(handle)).trimmingCharacters(in: .whitespacesAndNewlines)
        let code: PostgresError.Code = PQstatus(handle) == CONNECTION_OK ? .server : .connectionLost
        return PostgresError(code: code, context: context, underlying: message.isEmpty ? nil : message)
    }

    // MARK: Result conversion

    static func affectedRows(_ result: OpaquePointer) -> Int {
        guard let text = PQcmdTuples(result) else { return 0 }
        return Int(String(cString: text)) ?? 0
    }

    static func rows(from result: OpaquePointer) -> PostgresRows {
        let rowCount = Int(PQntuples(result))
        let columnCount = Int(PQnfields(result))
        guard columnCount > 0 else {
            return PostgresRows(storage: .empty, affectedRows: affectedRows(result))
        }
        var columns: [String] = []
        var types: [UInt32] = []
        for column in 0..<Int32(columnCount) {
            columns.append(PQfname(result, column).map { String(cString: $0) } ?? "?column?")
            types.append(PQftype(result, column))
        }
        let cellCount = rowCount * columnCount
        var starts: [Int] = []
        var lengths: [Int32] = []
        starts.reserveCapacity(cellCount)
        lengths.reserveCapacity(cellCount)
        var total = 0
        for row in 0..<Int32(rowCount) {
            for column in 0..<Int32(columnCount) {
                total += Int(PQgetlength(result, row, column))
            }
        }
        var data: [UInt8] = []
        data.reserveCapacity(total)
        for row in 0..<Int32(rowCount) {
            for column in 0..<Int32(columnCount) {
                starts.append(data.count)
                if PQgetisnull(result, row, column) == 1 {
                    lengths.append(-1)
                    continue
                }
                let length = PQgetlength(result, row, column)
                lengths.append(length)
                if length > 0, let value = PQgetvalue(result, row, column) {
                    data.append(contentsOf: UnsafeRawBufferPointer(start: value, count: Int(length)))
                }
            }
        }
        let storage = PostgresResultStorage(
            columns: columns, columnTypes: types, rowCount: rowCount, data: data, starts: starts, lengths: lengths)
        return PostgresRows(storage: storage, affectedRows: affectedRows(result))
    }

    /// Refuses a text-format parameter holding a NUL byte before anything is sent: libpq sends a text parameter as
    /// a C string, so it would be cut at the NUL (another value, or a malformed array literal) rather than refused.
    /// Thrown like any failed statement (`encoding`), so the caller's transaction rolls back as for a server error.
    static func refuseNUL(_ binds: [PostgresBind]) throws {
        for (position, bind) in binds.enumerated() where !bind.binary && bind.bytes.map(Self.holdsNUL) == true {
            throw PostgresError(
                code: .encoding, context: "parameter $\(position + 1) holds a NUL byte, which text format cannot carry")
        }
    }

    /// Whether `bytes` holds a zero byte (`memchr`: a batch's arrays are tens of kilobytes).
    static func holdsNUL(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { $0.isEmpty ? false : memchr($0.baseAddress!, 0, $0.count) != nil }
    }

    /// Lays out binds as the parallel C arrays `PQexecParams` wants, valid for the duration of `body`.
    static func withBinds<R>(
        _ binds: [PostgresBind],
        _ body: (
            Int32, UnsafePointer<Oid>?, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?,
            UnsafePointer<Int32>?
        ) -> R
    ) -> R {
        let total = binds.reduce(0) { $0 + ($1.bytes?.count ?? 0) + 1 }
        let storage = UnsafeMutablePointer<CChar>.allocate(capacity: max(total, 1))
        defer { storage.deallocate() }
        var types: [Oid] = []
        var values: [UnsafePointer<CChar>?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        types.reserveCapacity(binds.count)
        values.reserveCapacity(binds.count)
        lengths.reserveCapacity(binds.count)
        formats.reserveCapacity(binds.count)
        var offset = 0
        for bind in binds {
            types.append(bind.oid)
            formats.append(bind.binary ? 1 : 0)
            guard let bytes = bind.bytes else {
                values.append(nil)
                lengths.append(0)
                continue
            }
            let destination = storage + offset
            bytes.withUnsafeBytes { source in
                if let base = source.baseAddress, source.count > 0 {
                    UnsafeMutableRawPointer(destination).copyMemory(from: base, byteCount: source.count)
                }
            }
            destination[bytes.count] = 0
            values.append(UnsafePointer(destination))
            lengths.append(Int32(bytes.count))
            offset += bytes.count + 1
        }
        return types.withUnsafeBufferPointer { typePointer in
            values.withUnsafeBufferPointer { valuePointer in
                lengths.withUnsafeBufferPointer { lengthPointer in
                    formats.withUnsafeBufferPointer { formatPointer in
                        body(
                            Int32(binds.count), typePointer.baseAddress, valuePointer.baseAddress,
                            lengthPointer.baseAddress, formatPointer.baseAddress)
                    }
                }
            }
        }
    }
}
