import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// Runs due campaign schedules: starts and campaign-wide changes. Each run happens in the transaction that marks its
/// schedule done (or records how far it got), on a row claimed with `FOR UPDATE SKIP LOCKED`: whatever the number of
/// workers, a schedule runs exactly once, and a worker that dies mid-run leaves it to another (its work rolls back
/// with it).
///
/// A start writes its audience `chunk` members at a time (the first and the last `chunk` in smaller steps,
/// `stepSize`), one transaction each, in person order: each commits its instances and deliveries (so workers start
/// sending them while the next are written) and the position reached, on the schedule, which stays pending until the
/// last. Any worker continues from there. A campaign-wide change writes the campaign's open instances the same way,
/// `chunk` at a time in instance ID order.
public struct CampaignRunner: Sendable {
    let database: TenantDatabase
    let notifyChannel: String
    /// The lifetime of an instance whose campaign named no expiration.
    let lifetime: TimeInterval
    /// Members a start writes, or instances a campaign-wide change writes, per transaction.
    let chunk: Int

    public init(
        database: TenantDatabase, notifyChannel: String = "marquee_deliveries",
        lifetime: TimeInterval = Lifetime.maximum, chunk: Int = 10_000
    ) {
        self.database = database
        self.notifyChannel = notifyChannel
        self.lifetime = lifetime
        self.chunk = max(1, chunk)
    }

    /// The longest one statement of a run may legitimately take: a start's first step resolves its whole audience
    /// in one statement, under the bulk statement timeout. A run's other statements are under the usual one.
    public static var longestStatement: Duration { BulkStatements.statementTimeout }

    /// The phases a schedule records while partway (it stays pending): a start writing its audience, a channel
    /// change's first half done, a change writing its instances. One that has begun runs to the end: it is not
    /// cancelled (`CampaignStore.cancel`).
    public static let partwayPhases = ["starting", "broadcast", "changing"]

    /// Ends a run's transaction (PostgreSQL ends its session) once it has sat idle between two statements for as
    /// long as one statement may run (`statement_timeout`: `MARQUEE_DB_STATEMENT_TIMEOUT`; a minute when that is off):
    /// between its statements a run only computes. A worker that vanished mid-run without a word (its host
    /// partitioned away or paused, the process stopped) otherwise kept what the run holds (its schedule and campaign,
    /// up to a chunk of instances FOR UPDATE, the tenant's erasures) until PostgreSQL's TCP keepalives noticed, about
    /// two hours by default. For this transaction only, as the claims set theirs (`DeliveryQueue.claim`).
    static let idleLimit: PostgresQuery = """
        SELECT set_config('idle_in_transaction_session_timeout',
                          COALESCE(NULLIF(current_setting('statement_timeout'), '0'), '1min'), true)
        """

    /// A run's failure that is the campaign's, not the database's: recorded on the schedule, never retried.
    struct Refusal: Error {
        var reason: String
        var detail: String
    }

    /// A bulk write that cannot run yet (see `CampaignRun.state` `busy`); the run rolls back, nothing is written.
    struct Busy: Error {}

    /// Runs the oldest due schedule, if any; nil when none is due (or all due ones are being run by others).
    ///
    /// A campaign-wide change of a channel-backed campaign runs in two transactions, so that its broadcast is not
    /// held back by the bulk write: the first writes one instance and the broadcast, records that on the schedule
    /// (still pending) and commits; the second writes every other instance and marks the schedule done. A worker that
    /// dies between them leaves the schedule to another, which sees the first half recorded and runs the second.
    ///
    /// A start or a change in progress (`state` "starting" or "changing") returns after each chunk; calling again
    /// continues it.
    ///
    /// A bulk write never waits for another one of the same campaign: a run that finds its campaign being written
    /// returns `busy` at once, and the caller skips that schedule (`skipping`) until the writer's commit wakes it.
    public func runDue(skipping busy: [UUID] = []) async throws -> CampaignRun? {
        guard let first = try await run(nil, skipping: busy) else { return nil }
        guard first.state == "broadcast" else { return first }
        // The rest at once, unless another worker took the schedule meanwhile (then it runs the rest).
        return try await run(first.scheduleID) ?? first
    }

    /// One transaction: claims `scheduleID` (if nobody holds it and it is still pending), or else the oldest due
    /// schedule nobody holds, and runs it.
    func run(_ scheduleID: UUID?, skipping busy: [UUID] = []) async throws -> CampaignRun? {
        let lifetime = self.lifetime
        let channel = notifyChannel
        let chunk = self.chunk
        do {
            // Cancellable: a shutdown does not wait for a long step (a start's first resolves its whole audience, up
            // to the bulk statement timeout); the step rolls back, and any worker runs it again from the progress
            // recorded by the last one that committed.
            return try await database.pool.transaction(cancellable: true) { c in
                try c.query(Self.idleLimit)
                try c.enterSystem()
                let due = try c.query(
                    """
                    SELECT tenant_id, campaign_id, id, operation, change, result FROM campaign_schedules s
                    WHERE state = 'pending' AND due_at <= now() AND (\(scheduleID)::uuid IS NULL OR id = \(scheduleID))
                      AND NOT s.id = ANY(\(busy)::uuid[])
                      -- A campaign's changes wait for its start to finish (it runs in several transactions).
                      AND (operation = 'start' OR NOT EXISTS (
                          SELECT 1 FROM campaign_schedules b
                          WHERE b.tenant_id = s.tenant_id AND b.campaign_id = s.campaign_id
                            AND b.operation = 'start' AND b.state = 'pending'))
                    -- A change's first half (its broadcast) before the rest of earlier ones: a rest is a bulk write
                    -- that may have to wait for another (busy), a first half is quick.
                    ORDER BY COALESCE(s.result ->> 'phase', '') IN ('broadcast', 'changing'), due_at, id LIMIT 1
                    FOR UPDATE OF s SKIP LOCKED
                    """)
                guard let row = due.first else { return nil }
                let tenant = try row.decode(UUID.self, "tenant_id")
                let campaignID = try row.decode(String.self, "campaign_id")
                let scheduleID = try row.decode(UUID.self, "id")
                let operation = try row.decode(String.self, "operation")
                let change = try row.decode(JSONValue.self, "change")
                let recorded = try row.decode(JSONValue?.self, "result")
                // A start's steps look their rows up one by one (whatever the statistics); a change's read sets.
                if operation != "start" { try Self.refreshStatistics(c) }
                try c.enterTenant(tenant)
                // No savepoint in here: 100,000 foreign-key locks on one channel row from a subtransaction took
                // minutes.
                var state = "done"
                var result: JSONValue
                do {
                    if operation == "start" {
                        let step = try Self.start(
                            c, tenant, campaignID, change, lifetime: lifetime,
                            progress: recorded?["phase"]?.stringValue == "starting" ? recorded : nil, chunk: chunk)
                        result = step.result
                        if !step.done { state = "starting" }
                    } else {
                        let planned = CampaignChange(operation: operation == "update" ? .update : .end, json: change)
                        let phase = recorded?["phase"]?.stringValue
                        if phase == "broadcast" || phase == "changing" {
                            // The next chunk: the second half of a channel-backed change, or a change partway.
                            let step = try Self.change(
                                c, tenant, campaignID, planned, scope: .rest(recorded?["representative"]?.stringValue),
                                schedule: scheduleID, progress: recorded, chunk: chunk)
                            result = step.result
                            if !step.done { state = "changing" }
                        } else {
                            let first = try Self.change(
                                c, tenant, campaignID, planned, scope: .broadcastFirst, schedule: scheduleID,
                                chunk: chunk)
                            result = first.result
                            if let representative = first.representative {
                                state = "broadcast"
                                result = .object([
                                    "phase": .string("broadcast"), "representative": .string(representative),
                                    "broadcast": first.result,
                                ])
                            } else if !first.done {
                                state = "changing"
                            }
                        }
                    }
                } catch let error as PostgresError where Self.isPermanent(error) {
                    // A statement that can never succeed (bad data, a broken constraint, a limit) would otherwise be
                    // retried forever at the head of the schedule queue: it fails this schedule, visibly, instead
                    // (after this transaction rolls back).
                    throw Failure(
                        tenant: tenant, campaignID: campaignID, scheduleID: scheduleID, operation: operation,
                        reason: "database_error",
                        detail: "SQLSTATE \(error.sqlState ?? "?"): \(error.serverMessage ?? "")")
                } catch is Busy {
                    throw BusyRun(tenant: tenant, campaignID: campaignID, scheduleID: scheduleID, operation: operation)
                } catch let refusal as Refusal {
                    throw Failure(
                        tenant: tenant, campaignID: campaignID, scheduleID: scheduleID, operation: operation,
                        reason: refusal.reason, detail: refusal.detail)
                }
                // A first half ("broadcast"), or a start or change still writing ("starting", "changing"), stays
                // pending with its progress.
                let unfinished = Self.partwayPhases.contains(state)
                try c.execute(
                    """
                    UPDATE campaign_schedules
                    SET state = \(unfinished ? "pending" : state), result = \(result),
                        executed_at = CASE WHEN \(unfinished) THEN NULL ELSE clock_timestamp() END
                    WHERE tenant_id = \(tenant) AND id = \(scheduleID)
                    """)
                try c.query("SELECT pg_notify(\(channel), '')")
                return CampaignRun(
                    tenantID: tenant, campaignID: campaignID, scheduleID: scheduleID, operation: operation,
                    state: state, result: result)
            }
        } catch let failure as Failure {
            // A step cancelled (its statement: 57014, as a timeout) is not the campaign's failure.
            try Task.checkCancellation()
            return try await record(failure)
        } catch let busy as BusyRun {
            return CampaignRun(
                tenantID: busy.tenant, campaignID: busy.campaignID, scheduleID: busy.scheduleID,
                operation: busy.operation, state: "busy", result: .object([:]))
        }
    }

    /// A run that rolled back as `Busy`.
    struct BusyRun: Error {
        var tenant: UUID
        var campaignID: String
        var scheduleID: UUID
        var operation: String
    }

    /// Stores `ended` on started campaigns that are over: no open instance, nothing queued, no change pending (what
    /// reads derive as `ended`), so later reads need not walk their instances. Returns how many ended now.
    @discardableResult
    public func finalize() async throws -> Int {
        try await database.systemTransaction { c in try c.execute(Self.finalizeStatement) }
    }

    /// `finalize`'s statement. The look for queued pushes walks every instance of the campaign (the queue rows do
    /// not name it), so it is asked last, only of campaigns with no open instance and no pending change: in one
    /// statement with the cheap checks, the planner (on an active campaign's statistics, its instances "few") ran it
    /// first, and every worker spent 2.8–3.8 s of PostgreSQL on it every 30 s while a campaign of 100,000 was open
    /// (`auto_explain` during bench/campaign's start).
    static let finalizeStatement: PostgresQuery = """
        WITH quiet AS MATERIALIZED (
            SELECT c.tenant_id, c.id FROM campaigns c
            WHERE c.state = 'active'
              AND NOT EXISTS (SELECT 1 FROM campaign_schedules s
                              WHERE s.tenant_id = c.tenant_id AND s.campaign_id = c.id AND s.state = 'pending')
              AND NOT EXISTS (SELECT 1 FROM instances i
                              WHERE i.tenant_id = c.tenant_id AND i.campaign_id = c.id
                                AND i.state IN ('pending', 'active') AND i.expires_at > now())
        ), over AS (
            SELECT q.tenant_id, q.id FROM quiet q
            WHERE NOT \(unsafeRaw: CampaignStore.pushesLeft(tenant: "q.tenant_id", campaign: "q.id"))
        )
        UPDATE campaigns c SET state = 'ended', ended_at = COALESCE(c.ended_at, now())
        FROM over o
        WHERE c.tenant_id = o.tenant_id AND c.id = o.id AND c.state = 'active'
        """

    /// A run that failed for a reason of its own, rolled back; recorded by ``record(_:)``.
    struct Failure: Error {
        var tenant: UUID
        var campaignID: String
        var scheduleID: UUID
        var operation: String
        var reason: String
        var detail: String
    }

    /// Marks a failed run's schedule failed (and a start's campaign), if it is still pending.
    func record(_ f: Failure) async throws -> CampaignRun? {
        let channel = notifyChannel
        return try await database.tenantTransaction(f.tenant) { c in
            try c.query(Self.idleLimit)
            let pending = try c.query(
                """
                SELECT 1 FROM campaign_schedules
                WHERE tenant_id = \(f.tenant) AND id = \(f.scheduleID) AND state = 'pending' FOR UPDATE
                """)
            guard !pending.isEmpty else { return nil }
            let (state, result) = try Self.failed(
                c, f.tenant, f.campaignID, f.operation, reason: f.reason, detail: f.detail)
            try c.execute(
                """
                UPDATE campaign_schedules SET state = \(state), result = \(result), executed_at = clock_timestamp()
                WHERE tenant_id = \(f.tenant) AND id = \(f.scheduleID)
                """)
            try c.query("SELECT pg_notify(\(channel), '')")
            return CampaignRun(
                tenantID: f.tenant, campaignID: f.campaignID, scheduleID: f.scheduleID, operation: f.operation,
                state: state, result: result)
        }
    }

    /// A failed run's schedule state and result. A start that failed before writing any instance fails its
    /// campaign. One that failed in a later step (earlier steps committed instances, which are being sent) leaves the
    /// campaign active with what it started and the reason kept, so that those instances can still be updated and
    /// ended campaign-wide; the schedule's result says how many were started.
    static func failed(
        _ c: PostgresConnection, _ tenant: UUID, _ campaignID: String, _ operation: String, reason: String,
        detail: String
    ) throws -> (String, JSONValue) {
        var result: [String: JSONValue] = ["reason": .string(reason), "detail": .string(detail)]
        if operation == "start" {
            let started = try c.query(
                "SELECT count(*)::int AS n FROM instances WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID)"
            )[0].decode(Int.self, "n")
            if started > 0 {
                try markStarted(c, tenant, campaignID, failureReason: reason, stoppedEarly: true)
                result["instances"] = .int(Int64(started))
            } else {
                try c.execute(
                    """
                    UPDATE campaigns SET state = 'failed', failure_reason = \(reason)
                    WHERE tenant_id = \(tenant) AND id = \(campaignID) AND state = 'scheduled'
                    """)
            }
        }
        return ("failed", .object(result))
    }

    /// Errors of the statement itself (classes 22 data, 23 integrity, 42 syntax or access, 54 limits), not of the
    /// connection or of concurrency: trying again cannot help.
    static func isPermanent(_ error: PostgresError) -> Bool {
        guard let state = error.sqlState, !error.isTransactionRetryable else { return false }
        return ["22", "23", "42", "54"].contains(String(state.prefix(2)))
    }

    /// Two halves' counts added up.
    static func merged(_ a: JSONValue, _ b: JSONValue) -> JSONValue {
        guard case .object(let x) = a, case .object(let y) = b else { return b }
        var out = x
        for (key, value) in y {
            if let l = out[key]?.intValue, let r = value.intValue {
                out[key] = .int(l + r)
            } else if let l = out[key], case .object = l {
                out[key] = merged(l, value)
            } else {
                out[key] = value
            }
        }
        return .object(out)
    }

    // MARK: Start

    /// One step of a start. The first resolves the audience into `campaign_members`; each writes the next members
    /// (`stepSize` of them, in person order, after the position in `progress`) as instances with their start
    /// deliveries (push-to-start tokens of their iPhones, FCM tokens of their Android devices) in one statement. The
    /// last makes the campaign active and returns `done` with the counts of all steps; the others return the position
    /// reached, the audience's size and the counts so far, kept on the schedule.
    static func start(
        _ c: PostgresConnection, _ tenant: UUID, _ campaignID: String, _ plan: JSONValue, lifetime: TimeInterval,
        progress: JSONValue?, chunk: Int
    ) throws -> (result: JSONValue, done: Bool) {
        // No erasure in the tenant while the step reads people and writes for them; taken before anything is read
        // or locked (an erasure takes the campaign too, when its audience names the person).
        try c.query(ErasureLock.shared(tenant))
        let rows = try c.query(
            """
            SELECT \(unsafeRaw: CampaignStore.columns), c.state AS stored_state,
                   (SELECT ch.status = 'active' FROM channels ch
                    WHERE ch.tenant_id = c.tenant_id AND ch.id = c.channel_id) AS channel_active
            FROM campaigns c
            WHERE c.tenant_id = \(tenant) AND c.id = \(campaignID) FOR NO KEY UPDATE
            """)
        guard let row = rows.first else { throw Refusal(reason: "campaign_gone", detail: "the campaign was deleted") }
        guard try row.decode(String.self, "stored_state") == "scheduled" else {
            throw Refusal(reason: "not_scheduled", detail: "the campaign is no longer waiting to start")
        }
        let activityType = try row.decode(String.self, "activity_type")
        let platform = try row.decode(String?.self, "platform")
        // A channel-backed campaign: its instances subscribe at start (and live without push-to-start targets, as
        // apps may subscribe themselves); a channel gone since the campaign was created is not used.
        let channel =
            try row.decode(Bool?.self, "channel_active") == true ? try row.decode(UUID?.self, "channel_id") : nil
        let expiresAt =
            try row.decode(Date?.self, "expires_at") ?? Lifetime.defaultExpiration(now: Date(), maximum: lifetime)
        guard expiresAt > Date() || progress != nil else {
            throw Refusal(reason: "expired", detail: "the campaign's expiration passed before it could start")
        }
        guard let audience = CampaignAudience(json: try row.decode(JSONValue.self, "audience")) else {
            throw Refusal(reason: "bad_audience", detail: "the stored audience is not one Marquee knows")
        }

        try planForBulk(c)
        // The audience's size, once resolved (a start recorded partway by an older version has none: its steps are
        // all `chunk`).
        let members: Int?
        if progress == nil {
            // Every person of the audience in one statement: more than the worker's usual statement timeout allows.
            try c.query(BulkStatements.timeout)
            do {
                members = try resolveAudience(c, tenant, campaignID, audience)
            } catch let error as PostgresError where error.code == .queryCanceled {
                // Past the bulk statement timeout (or cancelled by an operator): another try would take as long and
                // hold a worker's campaign runs, a PostgreSQL core and the tenant's erasures all that time again.
                throw Refusal(
                    reason: "audience_timeout",
                    detail: "resolving the audience took longer than \(BulkStatements.timeoutDescription) "
                        + "(or was cancelled); a simpler segment, or a list of people, starts")
            }
            try c.query("SET LOCAL statement_timeout TO DEFAULT")
        } else {
            members = progress?["members"]?.intValue.map(Int.init)
        }
        // Where this step starts: after the last member the previous one wrote. Paced deliveries are due `rate` a
        // second from the first step's start, counted over every step's rows.
        let after = progress?["after"]?.stringValue ?? ""
        let (pacedFrom, pacedBefore) = try pacing(c, progress)
        let before = progress?["counts"] ?? .object([:])
        let written = Int(before["audience"]?.intValue ?? 0)

        // 2. Instances and deliveries for the next members, in one statement (none once the expiration passed: the
        // start ends with what it wrote).
        let fills = plan["fills"] ?? .array([])
        let sample = plan["sample"] ?? .object([:])
        let headroom = plan["headroom"]?.intValue.map(Int.init) ?? 0
        let contentState = try row.decode(JSONValue.self, "content_state")
        let options = try row.decode(JSONValue.self, "options")
        let template = try row.decode(JSONValue.self, "attributes")
        let rate = try row.decode(Int?.self, "rate_limit_per_second")
        let timestamp = Int64(Date().timeIntervalSince1970.rounded(.down))
        let limit =
            expiresAt > Date()
            ? Self.stepSize(remaining: members.map { $0 - written }, written: written, chunk: chunk) : 0
        let wrote = try c.query(
            """
            -- A step's members, their people, devices and push-to-start tokens are looked up row by row (LATERAL
            -- ... OFFSET 0 is a nested loop whatever the planner settings): hash joins, which planForBulk makes the
            -- rest use, would read the tenant's whole people, devices and tokens in every step.
            WITH m AS (
                SELECT m.person_id, m.instance_id, p.email,
                       marquee_fill_person(\(template)::jsonb, \(fills)::jsonb, p.attributes) AS attrs
                FROM (SELECT person_id, instance_id FROM campaign_members
                      WHERE tenant_id = \(tenant) AND campaign_id = \(campaignID) AND person_id > \(after)
                      ORDER BY person_id LIMIT \(limit)) m
                CROSS JOIN LATERAL (
                    SELECT p.email, p.attributes FROM people p
                    WHERE p.tenant_id = \(tenant) AND p.id = m.person_id OFFSET 0
                ) p
            ), ok AS (
                SELECT * FROM m
                WHERE attrs IS NOT NULL
                  -- What is stored must read back (a person's attributes put deep into the template can nest deeper
                  -- than any document may).
                  AND NOT jsonb_path_exists(attrs, \(Self.nestedTooDeep)::jsonpath)
                  -- The sample's length once (an InitPlan): in a generic plan the parameter would be written out
                  -- as text again for every row.
                  AND octet_length(attrs::text) - (SELECT octet_length(\(sample)::jsonb::text)) <= \(headroom)
            ), planned AS MATERIALIZED (
                SELECT ok.instance_id, ok.person_id, d.token AS device_token, d.platform, s.token AS pts
                FROM ok
                CROSS JOIN LATERAL (
                    SELECT d.token, d.platform FROM devices d
                    WHERE d.person_id = ok.person_id AND d.tenant_id = \(tenant) OFFSET 0
                ) d
                LEFT JOIN LATERAL (
                    SELECT s.token FROM push_to_start_tokens s
                    WHERE s.tenant_id = \(tenant) AND s.device_token = d.token AND s.activity_type = \(activityType)
                      AND s.status = 'active'
                    OFFSET 0
                ) s ON true
                WHERE (\(platform)::text IS NULL OR d.platform = \(platform)::text)
                  AND (d.platform = 'android' OR s.token IS NOT NULL)
            ), t AS MATERIALIZED (
                -- The planned targets still there, and still their person's, held until the commit
                -- (marquee_held_start_targets, migration 0109: the one home of the rule, with the single start's
                -- write). A device removed while the step ran (a logout, a worker's delete of one FCM calls
                -- unregistered) gets no start: the removal waits for this step's commit and then takes its pushes,
                -- or this step waits for the removal and leaves the device out (of instance_devices too, whose
                -- reference to it would fail the step, and with it the campaign); a push-to-start token retired
                -- meanwhile gets none either.
                SELECT p.* FROM (
                    SELECT array_agg(device_token) AS devices,
                           array_agg(CASE WHEN platform = 'ios' THEN pts END) AS tokens,
                           array_agg(\(activityType)::text) AS types
                    FROM planned
                ) a
                CROSS JOIN LATERAL marquee_held_start_targets(\(tenant), a.devices, a.tokens, a.types) h
                JOIN planned p
                  ON p.device_token = h.device_token AND p.person_id = h.person_id
                 AND h.token IS NOT DISTINCT FROM CASE WHEN p.platform = 'ios' THEN p.pts END
            ), targeted AS (
                -- Joined, never probed per row: a CTE has no index.
                SELECT DISTINCT instance_id FROM t
            ), ins AS (
                INSERT INTO instances (tenant_id, id, activity_type, person_id, person_email, state, failure_reason,
                                       attributes, content_state, options, version, content_timestamp,
                                       target_platform, expires_at, campaign_id, channel_id)
                SELECT \(tenant), ok.instance_id, \(activityType), ok.person_id, ok.email,
                       CASE WHEN g.instance_id IS NOT NULL THEN 'pending'
                            WHEN \(channel)::uuid IS NOT NULL THEN 'active' ELSE 'failed' END,
                       CASE WHEN g.instance_id IS NULL AND \(channel)::uuid IS NULL THEN 'no_push_to_start_token' END,
                       ok.attrs, \(contentState), \(options), 1, \(timestamp), \(platform), \(expiresAt),
                       \(campaignID), \(channel)
                FROM ok LEFT JOIN targeted g ON g.instance_id = ok.instance_id
                ON CONFLICT (tenant_id, id) DO NOTHING
                RETURNING id, attributes
            ), dels AS (
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, attributes, content_state, options,
                                        content_timestamp, next_attempt_at)
                SELECT \(tenant), marquee_new_ulid(), t.instance_id, t.device_token,
                       CASE t.platform WHEN 'ios' THEN 'apns' ELSE 'fcm' END,
                       CASE t.platform WHEN 'ios' THEN 'push_to_start' ELSE 'fcm' END,
                       CASE t.platform WHEN 'ios' THEN t.pts ELSE t.device_token END,
                       'start', 1, ins.attributes, \(contentState), \(options), \(timestamp),
                       \(unsafeRaw: Self.paced(rate, order: "t.instance_id, t.device_token", from: pacedFrom, after: pacedBefore))
                FROM t JOIN ins ON ins.id = t.instance_id
                RETURNING provider
            ), devs AS (
                INSERT INTO instance_devices (tenant_id, instance_id, device_token, state, state_at)
                SELECT \(tenant), t.instance_id, t.device_token, 'started', '-infinity'
                FROM t JOIN ins ON ins.id = t.instance_id
                WHERE t.platform = 'android'
                ON CONFLICT DO NOTHING
                RETURNING 1
            ), skip AS (
                UPDATE campaign_members cm
                SET skipped_reason = CASE WHEN m.attrs IS NULL THEN 'missing_attribute'
                                          WHEN o.person_id IS NOT NULL THEN 'instance_id_taken'
                                          WHEN jsonb_path_exists(m.attrs, \(Self.nestedTooDeep)::jsonpath)
                                              THEN 'attributes_too_deep'
                                          ELSE 'payload_too_large' END
                FROM m LEFT JOIN ok o ON o.person_id = m.person_id LEFT JOIN ins ON ins.id = m.instance_id
                WHERE cm.tenant_id = \(tenant) AND cm.campaign_id = \(campaignID) AND cm.person_id = m.person_id
                  AND ins.id IS NULL
                RETURNING cm.skipped_reason
            )
            SELECT (SELECT count(*) FROM m)::int AS audience, (SELECT max(person_id) FROM m) AS last_person,
                   (SELECT count(*) FROM ins)::int AS instances,
                   (SELECT count(*) FROM dels WHERE provider = 'apns')::int AS apns,
                   (SELECT count(*) FROM dels WHERE provider = 'fcm')::int AS fcm,
                   (SELECT COALESCE(jsonb_object_agg(reason, n), '{}') FROM (
                       SELECT skipped_reason AS reason, count(*) AS n FROM skip GROUP BY 1) s) AS skipped
            """)[0]
        let step = try wrote.decode(Int.self, "audience")
        let apns = try wrote.decode(Int.self, "apns")
        let fcm = try wrote.decode(Int.self, "fcm")
        let counts = merged(
            before,
            .object([
                "audience": .int(Int64(step)), "instances": .int(Int64(try wrote.decode(Int.self, "instances"))),
                "deliveries": .object(["apns": .int(Int64(apns)), "fcm": .int(Int64(fcm))]),
                "skipped": try wrote.decode(JSONValue.self, "skipped"),
            ]))
        // More to write: members left (or, without the size, a full step, which may have been the last).
        let more = members.map { written + step < $0 } ?? (step == limit)
        if step == limit, more, let last = try wrote.decode(String?.self, "last_person") {
            var next: [String: JSONValue] = [
                "phase": .string("starting"), "after": .string(last), "paced_from": .double(pacedFrom),
                "paced": .int(Int64(pacedBefore + apns + fcm)), "counts": counts,
            ]
            if let members { next["members"] = .int(Int64(members)) }
            return (.object(next), false)
        }
        // Stopped by the expiration (limit 0) with members left: those are marked not started.
        try markStarted(c, tenant, campaignID, stoppedEarly: limit == 0)
        return (counts, true)
    }

    /// A jsonpath that finds an array or object nested deeper than any document may be (`JSONValue.maxDepth`, the
    /// bound's one home): level 0 is the document itself, so a container at level `maxDepth` is nested one deeper.
    static let nestedTooDeep = "strict $.**{\(JSONValue.maxDepth)} ? (@.type() == \"object\" || @.type() == \"array\")"

    /// A start that wrote instances: its campaign is active from now, with the size of its audience (the members
    /// resolved) and, for a start that stopped partway, why. A start that stopped early (its expiration passed, a
    /// later step failed) marks the members it did not reach `not_started`: NULL means an instance was started.
    static func markStarted(
        _ c: PostgresConnection, _ tenant: UUID, _ campaignID: String, failureReason: String? = nil,
        stoppedEarly: Bool = false
    ) throws {
        if stoppedEarly {
            try c.execute(
                """
                UPDATE campaign_members m SET skipped_reason = 'not_started'
                WHERE m.tenant_id = \(tenant) AND m.campaign_id = \(campaignID) AND m.skipped_reason IS NULL
                  AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = m.tenant_id AND i.id = m.instance_id)
                """)
        }
        try c.execute(
            """
            UPDATE campaigns c SET state = 'active', started_at = now(), failure_reason = \(failureReason),
                audience_size = (
                    SELECT count(*) FROM campaign_members m WHERE m.tenant_id = c.tenant_id AND m.campaign_id = c.id)
            WHERE c.tenant_id = \(tenant) AND c.id = \(campaignID) AND c.state = 'scheduled'
            """)
    }

    /// How many members a start's step writes (or open instances a campaign-wide change's step changes), with
    /// `written` written by the steps before and `remaining` left (nil: not known). `chunk`, but:
    /// - the last `chunk` are written in halves while a half is at least `floor`: the pushes of a step leave only once
    ///   it commits, so the last step's are what the run waits for after its writes are done (bench/campaign: 10,000
    ///   of them, ~1 s of sending after the last commit);
    /// - the first steps grow from `floor`, each at most what the steps before wrote: the workers have nothing to send
    ///   until the first step commits (bench/campaign: a whole first chunk kept one of two cores idle for ~0.5 s), and
    ///   each later step is written while the one before is sent.
    ///
    /// Both keep the extra steps few (each costs a transaction and a plan: ~10–30 ms).
    static func stepSize(remaining: Int?, written: Int, chunk: Int, floor: Int = tailFloor) -> Int {
        let ramp = max(floor, written, 1)
        guard let remaining, remaining <= chunk else { return min(chunk, ramp) }
        let half = (remaining + 1) / 2
        return min(half >= floor ? half : max(remaining, 1), ramp)
    }

    /// The smallest step ``stepSize(remaining:written:chunk:floor:)`` begins a run with and splits its end into.
    static let tailFloor = 1_000

    /// The first step of a start: the audience, resolved now and kept in `campaign_members`. Returns its size.
    static func resolveAudience(
        _ c: PostgresConnection, _ tenant: UUID, _ campaignID: String, _ audience: CampaignAudience
    ) throws -> Int {
        var q = SegmentSQL.Builder()
        let t = q.parameter(tenant)
        let cid = q.parameter(campaignID)
        q.append(
            """
            INSERT INTO campaign_members (tenant_id, campaign_id, person_id, instance_id)
            SELECT p.tenant_id, \(cid)::text, p.id,
                   -- A person ID usable in an instance ID, or its MD5 after a ':' that no such ID starts with (a
                   -- person whose ID is another's MD5 must not get that person's instance). Campaign and person IDs
                   -- that both have dots can meet (a + b.c and a.b + c make a.b.c): the later start skips that
                   -- person as instance_id_taken (README, "Audience").
                   CASE WHEN p.id ~ '^[A-Za-z0-9._-][A-Za-z0-9._:-]*$' AND length(p.id) <= 127 - length(\(cid)::text)
                        THEN \(cid)::text || '.' || p.id ELSE \(cid)::text || '.:' || md5(p.id) END
            FROM people p WHERE p.tenant_id = \(t)::uuid
            """)
        switch audience {
        case .all:
            break
        case .people(let ids):
            q.append(" AND p.id = ANY(")
            q.append(bind: ids)
            q.append("::text[])")
        case .segment(let segmentID):
            let found = try c.query(
                "SELECT filter FROM segments WHERE tenant_id = \(tenant) AND id = \(segmentID)")
            guard let filterJSON = try found.first?.decode(JSONValue.self, "filter"),
                let filter = try? SegmentFilter(filterJSON)
            else {
                throw Refusal(
                    reason: "segment_gone", detail: "segment \(segmentID) was deleted before the campaign started")
            }
            q.append(" AND ")
            SegmentSQL.condition(filter, into: &q)
        }
        return try c.execute(q.query)
    }

    /// A channel change's one-instance first half is planned at each execution, for its values. The connection's
    /// statement cache would otherwise settle on one generic plan per statement text, and the same text serves a
    /// whole audience (planned under `planForBulk`'s settings: hash joins over every row) and that one instance, which
    /// then took 100–150 ms instead of 2 ms and held its broadcast back. Only there: forced on every run (starts'
    /// steps, bulk changes), custom plans made the 100,000-person start run 14.8 → 20.1–21.6 s and the campaign-wide
    /// update 5.0 → 6.4–6.9 s (bench/campaign).
    static func planEachRun(_ c: PostgresConnection) throws {
        try c.query("SELECT set_config('plan_cache_mode', 'force_custom_plan', true)")
    }

    /// Analyses the tables a change's step reads (`PlannerStatistics`) that have grown to twice what the planner
    /// believes since they were last analysed, before the step plans its statements: planned on a table's "handful of
    /// rows" while it holds 100,000, a step's `= ANY` over its 10,000 instance IDs was tested against every row of the
    /// tenant (a campaign-wide update 20 s instead of 9 when the tokens' autoanalyze came after the call). Not for a
    /// start's steps, whose lookups are by key one row at a time (`LATERAL`), and whose first step would wait for the
    /// analysis of an import's people, devices and tokens. Needs the system role (before `enterTenant`).
    static func refreshStatistics(_ c: PostgresConnection) throws {
        try c.query(PlannerStatistics.query(growth: PlannerStatistics.stepGrowth))
    }

    /// For the statements that write a whole audience: they read rows this transaction just made (no statistics yet)
    /// and CTEs (no indexes), where a nested loop planned on a guess of one row is quadratic at 100,000; hash joins
    /// are linear whatever the estimate. (Not for the one-instance half of a channel change: there, index lookups are
    /// what makes it fast.)
    static func planForBulk(_ c: PostgresConnection) throws {
        try c.query("SELECT set_config('enable_nestloop', 'off', true)")
    }

    /// Where a stepped run's pacing stands: the first step's start (epoch seconds; now, for the first) and how many rows
    /// the steps before spread, from their recorded progress (`paced_from`, `paced`).
    static func pacing(_ c: PostgresConnection, _ progress: JSONValue?) throws -> (from: Double, before: Int) {
        let from =
            try progress?["paced_from"]?.doubleValue
            ?? c.query("SELECT extract(epoch FROM clock_timestamp())::float8 AS t")[0].decode(Double.self, "t")
        return (from, progress?["paced"]?.intValue.map(Int.init) ?? 0)
    }

    /// `next_attempt_at` for a campaign's rows: now, or spread at `rate` a second in `order` (the tenant's own send
    /// limit applies on top, at the claim), the first at `from` (epoch seconds) after `after` rows already spread, or
    /// else as each row is written.
    static func paced(_ rate: Int?, order: String, from: Double? = nil, after: Int = 0) -> String {
        guard let rate else { return "now()" }
        // From the moment the run started (or the row is written), not the transaction's start: a run that took a
        // while would otherwise make its first rows due at once, all together.
        let origin = from.map { "to_timestamp(\($0))" } ?? "clock_timestamp()"
        return
            "\(origin) + make_interval(secs => (\(after) + row_number() OVER (ORDER BY \(order)) - 1) / \(rate)::float8)"
    }

    // MARK: Campaign-wide update and end

    /// Applies `change` to the campaign's open instances, a chunk at a time: one new content state per distinct current
    /// one (computed and checked here, by the same rules as a single update), then one statement writes the chunk's
    /// instances, supersedes their older queued pushes and queues one push per active target.
    enum Scope {
        /// With a channel: one open instance and the broadcast; without, the first chunk (the broadcast with it).
        case broadcastFirst
        /// The next chunk of the open instances but the one the first half wrote (nil: there was no first half; the
        /// broadcast goes with the first chunk that changes an instance).
        case rest(String?)
    }

    /// An earlier change of a campaign, still pending: `broadcastOn` is the instance that carried its broadcast once
    /// its first half ran (nil before).
    struct PendingChange {
        var broadcastOn: String?
    }

    /// The newest change of the same campaign still pending before `schedule` (due earlier, or as due with a smaller
    /// ID), if any. Nil without a schedule (a change run outside the runner's order).
    static func olderPending(_ c: PostgresConnection, _ tenant: UUID, _ schedule: UUID?) throws -> PendingChange? {
        guard let schedule else { return nil }
        return try c.query(
            """
            SELECT CASE WHEN o.result ->> 'phase' = ANY(\(Self.partwayPhases)) THEN o.result ->> 'representative' END
                       AS broadcast_on
            FROM campaign_schedules o, campaign_schedules s
            WHERE s.tenant_id = \(tenant) AND s.id = \(schedule)
              AND o.tenant_id = s.tenant_id AND o.campaign_id = s.campaign_id AND o.state = 'pending'
              AND o.operation <> 'start' AND (o.due_at, o.id) < (s.due_at, s.id)
            ORDER BY o.due_at DESC, o.id DESC LIMIT 1
            """
        ).first.map { PendingChange(broadcastOn: try $0.decode(String?.self, "broadcast_on")) }
    }

    /// One step: `progress` is what the steps before recorded (nil for the first); returns the counts of all steps
    /// and `done`, or the progress to record and not `done`. Steps follow one another in instance ID order, `chunk`
    /// open instances each, so that the pushes of each leave while the next is written.
    static func change(
        _ c: PostgresConnection, _ tenant: UUID, _ campaignID: String, _ change: CampaignChange, scope: Scope,
        schedule: UUID? = nil, progress: JSONValue? = nil, chunk: Int = .max, tailFloor: Int = tailFloor
    ) throws -> (result: JSONValue, representative: String?, done: Bool) {
        let rows = try c.query(
            """
            SELECT c.state, c.rate_limit_per_second, ch.id AS channel_id, ch.apns_channel_id,
                   \(unsafeRaw: Self.typeColumns), \(unsafeRaw: Self.sizingColumns)
            FROM campaigns c JOIN activity_types a ON a.tenant_id = c.tenant_id AND a.identifier = c.activity_type
            LEFT JOIN channels ch ON ch.tenant_id = c.tenant_id AND ch.id = c.channel_id AND ch.status = 'active'
            WHERE c.tenant_id = \(tenant) AND c.id = \(campaignID)
            """)
        guard let row = rows.first else {
            throw Refusal(reason: "campaign_gone", detail: "the campaign or its activity type was deleted")
        }
        guard try row.decode(String.self, "state") == "active" else {
            throw Refusal(
                reason: "not_started", detail: "the campaign is not active: it ended, was cancelled, or failed to start"
            )
        }
        let type = try RegistryStore.activityType(row)
        let sizing = try Self.sizing(row, campaignID: campaignID)
        let options = CampaignSizing.options(
            try row.decode(JSONValue.self, "campaign_options"), changed: change.options)
        let rate = try row.decode(Int?.self, "rate_limit_per_second")
        // A channel-backed campaign: the change is also ONE broadcast on its channel, for every subscribed device.
        let channelID = try row.decode(UUID?.self, "channel_id")
        let apnsChannelID = try row.decode(String?.self, "apns_channel_id")
        let channelDevice = channelID.map(ChannelBinding.deliveryDevice)
        var only: String?
        var excluded: String?
        var broadcast = apnsChannelID != nil
        let older = try Self.olderPending(c, tenant, schedule)
        switch scope {
        case .broadcastFirst:
            // One open instance nobody holds (a bulk write of an earlier change holds all the others): the broadcast
            // does not wait for that write. When there is none, the change runs whole, the broadcast with it.
            // The instance must already have every older change: while an older change of the campaign is pending,
            // it is the newest such change's own instance (its first half wrote it; its rest leaves it out, as this
            // change's rest will), and when that change's first half has not run yet, this one waits for it (busy):
            // broadcasts go out in schedule order too.
            if broadcast {
                var required: String?
                if let older {
                    guard let representative = older.broadcastOn else { throw Busy() }
                    required = representative
                }
                only = try c.query(
                    """
                    SELECT i.id FROM instances i
                    WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID)
                      AND i.state IN ('pending', 'active') AND i.expires_at > now()
                      AND (\(required)::text IS NULL OR i.id = \(required))
                    ORDER BY i.id LIMIT 1 FOR UPDATE SKIP LOCKED
                    """
                ).first?.decode(String.self, "id")
                if required != nil && only == nil { throw Busy() }
            }
        case .rest(let representative):
            excluded = representative
            // Without a first half, the broadcast goes with the first step that changed an instance.
            broadcast = broadcast && representative == nil && (progress?["counts"]?["broadcasts"]?.intValue ?? 0) == 0
        }
        if only != nil { try planEachRun(c) }
        if only == nil {
            // Bulk writes of one campaign run one at a time, in the order of their schedules (due time, then ID).
            // One that finds the campaign being written (locked), or an older change of it still pending (not run
            // yet, or being run by a worker that has not locked the campaign yet), does not wait: it is busy, and
            // runs after. NO KEY UPDATE: a cancel waits for it, the API accepting the next change does not
            // (CampaignStore.schedule).
            let locked = try c.query(
                """
                SELECT state FROM campaigns WHERE tenant_id = \(tenant) AND id = \(campaignID)
                FOR NO KEY UPDATE SKIP LOCKED
                """)
            guard let row = locked.first, older == nil else { throw Busy() }
            guard try row.decode(String.self, "state") == "active" else {
                throw Refusal(
                    reason: "not_started",
                    detail: "the campaign is not active: it ended, was cancelled, or failed to start")
            }
            try planForBulk(c)
        }
        // This step's chunk: the open instances after the last one an earlier step wrote, up to the step's last
        // (none when no more than a step is left: the last step). Found first, then locked as a range, so that an
        // instance ending meanwhile cannot make a short chunk look like the last.
        let after = progress?["after"]?.stringValue ?? ""
        // The IDs of the open instances after `after`, in order, from position `offset` (0-based).
        func open(offset: Int, limit: Int) throws -> [String] {
            try c.query(
                """
                SELECT i.id FROM instances i
                WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID) AND i.id > \(after)
                  AND i.state IN ('pending', 'active') AND i.expires_at > now()
                  AND (\(excluded)::text IS NULL OR i.id <> \(excluded))
                ORDER BY i.id OFFSET \(offset) LIMIT \(limit)
                """
            ).map { try $0.decode(String.self, "id") }
        }
        var bound: String?
        // The open instances the steps before covered, and this one covers (changed or not: a state the activity type
        // refuses changes none).
        let coveredBefore = Int(progress?["covered"]?.intValue ?? 0)
        var covered = 0
        if only == nil {
            // The first steps grow from the floor and the last chunk is written in halves, as a start's (`stepSize`):
            // a step's pushes leave only once it commits.
            let step = Self.stepSize(remaining: nil, written: coveredBefore, chunk: chunk, floor: tailFloor)
            let ends = try open(offset: step - 1, limit: 2)
            if ends.count == 2 {
                bound = ends[0]
                covered = step
            } else {
                let left = try c.query(
                    """
                    SELECT count(*)::int AS n FROM instances i
                    WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID) AND i.id > \(after)
                      AND i.state IN ('pending', 'active') AND i.expires_at > now()
                      AND (\(excluded)::text IS NULL OR i.id <> \(excluded))
                    """
                )[0].decode(Int.self, "n")
                let size = Self.stepSize(remaining: left, written: coveredBefore, chunk: chunk, floor: tailFloor)
                if size < left { bound = try open(offset: size - 1, limit: 1).first }
                covered = min(size, left)
            }
        }

        // The chunk's open instances, locked: a single update racing this one waits, then finds a new version and
        // retries. For an end, those of them whose end waits for an activity token, asked once for the chunk.
        let isEnd = change.operation == .end
        let waiting =
            try c.query(
                """
                WITH locked AS MATERIALIZED (
                    SELECT i.id FROM instances i
                    WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID) AND i.state IN ('pending', 'active')
                      AND i.expires_at > now()
                      AND (\(only)::text IS NULL OR i.id = \(only)) AND (\(excluded)::text IS NULL OR i.id <> \(excluded))
                      AND i.id > \(after) AND (\(bound)::text IS NULL OR i.id <= \(bound))
                    FOR UPDATE
                )
                -- Every row is locked (the count reads them all); only an end builds the array and asks.
                SELECT CASE WHEN \(isEnd) THEN
                           ARRAY(SELECT w.instance_id
                                 FROM marquee_ends_waiting_for_token(\(tenant), ARRAY(SELECT id FROM locked)) w)
                       END AS waiting
                FROM (SELECT count(*) FROM locked) n
                """
            )[0].decode([String]?.self, "waiting") ?? []
        let states = try c.query(
            """
            SELECT DISTINCT i.content_state FROM instances i
            WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID) AND i.state IN ('pending', 'active')
              AND i.expires_at > now()
              AND (\(only)::text IS NULL OR i.id = \(only)) AND (\(excluded)::text IS NULL OR i.id <> \(excluded))
              AND i.id > \(after) AND (\(bound)::text IS NULL OR i.id <= \(bound))
            """)

        var mapping: [JSONValue] = []
        var rejected: [String: Int] = [:]
        var suppressed = 0
        let hasAlert = change.options["alert"].map { $0 != .null } ?? false
        let now = Date()
        // Whether the push with `state` fits, measured as the campaign's pushes are (the API's rule for a whole new
        // state, and the campaign start's).
        func fits(_ state: JSONValue, _ options: StoredOptions) -> Bool {
            (try? sizing.check(state, options: options, operation: change.operation, type: type, now: now)) != nil
        }
        for state in states {
            let current = try state.decode(JSONValue.self, "content_state")
            do {
                let next = try change.content.apply(
                    to: current, schema: type.contentStateSchema, dateFields: type.dateFields,
                    profile: type.payloadProfile)
                // An update that changes nothing a device shows is suppressed, as a single one would be.
                if change.operation == .update && next == current && !hasAlert
                    && change.options.keys.allSatisfy({ $0 == "alert" })
                {
                    suppressed += 1
                    continue
                }
                try sizing.check(next, options: options, operation: change.operation, type: type, now: now)
                mapping.append(.object(["old": current, "new": next]))
            } catch {
                // Counted by the field the schema or profile refused, or as `push-too-large`.
                rejected[(error as? ValidationError)?.field ?? "push-too-large", default: 0] += 1
                // An end still ends: an instance whose final content would break its type's rules (a patch meeting a
                // state single updates changed, a schema changed since the end was scheduled) or make its push too
                // large ends showing what it shows now, rather than staying on the lock screen until it expires;
                // without its alert when even that push would not fit.
                if change.operation == .end {
                    var end: [String: JSONValue] = ["old": current, "new": current]
                    if !fits(current, options) { end["drop"] = .string("alert") }
                    mapping.append(.object(end))
                }
            }
        }
        let timestamp = Int64(Date().timeIntervalSince1970.rounded(.down))
        // A paced campaign's pushes are due `rate` a second from the first step's start, counted over every step's.
        let pacing = try rate == nil ? nil : Self.pacing(c, progress)
        // An update of a paced activity type is due, instance by instance, as a single one would be.
        let interval = change.operation == .update ? type.minUpdateIntervalMilliseconds : 0
        let written = try c.query(
            """
            WITH map AS (
                SELECT e -> 'old' AS old, e -> 'new' AS new, COALESCE(e ->> 'drop', '') AS drop
                FROM jsonb_array_elements(\(JSONValue.array(mapping))) e
            ), upd AS (
                UPDATE instances i SET
                    content_state = map.new,
                    options = jsonb_strip_nulls(
                        (i.options - 'alert' - 'dismissal_date') || (\(JSONValue.object(change.options)) - map.drop)),
                    version = i.version + 1,
                    content_timestamp = GREATEST(\(timestamp)::bigint, i.content_timestamp + 1),
                    state = CASE WHEN \(isEnd) THEN 'ended' ELSE i.state END,
                    ended_at = CASE WHEN \(isEnd) THEN now() ELSE i.ended_at END,
                    pending_end = \(isEnd) AND i.id IN (SELECT unnest(\(waiting)::text[])),
                    updated_at = now()
                FROM map
                WHERE i.tenant_id = \(tenant) AND i.campaign_id = \(campaignID) AND i.state IN ('pending', 'active')
                  AND i.expires_at > now() AND i.content_state = map.old
                  AND (\(only)::text IS NULL OR i.id = \(only)) AND (\(excluded)::text IS NULL OR i.id <> \(excluded))
                  AND i.id > \(after) AND (\(bound)::text IS NULL OR i.id <= \(bound))
                RETURNING i.id, i.attributes, i.content_state, i.options, i.version, i.content_timestamp
            ), tg AS MATERIALIZED (
                -- All the campaign's targets in one call (one scan, hash-joined): never a call per instance.
                SELECT u.*, x.device_token, x.platform, x.token
                FROM upd u
                JOIN marquee_instance_targets(\(tenant), (SELECT array_agg(id) FROM upd)) x ON x.instance_id = u.id
            ), gone AS (
                -- An end cancels every unsent push of the instance; an update supersedes older ones to its tokens;
                -- and the campaign's older queued broadcasts (on whichever instance carried them): latest wins. Rows
                -- a worker holds (claimed, or still being sent past its claim: marquee_being_sent) are skipped, never
                -- waited on, and left to finish.
                DELETE FROM delivery_queue d
                WHERE d.tenant_id = \(tenant) AND (
                    d.id IN (
                        SELECT q.id
                        FROM delivery_queue q
                        JOIN (SELECT u.id, NULL::text AS token FROM upd u WHERE \(isEnd)
                              UNION ALL
                              SELECT tg.id, tg.token FROM tg WHERE NOT \(isEnd)) x ON q.instance_id = x.id
                        WHERE q.tenant_id = \(tenant)
                          AND (x.token IS NULL OR (q.operation <> 'start' AND q.token = x.token))
                          AND NOT marquee_being_sent(q.sending_until)
                        FOR UPDATE OF q SKIP LOCKED)
                    -- An older broadcast of the campaign goes only when this statement queues the newer one (`bc`, from
                    -- a changed instance): a change that changes nothing here must not leave the channel's devices
                    -- without the older state.
                    OR (\(broadcast) AND NOT \(isEnd) AND EXISTS (SELECT 1 FROM upd) AND d.id IN (
                        SELECT q.id FROM delivery_queue q
                        JOIN instances i ON i.tenant_id = q.tenant_id AND i.id = q.instance_id
                        WHERE q.tenant_id = \(tenant) AND q.token_kind = 'channel' AND q.token = \(apnsChannelID)
                          AND i.campaign_id = \(campaignID) AND NOT marquee_being_sent(q.sending_until)
                        FOR UPDATE OF q SKIP LOCKED)))
                RETURNING d
            ), sup AS (
                INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'superseded') h
                RETURNING 1
            ), pace AS (
                -- The activity type's pacing (min_update_interval_ms): an instance's update is due that long after its
                -- last update that went out (marquee_paced_dues, migration 0110: the rule's one home, which the single
                -- change's write asks too), one call for the chunk; asked only for a paced type's update.
                SELECT p.instance_id, p.due
                FROM marquee_paced_dues(\(tenant), CASE WHEN \(interval)::int > 0 THEN ARRAY(SELECT id FROM upd) END,
                                        \(interval)::int) p
            ), bc AS (
                -- One broadcast, carried by one of the changed instances (its content is the change's).
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, attributes, content_state, options,
                                        content_timestamp, next_attempt_at)
                SELECT \(tenant), marquee_new_ulid(), u.id, \(channelDevice), 'apns', 'channel', \(apnsChannelID),
                       \(change.operation.rawValue), u.version, u.attributes, u.content_state, u.options,
                       u.content_timestamp, COALESCE((SELECT pc.due FROM pace pc WHERE pc.instance_id = u.id), now())
                FROM (SELECT * FROM upd ORDER BY id LIMIT 1) u
                WHERE \(broadcast)
                RETURNING 1
            ), dels AS (
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, attributes, content_state, options,
                                        content_timestamp, next_attempt_at)
                SELECT \(tenant), marquee_new_ulid(), tg.id, tg.device_token,
                       CASE tg.platform WHEN 'ios' THEN 'apns' ELSE 'fcm' END,
                       CASE tg.platform WHEN 'ios' THEN 'activity' ELSE 'fcm' END,
                       tg.token, \(change.operation.rawValue), tg.version, tg.attributes, tg.content_state, tg.options,
                       tg.content_timestamp,
                       GREATEST(\(unsafeRaw: Self.paced(rate, order: "tg.id, tg.device_token", from: pacing?.from, after: pacing?.before ?? 0)),
                                COALESCE(pc.due, now()))
                FROM tg LEFT JOIN pace pc ON pc.instance_id = tg.id
                RETURNING provider
            )
            SELECT (SELECT count(*) FROM upd)::int AS instances,
                   (SELECT count(*) FROM dels WHERE provider = 'apns')::int AS apns,
                   (SELECT count(*) FROM dels WHERE provider = 'fcm')::int AS fcm,
                   (SELECT count(*) FROM sup)::int AS superseded,
                   (SELECT count(*) FROM bc)::int AS broadcasts
            """)[0]
        let instances = try written.decode(Int.self, "instances")
        if only != nil && instances == 0 {
            // The first half's instance was not changed (its state already was the change's, or its type refuses
            // the new one): it carries no broadcast. No first half, then: the change runs whole, from the first
            // instance, and the broadcast goes with the first step that changes one (`rest(nil)`). What this one
            // superseded stays counted; its state is counted again there.
            let counts: JSONValue = .object([
                "superseded": .int(Int64(try written.decode(Int.self, "superseded"))), "broadcasts": .int(0),
            ])
            let rest: JSONValue = .object([
                "phase": .string("changing"), "after": .string(""), "counts": counts, "covered": .int(0),
            ])
            return (rest, nil, false)
        }
        let done = bound == nil
        if isEnd && done {
            try c.execute(
                """
                UPDATE campaigns SET ended_at = COALESCE(ended_at, now())
                WHERE tenant_id = \(tenant) AND id = \(campaignID)
                """)
        }
        let apns = try written.decode(Int.self, "apns")
        let fcm = try written.decode(Int.self, "fcm")
        var result: [String: JSONValue] = [
            "instances": .int(Int64(instances)),
            "deliveries": .object(["apns": .int(Int64(apns)), "fcm": .int(Int64(fcm))]),
            "superseded": .int(Int64(try written.decode(Int.self, "superseded"))),
            "broadcasts": .int(Int64(try written.decode(Int.self, "broadcasts"))),
        ]
        // Distinct states are counted per chunk: one found in two chunks counts twice.
        if suppressed > 0 { result["suppressed_states"] = .int(Int64(suppressed)) }
        if !rejected.isEmpty { result["rejected_states"] = .object(rejected.mapValues { .int(Int64($0)) }) }
        // The steps before: a first half's counts, or the counts so far of a change partway.
        let counts = merged(progress?["counts"] ?? progress?["broadcast"] ?? .object([:]), .object(result))
        if done { return (counts, broadcast ? only : nil, true) }
        var next: [String: JSONValue] = [
            "phase": .string("changing"), "after": .string(bound ?? ""), "counts": counts,
            "covered": .int(Int64(coveredBefore + covered)),
        ]
        if let pacing {
            next["paced_from"] = .double(pacing.from)
            next["paced"] = .int(Int64(pacing.before + apns + fcm))
        }
        if case .rest(let representative?) = scope { next["representative"] = .string(representative) }
        return (.object(next), nil, false)
    }
}

extension CampaignRunner {
    /// The activity type's columns from `activity_types a`, beside the campaign's.
    static let typeColumns = RegistryStore.typeColumns.split(separator: ",")
        .map { "a." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")

    /// The columns of `campaigns c` its pushes are measured with (``sizing(_:campaignID:)``) and its options: the
    /// headroom is the one its start schedule stored (0 for a campaign created before there was one).
    static let sizingColumns = """
        c.attributes AS campaign_attributes, c.options AS campaign_options, c.platform AS campaign_platform,
        COALESCE((SELECT (s.change ->> 'headroom')::int FROM campaign_schedules s
                  WHERE s.tenant_id = c.tenant_id AND s.campaign_id = c.id AND s.operation = 'start'
                  LIMIT 1), 0) AS campaign_headroom
        """

    static func sizing(_ row: PostgresRow, campaignID: String) throws -> CampaignSizing {
        CampaignSizing(
            campaignID: campaignID, template: try row.decode(JSONValue.self, "campaign_attributes"),
            headroom: try row.decode(Int.self, "campaign_headroom"),
            platform: try row.decodeRaw(Platform?.self, "campaign_platform"))
    }
}
