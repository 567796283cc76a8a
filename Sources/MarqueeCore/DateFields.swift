import Foundation

/// Date fields of a content state: accepted from the API in either common spelling and re-encoded the way the app's
/// decoder reads them.
///
/// Input at each configured pointer may be epoch seconds (a JSON number, fractions allowed) or an ISO 8601 date-time
/// string (`2025-03-01T12:30:00Z`, `2025-03-01T13:30:00.250+01:00`, `…+0100`). Output follows the field's
/// ``DateEncoding``:
/// - `epoch_seconds`: whole seconds since 1970, always an integer: a fraction is rounded down (towards the past), because
///   decoders such as Customer.io's `EpochSecondsDate` read an `Int64` and refuse `1740000000.5`, which makes the
///   whole content state undecodable;
/// - `apple_reference`: seconds since 2001-01-01T00:00:00Z (epoch − 978 307 200), what a plain `Date` in an
///   ActivityKit content state decodes with the default `JSONDecoder` strategy (a `Double`, so fractions are kept);
///   integer when whole;
/// - `iso8601`: `YYYY-MM-DDTHH:MM:SSZ` in UTC. Fractions are truncated to the second, because Swift's
///   `JSONDecoder.DateDecodingStrategy.iso8601` refuses fractional seconds.
public enum DateFields {
    /// Seconds between 1970-01-01 and 2001-01-01 (UTC).
    public static let appleReferenceOffset: Int64 = 978_307_200

    /// Earliest and latest instants accepted, in epoch seconds: 0001-01-01T00:00:00Z … 9999-12-31T23:59:59Z, so every
    /// accepted value can also be written as a four-digit-year ISO string.
    static let acceptedRange: ClosedRange<Double> = -62_135_596_800...253_402_300_799

    /// Re-encodes every date field present in `state`.
    ///
    /// - Parameters:
    ///   - state: the content state (normally an object).
    ///   - fields: JSON pointer text (`/eta`, `/stops/0/arrival`) → how the app decodes that field. Pointers that do not
    ///     exist in `state` are skipped; a `null` value is left as is (an optional date the team cleared).
    ///   - field: prefix for error fields, so a bad value at `/eta` is reported as `content_state/eta`.
    /// - Throws: ``ValidationError`` (`invalid-field`) naming `field` + pointer when a value is neither a number nor an
    ///   ISO 8601 date-time, or is out of range. The value itself is never quoted.
    public static func normalize(
        _ state: JSONValue, fields: [String: DateEncoding], field: String = "content_state"
    ) throws(ValidationError) -> JSONValue {
        var result = state
        // Sorted so that, with several bad fields, the same one is always reported.
        for pointerText in fields.keys.sorted() {
            let encoding = fields[pointerText]!
            guard let pointer = JSONPointer(pointerText) else {
                throw ValidationError(field: field + pointerText, reason: "is not a JSON pointer")
            }
            guard let value = result[pointer: pointer], value != .null else { continue }
            guard let seconds = epochSeconds(from: value) else {
                throw ValidationError(
                    field: field + pointer.description,
                    reason: "must be a date: epoch seconds or an ISO 8601 date-time such as 2025-03-01T12:30:00Z")
            }
            result.replace(at: pointer, with: encode(seconds, as: encoding))
        }
        return result
    }

    /// The instant a JSON value denotes, in epoch seconds: a number as is, a string parsed as ISO 8601; nil otherwise.
    public static func epochSeconds(from value: JSONValue) -> Double? {
        let seconds: Double?
        switch value {
        case .int, .double: seconds = value.doubleValue
        case .string(let text): seconds = ISO8601.parse(text)
        default: seconds = nil
        }
        guard let seconds, seconds.isFinite, acceptedRange.contains(seconds) else { return nil }
        return seconds
    }

    /// Encodes an instant (epoch seconds) for the app's decoder.
    public static func encode(_ epochSeconds: Double, as encoding: DateEncoding) -> JSONValue {
        switch encoding {
        case .epochSeconds: .int(Int64(epochSeconds.rounded(.down)))
        case .appleReference: number(epochSeconds - Double(appleReferenceOffset))
        case .iso8601: .string(ISO8601.format(Int64(epochSeconds.rounded(.down))))
        }
    }

    /// The instant an already encoded date field denotes, in epoch seconds (the inverse of
    /// `encode(_:as:)`); nil when the value is not in that encoding.
    public static func decode(_ value: JSONValue, as encoding: DateEncoding) -> Double? {
        switch (encoding, value) {
        case (.epochSeconds, .int), (.epochSeconds, .double): value.doubleValue
        case (.appleReference, .int), (.appleReference, .double):
            value.doubleValue.map { $0 + Double(appleReferenceOffset) }
        case (.iso8601, .string(let text)): ISO8601.parse(text)
        default: nil
        }
    }

    /// Whole milliseconds since 1970 (rounded down), for readers such as Customer.io's Android SDK. A value outside
    /// `acceptedRange` (which no validated date is, but a number in the attributes may be) is clamped to it: the
    /// conversion to an integer must not trap.
    public static func epochMilliseconds(_ epochSeconds: Double) -> Int64 {
        let seconds =
            epochSeconds.isNaN ? 0 : min(max(epochSeconds, acceptedRange.lowerBound), acceptedRange.upperBound)
        return Int64((seconds * 1000).rounded(.down))
    }

    /// Encodes a `Date` for the app's decoder.
    public static func encode(_ date: Date, as encoding: DateEncoding) -> JSONValue {
        encode(date.timeIntervalSince1970, as: encoding)
    }

    /// An integer when whole, else a fraction.
    static func number(_ value: Double) -> JSONValue {
        if value == value.rounded(), abs(value) < 9.0e15 { return .int(Int64(value)) }
        return .double(value)
    }
}

/// A strict ISO 8601 / RFC 3339 date-time reader and a UTC writer, independent of locale and formatter state.
enum ISO8601 {
    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM|±HHMM)` → epoch seconds, or nil.
    static func parse(_ text: String) -> Double? {
        let b = Array(text.utf8)
        var i = 0
        func digits(_ count: Int) -> Int? {
            guard i + count <= b.count else { return nil }
            var value = 0
            for k in i..<i + count {
                guard b[k] >= 0x30, b[k] <= 0x39 else { return nil }
                value = value * 10 + Int(b[k] - 0x30)
            }
            i += count
            return value
        }
        func expect(_ options: String) -> Bool {
            guard i < b.count, options.utf8.contains(b[i]) else { return false }
            i += 1
            return true
        }
        guard let year = digits(4), expect("-"), let month = digits(2), expect("-"), let day = digits(2),
            expect("Tt"), let hour = digits(2), expect(":"), let minute = digits(2), expect(":"),
            let second = digits(2)
        else { return nil }
        var fraction = 0.0
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            let start = i
            while i < b.count, b[i] >= 0x30, b[i] <= 0x39 { i += 1 }
            guard i > start, let value = Double("0." + String(decoding: b[start..<i], as: UTF8.self)) else {
                return nil
            }
            fraction = value
        }
        var offsetSeconds = 0
        guard i < b.count else { return nil }
        switch b[i] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            i += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            let sign = b[i] == UInt8(ascii: "-") ? -1 : 1
            i += 1
            guard let oh = digits(2) else { return nil }
            _ = expect(":")
            guard let om = digits(2), oh <= 23, om <= 59 else { return nil }
            offsetSeconds = sign * (oh * 3600 + om * 60)
        default:
            return nil
        }
        guard i == b.count, (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day),
            hour <= 23, minute <= 59, second <= 59
        else { return nil }
        let days = daysFromCivil(year: year, month: month, day: day)
        let local = Int64(days) * 86_400 + Int64(hour * 3600 + minute * 60 + second)
        return Double(local - Int64(offsetSeconds)) + fraction
    }

    /// Epoch seconds → `YYYY-MM-DDTHH:MM:SSZ`.
    static func format(_ epochSeconds: Int64) -> String {
        let days = Int(epochSeconds >= 0 ? epochSeconds / 86_400 : (epochSeconds - 86_399) / 86_400)
        let secondOfDay = Int(epochSeconds - Int64(days) * 86_400)
        let (year, month, day) = civilFromDays(days)
        func pad(_ value: Int, _ width: Int) -> String {
            let s = String(value)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(secondOfDay / 3600, 2)):"
            + "\(pad(secondOfDay % 3600 / 60, 2)):\(pad(secondOfDay % 60, 2))Z"
    }

    static func isLeap(_ year: Int) -> Bool { year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years, March-based years).
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let shiftedMonth = month > 2 ? month - 3 : month + 9
        let dayOfYear = (153 * shiftedMonth + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The inverse of ``daysFromCivil(year:month:day:)``.
    static func civilFromDays(_ days: Int) -> (year: Int, month: Int, day: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
