import Foundation
import MarqueeCore
import PostgresClient

/// Reads what updates and ends need before they write (`ChangeContext`), for many requests at once: the requests
/// that arrive while earlier reads are in flight go out together, one transaction and one round trip for the batch,
/// with at most three statements per tenant whatever the number of instances (each instance with its activity type
/// and channel; their active targets, `marquee_instance_targets`, the rule shared with campaigns and the registry;
/// and, when requests carry Idempotency-Keys, the answers stored for them). One snapshot per batch (REPEATABLE READ): a context is as consistent
/// as when each was read alone, and the write that follows still checks the instance's version.
final class ChangeContexts: Sendable {
    struct Request: Sendable {
        var tenant: UUID
        var instanceID: String
        var idempotencyKey: String?
    }

    private let database: TenantDatabase
    private let batches: Batches<Request, ChangeContext>
    private let onBatch: @Sendable (_ requests: Int) -> Void

    /// Up to `readers` batches at once (each on its own connection), each of up to `maxBatch` requests; `onBatch` is
    /// told the size of every batch read (for a histogram).
    init(
        database: TenantDatabase, readers: Int, maxBatch: Int = 64,
        onBatch: @escaping @Sendable (_ requests: Int) -> Void = { _ in }
    ) {
        self.database = database
        self.onBatch = onBatch
        batches = Batches(concurrency: readers, maxBatch: maxBatch)
    }

    /// Requests waiting for a batch.
    var queued: Int { batches.queued }

    func read(_ request: Request) async throws -> ChangeContext {
        try await batches.submit(request) { await self.read(batch: $0) }
    }

    /// One answer per request, in order (`answerEach`: if the batch fails as a whole, each request is read alone).
    private func read(batch: [Request]) async -> [Result<ChangeContext, any Error>] {
        onBatch(batch.count)
        return await answerEach(batch) { [database] in try await Self.read(database, $0) }
    }

    static func read(_ database: TenantDatabase, _ batch: [Request]) async throws -> [ChangeContext] {
        // Per tenant (in order of first appearance): its instances and keys, each once.
        var tenants: [UUID] = []
        var wanted: [UUID: (ids: [String], keys: [String])] = [:]
        for request in batch {
            if wanted[request.tenant] == nil {
                tenants.append(request.tenant)
                wanted[request.tenant] = ([], [])
            }
            if !wanted[request.tenant]!.ids.contains(request.instanceID) {
                wanted[request.tenant]!.ids.append(request.instanceID)
            }
            if let key = request.idempotencyKey, !wanted[request.tenant]!.keys.contains(key) {
                wanted[request.tenant]!.keys.append(key)
            }
        }
        let reads = tenants.map { tenant in
            let (ids, keys) = wanted[tenant]!
            var queries: [PostgresQuery] = [
                """
                SELECT \(unsafeRaw: LiveActivityStore.instanceColumnsJoined),
                       \(unsafeRaw: LiveActivityStore.typeColumnsJoined),
                       \(unsafeRaw: LiveActivityStore.channelColumnsJoined)
                FROM instances i
                JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type
                LEFT JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
                WHERE i.tenant_id = \(tenant) AND i.id = ANY(\(ids)::text[])
                """,
                RegistryStore.activityTargetsQuery(tenant: tenant, instanceIDs: ids),
            ]
            if !keys.isEmpty {
                queries.append(LiveActivityStore.idempotencyQuery(tenant, keys: keys))
            }
            return (tenant: tenant, queries: queries)
        }
        let rows = try await database.tenantReads(reads, genericPlans: true)

        var contexts: [UUID: [String: ChangeContext]] = [:]
        var stored: [UUID: [String: StoredResponse]] = [:]
        for (tenant, tenantRows) in zip(tenants, rows) {
            var targets: [String: [ActivityTarget]] = [:]
            for row in tenantRows[1] {
                targets[try row.decode(String.self, "instance_id"), default: []].append(
                    try RegistryStore.activityTarget(row))
            }
            var byInstance: [String: ChangeContext] = [:]
            for row in tenantRows[0] {
                let instance = try LiveActivityStore.instance(row)
                byInstance[instance.id] = ChangeContext(
                    instance: instance, activityType: try RegistryStore.activityType(row),
                    targets: targets[instance.id] ?? [], idempotent: nil, channel: try ChannelBinding.decode(row))
            }
            contexts[tenant] = byInstance
            if tenantRows.count > 2 {
                for row in tenantRows[2] {
                    let response = try LiveActivityStore.storedResponse(row)
                    stored[tenant, default: [:]][try row.decode(String.self, "key")] = response
                }
            }
        }
        return batch.map { request in
            // No such instance (in this tenant): a replay of a key is still answered from its own record.
            var context =
                contexts[request.tenant]?[request.instanceID]
                ?? ChangeContext(instance: nil, activityType: nil, targets: [], idempotent: nil)
            context.idempotent = request.idempotencyKey.flatMap { stored[request.tenant]?[$0] }
            return context
        }
    }
}
