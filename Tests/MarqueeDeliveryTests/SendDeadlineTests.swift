import Testing

@testable import MarqueeDelivery

@Suite("A batch's send deadline: one timer resumes the sends still waiting")
struct SendDeadlineTests {
    /// A send that registers with `deadline` and waits; `finish` says whether it completes by itself first.
    private func send(_ key: String, _ deadline: SendDeadline<String, String>, finish: Bool) async -> String {
        await withCheckedContinuation { continuation in
            let once = Once<String> { continuation.resume(returning: $0) }
            guard let id = deadline.add(once, key) else { return once.resume("refused " + key) }
            if finish {
                deadline.remove(id)
                once.resume("sent " + key)
            }
        }
    }

    @Test("expiry resumes the waiting sends with their fallback; finished ones are left alone, later ones refused")
    func expiry() async {
        let deadline = SendDeadline<String, String>()
        let finished = await send("b", deadline, finish: true)
        let results = await withTaskGroup(of: String.self) { group in
            for key in ["a", "c"] {
                group.addTask { await send(key, deadline, finish: false) }
            }
            while deadline.waitingCount < 2 { await Task.yield() }
            deadline.expire { "deadline " + $0 }
            return await group.reduce(into: [finished]) { $0.append($1) }
        }
        #expect(results.sorted() == ["deadline a", "deadline c", "sent b"])
        #expect(deadline.waitingCount == 0)
        #expect(await send("d", deadline, finish: false) == "refused d")
    }
}

@Suite("Shutdown's cutoff of the sends in flight")
struct SendCutoffTests {
    @Test("the cutoff leaves 5 s of the drain to record and stop, half of a drain under 10 s")
    func cutoff() {
        #expect(DeliveryWorker.shutdownCutoff(drain: .seconds(30)) == .seconds(25))
        #expect(DeliveryWorker.shutdownCutoff(drain: .seconds(10)) == .seconds(5))
        #expect(DeliveryWorker.shutdownCutoff(drain: .seconds(4)) == .seconds(2))
        #expect(DeliveryWorker.shutdownCutoff(drain: .seconds(1)) == .milliseconds(500))
    }

    @Test("a waiter returns once the cutoff is set and has passed; a cancelled one returns false")
    func passed() async {
        let cutoff = SendCutoff()
        let waiting = Task { await cutoff.passed() }
        let cancelled = Task { await cutoff.passed() }
        cancelled.cancel()
        #expect(await cancelled.value == false)
        let set = ContinuousClock.now + .milliseconds(100)
        cutoff.set(set)
        cutoff.set(ContinuousClock.now + .seconds(60))  // the first one stays
        #expect(cutoff.instant == set)
        #expect(await waiting.value)
        #expect(ContinuousClock.now >= set)
        #expect(await cutoff.passed())
    }
}
