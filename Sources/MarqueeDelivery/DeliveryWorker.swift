import Crypto
import Foundation
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient
import Synchronization

/// `marquee worker`: claims due deliveries in batches, composes each push from the instance's current state, sends
/// them concurrently over pooled HTTP/2 connections, and records the results in batches.
///
/// Woken by LISTEN/NOTIFY (one notification per committed batch of API writes), with a polling fallback. A claim locks
/// its rows for as long as the worker sends them (`DeliveryQueue.claim`): a crashed worker's session ends and its
/// claims are due again at once (at-least-once delivery; duplicates bounded by what it held: `loops` batches and two
/// express claims). On `beginShutdown()` (SIGTERM, through the service group's graceful shutdown) it stops claiming,
/// finishes and records what it holds, and returns within `drainTimeout`: sends still in flight near its end are
/// recorded as retries, as at their deadline. Nothing it holds is cancelled. Cancellation stops it at once (its
/// claims roll back, other workers take the deliveries over).
public final class DeliveryWorker: Sendable {
    public struct Configuration: Sendable {
        /// Identifies this worker in its logs.
        public var workerID: String
        /// Deliveries per claim. Default 256.
        public var batchSize: Int
        /// Claim–send–record loops running at once. Default 2.
        public var loops: Int
        /// The express lanes' claim size: when a notification arrives while every loop is busy with its batch, a claim
        /// of at most this many (an equal share per tenant with due deliveries, no top-up) goes out at once, so what
        /// was just queued does not wait for a loop to finish. Default 16; 0: no express lanes.
        public var expressBatch: Int
        /// The longest a claim is held: sends get three quarters of it, and PostgreSQL ends a worker that keeps its
        /// claim open longer (stuck), which releases the claim's rows. Default 60 s.
        public var hold: Duration
        /// Longest sleep between claims without a notification. Default 1 s.
        public var pollInterval: Duration
        /// Backoff for retryable failures.
        public var retryPolicy: RetryPolicy
        /// The channel the API notifies. Default `marquee_deliveries`.
        public var channel: String
        /// How long `run()` may take to return once `beginShutdown()` is called (`MARQUEE_DRAIN_TIMEOUT`): sends
        /// still in flight at `shutdownCutoff(drain:)` are recorded as retries (reason `shutdown`) and their provider
        /// connections closed, so that what the worker holds is recorded and committed in time, whatever `hold`
        /// allows a send. Default 30 s.
        public var drainTimeout: Duration

        public init(
            workerID: String, batchSize: Int = 256, loops: Int = 2, expressBatch: Int = 16,
            hold: Duration = .seconds(60),
            pollInterval: Duration = .seconds(1), retryPolicy: RetryPolicy = RetryPolicy(),
            channel: String = "marquee_deliveries", drainTimeout: Duration = .seconds(30)
        ) {
            self.workerID = workerID
            self.batchSize = batchSize
            self.loops = loops
            self.expressBatch = expressBatch
            self.hold = hold
            self.pollInterval = pollInterval
            self.retryPolicy = retryPolicy
            self.channel = channel
            self.drainTimeout = drainTimeout
        }
    }

    let configuration: Configuration
    let queue: DeliveryQueue
    let listener: PostgresListener
    let apns: APNsProvider
    let fcm: FCMProvider
    let keyRing: SealingKeyRing
    let logger: Logger
    let metrics: WorkerMetrics
    let queueGauges: QueueGauges
    let wakeup = Wakeup()
    /// Woken by notifications only (not by a loop finding more), for the express lane.
    let expressWakeup = Wakeup()
    /// Claim loops waiting for work: while one is, a notification is theirs and the express lane stays out.
    let idleLoops = Atomic<Int>(0)
    /// The tenants each loop's last claim found with a backlog (they filled their share of a full batch): the loops
    /// serve them, the express lane leaves them out.
    let backlogged = Mutex<[Int: Set<UUID>]>([:])
    /// Express claims whose slow sends (a tenant's endpoint taking its time) finish in the background, so that the
    /// lane goes on; past `maxExpressLate` the lane waits for them.
    let expressLate = Atomic<Int>(0)
    /// Sends still out after their claim committed (`LateSends`), by tenant and by the loop that claimed them.
    let stragglers = Mutex(Stragglers())
    /// Signalled when a claim's late sends are recorded: a loop whose room they filled may claim again.
    let lateRecorded = Wakeup()
    /// Deliveries this worker's claims hold (their transactions open): its other claims skip them by ID.
    let inHand = Mutex<Set<UUID>>([])
    /// Set by `beginShutdown()`: the loops stop claiming.
    let stopping = Atomic<Bool>(false)
    /// Set by `beginShutdown()`: when the sends still in flight are given up.
    let cutoff = SendCutoff()
    /// The providers' connections closing, once (`closeProviders`).
    let providersClosed = Mutex<Task<Void, Never>?>(nil)
    /// When each claim loop, express lane and the campaign runner last finished an iteration (`stalledLoops`). The
    /// campaign runner's iteration may take as long as its audience statement on top
    /// (`CampaignRunner.longestStatement`, 15 minutes): a start's first step resolves the whole audience in one
    /// statement, and a worker restarted while it runs would leave the start to the next worker, to be restarted in
    /// turn.
    let heartbeats = Heartbeats(allowances: [DeliveryWorker.campaignsLoop: CampaignRunner.longestStatement])
    /// The campaign runner's name among the loops.
    static let campaignsLoop = "campaigns"
    let credentials: CredentialCache
    /// Campaign starts and campaign-wide changes, run when due (woken by the same notifications).
    let campaigns: CampaignRunner
    let campaignWakeup = Wakeup()

    public init(
        pool: PostgresPool, listenerConfiguration: PostgresConfiguration, apns: APNsProvider, fcm: FCMProvider,
        keyRing: SealingKeyRing, configuration: Configuration, metrics: MetricsRegistry, logger: Logger
    ) {
        self.fcm = fcm
        self.configuration = configuration
        self.queue = DeliveryQueue(pool: pool)
        self.campaigns = CampaignRunner(database: TenantDatabase(pool: pool), notifyChannel: configuration.channel)
        self.listener = PostgresListener(listenerConfiguration, channels: [configuration.channel])
        self.apns = apns
        self.keyRing = keyRing
        self.logger = logger
        self.metrics = WorkerMetrics(registry: metrics)
        self.queueGauges = QueueGauges(metrics: self.metrics, registry: metrics)
        self.credentials = CredentialCache(queue: queue, keyRing: keyRing, apns: apns, fcm: fcm)
        let apns = self.apns
        let workerMetrics = self.metrics
        metrics.onCollect {
            let s = apns.statistics
            workerMetrics.connections.set(Double(s.connections), ["apns"])
            workerMetrics.streams.set(Double(s.streams), ["apns"])
            let f = fcm.statistics
            workerMetrics.connections.set(Double(f.connections), ["fcm"])
            workerMetrics.streams.set(Double(f.streams), ["fcm"])
        }
    }

    /// Stops claiming and campaign runs; `run()` returns once what is in hand is sent and recorded, or recorded as
    /// retries when its sends are still in flight at the drain's cutoff.
    public func beginShutdown() {
        cutoff.set(ContinuousClock.now + Self.shutdownCutoff(drain: configuration.drainTimeout))
        stopping.store(true, ordering: .releasing)
        wakeup.signal()
        expressWakeup.signal()
        campaignWakeup.signal()
    }

    /// Whether the loops should go on: no shutdown begun, not cancelled.
    var running: Bool { !stopping.load(ordering: .acquiring) && !Task.isCancelled }

    /// The loops (claim loops, express lanes, campaign schedules) that have not finished an iteration for longer than
    /// `bound` (the campaign runner: `bound` plus its longest statement), longest first, with how long it has been:
    /// empty while the worker is live, and once it is stopping. A claim loop's iteration takes at most about the
    /// claim's hold plus the poll interval; one stuck far longer (a claim waiting forever on a dead connection)
    /// delivers nothing until the process is restarted.
    public func stalledLoops(after bound: Duration) -> [(loop: String, since: Duration)] {
        guard !stopping.load(ordering: .acquiring) else { return [] }
        return heartbeats.stalled(after: bound)
    }

    /// Runs until `beginShutdown()` (or cancellation), then drains.
    public func run() async throws {
        // Children say whether they were a claim loop: the drain waits for those, not for whichever tasks end first
        // (the campaign runner also returns at shutdown, and cancelling a loop that is still draining would end its
        // waits early).
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await self.listener.run()
                return false
            }
            group.addTask {
                // A notification wakes one idle claimer, not all: a commit's few rows are one claim's, and every
                // other claimer woken would only find them taken (at a steady 1,000 updates/s, most claims came
                // back empty). A claimer that found something looks again, and a full claim wakes the others.
                for await _ in self.listener.notifications {
                    self.wakeup.signalOne()
                    self.expressWakeup.signalOne()
                    self.campaignWakeup.signal()
                }
                return false
            }
            group.addTask {
                await self.sampleQueue()
                return false
            }
            group.addTask {
                await self.runCampaignSchedules()
                return false
            }
            for index in 0..<configuration.loops {
                group.addTask {
                    await self.loop(index)
                    return true
                }
            }
            // The express lanes run ahead of the loops' sends in this process (a higher task priority: their sends'
            // tasks inherit it), so what they claimed is not queued behind a batch of 256 for the cooperative threads.
            let expressLanes = configuration.expressBatch > 0 ? Self.expressLanes : 0
            for index in 0..<expressLanes {
                group.addTask(priority: .high) {
                    await self.expressLane(index)
                    return true
                }
            }
            var drained = 0
            while drained < configuration.loops + expressLanes, let wasLoop = try await group.next() {
                if wasLoop { drained += 1 }
            }
            // Every loop has drained; stop the listener and the sampler.
            group.cancelAll()
            while (try? await group.next()) != nil {}
        }
        // Closed already if sends were still out at the cutoff; requests still open at it are not waited for.
        await closeProviders()
        logger.info("worker stopped", metadata: ["worker.id": .string(configuration.workerID)])
    }

    /// A claim's or late results' settle that failed three times after their records committed: only what follows a
    /// push (instances marked active, dead tokens retired) is missing.
    func logSettleFailure(_ failure: DeliveryQueue.SettleFailure) {
        logger.warning(
            "settle failed: instances reached may stay pending, tokens called dead stay active",
            metadata: ["error": .string(failure.reason)])
    }

    /// One claim–send–record loop. Returns when cancelled, after finishing the batch in hand.
    func loop(_ index: Int) async {
        let name = "loop \(index)"
        heartbeats.beat(name)
        defer { heartbeats.end(name) }
        // Whether the loop's last claim came back full: it is draining a backlog.
        var draining = false
        while running {
            defer { heartbeats.beat(name) }
            // The loop's earlier claims' sends still out take their room in its batch: what a worker holds stays
            // within `loops` batches (and the express lanes' claims), however slow an endpoint is.
            let limit = configuration.batchSize - stragglers.withLock { $0.byLoop[index, default: 0] }
            guard limit > 0 else {
                // Busy (not idle: a notification is the express lanes') until some of them are recorded.
                await lateRecorded.wait(timeout: configuration.pollInterval)
                continue
            }
            // Draining, the loop leaves what was queued moments ago to the express lane, which the notification of
            // its commit woke (no loop was idle to take it). Otherwise (it woke, or the queue ran short) it takes
            // everything: the express lane only claims while every loop is busy.
            let spare = draining && configuration.expressBatch > 0
            guard let claimed = await claimOnce(limit: limit, lane: .loop(index, spareFresh: spare)) else {
                draining = false
                continue
            }
            draining = claimed == limit
            if claimed == 0 {
                idleLoops.wrappingAdd(1, ordering: .relaxed)
                await wakeup.wait(timeout: configuration.pollInterval)
                idleLoops.wrappingSubtract(1, ordering: .relaxed)
                continue
            }
            if claimed == limit { wakeup.signal() }  // more is likely waiting
        }
        // Draining: the sends this loop left to finish in the background are recorded before the worker returns.
        while stragglers.withLock({ $0.byLoop[index, default: 0] }) > 0 && !Task.isCancelled {
            await lateRecorded.wait(timeout: .milliseconds(100))
        }
    }

    /// Who claims: a claim loop (which may spare fresh rows for the express lane), or the express lane.
    enum Lane {
        case loop(Int, spareFresh: Bool)
        case express
    }

    /// How long the loops leave a tenant's freshly queued rows to the express lane (from the row's due time, which is
    /// its API transaction's start): past it they claim them as usual, so nothing depends on the lane.
    static let expressWindow = Duration.seconds(1)
    /// Express lanes per worker: a notification goes to a lane that is waiting, so one lane's claim in flight (its
    /// sends, record and commit) does not hold back the next.
    static let expressLanes = 2
    /// Express claims whose slow sends may finish in the background at once (`expressLate`).
    static let maxExpressLate = 4

    /// The express lane: a loop's batch takes a claim, its sends and its record (tens of milliseconds, up to half a
    /// second for a slow endpoint, longer while a slow endpoint's sends fill the loop's room), and what is queued
    /// meanwhile waits for the next claim. When a notification comes while no loop
    /// is idle, this claims at once, `expressBatch` at most, shared equally by the tenants with due deliveries that
    /// the loops did not just find with a backlog, and not topped up: another tenant's single update goes out while
    /// one tenant's backlog keeps the loops busy, and the lane's claim does not walk that backlog's held rows. Returns
    /// when the worker stops (after finishing the claim in hand).
    func expressLane(_ index: Int) async {
        let name = "express \(index)"
        heartbeats.beat(name)
        defer { heartbeats.end(name) }
        while running {
            defer { heartbeats.beat(name) }
            await expressWakeup.wait(timeout: configuration.pollInterval)
            guard running, idleLoops.load(ordering: .relaxed) == 0 else { continue }
            guard let claimed = await claimOnce(limit: configuration.expressBatch, lane: .express), claimed > 0
            else { continue }
            // More may be waiting, and what it recorded may let a later version of the same token go (held back
            // while this one was in flight, with no notification of its own): look again, as a loop does after its
            // own claim — the loops if one is idle, else a lane (without this, such an update waited for the poll).
            lookAgain()
        }
        // Draining: the slow sends left to finish in the background are recorded before the worker returns.
        while expressLate.load(ordering: .relaxed) > 0 && !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Wakes every waiting claimer: after a lane's claim, what it recorded may let a held-back version go.
    func lookAgain() {
        wakeup.signal()
        expressWakeup.signal()
    }

    /// Connections a worker's pool needs: two per claimer (each loop and express lane: its claim's session, and a
    /// statement beside it) and two more (the queue sampler, the campaign runner).
    public static func poolConnections(loops: Int, expressBatch: Int) -> Int {
        max(4, (loops + (expressBatch > 0 ? expressLanes : 0)) * 2 + 2)
    }

    /// Claims up to `limit` for `lane`, sends and records them. Returns how many were claimed, or nil when the claim
    /// failed (after a short pause; its deliveries are due again).
    @discardableResult
    func claimOnce(limit: Int, lane: Lane) async -> Int? {
        var loop: Int?
        var spare: FreshRows?
        if case .loop(let index, let spareFresh) = lane {
            loop = index
            if spareFresh { spare = FreshRows(window: Self.expressWindow, except: backlogUnion()) }
        }
        var late: LateSends?
        var claimedIDs: [UUID] = []
        // Once the claim committed (or failed), its rows are no longer held (slow sends are leased, not due).
        defer { inHand.withLock { $0.subtract(claimedIDs) } }
        var claimed: Int
        do {
            // This worker's other claims are skipped by a filter rather than by failed lock attempts.
            let held = inHand.withLock { Array($0) }
            // Tenants with sends still out of an earlier claim (their endpoint is slow) wait until those are recorded:
            // an endpoint that never answers would otherwise have a share of every claim, each out until its deadline.
            let slow = stragglers.withLock { Set($0.byTenant.keys) }
            claimed = try await queue.claim(
                limit: limit, hold: configuration.hold,
                excludingTenants: loop == nil ? backlogUnion().union(slow) : slow,
                skipping: held, topUp: loop != nil, sparing: spare,
                unreadable: unreadable
            ) { batch in
                if let loop {
                    let found = Self.backlogged(batch.map(\.tenantID), limit: limit)
                    self.backlogged.withLock { $0[loop] = found }
                }
                claimedIDs = batch.map(\.id)
                self.inHand.withLock { $0.formUnion(claimedIDs) }
                self.metrics.claimed.inc(Double(batch.count), [loop == nil ? "express" : "loop"])
                for d in batch { self.metrics.inFlight.add(1, [d.provider.rawValue]) }
                // Shutdown is not cancellation: what was claimed is sent and recorded before the loop looks again.
                let sending = await self.send(batch)
                late = sending.late
                return sending.results
            }
        } catch let failure as DeliveryQueue.SettleFailure {
            logSettleFailure(failure)
            claimed = failure.claimed
        } catch {
            // Nothing of a failed claim was recorded: its deliveries are due again (at-least-once).
            logger.warning("claim failed", metadata: ["error": .string(String(describing: error))])
            await late?.finish()
            // A claim stopped by its statement timeout was planned on stale statistics (a burst just queued):
            // refresh them now rather than at the next tick, so the next claim is planned on the burst.
            if (try? await queue.refreshStatistics()) == true { logger.info("queue statistics refreshed") }
            try? await Task.sleep(for: .milliseconds(500))
            return nil
        }
        if claimed == 0, let loop { backlogged.withLock { $0[loop] = nil } }
        // The slow ones (a tenant's endpoint taking its time) finish after the claim committed the others: in the
        // background for a loop (they hold its room until recorded) and for a few express claims; past those, the
        // express lane waits for them here.
        if let late {
            let tenants = late.still.map(\.tenantID)
            let owner = loop
            stragglers.withLock { $0.add(tenants, loop: owner) }
            if owner != nil {
                Task { await self.record(late, tenants: tenants, loop: owner) }
            } else if expressLate.wrappingAdd(1, ordering: .relaxed).newValue <= Self.maxExpressLate {
                Task {
                    await self.record(late, tenants: tenants, loop: nil)
                    self.expressLate.wrappingSubtract(1, ordering: .relaxed)
                }
            } else {
                expressLate.wrappingSubtract(1, ordering: .relaxed)
                await record(late, tenants: tenants, loop: nil)
            }
        }
        return claimed
    }

    /// Claimed rows that could not be read, recorded failed by their claim: logged and counted as failed deliveries.
    func unreadable(_ rows: [UnreadableDelivery]) {
        for d in rows {
            metrics.deliveries.inc(
                1,
                [
                    d.provider?.rawValue ?? "unknown", d.operation?.rawValue ?? "unknown", "failed",
                    DeliveryReason.metricLabel(UnreadableDelivery.reason),
                ])
            logger.error(
                "delivery unreadable: recorded failed",
                metadata: [
                    "tenant.id": .string(d.tenantID.uuidString.lowercased()),
                    "delivery.id": .string(d.id.uuidString.lowercased()), "error": .string(d.error),
                ])
        }
    }

    /// Waits for a claim's late sends and records them; then their room and their tenants are free again.
    private func record(_ late: LateSends, tenants: [UUID], loop: Int?) async {
        await late.finish()
        stragglers.withLock { $0.remove(tenants, loop: loop) }
        lateRecorded.signal()
        // Recorded now: a later version they held back may go, and their tenants may be claimed again.
        lookAgain()
    }

    /// Sends still out after their claim committed: how many per tenant (those tenants are left out of claims until
    /// they are recorded) and per claim loop (they take room in its next batches).
    struct Stragglers {
        var byTenant: [UUID: Int] = [:]
        var byLoop: [Int: Int] = [:]

        mutating func add(_ tenants: [UUID], loop: Int?) {
            for tenant in tenants { byTenant[tenant, default: 0] += 1 }
            if let loop { byLoop[loop, default: 0] += tenants.count }
        }

        mutating func remove(_ tenants: [UUID], loop: Int?) {
            for tenant in tenants {
                let left = byTenant[tenant, default: 1] - 1
                byTenant[tenant] = left > 0 ? left : nil
            }
            if let loop {
                let left = byLoop[loop, default: 0] - tenants.count
                byLoop[loop] = left > 0 ? left : nil
            }
        }
    }

    /// The tenants any loop's last claim found with a backlog.
    func backlogUnion() -> Set<UUID> {
        backlogged.withLock { $0.values.reduce(into: Set<UUID>()) { $0.formUnion($1) } }
    }

    /// The tenants of a claimed batch (one entry per delivery) with a backlog: in a full batch, those that got at least
    /// an equal share (each tenant due is offered one, and what some leave unused goes to the others). A short batch
    /// took everything due.
    static func backlogged(_ batch: [UUID], limit: Int) -> Set<UUID> {
        guard batch.count >= limit else { return [] }
        var counts: [UUID: Int] = [:]
        for tenant in batch { counts[tenant, default: 0] += 1 }
        let share = max(1, limit / counts.count)
        return Set(counts.filter { $0.value >= share }.keys)
    }

    typealias Outcome = (DeliveryResult, TokenRetirement?, BrokenCredential?)

    /// Runs due campaign schedules one at a time until none is due, then waits for a notification or the poll
    /// interval. Returns when cancelled (after the claim loops drained): a run in progress is cancelled with it, its
    /// statement too, and rolls back (each run is one transaction, and records its progress when it commits).
    func runCampaignSchedules() async {
        var lastFinalize = ContinuousClock.now
        // Schedules found busy since the last wake-up (their campaign is being written by another run): skipped until
        // the next notification (that run's commit sends one) or the poll interval, so this worker runs other
        // schedules meanwhile — the next change's broadcast first of all — instead of waiting for the write.
        var busy: [UUID] = []
        heartbeats.beat(Self.campaignsLoop)
        defer { heartbeats.end(Self.campaignsLoop) }
        while running {
            defer { heartbeats.beat(Self.campaignsLoop) }
            // Every 30 s: campaigns that are over are stored as ended (cheap reads of them from then on).
            if ContinuousClock.now - lastFinalize > .seconds(30) {
                lastFinalize = ContinuousClock.now
                if let ended = try? await campaigns.finalize(), ended > 0 {
                    logger.info("campaigns ended", metadata: ["campaigns.ended": .int(ended)])
                }
            }
            do {
                let started = ContinuousClock.now
                if let run = try await campaigns.runDue(skipping: busy) {
                    let elapsed = ContinuousClock.now - started
                    metrics.campaignRuns.inc(labels: run.operation, run.state)
                    if run.state == "busy" {
                        busy.append(run.scheduleID)
                        continue
                    }
                    logger.info(
                        "campaign schedule ran",
                        metadata: [
                            "tenant.id": .string(run.tenantID.uuidString.lowercased()),
                            "campaign.id": .string(run.campaignID),
                            "schedule.id": .string(run.scheduleID.uuidString.lowercased()),
                            "schedule.operation": .string(run.operation), "schedule.state": .string(run.state),
                            "duration.ms": .double(
                                Double(elapsed.components.attoseconds) / 1e15
                                    + Double(elapsed.components.seconds) * 1000),
                            "result": .string(run.result.serialized()),
                        ])
                    wakeup.signal()  // its deliveries are due
                    continue
                }
            } catch  where !running {
                // Cancelled by the drain (its step rolled back): another worker runs it from the last step committed.
                logger.info("campaign schedule run stopped by shutdown", metadata: ["error": .string("\(error)")])
                break
            } catch {
                metrics.campaignRuns.inc(labels: "unknown", "error")
                logger.warning("campaign schedule run failed", metadata: ["error": .string(String(describing: error))])
                try? await Task.sleep(for: .seconds(1))
            }
            await campaignWakeup.wait(timeout: configuration.pollInterval)
            busy.removeAll()
        }
    }

    /// How long one delivery may take, everything included (credential and token fetch, send, refresh, resend):
    /// three quarters of the claim's hold, so that its result is recorded while the claim still holds.
    static func sendDeadline(hold: Duration) -> Duration { hold * 3 / 4 }

    /// How long after shutdown begins the sends still in flight are given up (recorded as retries, their requests'
    /// connections closed): the drain timeout less what recording them and stopping take, 5 s (half of a drain
    /// shorter than 10 s). A send's own deadline (`sendDeadline`) is usually longer than the drain.
    static func shutdownCutoff(drain: Duration) -> Duration { drain - min(.seconds(5), drain / 2) }

    /// Waits until a batch's sends end: at its deadline (`deadline` after now, the reason `deadline`) or at the
    /// shutdown cutoff (`shutdown`), whichever comes first; nil when cancelled (every send finished first). At the
    /// cutoff it returns once the providers' connections are closed (`closeProviders`): the sends still out are then
    /// recorded as retries, which another worker may send, so none of their requests may still be open, nor start
    /// after (a token exchange answered late, then the push). Their deadline's own guarantee is the same
    /// (`ProviderConnections.send(by:)`).
    func sendsEnd(after deadline: Duration) async -> String? {
        let first = await withTaskGroup(of: String?.self) { group in
            group.addTask {
                do { try await Task.sleep(for: deadline) } catch { return nil }
                return DeliveryReason.deadline
            }
            group.addTask { await self.cutoff.passed() ? DeliveryReason.shutdown : nil }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        if first == DeliveryReason.shutdown { await closeProviders() }
        return Task.isCancelled ? nil : first
    }

    /// Closes both providers' connections, once, for every caller: at the cutoff (when shutdown began) requests still
    /// open fail at once, and none is sent after (`ProviderConnections.shutdown`); without a shutdown (cancelled) they
    /// finish first.
    func closeProviders() async {
        let closing = providersClosed.withLock { closing in
            if let closing { return closing }
            let (apns, fcm, at) = (self.apns, self.fcm, cutoff.instant)
            let task = Task {
                await apns.shutdown(by: at)
                await fcm.shutdown(by: at)
            }
            closing = task
            return task
        }
        await closing.value
    }

    /// How long a claim waits for its slowest sends before it commits the others' results and leaves the rest to
    /// finish on their own (`LateSends`, recorded in the background): a slow endpoint holds back only its own
    /// deliveries. Until they are recorded they take room in their loop's batches, and their tenants are left out of
    /// this worker's claims (`Stragglers`).
    static let straggleAfter = Duration.milliseconds(500)

    /// Deliveries of a claim still being sent when it committed, recorded when they finish. It keeps the iterator the
    /// claim read the finished ones from: an AsyncStream ends when its iterator is dropped.
    final class LateSends {
        let worker: DeliveryWorker
        var iterator: AsyncStream<Outcome>.Iterator
        /// The deliveries still being sent, as the claim read them (their lease included).
        let still: [ClaimedDelivery]

        init(worker: DeliveryWorker, iterator: AsyncStream<Outcome>.Iterator, still: [ClaimedDelivery]) {
            self.worker = worker
            self.iterator = iterator
            self.still = still
        }

        /// Waits for the remaining sends (each ends by the batch's deadline) and records them.
        func finish() async {
            var outcomes: [Outcome] = []
            while outcomes.count < still.count, let outcome = await iterator.next() { outcomes.append(outcome) }
            outcomes = await worker.settleBroken(outcomes, of: still)
            let late = ClaimResults(results: outcomes.map(\.0), retirements: outcomes.compactMap(\.1))
            do {
                try await worker.queue.recordLate(late, claimed: still)
            } catch let failure as DeliveryQueue.SettleFailure {
                worker.logSettleFailure(failure)
            } catch {
                // Their lease runs out and they are sent again (at-least-once).
                worker.logger.warning("recording late results failed", metadata: ["error": .string("\(error)")])
            }
            worker.countSettled(outcomes, of: still)
        }
    }

    /// Sends a claimed batch concurrently. Returns the results to commit with the claim once every send finished, or
    /// after `straggleAfter` with the ones finished so far; the rest are then leased to this worker (until the
    /// claim's hold ends by the database's clock: `ClaimedDelivery.lease`) and handed back as `late`.
    func send(_ batch: [ClaimedDelivery]) async -> (results: ClaimResults, late: LateSends?) {
        // One timer for the batch's deadline, not one per delivery: a cancelled `Task.sleep` leaves its sleeping task
        // (about 1.2 KiB) queued until the sleep would have ended, so a timer per send kept 45 s of sends' worth of
        // them alive (60 MiB of a worker's RSS after 50,000 pushes).
        // The timer is cancelled once every send finished: a sleeping task keeps what its closure captured (here the
        // batch's deadline table) until it ends, and a batch's deadline is 45 s away by default.
        let deadline = SendDeadline<ClaimedDelivery, Outcome>()
        let sendDeadline = Self.sendDeadline(hold: configuration.hold)
        // The providers' requests end by it too (their timeouts cut to the time left): none is still open when the
        // deadline records a retry that another worker may send.
        let sendBy = ContinuousClock.now + sendDeadline
        // Shutdown may end the sends sooner: the drain's cutoff, which leaves time to record them.
        let deadlineTimer = Task {
            guard let reason = await self.sendsEnd(after: sendDeadline) else { return }
            deadline.expire { (self.retry($0, reason: reason, retryAfter: nil), nil, nil) }
        }
        let (stream, continuation) = AsyncStream.makeStream(of: Outcome.self)
        let (straggle, straggleContinuation) = AsyncStream.makeStream(of: Void.self)
        let remaining = Countdown(batch.count)
        for delivery in batch {
            // Each send's outcome goes to the stream once: from the send, or from the deadline if it passes first.
            let once = Once<Outcome> { outcome in
                continuation.yield(outcome)
                if remaining.decrement() == 0 {
                    deadlineTimer.cancel()
                    continuation.finish()
                    straggleContinuation.finish()
                }
            }
            send(delivery, once: once, within: deadline, by: sendBy)
        }
        let timer = Task {
            try? await Task.sleep(for: Self.straggleAfter)
            straggleContinuation.finish()
        }
        defer { timer.cancel() }
        for await _ in straggle {}
        // Every send finished, or it is time to commit what did: what is in the stream now is finished.
        var outcomes: [Outcome] = []
        var iterator = stream.makeAsyncIterator()
        let done = batch.count - remaining.value
        while outcomes.count < done, let outcome = await iterator.next() { outcomes.append(outcome) }
        outcomes = await settleBroken(outcomes, of: batch)
        countSettled(outcomes, of: batch)
        let finishedIDs = Set(outcomes.map(\.0.id))
        let still = batch.filter { !finishedIDs.contains($0.id) }
        let results = ClaimResults(
            results: outcomes.map(\.0), retirements: outcomes.compactMap(\.1),
            stillSending: still.map { ($0.tenantID, $0.instanceID, $0.id) })
        guard !still.isEmpty else { return (results, nil) }
        return (results, LateSends(worker: self, iterator: iterator, still: still))
    }

    /// Sends one delivery within the batch's `deadline`, its outcome to `once`; past the deadline the delivery is
    /// retried later (the request may still complete: at-least-once). The send runs unstructured so that a provider
    /// call that ignores cancellation cannot hold the batch, and with it every other tenant's results, past the
    /// deadline.
    func send(
        _ d: ClaimedDelivery, once: Once<Outcome>, within deadline: SendDeadline<ClaimedDelivery, Outcome>,
        by sendBy: ContinuousClock.Instant
    ) {
        guard let id = deadline.add(once, d) else {
            once.resume((retry(d, reason: DeliveryReason.deadline, retryAfter: nil), nil, nil))
            return
        }
        Task {
            let outcome = await self.send(d, by: sendBy)
            deadline.remove(id)
            once.resume(outcome)
        }
    }

    /// Marks the credentials the providers rejected broken (their tenants' queued deliveries park), before the
    /// outcomes that found them are recorded (as parked). Returns `outcomes` of `deliveries`, those whose credential
    /// the database says is proven (another worker's push got through since this one loaded it) as retired tokens.
    func settleBroken(_ outcomes: [Outcome], of deliveries: [ClaimedDelivery]) async -> [Outcome] {
        var proven: Set<BrokenCredential> = []
        for broken in Set(outcomes.compactMap(\.2)) {
            do {
                // The cache reloads the row either way: a rejected key that was replaced meanwhile is not marked
                // (its deliveries are recorded parked, and queued again at once as the stored credential is fine).
                credentials.invalidate(broken.tenant)
                switch try await queue.markCredentialBroken(
                    tenant: broken.tenant, provider: broken.provider, reason: broken.reason,
                    updatedAt: broken.credentialUpdatedAt, unlessProven: broken.untilProven)
                {
                case .marked: break
                case .unchanged: continue
                case .proven:
                    proven.insert(broken)
                    continue
                }
                metrics.credentialsBroken.inc(1, [broken.provider.rawValue])
                logger.error(
                    "credential rejected; the tenant's deliveries through this provider are paused until it is replaced",
                    metadata: [
                        "tenant.id": .string(broken.tenant.uuidString), "provider": .string(broken.provider.rawValue),
                        "provider.reason": .string(broken.reason),
                    ])
            } catch {
                logger.error("could not mark credential broken", metadata: ["error": .string("\(error)")])
            }
        }
        guard !proven.isEmpty else { return outcomes }
        let claimed = Dictionary(deliveries.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        return outcomes.map { outcome in
            guard let broken = outcome.2, proven.contains(broken), let d = claimed[outcome.0.id] else { return outcome }
            return retired(d, reason: broken.reason, unregisteredAt: nil, http: outcome.0.httpStatus)
        }
    }

    /// Counts finished deliveries (outcomes of `deliveries`) out of the in-flight gauge, their attempts in
    /// `marquee_deliveries_total` (and retries in `marquee_retries_total`), and the retirements among them. The one
    /// place an attempt is counted: each delivery's outcome reaches it once, whichever of its send, its deadline or
    /// the shutdown's cutoff came first, and after `settleBroken` has made it final.
    func countSettled(_ outcomes: [Outcome], of deliveries: [ClaimedDelivery]) {
        let claimed = Dictionary(deliveries.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        for outcome in outcomes {
            if let d = claimed[outcome.0.id] {
                metrics.inFlight.add(-1, [d.provider.rawValue])
                countAttempt(outcome.0, of: d)
            }
            if let retirement = outcome.1 {
                metrics.retired.inc(1, [retirement.kind == .fcm ? "fcm" : "apns", retirement.kind.rawValue])
            }
        }
    }

    struct BrokenCredential: Hashable, Sendable {
        var tenant: UUID
        var provider: PlannedDelivery.Provider
        var reason: String
        /// The rejected credential's `updated_at`, as loaded: only that row is marked broken, not a replacement.
        var credentialUpdatedAt: Date
        /// The reason blames the credential only until it has worked (`FCMErrorCode.blamesCredentialUntilProven`).
        var untilProven = false
    }

    /// Composes and sends one delivery, its provider requests ending by `sendBy`; returns its result.
    func send(_ d: ClaimedDelivery, by sendBy: ContinuousClock.Instant? = nil) async -> (
        DeliveryResult, TokenRetirement?, BrokenCredential?
    ) {
        let deliveryID = ULID(uuid: d.id).description
        // Made only when something is logged: most pushes log nothing, and this is a dictionary per push.
        var log: Logger {
            logger.with([
                "delivery.id": .string(deliveryID), "tenant.id": .string(d.tenantID.lowercasedString),
                "instance.id": .string(d.instanceID),
            ])
        }
        switch DeliveryGate.decide(
            event: d.operation, instanceEnded: d.instanceState == .ended, expiresAt: d.expiresAt, now: Date())
        {
        case .send: break
        case .instanceExpired: return (result(d, .failed, reason: "instance_expired"), nil, nil)
        case .instanceEnded: return (result(d, .superseded, reason: "instance_ended"), nil, nil)
        }
        let secret: [UInt8]
        do {
            secret = try await credentials.deliverySecret(d.tenantID)
        } catch {
            log.warning("delivery secret load failed", metadata: ["error": .string("\(error)")])
            return (retry(d, reason: "credential_load", retryAfter: nil), nil, nil)
        }
        // Composed from the delivery's own snapshot: a queued start keeps its alert even if an update came since.
        var content = DeliverySnapshot(
            attributes: d.attributes, contentState: d.contentState, options: d.options, timestamp: d.contentTimestamp
        ).content(
            event: d.operation, instanceID: d.instanceID, activityType: d.activityType,
            attributesType: d.profile.attributesType, profile: d.profile.payloadProfile,
            dateFields: d.profile.dateFields, now: Date())
        let attribution = DeliveryAttribution(
            deliveryID: deliveryID, deliveryToken: DeliveryTokens.make(deliveryID: deliveryID, secret: secret))

        let clock = ContinuousClock()
        let started = clock.now
        let outcome: SendOutcome
        let credentialUpdatedAt: Date
        let priority = d.options.apnsPriority(frequentUpdates: d.profile.frequentUpdates)
        switch d.provider {
        case .apns:
            let target: CredentialCache.APNs
            do {
                guard let found = try await credentials.apns(d.tenantID) else {
                    return (result(d, .failed, reason: "no_apns_credentials"), nil, nil)
                }
                target = found
            } catch {
                log.warning("credential load failed", metadata: ["error": .string("\(error)")])
                return (retry(d, reason: "credential_load", retryAfter: nil), nil, nil)
            }
            // A start of a channel-backed instance subscribes the new activity to the channel, on iPhones that can.
            // The channel is known at Apple for the app and in the environment it was created in only: a start sent
            // for another (the credential has moved since) could never be subscribed, and would leave an activity no
            // update reaches (`ChannelReach`).
            if d.tokenKind == .pushToStart, let channel = d.channel, channel.active,
                BroadcastSupport.supportsChannels(osVersion: d.deviceOSVersion)
            {
                if let reason = channel.reach(bundleID: target.bundleID, environment: target.environment).failureReason
                {
                    return (result(d, .failed, reason: reason), nil, nil)
                }
                content.inputPushChannel = channel.apnsChannelID
            }
            var push = APNsPush(
                token: d.token, topic: target.bundleID + ".push-type.liveactivity", priority: priority,
                expiration: Int64(d.expiresAt.timeIntervalSince1970), apnsID: d.id,
                payload: APNsPayload.bytes(content, attribution: attribution))
            if d.tokenKind == .channel {
                // One request for every device on the channel. Apple requires expiration 0 on a channel that
                // stores nothing.
                guard let channel = d.channel, channel.active, channel.apnsChannelID == d.token else {
                    return (result(d, .failed, reason: "channel_gone"), nil, nil)
                }
                push.broadcast = .init(bundleID: channel.bundleID, channelID: channel.apnsChannelID)
                if channel.storagePolicy == .none { push.expiration = 0 }
            }
            credentialUpdatedAt = target.updatedAt
            // A broadcast goes to its channel's environment, whatever the credential's is now; a key refused there
            // fails the broadcast alone when the channel is out of the credential's reach (`ChannelReach.judged`).
            let sent = await apns.send(
                push, to: target.target(environment: d.tokenKind == .channel ? d.channel?.environment : nil),
                by: sendBy)
            outcome =
                d.tokenKind == .channel
                ? d.channel?.reach(bundleID: target.bundleID, environment: target.environment).judged(sent) ?? sent
                : sent
        case .fcm:
            let tokens: FCMAccessTokens
            do {
                guard let found = try await credentials.fcm(d.tenantID) else {
                    return (result(d, .failed, reason: "no_fcm_credentials"), nil, nil)
                }
                (tokens, credentialUpdatedAt) = found
            } catch {
                log.warning("credential load failed", metadata: ["error": .string("\(error)")])
                return (retry(d, reason: "credential_load", retryAfter: nil), nil, nil)
            }
            let ttl = FCMMessage.ttlSeconds(
                event: content.event, staleDate: d.options.staleDate, expiresAt: d.expiresAt, now: Date())
            outcome = await fcm.send(
                token: d.token, data: FCMData.compose(content, attribution: attribution), ttlSeconds: ttl,
                collapseKey: FCMMessage.collapseKey(instanceID: d.instanceID), via: tokens, by: sendBy)
            // The credential's first accepted push proves it (a SENDER_ID_MISMATCH then blames the token): recorded
            // once per credential and process, for the other workers and the next start.
            if case .sent = outcome.decision, tokens.markProven() {
                do {
                    try await queue.markFCMCredentialProven(
                        tenant: d.tenantID, credentialUpdatedAt: credentialUpdatedAt)
                } catch {
                    log.warning("credential proof not recorded", metadata: ["error": .string("\(error)")])
                }
            }
        }
        metrics.sendLatency.observe(clock.now - started, [d.provider.rawValue])

        let http = outcome.httpStatus
        switch outcome.decision {
        case .sent(let providerID):
            if logger.isEnabled(.debug) { log.debug("sent", metadata: ["provider.id": .string(providerID ?? "")]) }
            var sent = result(d, .sent, providerID: providerID ?? d.id.lowercasedString, http: http ?? 200)
            if d.provider == .apns {
                sent.apnsPriority = priority
                metrics.apnsPushes.inc(1, [d.tenantID.lowercasedString, String(priority)])
            }
            return (sent, nil, nil)
        case .retireToken(let reason, let at):
            return retired(d, reason: reason, unregisteredAt: at, http: http)
        case .retry(let reason, let after):
            var retried = retry(d, reason: reason, retryAfter: after)
            retried.httpStatus = http
            return (retried, nil, nil)
        case .credentialBroken(let reason):
            // Parked, not failed: out of the queue until the credential is replaced (migration 0006's trigger).
            return (
                result(d, .parked, http: http, reason: reason), nil,
                BrokenCredential(
                    tenant: d.tenantID, provider: d.provider, reason: reason, credentialUpdatedAt: credentialUpdatedAt,
                    untilProven: d.provider == .fcm && FCMErrorCode(reason).blamesCredentialUntilProven)
            )
        case .refreshProviderToken(let reason):
            return (retry(d, reason: reason, retryAfter: nil), nil, nil)
        case .fail(let reason):
            log.warning("failed", metadata: ["provider.reason": .string(reason)])
            return (result(d, .failed, http: http, reason: reason), nil, nil)
        }
    }

    /// The outcome of a token the provider called dead: undeliverable (a channel: failed), the token to retire.
    func retired(_ d: ClaimedDelivery, reason: String, unregisteredAt at: Date?, http: Int?) -> Outcome {
        logger.info(
            d.tokenKind == .channel ? "channel gone" : "token retired",
            metadata: [
                "delivery.id": .string(ULID(uuid: d.id).description), "tenant.id": .string(d.tenantID.lowercasedString),
                "instance.id": .string(d.instanceID), "provider.reason": .string(reason),
            ])
        return (
            result(d, d.tokenKind == .channel ? .failed : .undeliverable, http: http, reason: reason),
            TokenRetirement(
                tenantID: d.tenantID, kind: d.tokenKind, deviceToken: d.deviceToken, token: d.token, reason: reason,
                unregisteredAt: at), nil
        )
    }

    /// One attempt's final result in `marquee_deliveries_total` (a retry as status `retry`, and in
    /// `marquee_retries_total`), and a push sent in the accept-to-sent histogram. Called by `countSettled` only.
    func countAttempt(_ r: DeliveryResult, of d: ClaimedDelivery) {
        let status = r.status == .queued ? "retry" : r.status.rawValue
        if r.status == .queued { metrics.retries.inc(1, [d.provider.rawValue]) }
        metrics.deliveries.inc(
            1, [d.provider.rawValue, d.operation.rawValue, status, DeliveryReason.metricLabel(r.reason)])
        if r.status == .sent {
            // Accept → sent, on the database's clock for the accept and this host's for the answer (never negative).
            metrics.acceptToSent.observe(max(0, Date().timeIntervalSince(d.createdAt)), [d.provider.rawValue])
        }
    }

    /// An attempt's result (counted once it is final: `countSettled`).
    func result(
        _ d: ClaimedDelivery, _ status: DeliveryResult.Status, providerID: String? = nil, http: Int? = nil,
        reason: String? = nil
    ) -> DeliveryResult {
        DeliveryResult(
            tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: status, providerID: providerID,
            httpStatus: http, reason: reason)
    }

    func retry(_ d: ClaimedDelivery, reason: String, retryAfter: Duration?) -> DeliveryResult {
        guard
            let delay = configuration.retryPolicy.delay(
                afterAttempts: d.attempts, counted: d.countedAttempts, retryAfter: retryAfter, reason: reason)
        else {
            return result(d, .failed, reason: DeliveryReason.gaveUp(after: d.countedAttempts, reason))
        }
        return DeliveryResult(
            tenantID: d.tenantID, id: d.id, instanceID: d.instanceID, status: .queued, reason: reason,
            retryDelay: delay)
    }

    /// Samples queue depth for the gauges every few seconds, and every few minutes removes idempotency records past
    /// their 24 hours (any worker may do it; the DELETE is idempotent).
    func sampleQueue() async {
        var ticks = 0
        // Idempotency records: a pass every five minutes (each reads the table: it has no index on their age), every
        // minute while a pass still found a backlog (a full slice or more).
        var nextExpiry = 0
        var failing = false
        while !Task.isCancelled {
            // Every second: the queue's statistics, fresh after a burst of enqueued deliveries, and those of the
            // tables the API's reads plan on, after a burst of starts or registrations.
            if let refreshed = try? await queue.refreshTickStatistics() {
                if refreshed.queue { logger.info("queue statistics refreshed") }
                if refreshed.tables > 0 {
                    logger.info("table statistics refreshed", metadata: ["tables.analysed": .int(refreshed.tables)])
                }
            }
            if ticks % 5 == 0 {
                let queue = self.queue
                if let error = await queueGauges.sample({ try await queue.statistics() }) {
                    if !failing {
                        logger.warning(
                            "queue depth sample failed; the queue gauges keep their last values",
                            metadata: ["error": .string(String(describing: error))])
                    }
                    failing = true
                } else {
                    if failing { logger.info("queue depth sampled again") }
                    failing = false
                }
            }
            if ticks >= nextExpiry {
                nextExpiry = ticks + 300
                do {
                    let removed = try await queue.expireIdempotencyKeys()
                    if removed > 0 {
                        logger.info("expired idempotency records removed", metadata: ["removed": .int(removed)])
                    }
                    if removed >= DeliveryQueue.idempotencySlice { nextExpiry = ticks + 60 }
                } catch {
                    logger.warning(
                        "expiring idempotency records failed; tried again in 5 minutes",
                        metadata: ["error": .string(String(describing: error))])
                }
            }
            ticks += 1
            try? await Task.sleep(for: .seconds(1))
        }
    }
}

/// The queue gauges a worker samples (`marquee_queue_due`, `marquee_queue_oldest_due_seconds`) and how fresh they are:
/// `marquee_queue_sample_age_seconds`, set at each scrape, is the time since the last successful sample (since the
/// gauges were made, before the first). A failed sample leaves the gauges as they were: without the age, a worker that
/// could not read the queue (PostgreSQL unreachable) showed its last healthy values, and no queue alert could fire.
final class QueueGauges: Sendable {
    private let metrics: WorkerMetrics
    private let now: @Sendable () -> ContinuousClock.Instant
    private let lastSample: Mutex<ContinuousClock.Instant>

    init(
        metrics: WorkerMetrics, registry: MetricsRegistry,
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.metrics = metrics
        self.now = now
        self.lastSample = Mutex(now())
        registry.onCollect { [self] in
            let age = self.now() - lastSample.withLock { $0 }
            metrics.queueSampleAge.set(age.inSeconds)
        }
    }

    /// Reads the statistics with `read` into the gauges; returns the error when it failed (the gauges unchanged).
    func sample(
        _ read: () async throws -> [PlannedDelivery.Provider: QueueStatistics]
    ) async -> (any Error)? {
        let byProvider: [PlannedDelivery.Provider: QueueStatistics]
        do {
            byProvider = try await read()
        } catch {
            return error
        }
        for (provider, stats) in byProvider {
            metrics.queueDue.set(Double(stats.due), [provider.rawValue])
            metrics.oldestDue.set(stats.oldestDueAge, [provider.rawValue])
            metrics.queueRateLimited.set(Double(stats.rateLimited), [provider.rawValue])
        }
        let sampled = now()
        lastSample.withLock { $0 = sampled }
        return nil
    }
}

/// The worker's metrics.
struct WorkerMetrics: Sendable {
    let deliveries: Counter
    let sendLatency: Histogram
    let streams: Gauge
    let connections: Gauge
    let queueDue: Gauge
    let oldestDue: Gauge
    let queueRateLimited: Gauge
    let queueSampleAge: Gauge
    let inFlight: Gauge
    let acceptToSent: Histogram
    let apnsPushes: Counter
    let retries: Counter
    let retired: Counter
    let claimed: Counter
    let credentialsBroken: Counter
    let campaignRuns: Counter

    init(registry: MetricsRegistry) {
        campaignRuns = registry.counter(
            "marquee_campaign_runs_total",
            help: "Campaign schedules run by this worker, by operation (start, update, end) and outcome (done, failed, "
                + "starting, changing and broadcast: a part of it ran; busy: its campaign was being written, skipped for now; "
                + "error: the run rolled back and will be retried).", labels: ["operation", "outcome"])
        deliveries = registry.counter(
            "marquee_deliveries_total", help: "Delivery attempts by provider, operation, outcome and reason.",
            labels: ["provider", "operation", "status", "reason"])
        sendLatency = registry.histogram(
            "marquee_send_duration_seconds", help: "Time from request sent to provider answer.", labels: ["provider"])
        streams = registry.gauge("marquee_inflight_streams", help: "HTTP/2 streams in flight.", labels: ["provider"])
        connections = registry.gauge(
            "marquee_open_connections", help: "Open HTTP/2 connections to providers.", labels: ["provider"])
        queueDue = registry.gauge(
            "marquee_queue_due",
            help: "Deliveries due (those being sent included), by provider; those of tenants sending at their own "
                + "send rate limit are in marquee_queue_rate_limited.", labels: ["provider"])
        oldestDue = registry.gauge(
            "marquee_queue_oldest_due_seconds", help: "Age of the oldest of marquee_queue_due, by provider.",
            labels: ["provider"])
        queueRateLimited = registry.gauge(
            "marquee_queue_rate_limited",
            help: "Deliveries due of tenants sending at their own send rate limit (more workers would not send them "
                + "sooner), by provider.", labels: ["provider"])
        queueSampleAge = registry.gauge(
            "marquee_queue_sample_age_seconds",
            help: "Seconds since this worker last read the queue's depth (marquee_queue_due, "
                + "marquee_queue_oldest_due_seconds; sampled every 5 s): those gauges are that old.")
        inFlight = registry.gauge(
            "marquee_queue_in_flight", help: "Deliveries this worker claimed and has not recorded yet, by provider.",
            labels: ["provider"])
        for provider in PlannedDelivery.Provider.allCases { inFlight.set(0, [provider.rawValue]) }
        apnsPushes = registry.counter(
            "marquee_apns_pushes_total",
            help: "APNs pushes sent, by tenant and apns-priority (Apple budgets high-priority updates per user).",
            labels: ["tenant_id", "priority"])
        acceptToSent = registry.histogram(
            "marquee_delivery_latency_seconds",
            help: "Time from the change accepted by the API to the provider's 2xx for its delivery (retries included).",
            labels: ["provider"], buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900])
        retries = registry.counter("marquee_retries_total", help: "Retries scheduled.", labels: ["provider"])
        retired = registry.counter(
            "marquee_tokens_retired_total", help: "Tokens retired after the provider called them dead.",
            labels: ["provider", "kind"])
        claimed = registry.counter(
            "marquee_deliveries_claimed_total",
            help: "Deliveries claimed by this worker, by lane (loop: the claim loops' batches; express: the express "
                + "lanes' small claims of what was just queued).", labels: ["lane"])
        credentialsBroken = registry.counter(
            "marquee_credentials_broken_total", help: "Credentials marked broken after the provider rejected them.",
            labels: ["provider"])
    }
}

/// Per-tenant credentials and delivery secrets, unsealed once and refreshed periodically.
final class CredentialCache: Sendable {
    struct APNs: Sendable {
        var target: APNsTarget
        var bundleID: String
        /// The credential's APNs environment, and its endpoint override (an operator's, for a simulator).
        var environment: String
        var endpoint: String?
        var updatedAt: Date
        var loadedAt: Date

        /// Where a push for something of `environment` goes (nil: the credential's). A broadcast channel lives in
        /// the environment it was created in, and Apple knows its ID there only; a team key signs for both (one
        /// limited to an environment is refused there: `ChannelReach`).
        func target(environment: String?) -> APNsTarget {
            guard let environment, environment != self.environment else { return target }
            return Self.target(environment: environment, endpoint: endpoint, tokens: target.tokens)
        }

        /// An unusable override (written around the API) gets no host: the provider refuses it as
        /// endpoint_not_allowed.
        static func target(environment: String, endpoint: String?, tokens: ProviderTokenCache) -> APNsTarget {
            let (host, port) = APNsTarget.endpoint(environment: environment, override: endpoint) ?? ("", 0)
            return APNsTarget(host: host, port: port, tokens: tokens)
        }
    }

    private let queue: DeliveryQueue
    private let keyRing: SealingKeyRing
    private let apnsEntries = Mutex<[UUID: APNs]>([:])
    private let fcmEntries = Mutex<[UUID: (tokens: FCMAccessTokens, updatedAt: Date, loadedAt: Date)]>([:])
    private let fcmProvider: FCMProvider
    private let apnsProvider: APNsProvider
    private let secrets = Mutex<[UUID: [UInt8]]>([:])
    /// How long a loaded credential is used before its row is read again (to notice replacements).
    private let ttl: TimeInterval = 30

    init(queue: DeliveryQueue, keyRing: SealingKeyRing, apns: APNsProvider, fcm: FCMProvider) {
        self.queue = queue
        self.keyRing = keyRing
        self.apnsProvider = apns
        self.fcmProvider = fcm
    }

    func invalidate(_ tenant: UUID) {
        _ = apnsEntries.withLock { $0.removeValue(forKey: tenant) }
        _ = fcmEntries.withLock { $0.removeValue(forKey: tenant) }
    }

    /// The tenant's FCM access tokens, and the `updated_at` of the credential row they were made from.
    func fcm(_ tenant: UUID) async throws -> (tokens: FCMAccessTokens, updatedAt: Date)? {
        let now = Date()
        if let cached = fcmEntries.withLock({ $0[tenant] }), now.timeIntervalSince(cached.loadedAt) < ttl {
            return (cached.tokens, cached.updatedAt)
        }
        guard let (info, sealed, proven) = try await queue.fcmCredential(tenant: tenant) else { return nil }
        if let cached = fcmEntries.withLock({ $0[tenant] }), cached.updatedAt == info.updatedAt {
            if proven { cached.tokens.markProven() }  // by another worker
            fcmEntries.withLock { $0[tenant] = (cached.tokens, cached.updatedAt, now) }
            return (cached.tokens, cached.updatedAt)
        }
        let json = try keyRing.open(sealed, associatedData: CredentialStore.context(tenant, "fcm"))
        guard let pem = try JSONValue.parse(json)["private_key"]?.stringValue else { return nil }
        let account = FCMAccount(
            projectID: info.projectID, clientEmail: info.clientEmail, privateKeyID: info.privateKeyID,
            tokenURI: info.tokenURI, endpoint: info.endpoint ?? "https://fcm.googleapis.com",
            key: try RS256PrivateKey(pem: pem))
        let tokens = fcmProvider.accessTokens(for: account)
        if proven { tokens.markProven() }
        fcmEntries.withLock { $0[tenant] = (tokens, info.updatedAt, now) }
        return (tokens, info.updatedAt)
    }

    func apns(_ tenant: UUID) async throws -> APNs? {
        let now = Date()
        if let cached = apnsEntries.withLock({ $0[tenant] }), now.timeIntervalSince(cached.loadedAt) < ttl {
            return cached
        }
        guard let (info, sealed) = try await queue.apnsCredential(tenant: tenant) else { return nil }
        if let cached = apnsEntries.withLock({ $0[tenant] }), cached.updatedAt == info.updatedAt {
            var refreshed = cached
            refreshed.loadedAt = now
            apnsEntries.withLock { $0[tenant] = refreshed }
            return refreshed
        }
        let pem = try keyRing.open(sealed, associatedData: CredentialStore.context(tenant, "apns"))
        // Tenants with the same key share its token: one token per key, as Apple asks.
        let tokens = try apnsProvider.tokenCaches.cache(teamID: info.teamID, keyID: info.keyID, pem: pem)
        let entry = APNs(
            target: APNs.target(environment: info.environment, endpoint: info.endpoint, tokens: tokens),
            bundleID: info.bundleID, environment: info.environment, endpoint: info.endpoint,
            updatedAt: info.updatedAt, loadedAt: now)
        apnsEntries.withLock { $0[tenant] = entry }
        return entry
    }

    func deliverySecret(_ tenant: UUID) async throws -> [UInt8] {
        if let secret = secrets.withLock({ $0[tenant] }) { return secret }
        guard let sealed = try await queue.sealedDeliverySecret(tenant: tenant) else {
            throw NotFound("tenant")
        }
        let secret = try keyRing.open(
            sealed, associatedData: TenantStore.deliverySecretContext(tenant))
        secrets.withLock { $0[tenant] = secret }
        return secret
    }
}

/// A value delivered once, by whichever of two callers comes first (a send or its deadline); later ones are ignored.
final class Once<Value: Sendable>: Sendable {
    private let deliver: Mutex<(@Sendable (Value) -> Void)?>

    init(_ deliver: @escaping @Sendable (Value) -> Void) { self.deliver = Mutex(deliver) }

    func resume(_ value: Value) {
        let deliver = self.deliver.withLock { d in
            defer { d = nil }
            return d
        }
        deliver?(value)
    }
}

/// One deadline shared by a batch of sends: when it passes (`expire`), every send still registered is resumed with the
/// value its key maps to; sends that finished first have removed themselves.
final class SendDeadline<Key: Sendable, Value: Sendable>: Sendable {
    private struct State {
        var expired = false
        var nextID = 0
        var waiting: [Int: (once: Once<Value>, key: Key)] = [:]
    }

    private let state = Mutex(State())

    /// Registers a waiting send; returns its ID, or `nil` when the deadline has passed already.
    func add(_ once: Once<Value>, _ key: Key) -> Int? {
        state.withLock { state in
            guard !state.expired else { return nil }
            state.nextID += 1
            state.waiting[state.nextID] = (once, key)
            return state.nextID
        }
    }

    /// The send finished before the deadline.
    func remove(_ id: Int) {
        _ = state.withLock { $0.waiting.removeValue(forKey: id) }
    }

    /// Sends still waiting (for tests).
    var waitingCount: Int { state.withLock { $0.waiting.count } }

    /// The deadline passed: resumes every send still waiting with `value(key)`, and refuses later ones.
    func expire(_ value: (Key) -> Value) {
        let waiting = state.withLock { state in
            state.expired = true
            defer { state.waiting = [:] }
            return Array(state.waiting.values)
        }
        for (once, key) in waiting { once.resume(value(key)) }
    }
}

/// When shutdown gives up the sends still in flight: unset until `beginShutdown()`, then fixed. Every batch's deadline
/// timer waits for it besides its own deadline.
final class SendCutoff: Sendable {
    private struct State {
        var at: ContinuousClock.Instant?
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = Mutex(State())

    /// The cutoff, once set.
    var instant: ContinuousClock.Instant? { state.withLock { $0.at } }

    /// Sets the cutoff (the first call only) and wakes who waits for it.
    func set(_ instant: ContinuousClock.Instant) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard state.at == nil else { return [] }
            state.at = instant
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns true once the cutoff has passed, false when cancelled first.
    func passed() async -> Bool {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.at != nil || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume()
        }
        guard let at = instant, !Task.isCancelled else { return false }
        do { try await Task.sleep(until: at, clock: .continuous) } catch { return false }
        return true
    }
}

/// When each of a worker's long-running loops last finished an iteration: one that has not for longer than a bound
/// (plus its allowance) is stuck.
final class Heartbeats: Sendable {
    private let now: @Sendable () -> ContinuousClock.Instant
    private let last = Mutex<[String: ContinuousClock.Instant]>([:])
    /// How much longer than the bound a loop's iteration may legitimately take (none when not named): the longest
    /// statement of its own that the bound does not cover.
    private let allowances: [String: Duration]

    init(
        allowances: [String: Duration] = [:], now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.allowances = allowances
        self.now = now
    }

    /// `loop` started, or finished an iteration.
    func beat(_ loop: String) {
        let instant = now()
        last.withLock { $0[loop] = instant }
    }

    /// `loop` returned: it is not stuck.
    func end(_ loop: String) {
        _ = last.withLock { $0.removeValue(forKey: loop) }
    }

    /// The loops whose last beat is older than `bound` plus their allowance, longest first.
    func stalled(after bound: Duration) -> [(loop: String, since: Duration)] {
        let instant = now()
        return last.withLock { last in
            last.map { ($0.key, instant - $0.value) }.filter { $0.1 > bound + (allowances[$0.0] ?? .zero) }
                .sorted { $0.1 > $1.1 }
        }
    }
}

/// A shared count down, from the tasks that finish a batch's sends.
final class Countdown: Sendable {
    private let count: Mutex<Int>

    init(_ count: Int) { self.count = Mutex(count) }

    /// Counts one down; returns what is left.
    func decrement() -> Int {
        count.withLock {
            $0 -= 1
            return $0
        }
    }

    var value: Int { count.withLock { $0 } }
}

/// Wakes waiting loops: `signal()` releases every current waiter, `signalOne()` one of them; `wait(timeout:)` returns
/// on a signal or timeout.
final class Wakeup: Sendable {
    private struct State {
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var pending = false
    }

    private let state = Mutex(State())

    func signal() {
        let waiters = state.withLock { state in
            if state.waiters.isEmpty { state.pending = true }
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// How many wait now.
    var waiting: Int { state.withLock { $0.waiters.count } }

    /// Releases one current waiter (the longest waiting), or the next to wait when none is waiting.
    func signalOne() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let id = state.waiters.keys.min() else {
                state.pending = true
                return nil
            }
            return state.waiters.removeValue(forKey: id)
        }
        waiter?.resume()
    }

    func wait(timeout: Duration) async {
        if state.withLock({ s in
            defer { s.pending = false }
            return s.pending
        }) {
            return
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: timeout) }
            group.addTask { await self.waitForSignal() }
            await group.next()
            group.cancelAll()
        }
    }

    private func waitForSignal() async {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume()
        }
    }
}
