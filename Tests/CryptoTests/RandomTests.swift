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

    @Test("uuid() from many threads at once: the shared pool never hands out the same bytes twice")
    func uuidsConcurrently() async {
        let batches = await withTaskGroup(of: [UUID].self) { group in
            for _ in 0..<8 { group.addTask { (0..<2_000).map { _ in SecureRandom.uuid() } } }
            return await group.reduce(into: [[UUID]]()) { $0.append($1) }
        }
        #expect(Set(batches.joined()).count == 16_000)
    }
}
