import Foundation

extension UUID {
    /// The canonical lower-case text form (`uuidString.lowercased()`), formatted byte by byte. On Linux Foundation's
    /// `uuidString` goes through `uuid_unparse` (printf formatting) and the case change makes a second string; this
    /// is on every push's path (the `apns-id` header).
    public var lowercasedString: String { canonicalText(digits: "0123456789abcdef") }

    /// The canonical upper-case text form (`uuidString`), formatted byte by byte.
    public var uppercasedString: String { canonicalText(digits: "0123456789ABCDEF") }

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
