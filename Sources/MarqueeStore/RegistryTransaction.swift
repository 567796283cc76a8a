import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// A registered device as ownership checks see it.
public struct RegisteredDevice: Sendable, Equatable {
    /// The person the device belongs to.
    public var personID: String
    public var platform: Platform
}

/// What a person write does with an email that belongs to another person (the unique index people_email).
public enum TakenEmail: Sendable, Equatable {
    /// Refused: `Conflict` on `email` (a 409), nothing written.
    case conflict
    /// The rest is written and the person keeps the email they had; `PersonWrite.emailKept` says so.
    case keepStored
}

/// A person as a write left it.
public struct PersonWrite: Sendable, Equatable {
    public var person: Person
    /// The email asked for belongs to another person and was not set (`TakenEmail.keepStored`).
    public var emailKept: Bool
}

/// The registry's writes (and the reads they depend on) on one open transaction confined to one tenant: the one home
/// of their SQL. `RegistryStore`'s single-call methods run one of these each in a transaction of its own; a caller
/// that must apply several changes atomically (a Customer.io batch) runs them all in one `RegistryStore.transaction`.
///
/// Not `Sendable`: it holds the transaction's connection and lives only inside the transaction's body.
public struct RegistryTransaction {
    let connection: PostgresConnection
    /// The tenant the transaction is confined to (row-level security and every statement's `tenant_id`).
    public let tenant: UUID

    init(_ connection: PostgresConnection, tenant: UUID) {
        self.connection = connection
        self.tenant = tenant
    }

    // MARK: People and devices

    /// Creates or updates a person. Absent fields keep their stored values; `attributes` replaces the object. An
    /// `email` that belongs to another person (compared as the people_email index does, `lower()`) is refused with
    /// `Conflict` or, with `.keepStored`, left out: the person keeps the email they had and `emailKept` says so.
    ///
    /// Two writes giving one email to two people at once may both find it free; the later one then meets the unique
    /// index. With `.keepStored` that error is rethrown as it is, so that the transaction runs again
    /// (`RegistryStore.transaction`) and finds the email taken.
    public func upsertPerson(id: String, email: String?, attributes: JSONValue?, takenEmail: TakenEmail = .conflict)
        throws -> PersonWrite
    {
        let keep = takenEmail == .keepStored
        do {
            let rows = try connection.query(
                """
                WITH taken AS (
                    SELECT \(keep) AND EXISTS (
                        SELECT 1 FROM people p
                        WHERE p.tenant_id = \(tenant) AND p.email IS NOT NULL AND lower(p.email) = lower(\(email))
                          AND p.id <> \(id)) AS taken
                )
                INSERT INTO people (tenant_id, id, email, attributes)
                SELECT \(tenant), \(id), CASE WHEN taken.taken THEN NULL ELSE \(email) END,
                       COALESCE(\(attributes), '{}'::jsonb)
                FROM taken
                ON CONFLICT (tenant_id, id) DO UPDATE SET
                    email = COALESCE(EXCLUDED.email, people.email),
                    attributes = CASE WHEN \(attributes) IS NULL THEN people.attributes ELSE EXCLUDED.attributes END
                RETURNING id, email, attributes, created_at, updated_at, (SELECT taken FROM taken) AS email_kept
                """)
            return PersonWrite(
                person: try RegistryStore.person(rows[0]), emailKept: try rows[0].decode(Bool.self, "email_kept"))
        } catch let error as PostgresError where error.code == .uniqueViolation && !keep {
            throw Conflict(field: "email", reason: "belongs to another person")
        }
    }

    /// Registers a device for a person (creating the person if needed). A token registered before under someone
    /// else moves to this person: a device has one owner. A person keeps at most the tenant's
    /// `max_devices_per_person` devices: beyond it, their least recently registered device is removed, as
    /// `deleteDevice` removes one (`marquee_keep_recent_devices`, migration 0081, the one home of the rule).
    ///
    /// The person's row is held until the commit (FOR NO KEY UPDATE, by the insert that finds it there): an erasure,
    /// which takes the person first, waits for this registration and then removes the device too, or this
    /// registration waits for the erasure and creates the person anew, rather than referring to a person deleted
    /// meanwhile (a foreign-key violation); and two registrations for one person take turns, so the cap holds.
    public func upsertDevice(_ registration: DeviceRegistration) throws -> Device {
        // One round trip: the person held, the device written, the cap applied (each statement after the one before).
        let rows: [PostgresRows]
        do {
            rows = try connection.pipelined([
                """
                INSERT INTO people (tenant_id, id) VALUES (\(tenant), \(registration.personID))
                ON CONFLICT (tenant_id, id) DO UPDATE SET updated_at = people.updated_at WHERE false
                """,
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
                RETURNING \(unsafeRaw: RegistryStore.deviceColumns)
                """,
                """
                SELECT marquee_keep_recent_devices(\(tenant), \([registration.personID])::text[], \([registration.token])::text[])
                """,
            ])
        } catch let error as PostgresError where error.code == .foreignKeyViolation {
            // The person is held first, so this is not expected; should it happen, the person is gone.
            throw NotFound("person")
        }
        return try RegistryStore.device(rows[1][0])
    }

    /// Removes a device (and its tokens). With `personID`, only if it belongs to that person. Throws `NotFound`
    /// when nothing was removed (which leaves the transaction usable).
    public func deleteDevice(personID: String?, token: String) throws {
        let deleted: Int
        if let personID {
            deleted = try connection.execute(
                "DELETE FROM devices WHERE tenant_id = \(tenant) AND token = \(token) AND person_id = \(personID)")
        } else {
            deleted = try connection.execute("DELETE FROM devices WHERE tenant_id = \(tenant) AND token = \(token)")
        }
        if deleted == 0 { throw NotFound("device") }
    }

    /// A registered device's owner and platform, or nil if the token is not registered.
    public func registeredDevice(token: String) throws -> RegisteredDevice? {
        try Self.registeredDevice(try connection.query(Self.registeredDeviceQuery(tenant: tenant, token: token)))
    }

    static func registeredDeviceQuery(tenant: UUID, token: String) -> PostgresQuery {
        "SELECT person_id, platform FROM devices WHERE tenant_id = \(tenant) AND token = \(token)"
    }

    static func registeredDevice(_ rows: PostgresRows) throws -> RegisteredDevice? {
        guard let row = rows.first else { return nil }
        let platform = try row.decode(String.self, "platform")
        guard let known = Platform(rawValue: platform) else {
            throw PostgresError(code: .decoding, context: "unknown device platform")
        }
        return RegisteredDevice(personID: try row.decode(String.self, "person_id"), platform: known)
    }

    // MARK: Tokens

    /// Registers the push-to-start token of a person's iOS device for an activity type. A different active token
    /// for the same (device, type) is retired. Unknown types are created with permissive defaults and `profile`,
    /// while the tenant has fewer types created so than its `max_auto_created_activity_types` (else
    /// `activityTypeLimit`, a 422). The token keeps `profile` (its route's): while the type is one a registration
    /// created, the token's starts are shaped with it (migration 0102).
    ///
    /// One statement (`marquee_register_push_to_start`, migrations 0003 and 0088), confined to the tenant by
    /// row-level security like every other query.
    public func registerPushToStart(
        personID: String, deviceToken: String, activityType: String, token: String, attributesType: String?,
        profile: PayloadProfile = .marquee
    ) throws -> TokenRegistration {
        try Self.pushToStartOutcome(
            try connection.query(
                Self.registerPushToStartQuery(
                    tenant: tenant, personID: personID, deviceToken: deviceToken, activityType: activityType,
                    token: token, attributesType: attributesType, profile: profile)))
    }

    static func registerPushToStartQuery(
        tenant: UUID, personID: String, deviceToken: String, activityType: String, token: String,
        attributesType: String?, profile: PayloadProfile
    ) -> PostgresQuery {
        let defaultAttributes = defaultAttributesType(activityType)
        return """
            SELECT outcome, rotated, inserted FROM marquee_register_push_to_start(
                \(tenant), \(personID), \(deviceToken), \(activityType), \(token), \(attributesType),
                \(profile.rawValue), \(defaultAttributes))
            """
    }

    /// The attributes type an activity type created by a token registration gets: its last label
    /// (`com.example.Delivery` → `Delivery`).
    static func defaultAttributesType(_ activityType: String) -> String {
        String(activityType.split(separator: ".").last ?? Substring(activityType))
    }

    static func pushToStartOutcome(_ rows: PostgresRows) throws -> TokenRegistration {
        switch try rows[0].decode(String.self, "outcome") {
        case "no_device": throw NotFound("device")
        case "not_ios": throw Conflict(field: "device_token", reason: "push-to-start tokens exist only for iOS devices")
        case "type_limit": throw activityTypeLimit(field: "activity_type")
        default: return try registration(rows[0])
        }
    }

    /// A registration refused because it names an activity type the tenant does not have and registrations may
    /// create no more (`marquee_create_activity_types`, migration 0088, the one home of the cap): the single route,
    /// the Customer.io ingest and the people import answer with this.
    public static func activityTypeLimit(field: String) -> ValidationError {
        ValidationError(
            .activityTypeLimit, field: field,
            reason: "is not an activity type of this workspace, and push-to-start registrations have created as many "
                + "as it allows (max_auto_created_activity_types): create the type with the app key, PUT "
                + "/v1/activity_types/{identifier}")
    }

    /// Registers the per-activity token of a device for an instance; a different active token is retired.
    ///
    /// The device must be one of the instance's person's (or the device the instance targets): the sdk key is
    /// public, so otherwise anyone could attach their own token to a guessable instance ID and receive its updates.
    /// The rule's one home is `marquee_device_belongs_to_instance` (migration 0013), checked under the device row's
    /// lock by `marquee_register_instance_token`, in the same statement. Throws `NotFound("device")` for an unknown
    /// device and `NotFound("instance")` for an unknown instance or one of another person (never told apart).
    public func registerActivityToken(instanceID: String, deviceToken: String, token: String) throws
        -> TokenRegistration
    {
        try Self.activityTokenOutcome(
            try connection.query(
                Self.registerActivityTokenQuery(
                    tenant: tenant, instanceID: instanceID, deviceToken: deviceToken, token: token)))
    }

    static func registerActivityTokenQuery(tenant: UUID, instanceID: String, deviceToken: String, token: String)
        -> PostgresQuery
    {
        """
        SELECT outcome, rotated, inserted
        FROM marquee_register_instance_token(\(tenant), \(instanceID), \(deviceToken), \(token))
        """
    }

    static func activityTokenOutcome(_ rows: PostgresRows) throws -> TokenRegistration {
        switch try rows[0].decode(String.self, "outcome") {
        case "no_device": throw NotFound("device")
        case "no_instance": throw NotFound("instance")
        default: return try registration(rows[0])
        }
    }

    static func registration(_ row: PostgresRow) throws -> TokenRegistration {
        let rotated = try row.decode(Bool.self, "rotated")
        let inserted = try row.decode(Bool.self, "inserted")
        return TokenRegistration(rotated: rotated, unchanged: !inserted && !rotated)
    }

    // MARK: Lifecycle events and delivery metrics

    /// Records a lifecycle event and moves the device's state for the instance. `ended` and `dismissed` are final:
    /// a later `updated` does not bring the device back. Older events never overwrite newer ones. Only a device of
    /// the instance's person may report (`marquee_device_belongs_to_instance`, as for activity tokens): otherwise
    /// `NotFound("instance")`; an unknown device is `NotFound("device")`.
    ///
    /// The device is held FOR SHARE and the instance FOR KEY SHARE from the check to the commit, so neither goes while
    /// the event is written, and the device does not change hands: a device deleted meanwhile (by its app, a worker retiring its FCM token, an erasure) is
    /// `NotFound("device")` rather than a row whose reference to it fails, and an instance deleted meanwhile
    /// (retention, an erasure) is `NotFound("instance")` rather than a device state its delete trigger (migration
    /// 0078) has already passed, which would outlive it and join a later instance with its ID. The people they
    /// belong to are held first, as a start holds them (`StartWrite.statement`'s `who`): an erasure takes the person,
    /// then collects and deletes the instances and devices, so it waits for this event and then removes it too, or
    /// this event waits for the erasure and finds them gone. A device moving to another person (an update of its
    /// owner, which FOR KEY SHARE lets through) waits for this event, and then its trigger (migration 0086) removes the
    /// device state written here; or this event waits for the move, and its ownership check, a statement of its own
    /// read after the locks, sees the new owner. (Checked in the locking statement, it read the snapshot from before
    /// the wait: the event wrote the previous owner's instance a device state the move had already swept, and that
    /// person's later updates reached the phone, now someone else's.)
    public func recordEvent(
        instanceID: String, event: LifecycleEvent, deviceToken: String, at: Date, contentState: JSONValue?
    ) throws {
        let check = try connection.pipelined([
            """
            WITH seen AS (
                -- Whose the device and the instance are, as read before any lock: the device's owner, the instance's
                -- person, or, for an instance started by an email no one had, the person with that email now (an
                -- erasure of either takes the instance: RegistryStore.deletePerson).
                SELECT d.person_id FROM devices d WHERE d.tenant_id = \(tenant) AND d.token = \(deviceToken)
                UNION ALL
                SELECT i.person_id FROM instances i WHERE i.tenant_id = \(tenant) AND i.id = \(instanceID)
                UNION ALL
                SELECT p.id FROM instances i
                JOIN people p ON p.tenant_id = i.tenant_id AND lower(p.email) = lower(i.person_email)
                WHERE i.tenant_id = \(tenant) AND i.id = \(instanceID) AND i.person_id IS NULL
            ), who AS (
                SELECT p.id FROM people p
                WHERE p.tenant_id = \(tenant) AND p.id = ANY(ARRAY(SELECT person_id FROM seen))
                FOR KEY SHARE
            ), dev AS (
                -- Once the people are held (the condition is a one-time filter): an erasure takes a person first.
                SELECT d.token FROM devices d
                WHERE d.tenant_id = \(tenant) AND d.token = \(deviceToken) AND (SELECT count(*) FROM who) >= 0
                FOR SHARE
            ), inst AS (
                SELECT i.id FROM instances i
                WHERE i.tenant_id = \(tenant) AND i.id = \(instanceID) AND (SELECT count(*) FROM dev) >= 0
                FOR KEY SHARE
            )
            -- A row deleted while this statement waited for its lock is not held, and so not there.
            SELECT EXISTS (SELECT 1 FROM dev) AS known, EXISTS (SELECT 1 FROM inst) AS held
            """,
            "SELECT marquee_device_belongs_to_instance(\(tenant), \(instanceID), \(deviceToken)) AS owned",
        ])
        guard try check[0][0].decode(Bool.self, "known") else { throw NotFound("device") }
        guard try check[0][0].decode(Bool.self, "held") && check[1][0].decode(Bool.self, "owned") else {
            throw NotFound("instance")
        }
        try connection.execute(
            """
            INSERT INTO activity_events (tenant_id, id, instance_id, device_token, event, at, content_state)
            VALUES (\(tenant), \(SecureRandom.uuid()), \(instanceID), \(deviceToken), \(event.rawValue), \(at), \(contentState))
            """)
        let final = LifecycleEvent.allCases.filter(\.stopsSends).map(\.rawValue)
        do {
            try connection.execute(
                """
                -- The device's clock orders its reports, but no later than the server's: a clock that jumped ahead
                -- (an event dated 2999) would otherwise pin the state, every later report being older. An end or a
                -- dismissal is final whatever its date (the device reports the activity gone).
                INSERT INTO instance_devices (tenant_id, instance_id, device_token, state, state_at, content_state)
                VALUES (\(tenant), \(instanceID), \(deviceToken), \(event.rawValue), LEAST(\(at), now()),
                        \(contentState))
                ON CONFLICT (tenant_id, instance_id, device_token) DO UPDATE SET
                    state = EXCLUDED.state, state_at = EXCLUDED.state_at,
                    content_state = COALESCE(EXCLUDED.content_state, instance_devices.content_state)
                WHERE instance_devices.state <> ALL(\(final)::text[])
                  AND (instance_devices.state_at <= EXCLUDED.state_at OR EXCLUDED.state = ANY(\(final)::text[]))
                """)
        } catch let error as PostgresError where error.code == .foreignKeyViolation {
            // The device is held above, so this is not expected; should it happen, the device is gone (the
            // transaction is aborted: nothing of the event is kept).
            throw NotFound("device")
        }
    }

    /// Records a delivery metric. `delivered` counts once per (delivery, recipient): returns false for a repeat.
    /// Throws `NotFound("delivery")` when no such delivery is queued or recorded (erased with its person, gone with
    /// retention): nothing is kept of the report (`marquee_record_delivery_metric`, migration 0101).
    public func recordMetric(deliveryID: String, metric: DeliveryMetric, recipient: String?, at: Date?) throws -> Bool {
        let rows = try connection.query(
            """
            SELECT marquee_record_delivery_metric(\(tenant), \(deliveryID), \(metric.rawValue), \(recipient ?? ""),
                                                  \(at), \(ULID(string: deliveryID)?.uuid)) AS recorded
            """)
        guard let recorded = try rows[0].decode(Bool?.self, "recorded") else { throw NotFound("delivery") }
        return recorded
    }
}
