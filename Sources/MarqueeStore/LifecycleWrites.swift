import Crypto
import Foundation
import MarqueeCore
import PostgresClient

extension ChangeWrite: SetWrite {
    /// Two changes of one instance, or two with one Idempotency-Key, never share a statement.
    public var exclusiveKeys: [String] {
        IdempotencyColumns.exclusiveKeys(instanceID: instanceID, idempotency)
    }

    /// The write of a batch's updates and ends of one tenant: one statement over arrays, one row per change (in
    /// order) with `version` (NULL when the instance was no longer at the expected version, or the Idempotency-Key
    /// was taken: then `key_taken`), `deliveries` and `coalesced`. The one home of the change's write rules: a version
    /// check per instance, supersede (latest wins), pacing, the pending end, the idempotency record.
    public static func statement(tenant: UUID, _ writes: [ChangeWrite]) -> PostgresQuery {
        let c = Columns(writes)
        return """
            WITH req AS (
                SELECT * FROM unnest(\(c.index)::int[], \(c.instanceIDs)::text[], \(c.operations)::text[],
                                     \(c.states)::text[], \(c.failureReasons)::text[], \(c.attributes)::jsonb[],
                                     \(c.contentStates)::jsonb[], \(c.options)::jsonb[], \(c.versions)::bigint[],
                                     \(c.expectedVersions)::bigint[], \(c.contentTimestamps)::bigint[],
                                     \(c.idempotency.keys)::text[], \(c.idempotency.hashes)::text[],
                                     \(c.idempotency.statuses)::int[], \(c.idempotency.responses)::jsonb[])
                    AS r(i, instance_id, op, state, failure_reason, attributes, content_state, options, version,
                         expected_version, content_timestamp, idem_key, idem_hash, idem_status, idem_response)
            ), planned AS (
                SELECT * FROM unnest(\(c.deliveryIndex)::int[], \(c.deliveries.ids)::uuid[],
                                     \(c.deliveries.devices)::text[], \(c.deliveries.providers)::text[],
                                     \(c.deliveries.kinds)::text[], \(c.deliveries.tokens)::text[])
                    AS d(i, id, device_token, provider, token_kind, token)
            ), stale AS MATERIALIZED (
                -- Changes whose planned targets are no longer their instance's targets: since the context read, a
                -- token was registered, rotated or retired, a device removed or moved to another person, an Android
                -- device reported the activity ended or dismissed (or started). Nothing of such a change is written
                -- (its version comes back NULL, and it is planned again): it would go to a token or device that is no
                -- longer a target (a removed or moved device's pushes went with it, migrations 0083 and 0086: this
                -- one would reach it after all), miss one that is, and answer with its plan's targets and state. The
                -- targets are marquee_instance_targets (migration 0049), the rule the context read used, asked once
                -- for the statement's instances; the plan's per-token deliveries are compared with them as sets.
                -- A planned broadcast is out of date when its channel no longer backs the instance as an active
                -- channel (deleted, which unlinks it, or found gone at Apple): it would go to a channel that is no
                -- longer there. Two changes of one instance never share a statement.
                SELECT DISTINCT COALESCE(p.instance_id, x.instance_id) AS instance_id
                FROM (SELECT r.instance_id, d.device_token, d.token
                      FROM planned d JOIN req r ON r.i = d.i WHERE d.token_kind <> 'channel') p
                FULL JOIN marquee_instance_targets(\(tenant), \(c.instanceIDs)::text[]) x
                  ON x.instance_id = p.instance_id AND x.device_token = p.device_token AND x.token = p.token
                WHERE p.token IS NULL OR x.token IS NULL
                UNION
                SELECT r.instance_id FROM planned d JOIN req r ON r.i = d.i
                WHERE d.token_kind = 'channel' AND NOT EXISTS (
                    SELECT 1 FROM instances i
                    JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
                    WHERE i.tenant_id = \(tenant) AND i.id = r.instance_id
                      AND ch.status = 'active' AND ch.apns_channel_id = d.token)
            ), pace AS (
                -- Pacing: an update of an instance whose activity type has min_update_interval_ms is due that long
                -- after the instance's last update that went out (or is going out now: marquee_paced_due, which asks
                -- marquee_paced_dues, migration 0110, the rule's one home, also a campaign-wide update's; asked only
                -- for paced updates); until then a newer update supersedes it (cand below).
                SELECT r.i,
                       CASE WHEN r.op = 'update' AND a.min_update_interval_ms > 0
                            THEN marquee_paced_due(\(tenant), r.instance_id, a.min_update_interval_ms)
                            ELSE now() END AS due,
                       CASE WHEN r.op = 'update' THEN a.min_update_interval_ms ELSE 0 END AS interval_ms
                FROM req r
                JOIN instances i ON i.tenant_id = \(tenant) AND i.id = r.instance_id
                JOIN activity_types a ON a.tenant_id = i.tenant_id AND a.identifier = i.activity_type
            ), writable AS (
                -- The changes that can be written, the one home of the write's conditions, which both the
                -- idempotency record (idem) and the write (upd) follow: the instance is still at the expected version
                -- (a concurrent change moved it on), not marked expired since the change was planned (markExpired
                -- leaves the version alone: planned again, the change finds the instance closed, instead of setting an
                -- expired row's state back), and the plan is not out of date (stale). Each instance is locked here,
                -- first, so nothing changes it between the record and the write: a change with an Idempotency-Key
                -- records it only if it is written (migration 0075; a retry with the key had been answered 200 from
                -- the record of a change that was never written, with a version that never existed).
                SELECT r.i FROM req r
                JOIN instances i ON i.tenant_id = \(tenant) AND i.id = r.instance_id AND i.version = r.expected_version
                WHERE i.state <> 'expired' AND r.instance_id NOT IN (SELECT instance_id FROM stale)
                FOR NO KEY UPDATE OF i
            ), idem AS (
                -- The answer recorded is the one given (below), with `coalesced` from `pace`: the record is made
                -- before the write, so it cannot see `paced`, which knows only after the write which older updates a
                -- worker holds. The two differ only when a worker takes an older update of the instance between
                -- `pace` (which counts the ones in flight then) and `free`, within this statement: the first answer
                -- then says coalesced, a replay not (openapi, ChangeResponse.coalesced).
                \(unsafeRaw: IdempotencyColumns.write(
                    response: """
                        r.idem_response || jsonb_build_object(
                            'coalesced', COALESCE((SELECT p.due > now() FROM pace p WHERE p.i = r.i), false)
                                         AND EXISTS (SELECT 1 FROM planned d WHERE d.i = r.i))
                        """,
                    only: "r.i IN (SELECT i FROM writable)"))
            ), waits AS MATERIALIZED (
                -- An end that reaches no activity token while a start went (or may go) out by push-to-start is
                -- kept: it is queued when the activity token registers (marquee_register_activity_token). Asked once
                -- for the statement's ends, and only when one of its rows is an end (upd reads it for those alone).
                SELECT w.instance_id
                FROM marquee_ends_waiting_for_token(\(tenant), ARRAY(SELECT instance_id FROM req WHERE op = 'end')) w
            ), upd AS (
                UPDATE instances SET
                    -- A push that reached a device meanwhile made a pending instance active (a worker's settle, which
                    -- leaves the version alone): a change planned while it was pending keeps it active.
                    state = CASE WHEN r.state = 'pending' AND instances.state = 'active' THEN 'active' ELSE r.state END,
                    failure_reason = r.failure_reason, attributes = r.attributes,
                    content_state = r.content_state, options = r.options, version = r.version,
                    content_timestamp = r.content_timestamp,
                    ended_at = CASE WHEN r.op = 'end' THEN now() ELSE ended_at END,
                    pending_end = r.op = 'end' AND r.instance_id IN (SELECT instance_id FROM waits),
                    updated_at = now()
                FROM req r
                WHERE instances.tenant_id = \(tenant) AND instances.id = r.instance_id
                  AND r.i IN (SELECT i FROM writable)
                  AND (r.idem_key IS NULL OR r.idem_key IN (SELECT key FROM idem))
                RETURNING r.i, instances.version
            ), cand AS (
                -- An end cancels every unsent delivery of its instance; an update supersedes older ones to its
                -- tokens (rows waiting for a retry included). Each instance's rows are looked up by index (LATERAL
                -- ... OFFSET 0 is a nested loop whatever the estimates, and the group commit turns sequential scans
                -- off): as a join, the generic plan read the whole queue whenever the tenant's estimated share of it
                -- was large (47 ms a write while another tenant's 100,000 drained, bench/latency with BACKLOG).
                SELECT q.id, r.i
                FROM req r
                CROSS JOIN LATERAL (
                    SELECT q.id, q.operation, q.token FROM delivery_queue q
                    WHERE q.tenant_id = \(tenant) AND q.instance_id = r.instance_id
                    OFFSET 0
                ) q
                WHERE r.op = 'end'
                   OR (q.operation <> 'start' AND q.token IN (SELECT p.token FROM planned p WHERE p.i = r.i))
            ), free AS (
                -- Rows a worker holds (claimed, or still being sent past its claim: marquee_being_sent) are skipped,
                -- never waited on, and left to finish (the worker supersedes an interrupted one of an ended instance,
                -- and a retry of an older version).
                SELECT id FROM delivery_queue
                WHERE tenant_id = \(tenant) AND id IN (SELECT id FROM cand) AND NOT marquee_being_sent(sending_until)
                FOR UPDATE SKIP LOCKED
            ), gone AS (
                DELETE FROM delivery_queue d
                USING cand c
                WHERE d.tenant_id = \(tenant) AND d.id = c.id AND d.id IN (SELECT id FROM free)
                  AND c.i IN (SELECT i FROM upd)
                RETURNING d, c.i
            ), sup AS (
                INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'superseded') h
                RETURNING 1
            ), paced AS (
                -- Pacing, second half: an older update a worker claimed after this statement's snapshot (so `pace`
                -- did not see it in flight) is going out now; this one waits a whole interval from now.
                SELECT p.i,
                       CASE WHEN p.interval_ms > 0
                                 AND (SELECT count(*) FROM cand c WHERE c.i = p.i)
                                     > (SELECT count(*) FROM gone g WHERE g.i = p.i)
                            THEN GREATEST(p.due, now() + make_interval(secs => p.interval_ms / 1000.0))
                            ELSE p.due END AS due
                FROM pace p
            ), dels AS (
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                            operation, instance_version, attributes, content_state, options,
                                            content_timestamp, next_attempt_at)
                SELECT \(tenant), d.id, r.instance_id, d.device_token, d.provider, d.token_kind, d.token, r.op,
                       u.version, r.attributes, r.content_state, r.options, r.content_timestamp,
                       COALESCE(pd.due, now())
                FROM planned d
                JOIN req r ON r.i = d.i
                JOIN upd u ON u.i = d.i
                LEFT JOIN paced pd ON pd.i = d.i
                RETURNING instance_id
            ), queued AS (
                SELECT instance_id, count(*)::int AS n FROM dels GROUP BY instance_id
            )
            SELECT u.version, COALESCE(q.n, 0) AS deliveries,
                   r.idem_key IS NOT NULL AND r.i IN (SELECT i FROM writable)
                       AND r.idem_key NOT IN (SELECT key FROM idem) AS key_taken,
                   COALESCE(pd.due > now(), false) AND q.n IS NOT NULL AS coalesced
            FROM req r
            LEFT JOIN upd u ON u.i = r.i
            LEFT JOIN paced pd ON pd.i = r.i
            LEFT JOIN queued q ON q.instance_id = r.instance_id
            ORDER BY r.i
            """
    }

    /// After a batch's ends: an end for every activity token registered while they were written (planned from
    /// targets read before, the ends did not reach it; the registration, which waits for an end holding the instance's
    /// row, found the instance not ended yet). Migration 0076.
    public static func afterwards(tenant: UUID, _ writes: [ChangeWrite]) -> PostgresQuery? {
        let ended = writes.filter { $0.operation == .end }.map(\.instanceID)
        guard !ended.isEmpty else { return nil }
        return "SELECT marquee_queue_missing_ends(\(tenant), \(ended)::text[])"
    }

    /// The arrays of a batch's changes (`req`) and their planned deliveries (`planned`, `deliveryIndex` naming each
    /// delivery's change).
    private struct Columns {
        var index: [Int] = []
        var instanceIDs: [String] = []
        var operations: [String] = []
        var states: [String] = []
        var failureReasons: [String?] = []
        var attributes: [String] = []
        var contentStates: [String] = []
        var options: [String] = []
        var versions: [Int] = []
        var expectedVersions: [Int] = []
        var contentTimestamps: [Int64] = []
        var idempotency = IdempotencyColumns()
        var deliveryIndex: [Int] = []
        var deliveries = DeliveryColumns([])

        init(_ writes: [ChangeWrite]) {
            for (i, write) in writes.enumerated() {
                let plan = write.plan
                index.append(i)
                instanceIDs.append(write.instanceID)
                operations.append(write.operation.rawValue)
                states.append(plan.state.rawValue)
                failureReasons.append(plan.failureReason)
                attributes.append(plan.attributes.text)
                contentStates.append(plan.contentState.text)
                options.append(plan.options.json.text)
                versions.append(plan.version)
                expectedVersions.append(plan.expectedVersion)
                contentTimestamps.append(plan.contentTimestamp)
                idempotency.append(write.idempotency)
                deliveries.append(plan.deliveries)
                deliveryIndex.append(contentsOf: repeatElement(i, count: plan.deliveries.count))
            }
        }
    }
}

extension StartWrite: SetWrite {
    /// Two starts of one instance ID, or two with one Idempotency-Key, never share a statement.
    public var exclusiveKeys: [String] {
        IdempotencyColumns.exclusiveKeys(instanceID: request.instanceID, idempotency)
    }

    /// The write of a batch's starts of one tenant: one statement over arrays, one row per start (in order) with
    /// `created` (false when the instance ID or the Idempotency-Key was taken) and `deliveries`. The instance, its
    /// first deliveries, its Android devices and the idempotency record.
    public static func statement(tenant: UUID, _ writes: [StartWrite]) -> PostgresQuery {
        let c = Columns(writes)
        return """
            WITH req AS (
                SELECT * FROM unnest(\(c.index)::int[], \(c.instanceIDs)::text[], \(c.activityTypes)::text[],
                                     \(c.personIDs)::text[], \(c.personEmails)::text[], \(c.states)::text[],
                                     \(c.failureReasons)::text[], \(c.attributes)::jsonb[], \(c.contentStates)::jsonb[],
                                     \(c.options)::jsonb[], \(c.contentTimestamps)::bigint[], \(c.platforms)::text[],
                                     \(c.deviceIDs)::text[], \(c.responses)::jsonb[], \(c.expiresAt)::timestamptz[],
                                     \(c.channelIDs)::uuid[], \(c.idempotency.keys)::text[],
                                     \(c.idempotency.hashes)::text[], \(c.idempotency.statuses)::int[],
                                     \(c.idempotency.responses)::jsonb[])
                    AS r(i, instance_id, activity_type, person_id, person_email, state, failure_reason, attributes,
                         content_state, options, content_timestamp, target_platform, target_device, start_response,
                         expires_at, channel_id, idem_key, idem_hash, idem_status, idem_response)
            ), planned AS (
                SELECT * FROM unnest(\(c.deliveryIndex)::int[], \(c.deliveries.ids)::uuid[],
                                     \(c.deliveries.devices)::text[], \(c.deliveries.providers)::text[],
                                     \(c.deliveries.kinds)::text[], \(c.deliveries.tokens)::text[])
                    AS d(i, id, device_token, provider, token_kind, token)
            ), android AS (
                SELECT * FROM unnest(\(c.androidIndex)::int[], \(c.androidDevices)::text[]) AS a(i, device_token)
            ), who AS (
                -- The people addressed and the owners of the planned devices, held until the commit, before their
                -- devices are: a person's erasure takes their row first and collects what is theirs after
                -- (RegistryStore.deletePerson), so it sees this start, or this start finds their devices gone.
                -- (`= ANY(ARRAY(...))`: looked up on the primary keys, whatever the statistics.)
                SELECT p.id FROM people p
                WHERE p.tenant_id = \(tenant)
                  AND p.id = ANY(ARRAY(SELECT person_id FROM req
                                       UNION SELECT dv.person_id FROM devices dv
                                             WHERE dv.tenant_id = \(tenant)
                                               AND dv.token = ANY(ARRAY(SELECT device_token FROM planned
                                                                        UNION SELECT device_token FROM android))))
                FOR KEY SHARE
            ), held AS MATERIALIZED (
                -- The planned targets still there, with their devices' owners now, held until the commit
                -- (marquee_held_start_targets, migration 0109: the one home of the rule, which a campaign's start
                -- steps follow too): a device deleted since the start was planned (a worker deletes one FCM calls
                -- unregistered; an erasure, its person's) gets no push, and no row in instance_devices (whose reference
                -- to it would fail the statement); a push-to-start token retired meanwhile is seen. Read once the
                -- people are held (the condition is a one-time filter): the erasure takes a person, then devices.
                SELECT h.device_token, h.person_id, h.token
                FROM (SELECT array_agg(x.device_token) AS devices, array_agg(x.token) AS tokens,
                             array_agg(x.activity_type) AS types
                      FROM (SELECT d.device_token, CASE WHEN d.token_kind = 'push_to_start' THEN d.token END AS token,
                                   r.activity_type
                            FROM planned d JOIN req r ON r.i = d.i
                            UNION ALL
                            SELECT a.device_token, NULL, NULL FROM android a) x) a
                CROSS JOIN LATERAL marquee_held_start_targets(\(tenant), a.devices, a.tokens, a.types) h
                WHERE (SELECT count(*) FROM who) >= 0
            ), idem AS (
                \(unsafeRaw: IdempotencyColumns.write(response: "r.idem_response"))
            ), ins AS (
                INSERT INTO instances (tenant_id, id, activity_type, person_id, person_email, state, failure_reason,
                                       attributes, content_state, options, version, content_timestamp,
                                       target_platform, target_device, start_response, expires_at, channel_id)
                SELECT \(tenant), r.instance_id, r.activity_type, r.person_id, r.person_email, r.state,
                       r.failure_reason, r.attributes, r.content_state, r.options, 1, r.content_timestamp,
                       r.target_platform, r.target_device, r.start_response, r.expires_at, r.channel_id
                FROM req r
                WHERE r.idem_key IS NULL OR r.idem_key IN (SELECT key FROM idem)
                ON CONFLICT (tenant_id, id) DO NOTHING
                RETURNING id
            ), dels AS (
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                            operation, instance_version, attributes, content_state, options,
                                            content_timestamp)
                SELECT \(tenant), d.id, r.instance_id, d.device_token, d.provider, d.token_kind, d.token, 'start', 1,
                       r.attributes, r.content_state, r.options, r.content_timestamp
                FROM planned d
                JOIN req r ON r.i = d.i
                WHERE r.instance_id IN (SELECT id FROM ins) AND d.device_token IN (SELECT device_token FROM held)
                RETURNING instance_id
            ), devs AS (
                INSERT INTO instance_devices (tenant_id, instance_id, device_token, state, state_at)
                SELECT \(tenant), r.instance_id, a.device_token, 'started', '-infinity'
                FROM android a
                JOIN req r ON r.i = a.i
                WHERE r.instance_id IN (SELECT id FROM ins) AND a.device_token IN (SELECT device_token FROM held)
                ON CONFLICT DO NOTHING
                RETURNING 1
            ), queued AS (
                SELECT instance_id, count(*)::int AS n FROM dels GROUP BY instance_id
            )
            SELECT r.instance_id IN (SELECT id FROM ins) AS created, COALESCE(q.n, 0) AS deliveries,
                   -- A start whose ID was taken meanwhile must not keep its key's record (migration 0075): the
                   -- statement fails, and the batch is written again a start at a time.
                   CASE WHEN r.idem_key IN (SELECT key FROM idem) AND r.instance_id NOT IN (SELECT id FROM ins)
                        THEN marquee_write_lost('instance ID taken: ' || r.instance_id) END AS lost,
                   -- A start whose plan is out of date is planned again (migration 0087): its answer and state
                   -- must be those of what it queued, to the targets the person has now. Since its context read, a
                   -- planned device went or became someone else's (a push to it would reach another person's phone,
                   -- and an Android phone would stay the instance's target), or a planned push-to-start token was
                   -- retired (rotated, or called dead by APNs: the device's token now is another one, or none).
                   CASE WHEN r.instance_id IN (SELECT id FROM ins)
                             AND EXISTS (SELECT 1 FROM planned d
                                         WHERE d.i = r.i
                                           AND NOT EXISTS (
                                               SELECT 1 FROM held h
                                               WHERE h.device_token = d.device_token AND h.person_id = r.person_id
                                                 AND h.token IS NOT DISTINCT FROM
                                                     CASE WHEN d.token_kind = 'push_to_start' THEN d.token END))
                        THEN marquee_plan_stale('a target of ' || r.instance_id || ' changed') END AS stale
            FROM req r
            LEFT JOIN queued q ON q.instance_id = r.instance_id
            -- The people are held even for a start with nothing to send (an erasure must see its instance), and
            -- every planned target is (a CTE is read only as far as a reader needs it).
            CROSS JOIN (SELECT count(*) FROM who) held_people
            CROSS JOIN (SELECT count(*) FROM held) held_targets
            ORDER BY r.i
            """
    }

    /// The arrays of a batch's starts (`req`), their planned deliveries (`planned`) and Android devices (`android`),
    /// each naming its start by index.
    private struct Columns {
        var index: [Int] = []
        var instanceIDs: [String] = []
        var activityTypes: [String] = []
        var personIDs: [String?] = []
        var personEmails: [String?] = []
        var states: [String] = []
        var failureReasons: [String?] = []
        var attributes: [String] = []
        var contentStates: [String] = []
        var options: [String] = []
        var contentTimestamps: [Int64] = []
        var platforms: [String?] = []
        var deviceIDs: [String?] = []
        var responses: [String] = []
        var expiresAt: [Date] = []
        var channelIDs: [UUID?] = []
        var idempotency = IdempotencyColumns()
        var deliveryIndex: [Int] = []
        var deliveries = DeliveryColumns([])
        var androidIndex: [Int] = []
        var androidDevices: [String] = []

        init(_ writes: [StartWrite]) {
            for (i, write) in writes.enumerated() {
                let (request, plan) = (write.request, write.plan)
                index.append(i)
                instanceIDs.append(request.instanceID)
                activityTypes.append(request.activityType)
                personIDs.append(write.personID)
                personEmails.append(write.personEmail)
                states.append(plan.state.rawValue)
                failureReasons.append(plan.failureReason)
                attributes.append(request.attributes.text)
                contentStates.append(plan.contentState.text)
                options.append(plan.options.json.text)
                contentTimestamps.append(plan.contentTimestamp)
                platforms.append(request.platform?.rawValue)
                deviceIDs.append(request.deviceID)
                responses.append(write.response.text)
                expiresAt.append(request.expiresAt)
                channelIDs.append(request.channelID)
                idempotency.append(write.idempotency)
                deliveries.append(plan.deliveries)
                deliveryIndex.append(contentsOf: repeatElement(i, count: plan.deliveries.count))
                androidDevices.append(contentsOf: plan.androidDevices)
                androidIndex.append(contentsOf: repeatElement(i, count: plan.androidDevices.count))
            }
        }
    }
}

extension IdempotencyRecord: SetWrite {
    public var exclusiveKeys: [String] { IdempotencyColumns.exclusiveKeys(instanceID: nil, self) }

    /// Records of requests that wrote nothing else (suppressed no-ops), or whose writes are in the transaction that
    /// records them (``record(_:tenant:on:)``): one row per record, `written` false when its key already had a record
    /// younger than a day.
    public static func statement(tenant: UUID, _ writes: [IdempotencyRecord]) -> PostgresQuery {
        var c = IdempotencyColumns()
        for write in writes { c.append(write) }
        return """
            WITH req AS (
                SELECT * FROM unnest(\(Array(writes.indices))::int[], \(c.keys)::text[], \(c.hashes)::text[],
                                     \(c.statuses)::int[], \(c.responses)::jsonb[])
                    AS r(i, idem_key, idem_hash, idem_status, idem_response)
            ), idem AS (
                \(unsafeRaw: IdempotencyColumns.write(response: "r.idem_response"))
            )
            SELECT r.idem_key IN (SELECT key FROM idem) AS written FROM req r ORDER BY r.i
            """
    }

    /// Records `record` in the transaction of `connection` (confined to `tenant`), by the rule every writer of
    /// idempotency records follows (``IdempotencyColumns/write(response:only:)``): false when its key already has a
    /// record younger than a day, made by any request (the transaction's writes must then not be kept).
    static func record(_ record: IdempotencyRecord, tenant: UUID, on connection: PostgresConnection) throws -> Bool {
        try connection.query(statement(tenant: tenant, [record]))[0].decode(Bool.self, "written")
    }
}

/// The idempotency records of a batch of writes, as arrays (NULL where a write has none).
struct IdempotencyColumns {
    var keys: [String?] = []
    var hashes: [String?] = []
    var statuses: [Int?] = []
    var responses: [String?] = []

    /// A lifecycle write's exclusive keys: its instance if it has one, and its Idempotency-Key if it has one.
    static func exclusiveKeys(instanceID: String?, _ record: IdempotencyRecord?) -> [String] {
        [instanceID.map { "instance:" + $0 }, record.map { "key:" + $0.key }].compactMap { $0 }
    }

    /// The `idem` part of a set-based write (the tenant entered): the record of each `req r` row with a key
    /// (`idem_key`, `idem_hash` in hex, `idem_status`, and `response`, SQL over `r`), written unless the key has a
    /// record younger than a day, in which case the row's write loses (`alreadyExists`); `only` (SQL over `r`)
    /// restricts the rows recorded. Returns the keys written. The one home of how a record is written: every writer
    /// of `idempotency_keys` (lifecycle writes, suppressed no-ops, people imports, campaigns, channels) goes through it,
    /// so a request never replaces another's record of the last day, whichever kind of request made it.
    static func write(response: String, only: String = "true") -> String {
        """
        INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response)
        SELECT marquee_current_tenant(), r.idem_key, decode(r.idem_hash, 'hex'), r.idem_status, \(response)
        FROM req r
        WHERE r.idem_key IS NOT NULL AND \(only)
        ON CONFLICT (tenant_id, key) DO UPDATE SET
            request_hash = EXCLUDED.request_hash, status = EXCLUDED.status, response = EXCLUDED.response,
            created_at = now()
        WHERE idempotency_keys.created_at <= now() - interval '24 hours'
        RETURNING key
        """
    }

    mutating func append(_ record: IdempotencyRecord?) {
        keys.append(record?.key)
        hashes.append(record.map { Hex.encode($0.requestHash) })
        statuses.append(record?.status)
        responses.append(record?.response.text)
    }
}

extension JSONValue {
    /// The JSON text, for an element of a `jsonb[]` array parameter.
    fileprivate var text: String { String(decoding: bytes, as: UTF8.self) }
}
