import Foundation

extension UUID {
    /// The canonical lower-case text form (`uuidString.lowercased()`), formatted byte by byte. On Linux Foundation's
    /// `uuidString` goes through `uuid_unparse` (printf formatting) and the case change makes a second string; this
    /// is on every push's path (the `apns-id` header).
    public var lowercasedString: String { canonicalText(digits: "0123456789abcdef") }

    /// The canonical upper-case text form (`uuidString`), formatted byte by byte.
    public var uppercasedString: String { canonicalText(digits: "0123456789ABCDEF") }

    /// The UUID in `text`, 32 hex digits of either case in groups of 8-4-4-4-12; nil for anything else. On Linux
    /// Foundation's `UUID(uuidString:)` parses with `sscanf`: 4% of the APNs simulator's CPU, which checks every
    /// request's `apns-id`, and on every API request (the tenant in its key).
    public init?(text: some StringProtocol) {
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        let utf8 = text.utf8
        guard utf8.count == 36 else { return nil }
        let parsed = withUnsafeMutableBytes(of: &bytes) { out -> Bool in
            var index = utf8.startIndex
            func nibble() -> UInt8? {
                let c = utf8[index]
                index = utf8.index(after: index)
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): return c &- UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): return c &- UInt8(ascii: "a") &+ 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): return c &- UInt8(ascii: "A") &+ 10
                default: return nil
                }
            }
            for byte in 0..<16 {
                if byte == 4 || byte == 6 || byte == 8 || byte == 10 {
                    guard utf8[index] == UInt8(ascii: "-") else { return false }
                    index = utf8.index(after: index)
                }
                guard let high = nibble(), let low = nibble() else { return false }
                out[byte] = high << 4 | low
            }
            return true
        }
        guard parsed else { return nil }
        self.init(uuid: bytes)
    }

    private func canonicalText(digits: StaticString) -> String {
        withUnsafeBytes(of: uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { output in
                digits.withUTF8Buffer { hex in
                    var at = 0
                    for (index, byte) in bytes.enumerated() {
                        if index == 4 || index == 6 || index == 8 || index == 10 {
                            output[at] = UInt8(ascii: "-")
                            at += 1
                        }
                        output[at] = hex[Int(byte >> 4)]
                        output[at + 1] = hex[Int(byte & 0x0F)]
                        at += 2
                    }
                    return at
                }
            }
        }
    }
}
