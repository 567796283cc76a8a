import Foundation
import Synchronization

/// A ULID: 48-bit big-endian millisecond Unix timestamp followed by 80 random bits, written as 26 characters of
/// Crockford base32 (`0-9A-Z` without `I L O U`).
///
/// Byte order, string order and `<` agree, so ULIDs sort by creation time. The same 128 bits can be read as a
/// `UUID` for storage in a `uuid` column.
public struct ULID: Sendable, Hashable, Comparable, CustomStringConvertible, Codable {
    /// The first 8 bytes, big-endian: 48-bit timestamp then the top 16 random bits.
    let high: UInt64
    /// The last 8 bytes, big-endian: the low 64 random bits.
    let low: UInt64

    static let maxTimestamp: UInt64 = (1 << 48) - 1

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// Builds a ULID from a millisecond timestamp (48 bits) and 80 random bits (top 16 and low 64).
    init(milliseconds: UInt64, randomHigh: UInt16, randomLow: UInt64) {
        precondition(milliseconds <= ULID.maxTimestamp, "ULID timestamp exceeds 48 bits")
        self.init(high: milliseconds << 16 | UInt64(randomHigh), low: randomLow)
    }

    /// Creates a ULID from its 16 bytes (big-endian). Traps if `bytes.count != 16`.
    public init(bytes: [UInt8]) {
        precondition(bytes.count == 16, "ULID needs exactly 16 bytes")
        var high: UInt64 = 0
        var low: UInt64 = 0
        for index in 0..<8 {
            high = high << 8 | UInt64(bytes[index])
            low = low << 8 | UInt64(bytes[index + 8])
        }
        self.init(high: high, low: low)
    }

    /// Creates a ULID holding the same 128 bits as `uuid`.
    public init(uuid: UUID) {
        let u = uuid.uuid
        self.init(bytes: [
            u.0, u.1, u.2, u.3, u.4, u.5, u.6, u.7, u.8, u.9, u.10, u.11, u.12, u.13, u.14, u.15,
        ])
    }

    /// Parses 26 Crockford base32 characters, case-insensitively. Returns nil for a wrong length, a character
    /// outside the alphabet (including `I L O U`), or a value above 128 bits (first character beyond `7`).
    public init?(string: String) {
        let chars = Array(string.utf8)
        guard chars.count == 26 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, char) in chars.enumerated() {
            guard let value = ULID.decodeValue(char) else { return nil }
            if index == 0 && value > 7 { return nil }
            // Shift the 128-bit (high, low) pair left by 5 and add the new digit.
            high = high << 5 | low >> 59
            low = low << 5 | UInt64(value)
        }
        self.init(high: high, low: low)
    }

    /// The 16 bytes, big-endian.
    public var bytes: [UInt8] {
        var out = [UInt8](repeating: 0, count: 16)
        for index in 0..<8 {
            out[index] = UInt8(truncatingIfNeeded: high >> UInt64(56 - 8 * index))
            out[index + 8] = UInt8(truncatingIfNeeded: low >> UInt64(56 - 8 * index))
        }
        return out
    }

    /// The embedded timestamp in milliseconds since 1970.
    public var milliseconds: UInt64 { high >> 16 }

    /// The embedded creation time, at millisecond precision.
    public var timestamp: Date { Date(timeIntervalSince1970: Double(milliseconds) / 1000) }

    /// The same 128 bits as a UUID (not an RFC 9562 v7 UUID: the version and variant bits are random).
    public var uuid: UUID {
        let b = bytes
        return UUID(
            uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15])
        )
    }

    /// The canonical 26-character uppercase form.
    public var description: String {
        var out = [UInt8](repeating: 0, count: 26)
        var high = self.high
        var low = self.low
        for index in stride(from: 25, through: 0, by: -1) {
            out[index] = ULID.alphabet[Int(low & 0x1F)]
            low = low >> 5 | high << 59
            high >>= 5
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Byte-wise order, which is creation order for ULIDs from one generator.
    public static func < (lhs: ULID, rhs: ULID) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }

    /// Decodes from a single string value.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let string = try container.decode(String.self)
        guard let value = ULID(string: string) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "not a valid ULID")
        }
        self = value
    }

    /// Encodes as the canonical 26-character string.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    private static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

    private static let decodeTable: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, char) in alphabet.enumerated() {
            table[Int(char)] = UInt8(index)
            table[Int(char | 0x20)] = UInt8(index)  // lowercase; digits are unchanged by the OR
        }
        return table
    }()

    private static func decodeValue(_ char: UInt8) -> UInt8? {
        let value = decodeTable[Int(char)]
        return value == 0xFF ? nil : value
    }
}

/// Makes ULIDs that are strictly increasing, even many within one millisecond and across threads.
///
/// Within a millisecond (or when the clock steps backwards) the previous ULID's 80-bit random part is incremented
/// by one, keeping its timestamp. If that part overflows, the timestamp is bumped by one millisecond instead of
/// waiting, so a frozen or slow clock can never block `next()`.
public final class ULIDGenerator: Sendable {
    private struct State {
        var last: ULID?
    }

    private let now: @Sendable () -> Date
    private let random: @Sendable (Int) -> [UInt8]
    private let state = Mutex(State())

    /// The process-wide generator on the system clock.
    public static let shared = ULIDGenerator()

    /// Creates a generator reading time from `now` (inject a fixed clock in tests).
    public convenience init(now: @escaping @Sendable () -> Date = Date.init) {
        self.init(now: now, random: SecureRandom.bytes)
    }

    /// Test seam: also inject the source of the 10 random bytes for each new millisecond.
    init(now: @escaping @Sendable () -> Date, random: @escaping @Sendable (Int) -> [UInt8]) {
        self.now = now
        self.random = random
    }

    /// Returns a ULID greater than every ULID this generator returned before.
    public func next() -> ULID {
        // Clamp in floating point first: a NaN, negative or far-future clock must not trap the conversion.
        let milliseconds = now().timeIntervalSince1970 * 1000
        let clock: UInt64 =
            milliseconds.isNaN || milliseconds <= 0
            ? 0 : UInt64(min(milliseconds, Double(ULID.maxTimestamp)).rounded(.down))
        return state.withLock { state in
            let id: ULID
            if let last = state.last, clock <= last.milliseconds {
                id = increment(last)
            } else {
                id = fresh(milliseconds: clock)
            }
            state.last = id
            return id
        }
    }

    private func fresh(milliseconds: UInt64) -> ULID {
        let bytes = random(10)
        precondition(bytes.count == 10, "ULID random source returned the wrong number of bytes")
        var randomLow: UInt64 = 0
        for byte in bytes[2..<10] { randomLow = randomLow << 8 | UInt64(byte) }
        return ULID(
            milliseconds: milliseconds, randomHigh: UInt16(bytes[0]) << 8 | UInt16(bytes[1]), randomLow: randomLow)
    }

    private func increment(_ last: ULID) -> ULID {
        let randomHigh = UInt16(truncatingIfNeeded: last.high)
        let (low, carry) = last.low.addingReportingOverflow(1)
        if !carry {
            return ULID(high: last.high, low: low)
        }
        if randomHigh < UInt16.max {
            return ULID(high: last.high + 1, low: 0)
        }
        // The 80-bit random part is exhausted: move to the next millisecond.
        precondition(last.milliseconds < ULID.maxTimestamp, "ULID timestamp space exhausted")
        return fresh(milliseconds: last.milliseconds + 1)
    }
}
