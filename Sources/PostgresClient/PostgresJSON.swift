import Foundation

/// A JSON document, bound as `jsonb` and decoded from `json`/`jsonb` columns as raw UTF-8 bytes.
public struct PostgresJSON: Sendable, Hashable, PostgresEncodable, PostgresDecodable {
    /// The document's UTF-8 bytes, as given or as returned by the server (normalised by `jsonb`).
    public var bytes: [UInt8]

    /// Wraps raw JSON bytes. They are not validated here; the server rejects malformed JSON.
    public init(bytes: [UInt8]) {
        self.bytes = bytes
    }

    /// Wraps a JSON text.
    public init(_ text: String) {
        self.bytes = Array(text.utf8)
    }

    /// Encodes a value with `JSONEncoder`.
    ///
    /// - Throws: `PostgresError` with code `.encoding`.
    public init(encoding value: some Encodable, encoder: JSONEncoder = JSONEncoder()) throws {
        do {
            self.bytes = Array(try encoder.encode(value))
        } catch {
            throw PostgresError(code: .encoding, context: "JSON encoding failed", underlying: "\(error)")
        }
    }

    /// The document as a string.
    public var string: String { String(decoding: bytes, as: UTF8.self) }

    /// Decodes the document with `JSONDecoder`.
    ///
    /// - Throws: `PostgresError` with code `.decoding`.
    public func decode<T: Decodable>(as type: T.Type, decoder: JSONDecoder = JSONDecoder()) throws -> T {
        do {
            return try decoder.decode(type, from: Data(bytes))
        } catch {
            throw PostgresError(code: .decoding, context: "JSON decoding failed", underlying: "\(error)")
        }
    }

    public static var postgresTypeOID: UInt32 { PostgresOID.jsonb }

    public func encodePostgres() -> PostgresBind {
        PostgresBind(bytes: bytes, oid: PostgresOID.jsonb)
    }

    public static func decodePostgres(from cell: PostgresCell) throws -> PostgresJSON {
        PostgresJSON(bytes: Array(try cell.requireBytes()))
    }
}

extension PostgresRow {
    /// Decodes a `json`/`jsonb` column into a `Decodable` type.
    public func decodeJSON<T: Decodable>(
        _ type: T.Type, _ column: String, decoder: JSONDecoder = JSONDecoder()
    ) throws -> T {
        try decode(PostgresJSON.self, column).decode(as: type, decoder: decoder)
    }
}
