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
