import Foundation

/// A Swift type that can be decoded from a text-format result cell.
public protocol PostgresDecodable: Sendable {
    /// Decodes from `cell`; `cell.bytes` is nil for SQL NULL.
    static func decodePostgres(from cell: PostgresCell) throws -> Self
}

extension Optional: PostgresDecodable where Wrapped: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Wrapped? {
        if cell.isNull {
            return nil
        }
        return try Wrapped.decodePostgres(from: cell)
    }
}

extension String: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> String {
        String(decoding: try cell.requireBytes(), as: UTF8.self)
    }
}

extension Int64: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Int64 {
        let bytes = try cell.requireBytes()
        guard let value = PostgresNumberText.parseInteger(bytes) else {
            throw cell.decodingError("not an integer in range", raw: bytes)
        }
        return value
    }
}

extension Int: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Int {
        Int(try Int64.decodePostgres(from: cell))
    }
}

extension Int32: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Int32 {
        let wide = try Int64.decodePostgres(from: cell)
        guard let value = Int32(exactly: wide) else {
            throw cell.decodingError("integer out of range for Int32", raw: cell.bytes)
        }
        return value
    }
}

extension Int16: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Int16 {
        let wide = try Int64.decodePostgres(from: cell)
        guard let value = Int16(exactly: wide) else {
            throw cell.decodingError("integer out of range for Int16", raw: cell.bytes)
        }
        return value
    }
}

extension Bool: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Bool {
        let bytes = try cell.requireBytes()
        switch String(decoding: bytes, as: UTF8.self).lowercased() {
        case "t", "true", "1", "yes", "on": return true
        case "f", "false", "0", "no", "off": return false
        default: throw cell.decodingError("not a boolean", raw: bytes)
        }
    }
}

extension Double: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Double {
        let bytes = try cell.requireBytes()
        guard let value = Double(String(decoding: bytes, as: UTF8.self)) else {
            throw cell.decodingError("not a floating-point number", raw: bytes)
        }
        return value
    }
}

extension Float: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Float {
        let bytes = try cell.requireBytes()
        guard let value = Float(String(decoding: bytes, as: UTF8.self)) else {
            throw cell.decodingError("not a floating-point number", raw: bytes)
        }
        return value
    }
}

extension UUID: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> UUID {
        let bytes = try cell.requireBytes()
        guard let value = PostgresUUIDText.parse(bytes) else {
            throw cell.decodingError("not a UUID", raw: bytes)
        }
        return value
    }
}

extension Date: PostgresDecodable {
    /// Decodes `timestamptz`, `timestamp` (taken as UTC) or `date` text output in ISO style, with or without
    /// fractional seconds and UTC offsets (`+00`, `+05:30`, `-03:00:15`), years beyond 9999, `BC`,
    /// and `infinity`/`-infinity` (as `distantFuture`/`distantPast`).
    public static func decodePostgres(from cell: PostgresCell) throws -> Date {
        let bytes = try cell.requireBytes()
        guard let value = PostgresTimestamp.parse(bytes) else {
            throw cell.decodingError("not a timestamp", raw: bytes)
        }
        return value
    }
}

extension Data: PostgresDecodable {
    public static func decodePostgres(from cell: PostgresCell) throws -> Data {
        Data(try UInt8.decodePostgresArray(from: cell))
    }
}

extension Array: PostgresDecodable where Element: PostgresArrayElement {
    public static func decodePostgres(from cell: PostgresCell) throws -> [Element] {
        try Element.decodePostgresArray(from: cell)
    }
}

enum PostgresNumberText {
    /// Parses an optionally signed decimal integer that fits in Int64.
    static func parseInteger(_ bytes: ArraySlice<UInt8>) -> Int64? {
        var index = bytes.startIndex
        guard index < bytes.endIndex else { return nil }
        var negative = false
        if bytes[index] == UInt8(ascii: "-") || bytes[index] == UInt8(ascii: "+") {
            negative = bytes[index] == UInt8(ascii: "-")
            index += 1
        }
        guard index < bytes.endIndex else { return nil }
        var value: Int64 = 0
        while index < bytes.endIndex {
            let digit = bytes[index] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (next, overflow2) =
                negative
                ? shifted.subtractingReportingOverflow(Int64(digit)) : shifted.addingReportingOverflow(Int64(digit))
            guard !overflow1, !overflow2 else { return nil }
            value = next
            index += 1
        }
        return value
    }
}
