import Foundation
import Testing

@testable import MarqueeDelivery

@Suite("The express lane's view of a loop's batch")
struct ExpressLaneTests {
    let a = UUID()
    let b = UUID()
    let c = UUID()

    @Test("in a full batch, the tenants that got at least an equal share have a backlog; the others do not")
    func fullBatch() {
        // A's backlog took the rest of B's share; B had one due.
        #expect(DeliveryWorker.backlogged([b] + Array(repeating: a, count: 15), limit: 16) == [a])
        // Three tenants, shares of 5: A and C filled theirs.
        let batch = Array(repeating: a, count: 9) + [b] + Array(repeating: c, count: 6)
        #expect(DeliveryWorker.backlogged(batch, limit: 16) == [a, c])
        #expect(DeliveryWorker.backlogged(Array(repeating: a, count: 16), limit: 16) == [a])
    }

    @Test("a short batch took everything due: nobody has a backlog")
    func shortBatch() {
        #expect(DeliveryWorker.backlogged(Array(repeating: a, count: 15), limit: 16).isEmpty)
        #expect(DeliveryWorker.backlogged([], limit: 16).isEmpty)
    }
}
