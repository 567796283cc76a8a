import Testing

@testable import PostgresClient

@Suite("Pool state machine (no database)")
struct PoolStateMachineTests {
    typealias Machine = PoolStateMachine<String>

    func createsSlot(_ action: Machine.AcquireAction) -> Bool {
        if case .grant(.create) = action { return true }
        return false
    }

    @Test("opens up to the bound, then queues callers")
    func bounded() {
        var machine = Machine(maxConnections: 2)
        #expect(createsSlot(machine.acquire(waiter: 1)))
        #expect(createsSlot(machine.acquire(waiter: 2)))
        guard case .wait = machine.acquire(waiter: 3) else {
            Issue.record("third caller should wait")
            return
        }
        #expect(machine.open == 2)
        #expect(machine.waiters == [3])
    }

    @Test("released connections go to waiters in FIFO order")
    func fifoHandOff() {
        var machine = Machine(maxConnections: 1)
        _ = machine.acquire(waiter: 1)
        _ = machine.acquire(waiter: 2)
        _ = machine.acquire(waiter: 3)
        guard case .grant(waiter: 2, .connection("c", _)) = machine.release("c", idleSince: .now) else {
            Issue.record("waiter 2 should get the connection first")
            return
        }
        guard case .grant(waiter: 3, .connection("c", _)) = machine.release("c", idleSince: .now) else {
            Issue.record("then waiter 3")
            return
        }
        guard case .none = machine.release("c", idleSince: .now) else {
            Issue.record("then the connection goes idle")
            return
        }
        #expect(machine.idle.count == 1)
        guard case .grant(.connection("c", _)) = machine.acquire(waiter: 4) else {
            Issue.record("an idle connection is reused")
            return
        }
    }

    @Test("a discarded connection's slot goes to the next waiter as a new connection")
    func discardHandsSlotOn() {
        var machine = Machine(maxConnections: 1)
        _ = machine.acquire(waiter: 1)
        _ = machine.acquire(waiter: 2)
        guard case .grant(waiter: 2, .create) = machine.discard() else {
            Issue.record("waiter 2 should be told to connect")
            return
        }
        #expect(machine.open == 1)
        guard case .none = machine.discard() else {
            Issue.record("nobody waiting")
            return
        }
        #expect(machine.open == 0)
        #expect(createsSlot(machine.acquire(waiter: 3)))
    }

    @Test("timed-out waiters leave the queue; late removal is a no-op")
    func waiterRemoval() {
        var machine = Machine(maxConnections: 1)
        _ = machine.acquire(waiter: 1)
        _ = machine.acquire(waiter: 2)
        _ = machine.acquire(waiter: 3)
        let removed = machine.removeWaiter(2)
        let removedAgain = machine.removeWaiter(2)
        #expect(removed)
        #expect(!removedAgain)
        guard case .grant(waiter: 3, _) = machine.release("c", idleSince: .now) else {
            Issue.record("waiter 3 is next after 2 left")
            return
        }
    }

    @Test("idle connections are taken for health checks and reaping by age")
    func takeIdle() {
        var machine = Machine(maxConnections: 3)
        let start = ContinuousClock.now
        for id in 1...3 {
            _ = machine.acquire(waiter: id)
        }
        _ = machine.release("old", idleSince: start)
        _ = machine.release("new", idleSince: start + .seconds(10))
        let taken = machine.takeIdle(idleBefore: start + .seconds(5))
        #expect(taken.map(\.connection) == ["old"])
        #expect(machine.idle.map(\.connection) == ["new"])
        #expect(machine.open == 3)
    }

    @Test("closing fails waiters, closes idle connections and later returns")
    func closing() {
        var machine = Machine(maxConnections: 2)
        _ = machine.acquire(waiter: 1)
        _ = machine.acquire(waiter: 2)
        _ = machine.acquire(waiter: 3)
        _ = machine.release("a", idleSince: .now)  // goes to waiter 3
        _ = machine.release("b", idleSince: .now)  // goes idle
        let (idle, waiters) = machine.close()
        #expect(idle == ["b"])
        #expect(waiters.isEmpty)
        guard case .close("a") = machine.release("a", idleSince: .now) else {
            Issue.record("connections returned after close are closed")
            return
        }
        guard case .fail(let error) = machine.acquire(waiter: 4) else {
            Issue.record("acquire after close fails")
            return
        }
        #expect(error.code == .poolClosed)
        #expect(machine.open == 0)
    }
}
