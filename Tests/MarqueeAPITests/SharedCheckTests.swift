import Synchronization
import Testing

@testable import MarqueeAPI

/// `/readyz` and `/metrics` are public: a flood of them shares one database check a second.
@Suite("Shared readiness check")
struct SharedCheckTests {
    struct Down: Error {}

    @Test("callers within the freshness window share one check, its failures too; a later caller starts another")
    func shared() async throws {
        let runs = Atomic<Int>(0)
        let fails = Atomic<Bool>(false)
        let check = SharedCheck<Int>(fresh: .seconds(3600)) {
            let n = runs.add(1, ordering: .relaxed).newValue
            try await Task.sleep(for: .milliseconds(20))
            if fails.load(ordering: .relaxed) { throw Down() }
            return n
        }
        let answers = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<200 { group.addTask { try await check.value() } }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(runs.load(ordering: .relaxed) == 1)
        #expect(Set(answers) == [1])

        fails.store(true, ordering: .relaxed)
        let again = SharedCheck<Int>(fresh: .zero) {
            runs.add(1, ordering: .relaxed)
            throw Down()
        }
        await #expect(throws: Down.self) { try await again.value() }
        await #expect(throws: Down.self) { try await again.value() }
        #expect(runs.load(ordering: .relaxed) == 3, "past the window each caller checks again")
    }
}
