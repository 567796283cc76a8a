import Crypto
import Foundation
import MarqueeCore
import PostgresClient

extension ChangeWrite: SetWrite {
    /// Two changes of one instance, or two with one Idempotency-Key, never share a statement.
    public var exclusiveKeys: [String] {
        var keys = ["instance:" + instanceID]
        if let key = idempotency?.key { keys.append("key:" + key) }
        return keys
    }

    /// The write of a batch's updates and ends of one tenant: one statement over arrays, one row per change (in
    /// order) with `version` (NULL when the instance was no longer at the expected version, or the Idempotency-Key
    /// was taken), `deliveries`, `idem_written` and `coalesced`. The one home of the change's write rules: a version
    /// check per instance, supersede (latest wins), pacing, the pending end, the idempotency record.
    public static func statement(tenant: UUID, _ writes: [ChangeWrite]) -> PostgresQuery {
        let c = Columns(writes)
        return """
            WITH req AS (
                SELECT * FROM unnest(\(c.index)::int[], \(c.instanceIDs)::text[], \(c.operations)::text[],
                                     \(c.states)::text[], \(c.failureReasons)::text[], \(c.attributes)::jsonb[],
                                     \(c.contentStates)::jsonb[], \(c.options)::jsonb[], \(c.versions)::bigint[],
                                     \(c.expectedVersions)::bigint[], \(c.contentTimestamps)::bigint[],
                                     \(c.keys)::text[], \(c.hashes)::text[], \(c.statuses)::int[],
                                     \(c.responses)::jsonb[])
                    AS r(i, instance_id, op, state, failure_reason, attributes, content_state, options, version,
                         expected_version, content_timestamp, idem_key, idem_hash, idem_status, idem_response)
            ), planned AS (
                SELECT * FROM unnest(\(c.deliveryIndex)::int[], \(c.deliveries.ids)::uuid[],
                                     \(c.deliveries.devices)::text[], \(c.deliveries.providers)::text[],
                                     \(c.deliveries.kinds)::text[], \(c.deliveries.tokens)::text[])
                    AS d(i, id, device_token, provider, token_kind, token)
            ), pace AS (
                -- Pacing: an update of an instance whose activity type has min_update_interval_ms is due that long
                -- after the instance's last update that went out (or is going out now); until then a newer update
                -- supersedes it (cand below). The one home of the rule.
                SELECT r.i,
                       CASE WHEN r.op = 'update' AND a.min_update_interval_ms > 0 THEN
                           GREATEST(now(), COALESCE((
                               SELECT max(CASE WHEN p.status = 'sent' THEN p.sent_at ELSE now() END)
                               FROM deliveries p
                               WHERE p.tenant_id = \(tenant) AND p.instance_id = r.instance_id
                                 AND p.operation = 'update'
                                 AND (p.status = 'sent'
                                      OR (p.status = 'queued' AND marquee_delivery_in_flight(p.tenant_id, p.id)))
                           ), '-infinity') + make_interval(secs => a.min_update_interval_ms / 1000.0))
                       ELSE now() END AS due,
                       CASE WHEN r.op = 'update' THEN a.min_update_interval_ms ELSE 0 END AS interval_ms
                FROM req r
                JOIN instances i ON i.tenant_id = \(tenant) AND i.id = r.instance_id
                JOIN activity_types a ON a.tenant_id = i.tenant_id AND a.identifier = i.activity_type
            ), idem AS (
                INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response)
                SELECT \(tenant), r.idem_key, decode(r.idem_hash, 'hex'), r.idem_status,
                       r.idem_response
                           || jsonb_build_object('coalesced', COALESCE((SELECT p.due > now() FROM pace p WHERE p.i = r.i),
                                                                       false))
                FROM req r
                WHERE r.idem_key IS NOT NULL
                ON CONFLICT (tenant_id, key) DO UPDATE SET
                    request_hash = EXCLUDED.request_hash, status = EXCLUDED.status, response = EXCLUDED.response,
                    created_at = now()
                WHERE idempotency_keys.created_at <= now() - interval '24 hours'
                RETURNING key
            ), upd AS (
                UPDATE instances SET
                    state = r.state, failure_reason = r.failure_reason, attributes = r.attributes,
                    content_state = r.content_state, options = r.options, version = r.version,
                    content_timestamp = r.content_timestamp,
                    ended_at = CASE WHEN r.op = 'end' THEN now() ELSE ended_at END,
                    -- An end that reaches no activity token while a start went (or may go) out by push-to-start is
                    -- kept: it is queued when the activity token registers (marquee_register_activity_token).
                    pending_end = r.op = 'end' AND marquee_end_waits_for_token(\(tenant), r.instance_id),
                    updated_at = now()
                FROM req r
                WHERE instances.tenant_id = \(tenant) AND instances.id = r.instance_id
                  AND instances.version = r.expected_version
                  AND (r.idem_key IS NULL OR r.idem_key IN (SELECT key FROM idem))
                RETURNING r.i, instances.version
            ), cand AS (
                -- An end cancels every unsent delivery of its instance; an update supersedes older ones to its
                -- tokens (rows waiting for a retry included).
                SELECT q.id, r.i
                FROM req r
                JOIN delivery_queue q ON q.tenant_id = \(tenant) AND q.instance_id = r.instance_id
                WHERE r.op = 'end'
                   OR (q.operation <> 'start' AND q.token IN (SELECT p.token FROM planned p WHERE p.i = r.i))
            ), free AS (
                -- Rows a worker holds (claimed, being sent) are skipped, never waited on, and left to finish (the
                -- worker supersedes an interrupted one of an ended instance, and a retry of an older version).
                SELECT id FROM delivery_queue
                WHERE tenant_id = \(tenant) AND id IN (SELECT id FROM cand)
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
                   r.idem_key IS NOT NULL AND r.idem_key IN (SELECT key FROM idem) AS idem_written,
                   COALESCE(pd.due > now(), false) AND q.n IS NOT NULL AS coalesced
            FROM req r
            LEFT JOIN upd u ON u.i = r.i
            LEFT JOIN paced pd ON pd.i = r.i
            LEFT JOIN queued q ON q.instance_id = r.instance_id
            ORDER BY r.i
            """
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
        var keys: [String?] = []
        var hashes: [String?] = []
        var statuses: [Int?] = []
        var responses: [String?] = []
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
                keys.append(write.idempotency?.key)
                hashes.append(write.idempotency.map { Hex.encode($0.requestHash) })
                statuses.append(write.idempotency?.status)
                responses.append(write.idempotency?.response.text)
                deliveries.append(plan.deliveries)
                deliveryIndex.append(contentsOf: repeatElement(i, count: plan.deliveries.count))
            }
        }
    }
}

extension JSONValue {
    /// The JSON text, for an element of a `jsonb[]` array parameter.
    fileprivate var text: String { String(decoding: bytes, as: UTF8.self) }
}
