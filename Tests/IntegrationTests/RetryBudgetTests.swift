import Foundation
import MarqueeCore
import MarqueeSimulators
import MarqueeStore
import Testing

/// Attempts that say nothing of the push (the worker's own retries, parks) spend none of its retry budget (migration
/// 0106, `RetryPolicy.spendsBudget`).
extension DeliveryTests {
    @Test("ten retries for a credential that would not load spend no budget: the provider's first 503 is retried")
    func uncountedAttemptsSpendNoBudget() async throws {
        let t = try await Self.tenant()
        t.fixture.simulator.setFaults([.init(tokenPrefix: "5032", action: .serviceUnavailable, times: 1)])
        defer { t.fixture.simulator.setFaults([]) }
        let (_, token) = try await t.iphone(tokenPrefix: "5032")
        let instance = Fake.id("budget")
        #expect(try await t.start(instance).status == 200)
        // Ten attempts the worker ended itself (a credential it could not load), recorded as a worker records them.
        let queue = DeliveryQueue(pool: t.fixture.pool)
        for _ in 0..<10 {
            let claimed = try await queue.claim(limit: 10, hold: .seconds(60), tenants: [t.tenant.uuid]) { batch in
                ClaimResults(
                    results: batch.map {
                        DeliveryResult(
                            tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .queued,
                            reason: "credential_load", retryDelay: .zero)
                    })
            }
            #expect(claimed == 1)
        }
        #expect(try await t.deliveries(instance).first?["attempts"] as? Int == 10, "every attempt is shown")
        // Then the provider answers 503 once: a first retry, not the push's last attempt.
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let settled = try await t.settled(instance, count: 1)
        #expect(settled[0].string("status") == "sent", "\(settled)")
        #expect(settled[0]["attempts"] as? Int == 12)
        #expect(t.fixture.simulator.pushes(token: token).count == 1)
    }
}
