import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Synchronization
import Testing

@testable import MarqueeAPI

final class Counts: Sendable {
    let admitted = Mutex(0)
    let queried = Mutex(0)
}

/// The key cache's parts without a database: the bounded cache and the single lookup per key.
@Suite("Key cache parts")
struct KeyCacheUnitTests {
    @Test("a cache at capacity makes room by age: the newer entries stay")
    func cacheKeepsNewerEntries() {
        let cache = ExpiringCache<Int, Int>(ttl: .seconds(600), capacity: 100)
        for key in 1...110 { cache.store(key, key) }
        // The 101st made room by dropping the oldest tenth (1…10); 101…110 then fit.
        #expect(cache.count == 100)
        #expect((1...10).allSatisfy { cache.lookup($0) == nil })
        #expect((11...110).allSatisfy { cache.lookup($0) == $0 })
        // Storing a key held again takes no room.
        cache.store(50, 500)
        #expect(cache.count == 100 && cache.lookup(11) == 11 && cache.lookup(50) == 500)
    }

    @Test("a key read before this process revoked it (or changed its tenant's settings) is not cached after")
    func readBeforeForgetIsNotCached() {
        let cache = KeyCache(ttl: .seconds(600))
        let tenant = UUID()
        let principal = Principal(tenantID: tenant, keyID: UUID(), kind: .app)
        let (stale, fresh): ([UInt8], [UInt8]) = (Array(repeating: 1, count: 32), Array(repeating: 2, count: 32))
        // A lookup reads the key; the key is revoked and forgotten; the lookup then stores what it read.
        let before = cache.generation
        cache.forget(tenant: tenant)
        cache.store(stale, .valid(principal), ifStill: before)
        cache.store(stale, .invalid, ifStill: before)
        #expect(cache.lookup(stale) == nil)
        // A lookup begun after the forget is cached as before.
        cache.store(fresh, .valid(principal), ifStill: cache.generation)
        #expect(cache.lookup(fresh) == .valid(principal))

        // The same for the settings caches: a removal makes reads begun before it unstorable.
        let settings = ExpiringCache<UUID, Int>(ttl: .seconds(600))
        let read = settings.generation
        settings.remove(tenant)
        settings.store(tenant, 1, ifStill: read)
        #expect(settings.lookup(tenant) == nil)
        settings.store(tenant, 2, ifStill: settings.generation)
        #expect(settings.lookup(tenant) == 2)
    }

    @Test("requests presenting one key while its lookup is under way wait for that lookup: one admission, one query")
    func oneLookupPerKey() async throws {
        let lookups = KeyLookups()
        let hash: [UInt8] = Array(repeating: 7, count: 32)
        let principal = Principal(tenantID: UUID(), keyID: UUID(), kind: .sdk)
        let counts = Counts()
        let answers = try await withThrowingTaskGroup(of: Principal?.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    try await lookups.run(
                        hash, admit: { counts.admitted.withLock { $0 += 1 } },
                        lookup: {
                            counts.queried.withLock { $0 += 1 }
                            // The lookup holds until the seven others wait for it.
                            let deadline = ContinuousClock.now + .seconds(20)
                            while lookups.waiting(for: hash) < 7, ContinuousClock.now < deadline { await Task.yield() }
                            return principal
                        })
                }
            }
            var answers: [Principal?] = []
            for try await answer in group { answers.append(answer) }
            return answers
        }
        #expect(answers.count == 8 && answers.allSatisfy { $0 == principal })
        #expect(counts.queried.withLock { $0 } == 1)
        #expect(counts.admitted.withLock { $0 } == 1)
        #expect(lookups.waiting(for: hash) == 0)

        // A refused admission runs no lookup and leaves none under way; the next request is admitted afresh.
        await #expect(throws: HTTPProblem.self) {
            try await lookups.run(hash, admit: { throw Problems.unauthorized() }, lookup: { principal })
        }
        #expect(try await lookups.run(hash, admit: {}, lookup: { nil }) == nil)
    }
}
