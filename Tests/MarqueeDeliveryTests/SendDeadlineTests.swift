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
