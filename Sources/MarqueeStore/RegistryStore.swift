import Foundation
import MarqueeCore
import PostgresClient

public struct Person: Sendable, Equatable {
    public var id: String
    public var email: String?
    public var attributes: JSONValue
    public var createdAt: Date
    public var updatedAt: Date
}

public struct Device: Sendable, Equatable {
    public var token: String
    public var personID: String
    public var platform: Platform
    public var appID: String?
    public var osVersion: String?
    public var appVersion: String?
    public var attributes: JSONValue
    public var createdAt: Date
    public var updatedAt: Date
}

/// A registered token as shown in reads: `masked`, never whole.
public struct TokenInfo: Sendable, Equatable {
    public enum Kind: String, Sendable {
        case pushToStart = "push_to_start"
        case activity
    }
    public var kind: Kind
    /// The activity type (push-to-start) or the instance ID (activity tokens).
    public var scope: String
    public var masked: String
    public var status: String
    public var updatedAt: Date
}

public struct DeviceDetail: Sendable, Equatable {
    public var device: Device
    /// At most `RegistryStore.maximumTokensPerDevice`: the active ones first, then the most recently changed.
    public var tokens: [TokenInfo]
    /// How many tokens the device has, active and retired.
    public var tokensTotal: Int
}

public struct PersonDetail: Sendable, Equatable {
    public var person: Person
    public var devices: [DeviceDetail]
}

/// Device fields as registered.
public struct DeviceRegistration: Sendable {
    public var personID: String
    public var token: String
    public var platform: Platform
    public var appID: String?
    public var osVersion: String?
    public var appVersion: String?
    public var attributes: JSONValue?

    public init(
        personID: String, token: String, platform: Platform, appID: String? = nil, osVersion: String? = nil,
        appVersion: String? = nil, attributes: JSONValue? = nil
    ) {
        self.personID = personID
        self.token = token
        self.platform = platform
        self.appID = appID
        self.osVersion = osVersion
        self.appVersion = appVersion
        self.attributes = attributes
    }
}

/// The outcome of a token registration.
public struct TokenRegistration: Sendable, Equatable {
    /// A different token was active and has been retired.
    public var rotated: Bool
    /// The token was already the active one.
    public var unchanged: Bool
}

/// Shows the ends of a token only.
public func maskToken(_ token: String) -> String {
    guard token.count > 12 else { return String(repeating: "•", count: token.count) }
    return token.prefix(4) + "…" + token.suffix(4)
}

/// People, devices, activity types, tokens, lifecycle events and delivery metrics.
public struct RegistryStore: Sendable {
    let database: TenantDatabase

    public init(database: TenantDatabase) {
        self.database = database
    }

    // MARK: Activity types

    /// Creates or replaces an activity type. Returns it and whether it was created.
    public func putActivityType(tenant: UUID, _ type: ActivityType) async throws -> (ActivityType, created: Bool) {
        let dateFields = JSONValue.object(type.dateFields.mapValues { .string($0.rawValue) })
        return try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                INSERT INTO activity_types (tenant_id, identifier, attributes_type, content_state_schema, date_fields,
                                            payload_profile, frequent_updates, min_update_interval_ms, auto_created)
                VALUES (\(tenant), \(type.identifier), \(type.attributesType), \(type.contentStateSchema),
                        \(dateFields), \(type.payloadProfile.rawValue), \(type.frequentUpdates),
                        \(type.minUpdateIntervalMilliseconds), false)
                ON CONFLICT (tenant_id, identifier) DO UPDATE SET
                    attributes_type = EXCLUDED.attributes_type, content_state_schema = EXCLUDED.content_state_schema,
                    date_fields = EXCLUDED.date_fields, payload_profile = EXCLUDED.payload_profile,
                    frequent_updates = EXCLUDED.frequent_updates,
                    min_update_interval_ms = EXCLUDED.min_update_interval_ms, auto_created = false
                RETURNING \(unsafeRaw: Self.typeColumns), (xmax = 0) AS inserted
                """)
            return (try Self.activityType(rows[0]), try rows[0].decode(Bool.self, "inserted"))
        }
    }

    public func activityType(tenant: UUID, identifier: String) async throws -> ActivityType {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                SELECT \(unsafeRaw: Self.typeColumns) FROM activity_types
                WHERE tenant_id = \(tenant) AND identifier = \(identifier)
                """)
            guard let row = rows.first else { throw NotFound("activity_type") }
            return try Self.activityType(row)
        }
    }

    /// The tenant's activity types by identifier, the first `limit` after `after` (a page: push-to-start registrations
    /// with an sdk key, which is public, create types, so a tenant may have any number of them).
    public func activityTypes(tenant: UUID, after: String?, limit: Int) async throws -> [ActivityType] {
        try await database.tenantTransaction(tenant) { connection in
            try connection.query(
                """
                SELECT \(unsafeRaw: Self.typeColumns) FROM activity_types
                WHERE tenant_id = \(tenant) AND (\(after)::text IS NULL OR identifier > \(after))
                ORDER BY identifier LIMIT \(limit)
                """
            ).map(Self.activityType)
        }
    }

    // MARK: People

    /// Creates or updates a person (see `RegistryTransaction.upsertPerson`).
    public func upsertPerson(
        tenant: UUID, id: String, email: String?, attributes: JSONValue?, takenEmail: TakenEmail = .conflict
    ) async throws -> PersonWrite {
        try await transaction(tenant: tenant) {
            try $0.upsertPerson(id: id, email: email, attributes: attributes, takenEmail: takenEmail)
        }
    }

    /// The most tokens a person read lists per device. An sdk key (public) registers tokens: every rotation keeps the
    /// retired token (for `MARQUEE_RETENTION_DAYS`) and every activity type it names is created (up to the tenant's
    /// `max_auto_created_activity_types`), so a device may hold very many of them.
    public static let maximumTokensPerDevice = 50

    /// The person with every device and its (masked) tokens: at most `maximumTokensPerDevice` of them each, the
    /// active first, then the most recently changed.
    public func person(tenant: UUID, id: String) async throws -> PersonDetail {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                SELECT id, email, attributes, created_at, updated_at FROM people
                WHERE tenant_id = \(tenant) AND id = \(id)
                """)
            guard let row = rows.first else { throw NotFound("person") }
            let person = try Self.person(row)
            let devices = try connection.query(
                """
                SELECT \(unsafeRaw: Self.deviceColumns) FROM devices
                WHERE tenant_id = \(tenant) AND person_id = \(id) ORDER BY created_at, token
                """
            ).map(Self.device)
            let tokenRows = try connection.query(
                """
                SELECT * FROM (
                    SELECT t.*, count(*) OVER w AS n,
                           row_number() OVER (w ORDER BY t.status = 'active' DESC, t.updated_at DESC) AS pos
                    FROM (
                        SELECT 'push_to_start' AS kind, device_token, activity_type AS scope, token, status, updated_at
                        FROM push_to_start_tokens p
                        WHERE p.tenant_id = \(tenant) AND p.device_token IN (
                            SELECT token FROM devices WHERE tenant_id = \(tenant) AND person_id = \(id))
                        UNION ALL
                        SELECT 'activity', device_token, instance_id, token, status, updated_at
                        FROM activity_tokens a
                        WHERE a.tenant_id = \(tenant) AND a.device_token IN (
                            SELECT token FROM devices WHERE tenant_id = \(tenant) AND person_id = \(id))
                    ) t
                    WINDOW w AS (PARTITION BY t.device_token)
                ) r
                WHERE pos <= \(Self.maximumTokensPerDevice)
                ORDER BY status = 'active' DESC, updated_at DESC
                """)
            var tokens: [String: [TokenInfo]] = [:]
            var totals: [String: Int] = [:]
            for row in tokenRows {
                let info = TokenInfo(
                    kind: try row.decodeRaw(TokenInfo.Kind.self, "kind"),
                    scope: try row.decode(String.self, "scope"),
                    masked: maskToken(try row.decode(String.self, "token")),
                    status: try row.decode(String.self, "status"), updatedAt: try row.decode(Date.self, "updated_at"))
                let device = try row.decode(String.self, "device_token")
                tokens[device, default: []].append(info)
                totals[device] = Int(try row.decode(Int64.self, "n"))
            }
            return PersonDetail(
                person: person,
                devices: devices.map {
                    DeviceDetail(device: $0, tokens: tokens[$0.token] ?? [], tokensTotal: totals[$0.token] ?? 0)
                })
        }
    }

    /// Erases a person's trace, in one transaction: their instances (with attributes, content and options), every
    /// delivery of those instances or to their devices and tokens (queued ones are thereby cancelled), the metrics of
    /// those deliveries, lifecycle events, stored idempotent replies of those instances, and finally the person with
    /// their devices and tokens (by cascade). Instances are removed, not anonymised: nothing of them is kept.
    ///
    /// The instances are held from their collection on (FOR UPDATE): a change or a catch-up end of one waits for the
    /// erasure and then finds it gone, so nothing is queued for them that a worker could send and record after the
    /// history was erased. Their history and metrics are erased after the instances, and a metric reported meanwhile
    /// waits for the erasure (the tenant's erasure lock) and then finds its delivery gone (migration 0101).
    public func deletePerson(tenant: UUID, id: String) async throws {
        let deleted = try await database.tenantTransaction(tenant) { connection in
            // The writes that make something of a person from what they read of them wait for this erasure, or it
            // for them: a campaign's start step and a people import hold the tenant's erasure lock (shared), an API
            // start the person's row (FOR KEY SHARE). Both are taken here first, each in a statement of its own, so
            // the collection below, with a snapshot taken after them, sees what such a write committed; a later write
            // finds the person gone.
            try connection.query(ErasureLock.exclusive(tenant))
            let held = try connection.query(
                "SELECT 1 FROM people WHERE tenant_id = \(tenant) AND id = \(id) FOR UPDATE")
            guard !held.isEmpty else { return 0 }
            let found = try connection.query(
                """
                WITH devs AS (SELECT token FROM devices WHERE tenant_id = \(tenant) AND person_id = \(id))
                SELECT ARRAY(SELECT token FROM devs) AS devices,
                       ARRAY(SELECT token FROM devs
                             UNION SELECT token FROM push_to_start_tokens
                                   WHERE tenant_id = \(tenant) AND device_token IN (SELECT token FROM devs)
                             UNION SELECT token FROM activity_tokens
                                   WHERE tenant_id = \(tenant) AND device_token IN (SELECT token FROM devs)) AS tokens,
                       ARRAY(SELECT i.id FROM instances i
                             WHERE i.tenant_id = \(tenant)
                               AND (i.person_id = \(id)
                                    -- Started by an email no one had then: whoever has it now. One started for a
                                    -- person by their email is theirs, whoever took the address since.
                                    OR (i.person_id IS NULL AND p.email IS NOT NULL
                                        AND lower(i.person_email) = lower(p.email))
                                    OR i.target_device IN (SELECT token FROM devs))
                             -- Held to the end: a change being written is waited for (what it queued is seen
                             -- below), a later one waits and finds the instance gone.
                             FOR UPDATE OF i) AS instances
                FROM people p WHERE p.tenant_id = \(tenant) AND p.id = \(id)
                """)
            guard let row = found.first else { return 0 }
            let devices = try row.decode([String].self, "devices")
            let tokens = try row.decode([String].self, "tokens")
            let instances = try row.decode([String].self, "instances")
            // Queued and recorded deliveries alike (the history is append-only, erasure is its one exception). The
            // queue first, in a statement of its own: a worker sending one of them holds its row until it has
            // recorded it, so the history, read with a snapshot taken after (below, once the instances are gone),
            // has its record.
            var deliveries = try connection.query(
                """
                DELETE FROM delivery_queue
                WHERE tenant_id = \(tenant)
                  AND (instance_id = ANY(\(instances)::text[]) OR device_token = ANY(\(devices)::text[])
                       OR token = ANY(\(tokens)::text[]))
                RETURNING id::text AS id
                """
            ).map { try $0.decode(String.self, "id") }
            try connection.execute(
                """
                DELETE FROM activity_events
                WHERE tenant_id = \(tenant)
                  AND (instance_id = ANY(\(instances)::text[]) OR device_token = ANY(\(devices)::text[]))
                """)
            // Other devices' state and tokens for the person's instances (a device may have moved to someone else).
            try connection.execute(
                "DELETE FROM instance_devices WHERE tenant_id = \(tenant) AND instance_id = ANY(\(instances)::text[])")
            try connection.execute(
                "DELETE FROM activity_tokens WHERE tenant_id = \(tenant) AND instance_id = ANY(\(instances)::text[])")
            // The stored replies of starts, updates and ends name their instance in `instance_id`
            // (`LifecycleRoutes.render`); matched exactly, so another request's reply that merely contains an erased
            // instance's ID somewhere keeps it, and a retry of that request is still answered from it.
            try connection.execute(
                """
                DELETE FROM idempotency_keys k
                WHERE k.tenant_id = \(tenant) AND k.response ->> 'instance_id' = ANY(\(instances)::text[])
                """)
            // Campaigns: who they addressed (the audience kept at start) and lists of people they name.
            try connection.execute(
                """
                DELETE FROM campaign_members
                WHERE tenant_id = \(tenant) AND (person_id = \(id) OR instance_id = ANY(\(instances)::text[]))
                """)
            try connection.execute(
                """
                UPDATE campaigns SET audience = jsonb_set(audience, '{people}', (audience -> 'people') - \(id)::text)
                WHERE tenant_id = \(tenant) AND audience -> 'people' ? \(id)::text
                """)
            try connection.execute(
                "DELETE FROM instances WHERE tenant_id = \(tenant) AND id = ANY(\(instances)::text[])")
            deliveries += try connection.query(
                """
                DELETE FROM delivery_history
                WHERE tenant_id = \(tenant)
                  AND (instance_id = ANY(\(instances)::text[]) OR device_token = ANY(\(devices)::text[])
                       OR token = ANY(\(tokens)::text[]))
                RETURNING id::text AS id
                """
            ).map { try $0.decode(String.self, "id") }
            try connection.execute(
                """
                DELETE FROM delivery_metrics
                WHERE tenant_id = \(tenant)
                  AND (lower(delivery_id) = ANY(\(deliveries)::text[]) OR delivery_uuid = ANY(\(deliveries)::uuid[])
                       OR recipient = ANY(\(tokens)::text[]))
                """)
            return try connection.execute("DELETE FROM people WHERE tenant_id = \(tenant) AND id = \(id)")
        }
        if deleted == 0 { throw NotFound("person") }
    }

    // MARK: Devices

    /// Registers a device for a person (creating the person if needed). A token registered before under someone
    /// else moves to this person: a device has one owner.
    public func upsertDevice(tenant: UUID, _ registration: DeviceRegistration) async throws -> Device {
        try await transaction(tenant: tenant) { try $0.upsertDevice(registration) }
    }

    /// Removes a device (and its tokens). With `personID`, only if it belongs to that person.
    public func deleteDevice(tenant: UUID, personID: String?, token: String) async throws {
        try await transaction(tenant: tenant) { try $0.deleteDevice(personID: personID, token: token) }
    }

    // MARK: Tokens

    /// A registered device's owner and platform, or nil if the token is not registered (one round trip).
    public func registeredDevice(tenant: UUID, token: String) async throws -> RegisteredDevice? {
        try RegistryTransaction.registeredDevice(
            try await database.tenantStatement(
                tenant, RegistryTransaction.registeredDeviceQuery(tenant: tenant, token: token)))
    }

    /// Registers the push-to-start token of a person's iOS device for an activity type (see
    /// `RegistryTransaction.registerPushToStart`), in one round trip: the SQL function confines itself to the tenant.
    public func registerPushToStart(
        tenant: UUID, personID: String, deviceToken: String, activityType: String, token: String,
        attributesType: String?, profile: PayloadProfile = .marquee
    ) async throws -> TokenRegistration {
        let query = RegistryTransaction.registerPushToStartQuery(
            tenant: tenant, personID: personID, deviceToken: deviceToken, activityType: activityType, token: token,
            attributesType: attributesType, profile: profile)
        return try RegistryTransaction.pushToStartOutcome(
            try await retryingRace { try await database.tenantQuery(tenant, query) })
    }

    /// Registers the per-activity token of a device of the instance's person (see
    /// `RegistryTransaction.registerActivityToken`): one round trip, ownership checked in the same statement.
    public func registerActivityToken(tenant: UUID, instanceID: String, deviceToken: String, token: String)
        async throws -> TokenRegistration
    {
        let query = RegistryTransaction.registerActivityTokenQuery(
            tenant: tenant, instanceID: instanceID, deviceToken: deviceToken, token: token)
        return try RegistryTransaction.activityTokenOutcome(
            try await retryingRace { try await database.tenantQuery(tenant, query) })
    }

    /// The tokens an update or end of `instanceID` goes to: every active per-activity token, and the FCM tokens of
    /// the Android devices of the instance, leaving out devices that reported `ended` or `dismissed`.
    public func activityTargets(tenant: UUID, instanceID: String) async throws -> [ActivityTarget] {
        try await database.tenantTransaction(tenant) { connection in
            try connection.query(Self.activityTargetsQuery(tenant: tenant, instanceIDs: [instanceID])).map(
                Self.activityTarget)
        }
    }

    /// The rule is `marquee_instance_targets` (migration 0049), shared with the set-based campaign writes. It is driven
    /// from the instance's own rows (its activity tokens and its devices), never from the tenant's whole device table,
    /// so it costs the same with ten devices or ten million.
    static func activityTargetsQuery(tenant: UUID, instanceIDs: [String]) -> PostgresQuery {
        """
        SELECT instance_id, device_token, platform, token FROM marquee_instance_targets(\(tenant), \(instanceIDs)::text[])
        ORDER BY instance_id, device_token
        """
    }

    static func activityTarget(_ row: PostgresRow) throws -> ActivityTarget {
        ActivityTarget(
            deviceToken: try row.decode(String.self, "device_token"),
            platform: try row.decodeRaw(Platform.self, "platform"),
            token: try row.decode(String.self, "token"))
    }

    // MARK: Lifecycle events and delivery metrics

    /// Records a lifecycle event and moves the device's state for the instance (see
    /// `RegistryTransaction.recordEvent`).
    public func recordEvent(
        tenant: UUID, instanceID: String, event: LifecycleEvent, deviceToken: String, at: Date,
        contentState: JSONValue?
    ) async throws {
        try await transaction(tenant: tenant) {
            try $0.recordEvent(
                instanceID: instanceID, event: event, deviceToken: deviceToken, at: at, contentState: contentState)
        }
    }

    /// Records a delivery metric. `delivered` counts once per (delivery, recipient): returns false for a repeat.
    public func recordMetric(
        tenant: UUID, deliveryID: String, metric: DeliveryMetric, recipient: String?, at: Date?
    ) async throws -> Bool {
        try await transaction(tenant: tenant) {
            try $0.recordMetric(deliveryID: deliveryID, metric: metric, recipient: recipient, at: at)
        }
    }

    // MARK: Transactions

    /// Runs `body` in one transaction confined to `tenant`: whatever it writes commits together, or (when it throws,
    /// or the process dies first) not at all. A deadlock re-runs the whole body (the pool's transaction), and so does
    /// a unique violation from two token registrations racing for the same (device, scope): `body` must be safe to
    /// run again, which holds as long as it only uses `RegistryTransaction`.
    public func transaction<T: Sendable>(
        tenant: UUID, _ body: @escaping @Sendable (RegistryTransaction) throws -> T
    ) async throws -> T {
        try await retryingRace {
            try await database.tenantTransaction(tenant) { connection in
                try body(RegistryTransaction(connection, tenant: tenant))
            }
        }
    }

    // MARK: Rows

    static let typeColumns =
        "identifier, attributes_type, content_state_schema, date_fields, payload_profile, frequent_updates, "
        + "min_update_interval_ms, auto_created, "
        + "created_at, updated_at"
    static let deviceColumns =
        "token, person_id, platform, app_id, os_version, app_version, attributes, created_at, updated_at"

    /// An activity type's `date_fields` column: JSON pointer → encoding.
    static func dateFields(_ json: JSONValue) throws -> [String: DateEncoding] {
        var dateFields: [String: DateEncoding] = [:]
        for (pointer, value) in json.objectValue ?? [:] {
            guard let encoding = value.stringValue.flatMap(DateEncoding.init(rawValue:)) else {
                throw PostgresError(code: .decoding, context: "unknown date encoding of \(pointer): \(value)")
            }
            dateFields[pointer] = encoding
        }
        return dateFields
    }

    static func activityType(_ row: PostgresRow) throws -> ActivityType {
        let dateFields = try Self.dateFields(row.decode(JSONValue.self, "date_fields"))
        // Joined with `instances`, the type's timestamps come as type_created_at / type_updated_at.
        let joined = row.columns.contains("type_created_at")
        return ActivityType(
            identifier: try row.decode(String.self, "identifier"),
            attributesType: try row.decode(String.self, "attributes_type"),
            contentStateSchema: try row.decode(JSONValue?.self, "content_state_schema"), dateFields: dateFields,
            payloadProfile: try row.decodeRaw(PayloadProfile.self, "payload_profile"),
            // Absent from joins that do not need them (the claim, the change context).
            frequentUpdates: row.columns.contains("frequent_updates")
                ? try row.decode(Bool.self, "frequent_updates") : false,
            minUpdateIntervalMilliseconds: row.columns.contains("min_update_interval_ms")
                ? try row.decode(Int.self, "min_update_interval_ms") : 0,
            autoCreated: try row.decode(Bool.self, "auto_created"),
            createdAt: try row.decode(Date.self, joined ? "type_created_at" : "created_at"),
            updatedAt: try row.decode(Date.self, joined ? "type_updated_at" : "updated_at"))
    }

    static func person(_ row: PostgresRow) throws -> Person {
        Person(
            id: try row.decode(String.self, "id"), email: try row.decode(String?.self, "email"),
            attributes: try row.decode(JSONValue.self, "attributes"),
            createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"))
    }

    static func device(_ row: PostgresRow) throws -> Device {
        Device(
            token: try row.decode(String.self, "token"), personID: try row.decode(String.self, "person_id"),
            platform: try row.decodeRaw(Platform.self, "platform"),
            appID: try row.decode(String?.self, "app_id"), osVersion: try row.decode(String?.self, "os_version"),
            appVersion: try row.decode(String?.self, "app_version"),
            attributes: try row.decode(JSONValue.self, "attributes"),
            createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"))
    }
}

/// Two registrations racing for the same (device, scope) can both try to insert the active row; the loser hits the
/// partial unique index. Running it again sees the winner's row and rotates it properly.
func retryingRace<T: Sendable>(_ body: () async throws -> T) async throws -> T {
    for _ in 0..<3 {
        do {
            return try await body()
        } catch let error as PostgresError where error.code == .uniqueViolation || error.code == .deadlockDetected {
            continue
        }
    }
    return try await body()
}

/// A tenant's person erasures against its campaigns' start steps, which read people by the thousand and write their
/// instances, and its people imports, which write up to 100,000 people: a transaction-scoped advisory lock, taken
/// exclusive by an erasure and shared by a step or an import. One lock per step, where a row lock on each person read
/// cost 7 µs and 200 bytes of WAL a person (fsync and full-page writes on); an erasure waits for a running step (1–2 s
/// at most) or import (up to a minute for 100,000 people), and the tenant's next steps and imports wait for the
/// erasure. Delivery metrics take it shared too, inside `marquee_record_delivery_metric` (migration 0101); the lock's
/// one home is `marquee_erasure_lock`.
enum ErasureLock {
    static func shared(_ tenant: UUID) -> PostgresQuery {
        "SELECT marquee_erasure_lock(\(tenant), false)"
    }

    static func exclusive(_ tenant: UUID) -> PostgresQuery {
        "SELECT marquee_erasure_lock(\(tenant), true)"
    }
}
