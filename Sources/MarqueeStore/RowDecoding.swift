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
