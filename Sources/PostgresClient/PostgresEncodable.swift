import Foundation

/// Well-known PostgreSQL type OIDs (from `pg_type`).
public enum PostgresOID {
    /// Let the server infer the type from context.
    public static let unspecified: UInt32 = 0
    public static let bool: UInt32 = 16
    public static let bytea: UInt32 = 17
    public static let int8: UInt32 = 20
    public static let int2: UInt32 = 21
    public static let int4: UInt32 = 23
    public static let text: UInt32 = 25
    public static let json: UInt32 = 114
    public static let float4: UInt32 = 700
    public static let float8: UInt32 = 701
    public static let varchar: UInt32 = 1043
    public static let date: UInt32 = 1082
    public static let timestamp: UInt32 = 1114
    public static let timestamptz: UInt32 = 1184
    public static let numeric: UInt32 = 1700
    public static let uuid: UInt32 = 2950
    public static let jsonb: UInt32 = 3802
    public static let boolArray: UInt32 = 1000
    public static let byteaArray: UInt32 = 1001
    public static let int2Array: UInt32 = 1005
    public static let int4Array: UInt32 = 1007
    public static let textArray: UInt32 = 1009
    public static let int8Array: UInt32 = 1016
    public static let float4Array: UInt32 = 1021
    public static let float8Array: UInt32 = 1022
    public static let timestamptzArray: UInt32 = 1185
    public static let uuidArray: UInt32 = 2951
    public static let jsonbArray: UInt32 = 3807
}

/// One bound parameter (`$n`): its bytes (nil for SQL NULL), its type OID and whether the bytes are in
/// PostgreSQL's binary format (only used for `bytea`) rather than text format.
public struct PostgresBind: Sendable, Hashable {
    /// The encoded value; `nil` is SQL NULL.
    public var bytes: [UInt8]?
    /// The parameter's type OID; `0` lets the server infer it.
    public var oid: UInt32
    /// True if `bytes` are in binary format.
    public var binary: Bool

    /// Creates a bind from raw bytes.
    public init(bytes: [UInt8]?, oid: UInt32, binary: Bool = false) {
        self.bytes = bytes
        self.oid = oid
        self.binary = binary
    }

    /// Creates a text-format bind.
    public init(text: String, oid: UInt32 = PostgresOID.text) {
        self.init(bytes: Array(text.utf8), oid: oid)
    }

    /// SQL NULL of the given type.
    public static func null(oid: UInt32 = PostgresOID.unspecified) -> PostgresBind {
        PostgresBind(bytes: nil, oid: oid)
    }

    /// True if this is SQL NULL.
    public var isNull: Bool { bytes == nil }
}

/// A value that can be bound as a query parameter or written by COPY.
public protocol PostgresEncodable: Sendable {
    /// The type OID used for NULLs of this type (e.g. in `Optional<Self>.none`). Default: unspecified.
    static var postgresTypeOID: UInt32 { get }
    /// Encodes the value.
    func encodePostgres() -> PostgresBind
}

extension PostgresEncodable {
    /// Default: let the server infer the type of NULLs.
    public static var postgresTypeOID: UInt32 { PostgresOID.unspecified }
}

extension PostgresBind: PostgresEncodable {
    public func encodePostgres() -> PostgresBind { self }
}

extension Optional: PostgresEncodable where Wrapped: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { Wrapped.postgresTypeOID }

    public func encodePostgres() -> PostgresBind {
        switch self {
        case .some(let wrapped): return wrapped.encodePostgres()
        case .none: return .null(oid: Wrapped.postgresTypeOID)
        }
    }
}

extension String: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.text }
    public func encodePostgres() -> PostgresBind { PostgresBind(bytes: Array(utf8), oid: PostgresOID.text) }
}

extension Substring: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.text }
    public func encodePostgres() -> PostgresBind { PostgresBind(bytes: Array(utf8), oid: PostgresOID.text) }
}

extension Int: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.int8 }
    public func encodePostgres() -> PostgresBind { PostgresBind(text: String(self), oid: PostgresOID.int8) }
}

extension Int64: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.int8 }
    public func encodePostgres() -> PostgresBind { PostgresBind(text: String(self), oid: PostgresOID.int8) }
}

extension Int32: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.int4 }
    public func encodePostgres() -> PostgresBind { PostgresBind(text: String(self), oid: PostgresOID.int4) }
}

extension Int16: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.int2 }
    public func encodePostgres() -> PostgresBind { PostgresBind(text: String(self), oid: PostgresOID.int2) }
}

extension Bool: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.bool }
    public func encodePostgres() -> PostgresBind {
        PostgresBind(bytes: self ? [UInt8(ascii: "t")] : [UInt8(ascii: "f")], oid: PostgresOID.bool)
    }
}

extension Double: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.float8 }
    public func encodePostgres() -> PostgresBind {
        PostgresBind(text: PostgresText.float(self), oid: PostgresOID.float8)
    }
}

extension Float: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.float4 }
    public func encodePostgres() -> PostgresBind {
        let text: String
        if isNaN {
            text = "NaN"
        } else if isInfinite {
            text = self < 0 ? "-Infinity" : "Infinity"
        } else {
            text = String(self)
        }
        return PostgresBind(text: text, oid: PostgresOID.float4)
    }
}

extension UUID: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.uuid }
    public func encodePostgres() -> PostgresBind {
        PostgresBind(text: PostgresUUIDText.format(self), oid: PostgresOID.uuid)
    }
}

extension Date: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.timestamptz }
    public func encodePostgres() -> PostgresBind {
        PostgresBind(text: PostgresTimestamp.format(self), oid: PostgresOID.timestamptz)
    }
}

extension Data: PostgresEncodable {
    public static var postgresTypeOID: UInt32 { PostgresOID.bytea }
    public func encodePostgres() -> PostgresBind {
        PostgresBind(bytes: Array(self), oid: PostgresOID.bytea, binary: true)
    }
}

/// An element type usable in PostgreSQL arrays (`[String]` as `text[]`, `[Int]` as `int8[]`, …).
///
/// `[UInt8]` is special: it is `bytea`, not an array of bytes.
public protocol PostgresArrayElement: Sendable {
    /// Encodes a Swift array of this element type.
    static func encodePostgresArray(_ elements: [Self]) -> PostgresBind
    /// Decodes a Swift array of this element type.
    static func decodePostgresArray(from cell: PostgresCell) throws -> [Self]
}

/// Element types whose array form is PostgreSQL's `{…}` text literal of their own text encodings.
public protocol PostgresTextArrayElement: PostgresArrayElement, PostgresEncodable, PostgresDecodable {
    /// The OID of the array type, e.g. 1009 for `text[]`.
    static var postgresArrayTypeOID: UInt32 { get }
}

extension PostgresTextArrayElement {
    public static func encodePostgresArray(_ elements: [Self]) -> PostgresBind {
        PostgresBind(
            bytes: PostgresArrayText.literal(elements.map { $0.encodePostgres().bytes }),
            oid: postgresArrayTypeOID)
    }

    public static func decodePostgresArray(from cell: PostgresCell) throws -> [Self] {
        let bytes = try cell.requireBytes()
        let elements: [[UInt8]?]
        do {
            elements = try PostgresArrayText.parse(bytes)
        } catch {
            throw cell.decodingError("malformed array literal", raw: bytes)
        }
        return try elements.map { element in
            try Self.decodePostgres(
                from: PostgresCell(
                    bytes: element.map { ArraySlice($0) }, typeOID: PostgresOID.unspecified,
                    columnName: cell.columnName))
        }
    }
}

extension String: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.textArray }
}
extension Int: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.int8Array }
}
extension Int64: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.int8Array }
}
extension Int32: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.int4Array }
}
extension Int16: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.int2Array }
}
extension Bool: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.boolArray }
}
extension Double: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.float8Array }
}
extension UUID: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.uuidArray }
}
extension Date: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { PostgresOID.timestamptzArray }
}
extension Optional: PostgresArrayElement where Wrapped: PostgresTextArrayElement {}
extension Optional: PostgresTextArrayElement where Wrapped: PostgresTextArrayElement {
    public static var postgresArrayTypeOID: UInt32 { Wrapped.postgresArrayTypeOID }
}

extension UInt8: PostgresArrayElement {
    /// `[UInt8]` binds as `bytea` (binary format).
    public static func encodePostgresArray(_ elements: [UInt8]) -> PostgresBind {
        PostgresBind(bytes: elements, oid: PostgresOID.bytea, binary: true)
    }

    /// `[UInt8]` decodes from `bytea` text output (hex or escape format).
    public static func decodePostgresArray(from cell: PostgresCell) throws -> [UInt8] {
        let bytes = try cell.requireBytes()
        guard let decoded = PostgresByteaText.decode(bytes) else {
            throw cell.decodingError("malformed bytea", raw: bytes)
        }
        return decoded
    }
}

extension Array: PostgresEncodable where Element: PostgresArrayElement {
    public func encodePostgres() -> PostgresBind { Element.encodePostgresArray(self) }
}

/// Text-format helpers shared by encoders.
enum PostgresText {
    static func float(_ value: Double) -> String {
        if value.isNaN {
            return "NaN"
        }
        if value.isInfinite {
            return value < 0 ? "-Infinity" : "Infinity"
        }
        return String(value)
    }
}
