/// The immutable, shared storage of one result: all cell bytes in one buffer.
final class PostgresResultStorage: Sendable {
    let columns: [String]
    let columnTypes: [UInt32]
    let columnIndex: [String: Int]
    let rowCount: Int
    /// All non-NULL cell bytes, row-major.
    let data: [UInt8]
    /// Start offset of each cell in `data`, row-major.
    let starts: [Int]
    /// Length of each cell, or -1 for NULL.
    let lengths: [Int32]

    init(columns: [String], columnTypes: [UInt32], rowCount: Int, data: [UInt8], starts: [Int], lengths: [Int32]) {
        self.columns = columns
        self.columnTypes = columnTypes
        var index: [String: Int] = [:]
        for (position, name) in columns.enumerated() where index[name] == nil {
            index[name] = position
        }
        self.columnIndex = index
        self.rowCount = rowCount
        self.data = data
        self.starts = starts
        self.lengths = lengths
    }

    static let empty = PostgresResultStorage(
        columns: [], columnTypes: [], rowCount: 0, data: [], starts: [], lengths: [])

    func cell(row: Int, column: Int) -> PostgresCell {
        let slot = row * columns.count + column
        let length = lengths[slot]
        let bytes: ArraySlice<UInt8>? = length < 0 ? nil : data[starts[slot]..<(starts[slot] + Int(length))]
        return PostgresCell(bytes: bytes, typeOID: columnTypes[column], columnName: columns[column])
    }
}

/// The rows of one result, plus the command's affected-row count.
public struct PostgresRows: Sendable, RandomAccessCollection {
    let storage: PostgresResultStorage

    /// Result column names, in order.
    public var columns: [String]
    /// Rows affected (INSERT/UPDATE/DELETE/COPY) or returned (SELECT), from `PQcmdTuples`; 0 if not reported.
    public var affectedRows: Int

    init(storage: PostgresResultStorage, affectedRows: Int) {
        self.storage = storage
        self.columns = storage.columns
        self.affectedRows = affectedRows
    }

    /// The type OID of each result column.
    public var columnTypeOIDs: [UInt32] { storage.columnTypes }

    public var startIndex: Int { 0 }
    public var endIndex: Int { storage.rowCount }

    public subscript(position: Int) -> PostgresRow {
        precondition(position >= 0 && position < storage.rowCount, "row index out of range")
        return PostgresRow(storage: storage, row: position)
    }
}

/// One result row. Cells are looked up by column name (first match) or position.
public struct PostgresRow: Sendable {
    let storage: PostgresResultStorage
    let row: Int

    /// Result column names, in order.
    public var columns: [String] { storage.columns }

    /// The cell of the named column. A missing column yields a cell whose `decode` throws.
    public subscript(column: String) -> PostgresCell {
        guard let index = storage.columnIndex[column] else {
            return PostgresCell(missingColumn: column)
        }
        return storage.cell(row: row, column: index)
    }

    /// The cell at a column position. An out-of-range position yields a cell whose `decode` throws.
    public subscript(index: Int) -> PostgresCell {
        guard index >= 0 && index < storage.columns.count else {
            return PostgresCell(missingColumn: "#\(index)")
        }
        return storage.cell(row: row, column: index)
    }

    /// Decodes the named column.
    public func decode<T: PostgresDecodable>(_ type: T.Type, _ column: String) throws -> T {
        try self[column].decode(type)
    }

    /// Decodes the column at `index`.
    public func decode<T: PostgresDecodable>(_ type: T.Type, at index: Int) throws -> T {
        try self[index].decode(type)
    }
}

/// One cell of a result row in text format.
public struct PostgresCell: Sendable {
    /// The text-format bytes; `nil` for SQL NULL.
    public let bytes: ArraySlice<UInt8>?
    /// The column's type OID.
    public let typeOID: UInt32
    /// The column's name.
    public let columnName: String
    let exists: Bool

    /// Creates a cell; decoders of composite types use this to decode elements.
    public init(bytes: ArraySlice<UInt8>?, typeOID: UInt32, columnName: String) {
        self.bytes = bytes
        self.typeOID = typeOID
        self.columnName = columnName
        self.exists = true
    }

    init(missingColumn: String) {
        self.bytes = nil
        self.typeOID = 0
        self.columnName = missingColumn
        self.exists = false
    }

    /// True for SQL NULL.
    public var isNull: Bool { bytes == nil }

    /// The text of the cell, or nil for NULL.
    public var string: String? { bytes.map { String(decoding: $0, as: UTF8.self) } }

    /// Decodes the cell. Throws `.decoding` for NULL into a non-Optional type, malformed text, or a
    /// column that does not exist.
    public func decode<T: PostgresDecodable>(_ type: T.Type = T.self) throws -> T {
        guard exists else {
            var error = PostgresError(code: .decoding, context: "no such column")
            error.column = columnName
            throw error
        }
        return try T.decodePostgres(from: self)
    }

    /// The bytes, or a `.decoding` error for NULL.
    public func requireBytes() throws -> ArraySlice<UInt8> {
        guard let bytes else {
            throw decodingError("unexpected NULL", raw: nil)
        }
        return bytes
    }

    /// A `.decoding` error for this cell. `raw` appears only in `debugDescription`.
    public func decodingError(_ reason: String, raw: ArraySlice<UInt8>?) -> PostgresError {
        var error = PostgresError(
            code: .decoding, context: reason,
            underlying: raw.map { "value: " + String(decoding: $0.prefix(200), as: UTF8.self) })
        error.column = columnName
        return error
    }
}
