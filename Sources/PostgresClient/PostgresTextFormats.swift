import Foundation

/// `timestamptz` text format and calendar arithmetic (proleptic Gregorian, UTC).
enum PostgresTimestamp {
    /// Days since 1970-01-01 for a civil date (astronomical year numbering: 1 BC is year 0).
    static func days(year: Int64, month: Int64, day: Int64) -> Int64 {
        let shiftedYear = month <= 2 ? year - 1 : year
        let era = (shiftedYear >= 0 ? shiftedYear : shiftedYear - 399) / 400
        let yearOfEra = shiftedYear - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The civil date for a count of days since 1970-01-01.
    static func civil(days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        return (year, month, day)
    }

    /// Formats as `YYYY-MM-DD HH:MM:SS.ffffff+00` (UTC, microseconds), which every DateStyle accepts.
    static func format(_ date: Date) -> String {
        if date == .distantFuture {
            return "infinity"
        }
        if date == .distantPast {
            return "-infinity"
        }
        // Beyond ±292,000 years the microseconds do not fit in 64 bits (and PostgreSQL's own range ends before
        // that): such a date is clamped to the infinity on its side rather than trapping. A NaN time is no time at
        // all; PostgreSQL refuses its text, so the statement fails instead of the process.
        let scaled = (date.timeIntervalSince1970 * 1_000_000).rounded()
        guard let micros = Int64(exactly: scaled) else {
            return scaled.isNaN ? "NaN" : scaled > 0 ? "infinity" : "-infinity"
        }
        let microsPerDay: Int64 = 86_400_000_000
        var days = micros / microsPerDay
        var inDay = micros % microsPerDay
        if inDay < 0 {
            inDay += microsPerDay
            days -= 1
        }
        let (year, month, day) = civil(days: days)
        let seconds = inDay / 1_000_000
        let fraction = inDay % 1_000_000
        var text = ""
        text.reserveCapacity(32)
        text += pad(year <= 0 ? 1 - year : year, 4)
        text += "-" + pad(month, 2) + "-" + pad(day, 2)
        text += " " + pad(seconds / 3600, 2) + ":" + pad(seconds / 60 % 60, 2) + ":" + pad(seconds % 60, 2)
        text += "." + pad(fraction, 6) + "+00"
        if year <= 0 {
            text += " BC"
        }
        return text
    }

    private static func pad(_ value: Int64, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }

    /// Parses ISO-style output of `timestamptz`, `timestamp` and `date`.
    static func parse(_ bytes: ArraySlice<UInt8>) -> Date? {
        // Compared as bytes: a String made of every cell just for these two was a good part of the parse.
        if bytes.elementsEqual("infinity".utf8) { return .distantFuture }
        if bytes.elementsEqual("-infinity".utf8) { return .distantPast }
        var scanner = ByteScanner(bytes)
        guard let year = scanner.number(minDigits: 4, maxDigits: 7), scanner.skip("-"),
            let month = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip("-"),
            let day = scanner.number(minDigits: 2, maxDigits: 2), (1...12).contains(month), (1...31).contains(day)
        else { return nil }
        var seconds: Int64 = 0
        var micros: Int64 = 0
        var offset: Int64 = 0
        if scanner.skip(" ") || scanner.skip("T") {
            guard let hour = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip(":"),
                let minute = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip(":"),
                let second = scanner.number(minDigits: 2, maxDigits: 2), hour <= 24, minute < 60, second <= 60
            else { return nil }
            seconds = hour * 3600 + minute * 60 + second
            if scanner.skip(".") {
                var digits = 0
                while let digit = scanner.digit() {
                    if digits < 6 {
                        micros = micros * 10 + digit
                    }
                    digits += 1
                }
                guard digits > 0 else { return nil }
                for _ in digits..<max(digits, 6) {
                    micros *= 10
                }
            }
            if scanner.skip("Z") {
                offset = 0
            } else if let sign = scanner.sign() {
                guard let hours = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                var total = hours * 3600
                if scanner.skip(":") || scanner.peekDigit() {
                    guard let minutes = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                    total += minutes * 60
                    if scanner.skip(":") || scanner.peekDigit() {
                        guard let secs = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                        total += secs
                    }
                }
                offset = sign * total
            }
        }
        var astronomicalYear = year
        if scanner.skip(" BC") {
            astronomicalYear = 1 - year
        }
        guard scanner.atEnd else { return nil }
        let dayCount = days(year: astronomicalYear, month: month, day: day)
        let totalSeconds = dayCount * 86_400 + seconds - offset
        let (scaled, overflow1) = totalSeconds.multipliedReportingOverflow(by: 1_000_000)
        let (totalMicros, overflow2) = scaled.addingReportingOverflow(micros)
        if overflow1 || overflow2 || totalMicros.magnitude > (1 << 53) {
            return Date(timeIntervalSince1970: Double(totalSeconds) + Double(micros) / 1_000_000)
        }
        return Date(timeIntervalSince1970: Double(totalMicros) / 1_000_000)
    }
}

/// A tiny cursor over ASCII bytes, read where they are (no copy).
struct ByteScanner {
    let bytes: ArraySlice<UInt8>
    var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    var atEnd: Bool { index == bytes.endIndex }

    /// Consumes `literal` if the bytes at the index are it. Compared in place: copying both sides into arrays made
    /// this most of a timestamp's parse (a claim decodes two per delivery).
    mutating func skip(_ literal: StaticString) -> Bool {
        let count = literal.utf8CodeUnitCount
        guard bytes.endIndex - index >= count else { return false }
        let matches = literal.withUTF8Buffer { utf8 in
            utf8.indices.allSatisfy { bytes[index + $0] == utf8[$0] }
        }
        if matches { index += count }
        return matches
    }

    func peekDigit() -> Bool {
        index < bytes.endIndex && bytes[index] &- UInt8(ascii: "0") < 10
    }

    mutating func digit() -> Int64? {
        guard peekDigit() else { return nil }
        defer { index += 1 }
        return Int64(bytes[index] &- UInt8(ascii: "0"))
    }

    mutating func sign() -> Int64? {
        if skip("+") {
            return 1
        }
        if skip("-") {
            return -1
        }
        return nil
    }

    mutating func number(minDigits: Int, maxDigits: Int) -> Int64? {
        var value: Int64 = 0
        var count = 0
        while count < maxDigits, let digit = digit() {
            value = value * 10 + digit
            count += 1
        }
        return count >= minDigits ? value : nil
    }
}

/// PostgreSQL one-dimensional array literals (`{a,"b,c",NULL}`).
enum PostgresArrayText {
    struct Malformed: Error {}

    /// Builds a literal with every element quoted, so any text round-trips; nil elements become NULL.
    static func literal(_ elements: [[UInt8]?]) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "{")]
        for (position, element) in elements.enumerated() {
            if position > 0 {
                out.append(UInt8(ascii: ","))
            }
            guard let element else {
                out.append(contentsOf: "NULL".utf8)
                continue
            }
            out.append(UInt8(ascii: "\""))
            for byte in element {
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                    out.append(UInt8(ascii: "\\"))
                }
                out.append(byte)
            }
            out.append(UInt8(ascii: "\""))
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// Parses a one-dimensional array literal; unquoted `NULL` (any case) becomes nil.
    static func parse(_ slice: ArraySlice<UInt8>) throws -> [[UInt8]?] {
        let bytes = Array(slice)
        var index = 0
        func isSpace(_ byte: UInt8) -> Bool {
            byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "[") {
            // Explicit bounds such as "[0:2]={…}".
            while index < bytes.count, bytes[index] != UInt8(ascii: "=") {
                index += 1
            }
            index += 1
        }
        guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { throw Malformed() }
        index += 1
        var elements: [[UInt8]?] = []
        while index < bytes.count, isSpace(bytes[index]) {
            index += 1
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            guard index == bytes.count else { throw Malformed() }
            return elements
        }
        while true {
            while index < bytes.count, isSpace(bytes[index]) {
                index += 1
            }
            guard index < bytes.count else { throw Malformed() }
            if bytes[index] == UInt8(ascii: "{") {
                throw Malformed()  // multidimensional arrays are not supported
            }
            if bytes[index] == UInt8(ascii: "\"") {
                index += 1
                var element: [UInt8] = []
                while true {
                    guard index < bytes.count else { throw Malformed() }
                    let byte = bytes[index]
                    if byte == UInt8(ascii: "\\") {
                        index += 1
                        guard index < bytes.count else { throw Malformed() }
                        element.append(bytes[index])
                    } else if byte == UInt8(ascii: "\"") {
                        index += 1
                        break
                    } else {
                        element.append(byte)
                    }
                    index += 1
                }
                elements.append(element)
            } else {
                var element: [UInt8] = []
                var escaped = false
                while index < bytes.count, bytes[index] != UInt8(ascii: ","), bytes[index] != UInt8(ascii: "}") {
                    if bytes[index] == UInt8(ascii: "\\") {
                        index += 1
                        guard index < bytes.count else { throw Malformed() }
                        escaped = true
                    }
                    element.append(bytes[index])
                    index += 1
                }
                while let last = element.last, isSpace(last) {
                    element.removeLast()
                }
                let isNull = !escaped && String(decoding: element, as: UTF8.self).uppercased() == "NULL"
                elements.append(isNull ? nil : element)
            }
            while index < bytes.count, isSpace(bytes[index]) {
                index += 1
            }
            guard index < bytes.count else { throw Malformed() }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "}") else { throw Malformed() }
            index += 1
            guard index == bytes.count else { throw Malformed() }
            return elements
        }
    }
}

/// Hex digits, both ways (bytea's hex format, uuid text).
enum PostgresHex {
    /// Lower-case digits by value.
    static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    /// The value of a hex digit of either case; nil for anything else.
    static func value(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// `bytea` text output (hex and the older escape format).
enum PostgresByteaText {

    static func decode(_ slice: ArraySlice<UInt8>) -> [UInt8]? {
        let bytes = Array(slice)
        if bytes.count >= 2, bytes[0] == UInt8(ascii: "\\"), bytes[1] == UInt8(ascii: "x") {
            guard bytes.count % 2 == 0 else { return nil }
            var out: [UInt8] = []
            out.reserveCapacity((bytes.count - 2) / 2)
            var index = 2
            while index < bytes.count {
                guard let high = PostgresHex.value(bytes[index]), let low = PostgresHex.value(bytes[index + 1]) else {
                    return nil
                }
                out.append(high << 4 | low)
                index += 2
            }
            return out
        }
        var out: [UInt8] = []
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            if byte != UInt8(ascii: "\\") {
                out.append(byte)
                index += 1
            } else if index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "\\") {
                out.append(byte)
                index += 2
            } else if index + 3 < bytes.count, let value = octal(bytes[(index + 1)...(index + 3)]) {
                out.append(value)
                index += 4
            } else {
                return nil
            }
        }
        return out
    }

    private static func octal(_ digits: ArraySlice<UInt8>) -> UInt8? {
        var value = 0
        for digit in digits {
            let number = Int(digit) - Int(UInt8(ascii: "0"))
            guard (0...7).contains(number) else { return nil }
            value = value * 8 + number
        }
        return UInt8(exactly: value)
    }

    /// Appends `\x…` hex text for `bytes`.
    static func appendHex(_ bytes: [UInt8], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\\"))
        out.append(UInt8(ascii: "x"))
        for byte in bytes {
            out.append(PostgresHex.digits[Int(byte >> 4)])
            out.append(PostgresHex.digits[Int(byte & 0x0F)])
        }
    }
}

/// COPY … FROM STDIN text format.
enum PostgresCopyText {
    /// Appends one field, escaping backslash, tab, newline and carriage return; nil becomes `\N`; a NUL is refused.
    static func appendField(_ bind: PostgresBind, to out: inout [UInt8]) throws {
        guard var bytes = bind.bytes else {
            out.append(UInt8(ascii: "\\"))
            out.append(UInt8(ascii: "N"))
            return
        }
        if bind.binary {
            guard bind.oid == PostgresOID.bytea else {
                throw PostgresError(code: .unsupported, context: "binary binds other than bytea cannot be copied")
            }
            var hex: [UInt8] = []
            hex.reserveCapacity(bytes.count * 2 + 2)
            PostgresByteaText.appendHex(bytes, to: &hex)
            bytes = hex
        }
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "\\"):
                out.append(UInt8(ascii: "\\"))
                out.append(UInt8(ascii: "\\"))
            case 0x09:
                out.append(UInt8(ascii: "\\"))
                out.append(UInt8(ascii: "t"))
            case 0x0A:
                out.append(UInt8(ascii: "\\"))
                out.append(UInt8(ascii: "n"))
            case 0x0D:
                out.append(UInt8(ascii: "\\"))
                out.append(UInt8(ascii: "r"))
            case 0x00:
                throw PostgresError(code: .encoding, context: "a COPY field holds a NUL byte, which text cannot carry")
            default:
                out.append(byte)
            }
        }
    }
}

/// Quoting of SQL identifiers.
enum PostgresIdentifier {
    /// `"name"` with embedded quotes doubled.
    static func quote(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    /// Quotes each dot-separated part: `public.events` → `"public"."events"`.
    static func quoteQualified(_ name: String) -> String {
        name.split(separator: ".", omittingEmptySubsequences: false).map { quote(String($0)) }.joined(separator: ".")
    }
}

/// `uuid` text, the form PostgreSQL writes: 32 lower-case hex digits in groups of 8-4-4-4-12. On Linux Foundation's
/// `UUID(uuidString:)` parses with `sscanf` and `uuidString` formats with `sprintf`: 3% of a delivery worker's CPU in
/// bench/fanout's profile (every claimed row and every recorded result carries UUIDs both ways).
enum PostgresUUIDText {
    /// Where a `-` goes in the text (after the 4th, 6th, 8th and 10th byte).
    private static func dashBefore(_ byte: Int) -> Bool { byte == 4 || byte == 6 || byte == 8 || byte == 10 }

    static func format(_ uuid: UUID) -> String {
        withUnsafeBytes(of: uuid.uuid) { raw in
            String(unsafeUninitializedCapacity: 36) { out in
                var at = 0
                for (index, byte) in raw.enumerated() {
                    if dashBefore(index) {
                        out[at] = UInt8(ascii: "-")
                        at += 1
                    }
                    out[at] = PostgresHex.digits[Int(byte >> 4)]
                    out[at + 1] = PostgresHex.digits[Int(byte & 0x0F)]
                    at += 2
                }
                return at
            }
        }
    }

    /// The UUID in `text` (8-4-4-4-12 hex digits, either case); nil for anything else.
    static func parse(_ text: some Collection<UInt8>) -> UUID? {
        guard text.count == 36 else { return nil }
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        let parsed = withUnsafeMutableBytes(of: &bytes) { out -> Bool in
            var index = text.startIndex
            for byte in 0..<16 {
                if dashBefore(byte) {
                    guard text[index] == UInt8(ascii: "-") else { return false }
                    index = text.index(after: index)
                }
                guard let high = PostgresHex.value(text[index]) else { return false }
                index = text.index(after: index)
                guard let low = PostgresHex.value(text[index]) else { return false }
                index = text.index(after: index)
                out[byte] = high << 4 | low
            }
            return true
        }
        return parsed ? UUID(uuid: bytes) : nil
    }
}
