import PostgresClient

extension PostgresRow {
    /// A text column holding one of `T`'s raw values. Any other value (a row written by a newer version, a
    /// constraint gone missing) is a decoding error, never a silent default.
    func decodeRaw<T: RawRepresentable>(_ type: T.Type, _ column: String) throws -> T where T.RawValue == String {
        let text = try decode(String.self, column)
        guard let value = T(rawValue: text) else {
            throw PostgresError(code: .decoding, context: "unknown value of \(column): \(text)")
        }
        return value
    }

    /// ``decodeRaw(_:_:)`` for a nullable column: NULL is nil, any other unknown value a decoding error.
    func decodeRaw<T: RawRepresentable>(_ type: T?.Type, _ column: String) throws -> T? where T.RawValue == String {
        guard let text = try decode(String?.self, column) else { return nil }
        guard let value = T(rawValue: text) else {
            throw PostgresError(code: .decoding, context: "unknown value of \(column): \(text)")
        }
        return value
    }
}

/// Decodes cells whose text repeats from row to row (a batch's shared content state, options or type) once per
/// distinct text: the last few texts and their values are kept, and a cell equal to one of them byte for byte gets
/// its value without being parsed again.
struct RepeatedTexts<Value> {
    private var recent: [(text: ArraySlice<UInt8>?, value: Value)] = []
    private static var kept: Int { 4 }

    mutating func value(of cell: PostgresCell, _ decode: (PostgresCell) throws -> Value) throws -> Value {
        if let hit = recent.first(where: { $0.text == cell.bytes }) { return hit.value }
        let value = try decode(cell)
        if recent.count == Self.kept { recent.removeFirst() }
        recent.append((cell.bytes, value))
        return value
    }
}
