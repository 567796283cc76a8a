import Foundation
import MarqueeCore
import PostgresClient

/// Reads what starts need before they write (`StartContext`), for many requests at once, as `ChangeContexts` does
/// for updates and ends: one transaction (one snapshot, REPEATABLE READ) and one round trip per batch, with at most
/// five statements per tenant whatever the number of starts — their activity types; their people (by ID or email)
/// with each person's devices and active push-to-start tokens for the types asked for; the instances already
/// holding the requested IDs; and, when asked for, the answers stored for Idempotency-Keys and the channels named.
final class StartContexts: Sendable {
    struct Request: Sendable {
        var tenant: UUID
        var activityType: String
        var personID: String?
        var email: String?
        var instanceID: String
        var idempotencyKey: String?
        var channelID: UUID?
    }

    private let database: TenantDatabase
    private let batches: Batches<Request, StartContext>

    init(database: TenantDatabase, readers: Int, maxBatch: Int = 64) {
        self.database = database
        batches = Batches(concurrency: readers, maxBatch: maxBatch)
    }

    /// Requests waiting for a batch.
    var queued: Int { batches.queued }

    func read(_ request: Request) async throws -> StartContext {
        try await batches.submit(request) { [database] batch in
            await answerEach(batch) { try await Self.read(database, $0) }
        }
    }

    static func read(_ database: TenantDatabase, _ batch: [Request]) async throws -> [StartContext] {
        var tenants: [UUID] = []
        var wanted: [UUID: Wanted] = [:]
        for request in batch {
            if wanted[request.tenant] == nil { tenants.append(request.tenant) }
            wanted[request.tenant, default: Wanted()].add(request)
        }
        let rows = try await database.tenantReads(
            tenants.map { ($0, wanted[$0]!.queries(tenant: $0)) }, genericPlans: true)

        var found: [UUID: Found] = [:]
        for (tenant, tenantRows) in zip(tenants, rows) {
            found[tenant] = try Found(tenantRows, wanted[tenant]!)
        }
        return batch.map { found[$0.tenant]!.context(for: $0) }
    }

    /// What one tenant's requests ask for, each value once.
    private struct Wanted {
        var types: [String] = []
        /// People by ID (`kind` "id") or email (`kind` "email"), each identifier once, compared as bytes
        /// (`Identifiers.personKey`: canonically equivalent IDs are two people).
        var kinds: [String] = []
        var identifiers: [String] = []
        var instanceIDs: [String] = []
        var keys: [String] = []
        var channels: [UUID] = []

        mutating func add(_ request: Request) {
            Self.insert(request.activityType, into: &types)
            func asked(_ kind: String, _ value: String) -> Bool {
                zip(kinds, identifiers).contains { $0.0 == kind && $0.1.utf8.elementsEqual(value.utf8) }
            }
            if let id = request.personID, !asked("id", id) {
                kinds.append("id")
                identifiers.append(id)
            } else if let email = request.email, !asked("email", email) {
                kinds.append("email")
                identifiers.append(email)
            }
            Self.insert(request.instanceID, into: &instanceIDs)
            if let key = request.idempotencyKey { Self.insert(key, into: &keys) }
            if let channel = request.channelID, !channels.contains(channel) { channels.append(channel) }
        }

        private static func insert(_ value: String, into list: inout [String]) {
            if !list.contains(value) { list.append(value) }
        }

        func queries(tenant: UUID) -> [PostgresQuery] {
            var queries: [PostgresQuery] = [
                """
                SELECT \(unsafeRaw: RegistryStore.typeColumns) FROM activity_types
                WHERE tenant_id = \(tenant) AND identifier = ANY(\(types)::text[])
                """,
                // Each identifier's person (emails compared case-insensitively, unique per tenant), then the person's
                // devices in the order they were registered, each with its active push-to-start tokens for the
                // requested types (a row per token, or one without).
                """
                WITH asked AS (
                    SELECT * FROM unnest(\(kinds)::text[], \(identifiers)::text[]) AS a(kind, identifier)
                ), resolved AS (
                    SELECT a.kind, a.identifier,
                           CASE a.kind
                               WHEN 'id' THEN (SELECT pe.id FROM people pe
                                               WHERE pe.tenant_id = \(tenant) AND pe.id = a.identifier)
                               ELSE (SELECT pe.id FROM people pe
                                     WHERE pe.tenant_id = \(tenant) AND lower(pe.email) = lower(a.identifier))
                           END AS person_id
                    FROM asked a
                )
                -- Lookups by index for each person and device (LATERAL … OFFSET 0): a join planned on stale
                -- statistics hashed every device of the tenant for each batch (7 ms a batch at 10,000 devices).
                SELECT r.kind, r.identifier, r.person_id, d.token AS device_token, d.platform,
                       p.activity_type AS token_type, p.token AS push_to_start_token
                FROM resolved r
                LEFT JOIN LATERAL (
                    SELECT dv.token, dv.platform, dv.created_at FROM devices dv
                    WHERE dv.tenant_id = \(tenant) AND dv.person_id = r.person_id OFFSET 0
                ) d ON true
                LEFT JOIN LATERAL (
                    SELECT t.activity_type, t.token FROM push_to_start_tokens t
                    WHERE t.tenant_id = \(tenant) AND t.device_token = d.token AND t.status = 'active'
                      AND t.activity_type = ANY(\(types)::text[])
                    OFFSET 0
                ) p ON true
                ORDER BY r.kind, r.identifier, d.created_at, d.token
                """,
                """
                SELECT id, start_response FROM instances
                WHERE tenant_id = \(tenant) AND id = ANY(\(instanceIDs)::text[])
                """,
            ]
            if !keys.isEmpty { queries.append(LiveActivityStore.idempotencyQuery(tenant, keys: keys)) }
            if !channels.isEmpty {
                queries.append(
                    """
                    SELECT \(unsafeRaw: ChannelStore.columns) FROM channels
                    WHERE tenant_id = \(tenant) AND id = ANY(\(channels)::uuid[])
                    """)
            }
            return queries
        }
    }

    /// What was read for one tenant, by the values asked for.
    private struct Found {
        struct Device {
            var token: String
            var platform: Platform
            /// Active push-to-start tokens by activity type.
            var pushToStart: [String: String] = [:]
        }

        var types: [String: ActivityType] = [:]
        /// By "kind:identifier" as bytes (`Identifiers.personKey`): the person and their devices in order.
        var people: [[UInt8]: (id: String?, devices: [Device])] = [:]
        /// Instances with a requested ID, and their stored start answer.
        var instances: [String: JSONValue?] = [:]
        var stored: [String: StoredResponse] = [:]
        var channels: [UUID: ChannelRecord] = [:]

        init(_ rows: [PostgresRows], _ wanted: Wanted) throws {
            for row in rows[0] {
                let type = try RegistryStore.activityType(row)
                types[type.identifier] = type
            }
            for row in rows[1] {
                let key = Identifiers.personKey(
                    try row.decode(String.self, "kind") + ":" + row.decode(String.self, "identifier"))
                var person = try people[key] ?? (row.decode(String?.self, "person_id"), [])
                if let token = try row.decode(String?.self, "device_token") {
                    if person.devices.last?.token != token {
                        person.devices.append(
                            Device(token: token, platform: try row.decodeRaw(Platform.self, "platform")))
                    }
                    if let type = try row.decode(String?.self, "token_type") {
                        person.devices[person.devices.count - 1].pushToStart[type] = try row.decode(
                            String.self, "push_to_start_token")
                    }
                }
                people[key] = person
            }
            for row in rows[2] {
                instances[try row.decode(String.self, "id")] = try row.decode(JSONValue?.self, "start_response")
            }
            var next = 3
            if !wanted.keys.isEmpty {
                for row in rows[next] {
                    stored[try row.decode(String.self, "key")] = try LiveActivityStore.storedResponse(row)
                }
                next += 1
            }
            if !wanted.channels.isEmpty {
                for row in rows[next] {
                    let channel = try ChannelStore.channel(row)
                    channels[channel.id] = channel
                }
            }
        }

        func context(for request: Request) -> StartContext {
            let key = request.personID.map { "id:" + $0 } ?? request.email.map { "email:" + $0 } ?? ""
            let person = people[Identifiers.personKey(key)]
            let candidates = (person?.devices ?? []).map {
                StartCandidate(
                    deviceToken: $0.token, platform: $0.platform, pushToStartToken: $0.pushToStart[request.activityType]
                )
            }
            let existing = instances[request.instanceID]
            return StartContext(
                activityType: types[request.activityType], personID: person?.id, candidates: candidates,
                idempotent: request.idempotencyKey.flatMap { stored[$0] },
                existingStart: (existing ?? nil).map { StoredResponse(status: 200, body: $0, requestHash: []) },
                existingInstance: existing != nil, channel: request.channelID.flatMap { channels[$0] })
        }
    }
}
