/// SQL text plus bind parameters. String interpolation turns values into `$n` parameters, so values can
/// never change the statement's structure:
///
/// ```swift
/// let query: PostgresQuery = "SELECT * FROM people WHERE tenant_id = \(tenantID) AND email = \(email)"
/// // sql: "SELECT * FROM people WHERE tenant_id = $1 AND email = $2"
/// ```
///
/// Raw text is only spliced through the explicit `\(unsafeRaw:)` interpolation or `init(unsafeSQL:)`.
/// A query without binds is sent with the simple protocol, so it may contain several statements.
public struct PostgresQuery: Sendable, ExpressibleByStringInterpolation, CustomStringConvertible {
    /// The SQL text, with `$1…$n` placeholders.
    public var sql: String
    /// The parameters, in placeholder order.
    public var binds: [PostgresBind]

    /// A query from raw SQL and explicit binds. The caller is responsible for `sql` being trusted text.
    public init(unsafeSQL: String, binds: [PostgresBind] = []) {
        self.sql = unsafeSQL
        self.binds = binds
    }

    /// A literal without interpolations (compile-time text, hence trusted).
    public init(stringLiteral value: String) {
        self.sql = value
        self.binds = []
    }

    public init(stringInterpolation: StringInterpolation) {
        self.sql = stringInterpolation.sql
        self.binds = stringInterpolation.binds
    }

    /// The SQL text and the number of binds; never the bound values.
    public var description: String {
        "\(sql) [\(binds.count) bind\(binds.count == 1 ? "" : "s")]"
    }

    /// Builds a `PostgresQuery` from a string interpolation.
    public struct StringInterpolation: StringInterpolationProtocol {
        var sql: String
        var binds: [PostgresBind]

        public init(literalCapacity: Int, interpolationCount: Int) {
            sql = ""
            sql.reserveCapacity(literalCapacity + interpolationCount * 3)
            binds = []
            binds.reserveCapacity(interpolationCount)
        }

        public mutating func appendLiteral(_ literal: String) {
            sql += literal
        }

        /// `\(value)`: a bind parameter.
        public mutating func appendInterpolation(_ value: some PostgresEncodable) {
            binds.append(value.encodePostgres())
            sql += "$\(binds.count)"
        }

        /// `\(optional)`: a bind parameter; `nil` binds SQL NULL of the wrapped type.
        public mutating func appendInterpolation<Value: PostgresEncodable>(_ value: Value?) {
            binds.append(value.encodePostgres())
            sql += "$\(binds.count)"
        }

        /// `\(unsafeRaw: text)`: spliced verbatim. Only for text the program controls (never user input).
        public mutating func appendInterpolation(unsafeRaw text: String) {
            sql += text
        }

        /// `\(identifier: name)`: a double-quoted identifier; dots separate schema and name.
        public mutating func appendInterpolation(identifier name: String) {
            sql += PostgresIdentifier.quoteQualified(name)
        }

        /// `\(list: values)`: `$1, $2, …`, e.g. for `IN (…)`. An empty list becomes `NULL`, which matches
        /// nothing in `IN (…)`. Prefer `= ANY(\(array))` for long lists.
        public mutating func appendInterpolation(list values: [some PostgresEncodable]) {
            guard !values.isEmpty else {
                sql += "NULL"
                return
            }
            for (position, value) in values.enumerated() {
                if position > 0 {
                    sql += ", "
                }
                appendInterpolation(value)
            }
        }
    }
}
