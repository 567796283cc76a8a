import Foundation
import MarqueeCore
import PostgresClient

/// An activity type: how instances of it are validated and shaped for the device.
public struct ActivityType: Sendable, Equatable {
    public var identifier: String
    public var attributesType: String
    public var contentStateSchema: JSONValue?
    /// JSON pointers into the content state, each with its encoding.
    public var dateFields: [String: DateEncoding]
    public var payloadProfile: PayloadProfile
    public var autoCreated: Bool
    public var createdAt: Date
    public var updatedAt: Date

    public init(
        identifier: String, attributesType: String, contentStateSchema: JSONValue? = nil,
        dateFields: [String: DateEncoding] = [:], payloadProfile: PayloadProfile = .marquee, autoCreated: Bool = false,
        createdAt: Date = Date(), updatedAt: Date = Date()
    ) {
        self.identifier = identifier
        self.attributesType = attributesType
        self.contentStateSchema = contentStateSchema
        self.dateFields = dateFields
        self.payloadProfile = payloadProfile
        self.autoCreated = autoCreated
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

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
    public var tokens: [TokenInfo]
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

/// A token a send would go to for an instance (update and end targets).
public struct ActivityTarget: Sendable, Equatable {
    public var deviceToken: String
    public var platform: Platform
    /// The per-activity APNs token, or the FCM token for Android.
    public var token: String
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
                                            payload_profile, auto_created)
                VALUES (\(tenant), \(type.identifier), \(type.attributesType), \(type.contentStateSchema),
                        \(dateFields), \(type.payloadProfile.rawValue), false)
                ON CONFLICT (tenant_id, identifier) DO UPDATE SET
                    attributes_type = EXCLUDED.attributes_type, content_state_schema = EXCLUDED.content_state_schema,
                    date_fields = EXCLUDED.date_fields, payload_profile = EXCLUDED.payload_profile,
                    auto_created = false
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

    public func activityTypes(tenant: UUID) async throws -> [ActivityType] {
        try await database.tenantTransaction(tenant) { connection in
            try connection.query(
                """
                SELECT \(unsafeRaw: Self.typeColumns) FROM activity_types
                WHERE tenant_id = \(tenant) ORDER BY identifier
                """
            ).map(Self.activityType)
        }
    }

    // MARK: People

    /// Creates or updates a person. Absent fields keep their stored values; `attributes` replaces the object.
    public func upsertPerson(tenant: UUID, id: String, email: String?, attributes: JSONValue?) async throws -> Person {
        try await database.tenantTransaction(tenant) { connection in
            try Self.upsertPerson(connection, tenant: tenant, id: id, email: email, attributes: attributes)
        }
    }

    static func upsertPerson(
        _ connection: PostgresConnection, tenant: UUID, id: String, email: String?, attributes: JSONValue?
    ) throws -> Person {
        do {
            let rows = try connection.query(
                """
                INSERT INTO people (tenant_id, id, email, attributes)
                VALUES (\(tenant), \(id), \(email), COALESCE(\(attributes), '{}'::jsonb))
                ON CONFLICT (tenant_id, id) DO UPDATE SET
                    email = COALESCE(EXCLUDED.email, people.email),
                    attributes = CASE WHEN \(attributes) IS NULL THEN people.attributes ELSE EXCLUDED.attributes END
                RETURNING id, email, attributes, created_at, updated_at
                """)
            return try person(rows[0])
        } catch let error as PostgresError where error.code == .uniqueViolation {
            throw Conflict(field: "email", reason: "belongs to another person")
        }
    }

    /// The person with every device and (masked) token.
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
                SELECT 'push_to_start' AS kind, device_token, activity_type AS scope, token, status, updated_at
                FROM push_to_start_tokens p
                WHERE p.tenant_id = \(tenant) AND p.device_token IN (
                    SELECT token FROM devices WHERE tenant_id = \(tenant) AND person_id = \(id))
                UNION ALL
                SELECT 'activity', device_token, instance_id, token, status, updated_at
                FROM activity_tokens a
                WHERE a.tenant_id = \(tenant) AND a.device_token IN (
                    SELECT token FROM devices WHERE tenant_id = \(tenant) AND person_id = \(id))
                ORDER BY updated_at DESC
                """)
            var tokens: [String: [TokenInfo]] = [:]
            for row in tokenRows {
                let info = TokenInfo(
                    kind: TokenInfo.Kind(rawValue: try row.decode(String.self, "kind")) ?? .activity,
                    scope: try row.decode(String.self, "scope"),
                    masked: maskToken(try row.decode(String.self, "token")),
                    status: try row.decode(String.self, "status"), updatedAt: try row.decode(Date.self, "updated_at"))
                tokens[try row.decode(String.self, "device_token"), default: []].append(info)
            }
            return PersonDetail(
                person: person, devices: devices.map { DeviceDetail(device: $0, tokens: tokens[$0.token] ?? []) })
        }
    }

    /// Erases a person's trace, in one transaction: their instances (with attributes, content and options), every
    /// delivery of those instances or to their devices and tokens (queued ones are thereby cancelled), the metrics of
    /// those deliveries, lifecycle events, stored idempotent replies of those instances, and finally the person with
    /// their devices and tokens (by cascade). Instances are removed, not anonymised: nothing of them is kept.
    public func deletePerson(tenant: UUID, id: String) async throws {
        let deleted = try await database.tenantTransaction(tenant) { connection in
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
                                    OR (p.email IS NOT NULL AND lower(i.person_email) = lower(p.email))
                                    OR i.target_device IN (SELECT token FROM devs))) AS instances
                FROM people p WHERE p.tenant_id = \(tenant) AND p.id = \(id)
                FOR UPDATE OF p
                """)
            guard let row = found.first else { return 0 }
            let devices = try row.decode([String].self, "devices")
            let tokens = try row.decode([String].self, "tokens")
            let instances = try row.decode([String].self, "instances")
            let deliveries = try connection.query(
                """
                DELETE FROM deliveries
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
                  AND (lower(delivery_id) = ANY(\(deliveries)::text[]) OR recipient = ANY(\(tokens)::text[]))
                """)
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
            try connection.execute(
                """
                DELETE FROM idempotency_keys k
                WHERE k.tenant_id = \(tenant)
                  AND EXISTS (SELECT 1 FROM unnest(\(instances)::text[]) AS i(id) WHERE strpos(k.response::text, i.id) > 0)
                """)
            try connection.execute(
                "DELETE FROM instances WHERE tenant_id = \(tenant) AND id = ANY(\(instances)::text[])")
            return try connection.execute("DELETE FROM people WHERE tenant_id = \(tenant) AND id = \(id)")
        }
        if deleted == 0 { throw NotFound("person") }
    }

    // MARK: Devices

    /// Registers a device for a person (creating the person if needed). A token registered before under someone
    /// else moves to this person: a device has one owner.
    public func upsertDevice(tenant: UUID, _ registration: DeviceRegistration) async throws -> Device {
        try await database.tenantTransaction(tenant) { connection in
            try connection.execute(
                """
                INSERT INTO people (tenant_id, id) VALUES (\(tenant), \(registration.personID))
                ON CONFLICT (tenant_id, id) DO NOTHING
                """)
            let rows = try connection.query(
                """
                INSERT INTO devices (tenant_id, token, person_id, platform, app_id, os_version, app_version, attributes)
                VALUES (\(tenant), \(registration.token), \(registration.personID), \(registration.platform.rawValue),
                        \(registration.appID), \(registration.osVersion), \(registration.appVersion),
                        COALESCE(\(registration.attributes), '{}'::jsonb))
                ON CONFLICT (tenant_id, token) DO UPDATE SET
                    person_id = EXCLUDED.person_id, platform = EXCLUDED.platform,
                    app_id = COALESCE(EXCLUDED.app_id, devices.app_id),
                    os_version = COALESCE(EXCLUDED.os_version, devices.os_version),
                    app_version = COALESCE(EXCLUDED.app_version, devices.app_version),
                    attributes = CASE WHEN \(registration.attributes) IS NULL THEN devices.attributes
                                      ELSE EXCLUDED.attributes END
                RETURNING \(unsafeRaw: Self.deviceColumns)
                """)
            return try Self.device(rows[0])
        }
    }

    /// Removes a device (and its tokens). With `personID`, only if it belongs to that person.
    public func deleteDevice(tenant: UUID, personID: String?, token: String) async throws {
        let deleted = try await database.tenantTransaction(tenant) { connection in
            if let personID {
                return try connection.execute(
                    "DELETE FROM devices WHERE tenant_id = \(tenant) AND token = \(token) AND person_id = \(personID)")
            }
            return try connection.execute("DELETE FROM devices WHERE tenant_id = \(tenant) AND token = \(token)")
        }
        if deleted == 0 { throw NotFound("device") }
    }

    /// The device's platform, or nil if it is not registered (to this person, when one is given).
    public func devicePlatform(tenant: UUID, token: String, personID: String? = nil) async throws -> Platform? {
        try await database.tenantTransaction(tenant) { connection in
            try Self.devicePlatform(connection, tenant: tenant, token: token, personID: personID)
        }
    }

    /// (Token registrations lock the device row themselves, inside their SQL functions, migration 0003.)
    static func devicePlatform(_ connection: PostgresConnection, tenant: UUID, token: String, personID: String?) throws
        -> Platform?
    {
        let rows = try connection.query(
            """
            SELECT platform FROM devices
            WHERE tenant_id = \(tenant) AND token = \(token) AND (\(personID)::text IS NULL OR person_id = \(personID))
            """)
        guard let row = rows.first else { return nil }
        return Platform(rawValue: try row.decode(String.self, "platform"))
    }

    // MARK: Tokens

    /// The person a registered device belongs to, or nil if the token is not registered.
    public func deviceOwner(tenant: UUID, token: String) async throws -> String? {
        let rows = try await database.tenantStatement(
            tenant, "SELECT person_id FROM devices WHERE tenant_id = \(tenant) AND token = \(token)")
        return try rows.first?.decode(String.self, "person_id")
    }

    /// Registers the push-to-start token of a person's iOS device for an activity type. A different active token
    /// for the same (device, type) is retired. Unknown types are created with permissive defaults.
    ///
    /// One statement (`marquee_register_push_to_start`, migration 0003), confined to the tenant by row-level
    /// security like every other query.
    public func registerPushToStart(
        tenant: UUID, personID: String, deviceToken: String, activityType: String, token: String,
        attributesType: String?, profile: PayloadProfile = .marquee
    ) async throws -> TokenRegistration {
        let defaultAttributes = String(activityType.split(separator: ".").last ?? Substring(activityType))
        let rows = try await retryingRace {
            try await database.pool.query(
                """
                SELECT outcome, rotated, inserted FROM marquee_register_push_to_start(
                    \(tenant), \(personID), \(deviceToken), \(activityType), \(token), \(attributesType),
                    \(profile.rawValue), \(defaultAttributes))
                """)
        }
        switch try rows[0].decode(String.self, "outcome") {
        case "no_device": throw NotFound("device")
        case "not_ios": throw Conflict(field: "device_token", reason: "push-to-start tokens exist only for iOS devices")
        default: return try Self.registration(rows[0])
        }
    }

    /// Whether `deviceToken` is a device of the person `instanceID` was started for (or the device it targets). The
    /// sdk key is public, so an activity token or a lifecycle event for an instance is taken only from such a device:
    /// otherwise anyone could attach their own token to a guessable instance ID and receive its updates.
    public func deviceBelongsToInstance(tenant: UUID, instanceID: String, deviceToken: String) async throws -> Bool {
        try await database.tenantTransaction(tenant) { connection in
            try Self.deviceBelongsToInstance(
                connection, tenant: tenant, instanceID: instanceID, deviceToken: deviceToken)
        }
    }

    static func deviceBelongsToInstance(
        _ connection: PostgresConnection, tenant: UUID, instanceID: String, deviceToken: String
    ) throws -> Bool {
        let rows = try connection.query(
            """
            SELECT 1 AS ok FROM instances i
            JOIN devices d ON d.tenant_id = i.tenant_id AND d.token = \(deviceToken)
            WHERE i.tenant_id = \(tenant) AND i.id = \(instanceID)
              AND (d.person_id = i.person_id OR d.token = i.target_device)
            """)
        return !rows.isEmpty
    }

    /// Registers the per-activity token of a device for an instance; a different active token is retired.
    public func registerActivityToken(tenant: UUID, instanceID: String, deviceToken: String, token: String)
        async throws -> TokenRegistration
    {
        let rows = try await retryingRace {
            try await database.pool.query(
                """
                SELECT outcome, rotated, inserted
                FROM marquee_register_activity_token(\(tenant), \(instanceID), \(deviceToken), \(token))
                """)
        }
        if try rows[0].decode(String.self, "outcome") == "no_device" { throw NotFound("device") }
        return try Self.registration(rows[0])
    }

    static func registration(_ row: PostgresRow) throws -> TokenRegistration {
        let rotated = try row.decode(Bool.self, "rotated")
        let inserted = try row.decode(Bool.self, "inserted")
        return TokenRegistration(rotated: rotated, unchanged: !inserted && !rotated)
    }

    /// The tokens an update or end of `instanceID` goes to: every active per-activity token, and the FCM tokens of
    /// the Android devices of the instance, leaving out devices that reported `ended` or `dismissed`.
    public func activityTargets(tenant: UUID, instanceID: String) async throws -> [ActivityTarget] {
        try await database.tenantTransaction(tenant) { connection in
            try connection.query(Self.activityTargetsQuery(tenant: tenant, instanceID: instanceID)).map(
                Self.activityTarget)
        }
    }

    /// Driven from the instance's own rows (its activity tokens and its devices), never from the tenant's whole
    /// device table, so it costs the same with ten devices or ten million.
    static func activityTargetsQuery(tenant: UUID, instanceID: String) -> PostgresQuery {
        """
        SELECT a.device_token, d.platform, a.token
        FROM activity_tokens a
        JOIN devices d ON d.tenant_id = a.tenant_id AND d.token = a.device_token
        WHERE a.tenant_id = \(tenant) AND a.instance_id = \(instanceID) AND a.status = 'active'
          AND NOT EXISTS (
              SELECT 1 FROM instance_devices s
              WHERE s.tenant_id = a.tenant_id AND s.instance_id = a.instance_id AND s.device_token = a.device_token
                AND s.state IN ('ended', 'dismissed'))
        UNION ALL
        SELECT s.device_token, d.platform, d.token
        FROM instance_devices s
        JOIN devices d ON d.tenant_id = s.tenant_id AND d.token = s.device_token
        WHERE s.tenant_id = \(tenant) AND s.instance_id = \(instanceID) AND d.platform = 'android'
          AND s.state NOT IN ('ended', 'dismissed')
          AND NOT EXISTS (
              SELECT 1 FROM activity_tokens a
              WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id AND a.device_token = s.device_token
                AND a.status = 'active')
        ORDER BY 1
        """
    }

    static func activityTarget(_ row: PostgresRow) throws -> ActivityTarget {
        ActivityTarget(
            deviceToken: try row.decode(String.self, "device_token"),
            platform: Platform(rawValue: try row.decode(String.self, "platform")) ?? .ios,
            token: try row.decode(String.self, "token"))
    }

    // MARK: Lifecycle events and delivery metrics

    /// Records a lifecycle event and moves the device's state for the instance. `ended` and `dismissed` are final:
    /// a later `updated` does not bring the device back. Older events never overwrite newer ones.
    public func recordEvent(
        tenant: UUID, instanceID: String, event: LifecycleEvent, deviceToken: String, at: Date,
        contentState: JSONValue?
    ) async throws {
        try await database.tenantTransaction(tenant) { connection in
            guard try Self.devicePlatform(connection, tenant: tenant, token: deviceToken, personID: nil) != nil else {
                throw NotFound("device")
            }
            guard
                try Self.deviceBelongsToInstance(
                    connection, tenant: tenant, instanceID: instanceID, deviceToken: deviceToken)
            else { throw NotFound("instance") }
            try connection.execute(
                """
                INSERT INTO activity_events (tenant_id, id, instance_id, device_token, event, at, content_state)
                VALUES (\(tenant), \(UUID()), \(instanceID), \(deviceToken), \(event.rawValue), \(at), \(contentState))
                """)
            try connection.execute(
                """
                INSERT INTO instance_devices (tenant_id, instance_id, device_token, state, state_at, content_state)
                VALUES (\(tenant), \(instanceID), \(deviceToken), \(event.rawValue), \(at), \(contentState))
                ON CONFLICT (tenant_id, instance_id, device_token) DO UPDATE SET
                    state = EXCLUDED.state, state_at = EXCLUDED.state_at,
                    content_state = COALESCE(EXCLUDED.content_state, instance_devices.content_state)
                WHERE instance_devices.state NOT IN ('ended', 'dismissed')
                  AND instance_devices.state_at <= EXCLUDED.state_at
                """)
        }
    }

    /// Records a delivery metric. `delivered` counts once per (delivery, recipient): returns false for a repeat.
    public func recordMetric(
        tenant: UUID, deliveryID: String, metric: DeliveryMetric, recipient: String?, at: Date?
    ) async throws -> Bool {
        try await database.tenantTransaction(tenant) { connection in
            let inserted = try connection.execute(
                """
                INSERT INTO delivery_metrics (tenant_id, id, delivery_id, metric, recipient, at)
                VALUES (\(tenant), \(UUID()), \(deliveryID), \(metric.rawValue), \(recipient ?? ""),
                        COALESCE(\(at), now()))
                ON CONFLICT (tenant_id, delivery_id, recipient) WHERE metric = 'delivered' DO NOTHING
                """)
            return inserted > 0
        }
    }

    // MARK: Rows

    static let typeColumns =
        "identifier, attributes_type, content_state_schema, date_fields, payload_profile, auto_created, created_at, updated_at"
    static let deviceColumns =
        "token, person_id, platform, app_id, os_version, app_version, attributes, created_at, updated_at"

    static func activityType(_ row: PostgresRow) throws -> ActivityType {
        var dateFields: [String: DateEncoding] = [:]
        for (pointer, value) in try row.decode(JSONValue.self, "date_fields").objectValue ?? [:] {
            if let encoding = value.stringValue.flatMap(DateEncoding.init(rawValue:)) { dateFields[pointer] = encoding }
        }
        // Joined with `instances`, the type's timestamps come as type_created_at / type_updated_at.
        let joined = row.columns.contains("type_created_at")
        return ActivityType(
            identifier: try row.decode(String.self, "identifier"),
            attributesType: try row.decode(String.self, "attributes_type"),
            contentStateSchema: try row.decode(JSONValue?.self, "content_state_schema"), dateFields: dateFields,
            payloadProfile: PayloadProfile(rawValue: try row.decode(String.self, "payload_profile")) ?? .marquee,
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
            platform: Platform(rawValue: try row.decode(String.self, "platform")) ?? .ios,
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
