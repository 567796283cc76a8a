import Foundation
import Synchronization
import Testing

@testable import Crypto

@Suite("ULID")
struct ULIDTests {
    @Test("Known bytes encode to the expected Crockford string and back")
    func knownVectors() throws {
        let id = ULID(bytes: Array(1...16))
        #expect(id.description == "01081G81860W40J2GB1G6GW3RG")
        #expect(ULID(string: "01081G81860W40J2GB1G6GW3RG") == id)

        let max = ULID(bytes: [UInt8](repeating: 0xff, count: 16))
        #expect(max.description == "7ZZZZZZZZZZZZZZZZZZZZZZZZZ")
        #expect(ULID(bytes: [UInt8](repeating: 0, count: 16)).description == "00000000000000000000000000")

        let stamped = try #require(ULID(string: "01J2GV5GYMZZZZZZZZZZZZZZZZ"))
        #expect(stamped.bytes == Hex.decode("0190a1b2c3d4ffffffffffffffffffff"))
        #expect(stamped.timestamp == Date(timeIntervalSince1970: 1_720_699_765.716))
    }

    @Test("Generated ULIDs are 26 characters and round-trip through string, bytes, UUID and JSON")
    func roundTrips() throws {
        let instant = Date(timeIntervalSince1970: 1_700_000_000.123)
        let generator = ULIDGenerator(now: { instant })
        let id = generator.next()
        #expect(id.description.count == 26)
        #expect(id.milliseconds == 1_700_000_000_123)
        #expect(abs(id.timestamp.timeIntervalSince(instant)) < 0.001)
        #expect(ULID(string: id.description) == id)
        #expect(ULID(string: id.description.lowercased()) == id)
        #expect(ULID(bytes: id.bytes) == id)
        #expect(ULID(uuid: id.uuid) == id)
        #expect(Array(withUnsafeBytes(of: id.uuid.uuid) { Array($0) }) == id.bytes)

        let json = try JSONEncoder().encode(["id": id])
        #expect(String(decoding: json, as: UTF8.self) == "{\"id\":\"\(id)\"}")
        #expect(try JSONDecoder().decode([String: ULID].self, from: json)["id"] == id)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode([String: ULID].self, from: Data("{\"id\":\"nope\"}".utf8))
        }
    }

    @Test(
        "Invalid strings are rejected",
        arguments: [
            "", "0123456789ABCDEFGHJKMNPQR", "0123456789ABCDEFGHJKMNPQRST", "01081G81860W40J2GB1G6GW3RU",
            "01081G81860W40J2GB1G6GW3RI", "01081G81860W40J2GB1G6GW3RL", "01081G81860W40J2GB1G6GW3RO",
            "81081G81860W40J2GB1G6GW3RG", "Z1081G81860W40J2GB1G6GW3RG", "01081G81860W40J2GB1G6GW3R-",
            "01081G81860W40J2GB1G6GW3Ré",
        ])
    func rejectsInvalid(_ string: String) {
        #expect(ULID(string: string) == nil)
    }

    @Test("10,000 ULIDs from a frozen clock sort in creation order and are distinct")
    func monotonicWithinMillisecond() {
        let instant = Date(timeIntervalSince1970: 1_700_000_000)
        let generator = ULIDGenerator(now: { instant })
        let ids = (0..<10_000).map { _ in generator.next() }
        #expect(ids == ids.sorted())
        #expect(ids.map(\.description) == ids.map(\.description).sorted())
        #expect(Set(ids).count == ids.count)
        #expect(ids.allSatisfy { $0.milliseconds == 1_700_000_000_000 })
    }

    @Test("A new millisecond starts a fresh random part; a clock stepping back stays monotonic")
    func clockMovement() {
        let clock = Mutex(Date(timeIntervalSince1970: 1_700_000_000))
        let generator = ULIDGenerator(now: { clock.withLock { $0 } })
        let first = generator.next()
        clock.withLock { $0 = $0.addingTimeInterval(0.005) }
        let second = generator.next()
        #expect(second.milliseconds == first.milliseconds + 5)
        clock.withLock { $0 = $0.addingTimeInterval(-10) }
        let third = generator.next()
        #expect(third > second)
        #expect(third.milliseconds == second.milliseconds)
    }

    @Test("Overflow of the 80-bit random part bumps the timestamp instead of waiting")
    func overflowBumpsTimestamp() {
        let instant = Date(timeIntervalSince1970: 1_700_000_000)
        let generator = ULIDGenerator(now: { instant }, random: { [UInt8](repeating: 0xff, count: $0) })
        let first = generator.next()
        #expect(first.description.hasSuffix("ZZZZZZZZZZZZZZZZ"))
        let second = generator.next()
        #expect(second > first)
        #expect(second.milliseconds == first.milliseconds + 1)
    }

    @Test("Carry from the low 64 random bits into the high 16 keeps order")
    func carryIntoHighRandomBits() {
        let instant = Date(timeIntervalSince1970: 1_700_000_000)
        let generator = ULIDGenerator(now: { instant }, random: { _ in [0, 0] + [UInt8](repeating: 0xff, count: 8) })
        let first = generator.next()
        let second = generator.next()
        #expect(second > first)
        #expect(second.milliseconds == first.milliseconds)
        #expect(Hex.encode(second.bytes.suffix(10)) == "00010000000000000000")
    }

    @Test("The shared generator is safe and strictly increasing across concurrent tasks")
    func concurrentGeneration() async {
        let generator = ULIDGenerator.shared
        let ids = await withTaskGroup(of: [ULID].self) { group in
            for _ in 0..<8 {
                group.addTask { (0..<1_000).map { _ in generator.next() } }
            }
            var all: [[ULID]] = []
            for await batch in group { all.append(batch) }
            return all
        }
        #expect(Set(ids.joined()).count == 8_000)
        for batch in ids {
            #expect(batch == batch.sorted())
        }
    }
}

@Suite("ULID clock edge cases")
struct ULIDClockTests {
    @Test("Pre-1970 and absurdly far-future clocks never trap and stay monotonic")
    func extremeClocks() {
        let past = ULIDGenerator(now: { Date(timeIntervalSince1970: -5) })
        #expect(past.next().milliseconds == 0)
        let future = ULIDGenerator(now: { Date(timeIntervalSince1970: 1e300) })
        let a = future.next()
        let b = future.next()
        #expect(a.milliseconds == (1 << 48) - 1)
        #expect(b > a)
    }
}
