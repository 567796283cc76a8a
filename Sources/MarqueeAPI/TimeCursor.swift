import Crypto
import Foundation
import MarqueeCore

/// The opaque cursor of lists ordered by (time, id), newest first: base64url of `<microseconds>|<id>`. The one home
/// of its format, for the instance and campaign lists.
enum TimeCursor {
    /// The cursor for the page after `(time, id)`.
    static func encode(_ time: Date, _ id: String) -> JSONValue {
        let micros = Int64((time.timeIntervalSince1970 * 1e6).rounded())
        return .string(Base64URL.encode(Array("\(micros)|\(id)".utf8)))
    }

    /// The `(time, id)` a cursor names; nil without one; 422 for `cursor` when it is not one this API returned.
    static func decode(_ cursor: String?) throws(ValidationError) -> (Date, String)? {
        guard let cursor else { return nil }
        guard let bytes = Base64URL.decode(cursor), let text = String(validating: bytes, as: UTF8.self),
            let bar = text.firstIndex(of: "|"), let micros = Int64(text[..<bar]),
            // Every time this API lists is within the accepted range; one beyond it could not be bound.
            Timestamps.acceptedRange.contains(Double(micros) / 1e6),
            // Instance and campaign IDs alike (one rule): no byte of anything else reaches SQL.
            let id = try? Identifiers.instanceReference(String(text[text.index(after: bar)...]), field: "cursor")
        else { throw ValidationError(field: "cursor", reason: "is not a cursor this API returned") }
        return (Date(timeIntervalSince1970: Double(micros) / 1e6), id)
    }
}
