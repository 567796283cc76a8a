import Crypto
import Foundation
import Testing

@Suite("Secure random")
struct RandomTests {
    @Test("uuid(): version 4 and the RFC 9562 variant, canonical text, never repeated in 10,000")
    func uuids() {
        var seen = Set<UUID>()
        for _ in 0..<10_000 {
            let id = SecureRandom.uuid()
            let b = id.uuid
            #expect(b.6 >> 4 == 4)
            #expect(b.8 >> 6 == 0b10)
            #expect(UUID(uuidString: id.uuidString) == id)
            seen.insert(id)
        }
        #expect(seen.count == 10_000)
    }
}
