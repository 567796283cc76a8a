import Foundation
import Testing

@testable import MarqueeCore

@Suite struct UUIDTextTests {
    @Test func canonicalTextsAreUUIDStringInEitherCase() {
        var uuids = (0..<500).map { _ in UUID() }
        uuids.append(UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
        uuids.append(UUID(uuid: (255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255)))
        uuids.append(UUID(uuidString: "0123456789ABCDEF0123456789ABCDEF".inserting())!)
        for uuid in uuids {
            #expect(uuid.lowercasedString == uuid.uuidString.lowercased())
            #expect(uuid.uppercasedString == uuid.uuidString)
            #expect(UUID(text: uuid.lowercasedString) == uuid)
            #expect(UUID(text: uuid.uppercasedString) == uuid)
        }
    }

    @Test func textParsesTheCanonicalFormOnly() {
        let good = "0123456789abcdefABCDEF0123456789".inserting()
        #expect(UUID(text: good) == UUID(uuidString: good))
        #expect(UUID(text: good[...]) == UUID(uuidString: good))
        let bad = [
            "", "0123456789abcdef0123456789abcdef", String(good.dropLast()), good + "0",
            good.replacingOccurrences(of: "-", with: "0", options: [], range: good.range(of: "-")),
            "g" + good.dropFirst(), "01234567-89ab-cdef0-123-456789abcdef", "{" + good.dropFirst(2) + "}",
            "0123456é-89ab-cdef-0123-456789abcdef", " " + good.dropFirst(), "01234567-89ab-cdef-0123-456789abcde\u{0}",
        ]
        for text in bad {
            #expect(UUID(text: text) == nil, "\(text)")
        }
    }
}

extension String {
    /// 32 hex digits as 8-4-4-4-12.
    fileprivate func inserting() -> String {
        let c = Array(self)
        return [c[0..<8], c[8..<12], c[12..<16], c[16..<20], c[20..<32]].map { String($0) }.joined(separator: "-")
    }
}
