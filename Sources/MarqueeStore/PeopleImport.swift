import Foundation
import MarqueeCore
import PostgresClient

/// One person of a bulk import, checked line by line by the API.
public struct ImportPerson: Sendable, Equatable {
    public struct Device: Sendable, Equatable {
        public var token: String
        public var platform: Platform
        /// Push-to-start tokens of an iOS device, by activity type.
        public var pushToStart: [String: String]

        public init(token: String, platform: Platform, pushToStart: [String: String] = [:]) {
            self.token = token
            self.platform = platform
            self.pushToStart = pushToStart
        }
    }

    /// The line of the import it came from (1-based).
    public var line: Int
    public var id: String
    /// nil keeps the stored email.
    public var email: String?
    /// nil keeps the stored attributes; an object (serialized JSON, checked by the API) replaces them. Text, not a
    /// parsed tree: that takes 24 bytes and more a value, from as little as two bytes of text.
    public var attributes: [UInt8]?
    public var devices: [Device]

    public init(line: Int, id: String, email: String?, attributes: [UInt8]?, devices: [Device]) {
        self.line = line
        self.id = id
        self.email = email
        self.attributes = attributes
        self.devices = devices
    }
}

/// A line the import did not apply, and why.
public struct ImportRejection: Sendable, Equatable {
    public var line: Int
    public var field: String
    public var reason: String

    public init(line: Int, field: String, reason: String) {
        self.line = line
        self.field = field
        self.reason = reason
    }
}

/// What an import did.
public struct ImportOutcome: Sendable, Equatable {
    /// People created.
    public var imported: Int
    /// People who existed and were updated.
    public var updated: Int
    /// Lines refused by the database's rules (an email that belongs to another person, an activity type past the
    /// tenant's cap on types registrations create); the API adds the lines it refused before.
    public var rejected: [ImportRejection]
}

/// The answer to an import request: done now, or the stored answer of an earlier request with the same key.
public enum ImportResult: Sendable {
    case done(ImportOutcome, JSONValue)
    case replay(StoredResponse)
}

/// Bulk upsert of people, their devices and push-to-start tokens: COPY into staging tables, then one merge per
/// table, in one transaction.
public struct PeopleImportStore: Sendable {
    let database: TenantDatabase

    public init(database: TenantDatabase) {
        self.database = database
    }

    /// Imports `people` (distinct IDs and device tokens: the API rejects repeats; a repeated email is refused here).
    /// With an idempotency key, the rendered answer (`render`) is stored in the same transaction, and a repeat returns
    /// it instead; so does an import whose key another request recorded while it ran (nothing of it is kept).
    public func importPeople(
        tenant: UUID, _ people: [ImportPerson], idempotencyKey: String?, requestHash: [UInt8],
        render: @escaping @Sendable (ImportOutcome) -> JSONValue
    ) async throws -> ImportResult {
        do {
            return try await write(
                tenant: tenant, people, idempotencyKey: idempotencyKey, requestHash: requestHash, render: render)
        } catch let taken as KeyTaken {
            return .replay(taken.stored)
        }
    }

    /// Another request recorded the import's Idempotency-Key while it ran; `stored` is that request's record.
    private struct KeyTaken: Error {
        var stored: StoredResponse
    }

    private func write(
        tenant: UUID, _ people: [ImportPerson], idempotencyKey: String?, requestHash: [UInt8],
        render: @escaping @Sendable (ImportOutcome) -> JSONValue
    ) async throws -> ImportResult {
        try await database.tenantTransaction(tenant) { connection in
            // Up to 100,000 people in one transaction: more than the API's usual statement timeout allows.
            try connection.query(BulkStatements.timeout)
            if let key = idempotencyKey {
                // Serialises requests with the same key: the second waits, then replays the first's answer.
                try connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\(tenant.uuidString + key), 0))")
                if let stored = try LiveActivityStore.storedResponse(
                    connection.query(LiveActivityStore.idempotencyQuery(tenant, key)))
                {
                    return .replay(stored)
                }
            }
            // No erasure in the tenant while the import writes its people: one it finds (and leaves unlocked until it
            // updates them or gives them devices) is not deleted meanwhile (a foreign-key violation), and an erasure
            // that comes now waits and then takes what the import wrote. As a campaign's start step does.
            try connection.query(ErasureLock.shared(tenant))
            let outcome = try Self.merge(connection, tenant: tenant, people)
            let response = render(outcome)
            if let key = idempotencyKey {
                // The advisory lock serialises imports only: a start, change, campaign or channel with the key may
                // have recorded it since (they take no such lock). Its record stays, as a concurrent request's
                // record does for every writer: nothing of this import is kept (KeyTaken rolls it back), and it is
                // answered from that record, as its retry would be (a replay, or 422 for a different request).
                let record = IdempotencyRecord(key: key, requestHash: requestHash, status: 200, response: response)
                while try !IdempotencyRecord.record(record, tenant: tenant, on: connection) {
                    if let stored = try LiveActivityStore.storedResponse(
                        connection.query(LiveActivityStore.idempotencyQuery(tenant, key)))
                    {
                        throw KeyTaken(stored: stored)
                    }
                    // Gone again meanwhile (its person erased): the key is free.
                }
            }
            return .done(outcome, response)
        }
    }

    /// Creates the activity types the staged push-to-start tokens name that the tenant does not have, through the one
    /// home of the cap on types registrations create (`marquee_create_activity_types`, migrations 0088 and 0090),
    /// before any person is written. Each line is a group that creates all its unknown types or none, lines in order,
    /// so that a line it rejects leaves no type behind (nor holds a place of the cap a later line could use). The
    /// lines naming a type that could not be created are removed from the staging tables and returned as rejected,
    /// so that such a line is skipped whole, as every other bad line is. One statement for any number of lines, and
    /// one more only when some are refused.
    static func createActivityTypes(_ connection: PostgresConnection, tenant: UUID, _ people: [ImportPerson]) throws
        -> [ImportRejection]
    {
        // Only what can change the outcome goes in (the staged lines name one type 100,000 times): the unknown types,
        // each once per line (the attributes type of its first device), and of the lines naming a single one only
        // the first per type: a later such line goes in exactly when that first one did (its type is then created,
        // or the cap is reached for good).
        let created = try connection.query(
            """
            WITH unknown AS (
                SELECT u.activity_type FROM (SELECT DISTINCT activity_type FROM import_push_to_start) u
                WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                  WHERE a.tenant_id = \(tenant) AND a.identifier = u.activity_type)
            ), named AS (
                SELECT DISTINCT ON (t.line, t.activity_type) t.line, t.activity_type, t.default_attributes_type
                FROM import_push_to_start t JOIN unknown USING (activity_type)
                ORDER BY t.line, t.activity_type, t.device_token
            ), counted AS (
                SELECT n.*, count(*) OVER (PARTITION BY n.line) = 1 AS single FROM named n
            ), kept AS (
                SELECT c.* FROM (SELECT c.*, row_number() OVER (PARTITION BY c.activity_type, c.single ORDER BY c.line)
                                        AS nth
                                 FROM counted c) c
                WHERE NOT c.single OR c.nth = 1
            )
            SELECT marquee_create_activity_types(
                       \(tenant), 'marquee',
                       COALESCE(array_agg(activity_type ORDER BY line, activity_type), '{}'),
                       COALESCE(array_agg(default_attributes_type ORDER BY line, activity_type), '{}'),
                       COALESCE(array_agg(line::bigint ORDER BY line, activity_type), '{}'))
                   AS refused
            FROM kept
            """)
        let refused = Set(try created[0].decode([String].self, "refused"))
        guard !refused.isEmpty else { return [] }
        let lines = try connection.query(
            """
            WITH bad AS (
                SELECT DISTINCT line FROM import_push_to_start WHERE activity_type = ANY(\(Array(refused))::text[])
            ), people AS (
                DELETE FROM import_people i USING bad WHERE i.line = bad.line
            ), devices AS (
                DELETE FROM import_devices d USING bad WHERE d.line = bad.line
            ), tokens AS (
                DELETE FROM import_push_to_start t USING bad WHERE t.line = bad.line
            )
            SELECT line FROM bad ORDER BY line
            """
        ).map { try $0.decode(Int.self, "line") }
        // Each line's field: its first device, and that device's first type (in key order), that was refused.
        let byLine = Dictionary(people.map { ($0.line, $0) }, uniquingKeysWith: { first, _ in first })
        return lines.map { line in
            var field = "devices"
            for (index, device) in (byLine[line]?.devices ?? []).enumerated() {
                if let type = device.pushToStart.keys.sorted().first(where: refused.contains) {
                    field = "devices[\(index)].push_to_start.\(type)"
                    break
                }
            }
            let error = RegistryTransaction.activityTypeLimit(field: field)
            return ImportRejection(line: line, field: error.field, reason: error.reason)
        }
    }

    /// How many times the merge runs again when an email it found free was given to someone else before it wrote it.
    static let emailRaces = 3

    /// Stages the people, then writes them (``write(_:tenant:_:)``). The write's check of emails reads them with its
    /// statement's snapshot: a person write that gives one of them to someone else before the import writes it (a
    /// `PUT /v1/people/{id}`, an identify, another import) makes the people_email index refuse the import's. The
    /// write then runs again from a savepoint, and its check finds the email taken (the other write has committed, or
    /// the index would be waiting for it): the line is refused as one whose email belongs to another person.
    static func merge(_ connection: PostgresConnection, tenant: UUID, _ people: [ImportPerson]) throws
        -> ImportOutcome
    {
        try stage(connection, people)
        try connection.execute("SAVEPOINT import_write")
        var races = 0
        while true {
            do {
                return try write(connection, tenant: tenant, people)
            } catch let error as PostgresError
                where error.code == .uniqueViolation && error.constraint == "people_email" && races < emailRaces
            {
                races += 1
                try connection.execute("ROLLBACK TO SAVEPOINT import_write")
            }
        }
    }

    /// The staging tables, filled by COPY.
    static func stage(_ connection: PostgresConnection, _ people: [ImportPerson]) throws {
        for table in [
            """
            CREATE TEMP TABLE import_people (line integer NOT NULL, id text NOT NULL, email text, attributes jsonb,
                                             created boolean NOT NULL DEFAULT false) ON COMMIT DROP
            """,
            """
            CREATE TEMP TABLE import_devices (line integer NOT NULL, person_id text NOT NULL, token text NOT NULL,
                                              platform text NOT NULL) ON COMMIT DROP
            """,
            """
            CREATE TEMP TABLE import_push_to_start (line integer NOT NULL, person_id text NOT NULL,
                                                    device_token text NOT NULL, activity_type text NOT NULL,
                                                    token text NOT NULL, default_attributes_type text NOT NULL)
                ON COMMIT DROP
            """,
        ] {
            try connection.execute(PostgresQuery(unsafeSQL: table))
        }
        _ = try connection.copyFrom(
            table: "import_people", columns: ["line", "id", "email", "attributes"],
            rows: people.lazy.map { p in
                [
                    p.line.encodePostgres(), p.id.encodePostgres(), p.email.encodePostgres(),
                    p.attributes.map(PostgresJSON.init(bytes:)).encodePostgres(),
                ]
            })
        _ = try connection.copyFrom(
            table: "import_devices", columns: ["line", "person_id", "token", "platform"],
            rows: people.lazy.flatMap { p in
                p.devices.map { d in
                    [
                        p.line.encodePostgres(), p.id.encodePostgres(), d.token.encodePostgres(),
                        d.platform.rawValue.encodePostgres(),
                    ]
                }
            })
        _ = try connection.copyFrom(
            table: "import_push_to_start",
            columns: ["line", "person_id", "device_token", "activity_type", "token", "default_attributes_type"],
            rows: people.lazy.flatMap { p in
                p.devices.flatMap { d in
                    d.pushToStart.sorted { $0.key < $1.key }.map { type, token in
                        [
                            p.line.encodePostgres(), p.id.encodePostgres(), d.token.encodePostgres(),
                            type.encodePostgres(), token.encodePostgres(),
                            RegistryTransaction.defaultAttributesType(type).encodePostgres(),
                        ]
                    }
                }
            })
        // Temporary tables are never analysed by autovacuum: without statistics the planner guesses their sizes,
        // and the joins below are planned for a handful of rows instead of up to 100,000.
        try connection.execute("ANALYZE import_people, import_devices, import_push_to_start")
    }

    /// The staged people checked and written: one merge per table. Lines it refuses are removed from the staging
    /// tables (undone with the rest when ``merge(_:tenant:_:)`` runs it again).
    static func write(_ connection: PostgresConnection, tenant: UUID, _ people: [ImportPerson]) throws
        -> ImportOutcome
    {
        // An email that belongs to someone else already, or that an earlier line has: the one check of both, comparing
        // emails as the people_email index does (`lower()`, then bytes; Swift folds some letters otherwise, e.g.
        // U+0130, and takes canonically equivalent spellings for one). The line is refused, the others go on.
        let conflicts = try connection.query(
            """
            WITH firsts AS MATERIALIZED (
                SELECT i.line, min(i.line) OVER (PARTITION BY lower(i.email)) AS first
                FROM import_people i WHERE i.email IS NOT NULL
            ), bad AS (
                DELETE FROM import_people i
                USING firsts f
                WHERE f.line = i.line AND (f.first <> f.line OR EXISTS (
                    SELECT 1 FROM people p
                    WHERE p.tenant_id = \(tenant) AND lower(p.email) = lower(i.email) AND p.id <> i.id))
                RETURNING i.line, i.id, NULLIF(f.first, f.line) AS repeats
            ), devices AS (
                DELETE FROM import_devices d USING bad WHERE d.line = bad.line
            ), tokens AS (
                DELETE FROM import_push_to_start t USING bad WHERE t.line = bad.line
            )
            SELECT line, repeats FROM bad ORDER BY line
            """)
        var rejected = try conflicts.map {
            ImportRejection(
                line: try $0.decode(Int.self, "line"), field: "email",
                reason: try $0.decode(Int?.self, "repeats").map { "repeats line \($0)" } ?? "belongs to another person")
        }
        rejected += try Self.createActivityTypes(connection, tenant: tenant, people)
        // People: new ones inserted (and marked), existing ones updated; absent email and attributes are kept.
        try connection.execute(
            """
            WITH inserted AS (
                INSERT INTO people (tenant_id, id, email, attributes)
                SELECT \(tenant), i.id, i.email, COALESCE(i.attributes, '{}'::jsonb) FROM import_people i ORDER BY i.id
                ON CONFLICT (tenant_id, id) DO NOTHING
                RETURNING id
            )
            UPDATE import_people i SET created = true FROM inserted WHERE i.id = inserted.id
            """)
        let updated = try connection.execute(
            """
            UPDATE people p SET email = COALESCE(i.email, p.email), attributes = COALESCE(i.attributes, p.attributes)
            FROM import_people i
            WHERE p.tenant_id = \(tenant) AND p.id = i.id AND NOT i.created
            """)
        let created = try connection.query("SELECT count(*)::int AS n FROM import_people WHERE created")
        // Devices: a token registered before under someone else moves to this person (a device has one owner),
        // as a single registration does.
        try connection.execute(
            """
            INSERT INTO devices (tenant_id, token, person_id, platform)
            SELECT \(tenant), d.token, d.person_id, d.platform FROM import_devices d ORDER BY d.token
            ON CONFLICT (tenant_id, token) DO UPDATE SET person_id = EXCLUDED.person_id, platform = EXCLUDED.platform
            """)
        // Push-to-start tokens: all at once through the one home of the rotation rule (migration 0065), which a
        // single registration uses too. The arrays in one order (each aggregate sorts the same way).
        try connection.query(
            """
            SELECT count(r.outcome) AS n
            FROM (SELECT array_agg(person_id ORDER BY line, device_token, activity_type) AS people,
                         array_agg(device_token ORDER BY line, device_token, activity_type) AS devices,
                         array_agg(activity_type ORDER BY line, device_token, activity_type) AS types,
                         array_agg(token ORDER BY line, device_token, activity_type) AS tokens,
                         array_agg(NULL::text ORDER BY line, device_token, activity_type) AS attributes_types,
                         array_agg(default_attributes_type ORDER BY line, device_token, activity_type) AS defaults
                  FROM import_push_to_start) a
            CROSS JOIN LATERAL marquee_register_push_to_start_rows(
                \(tenant), 'marquee', a.people, a.devices, a.types, a.tokens, a.attributes_types, a.defaults) r
            WHERE a.people IS NOT NULL
            """)
        // A person keeps at most the tenant's max_devices_per_person devices, the imported ones first: the rule's one
        // home (migration 0081), which a single registration uses too. The people's rows are held (written above).
        // Asked only for people who may be over it: someone this import created has no devices but its own, so one
        // device (the cap is at least 1) cannot be too many — a first import of 100,000 people skips 100,000 counts.
        try connection.query(
            """
            SELECT marquee_keep_recent_devices(
                \(tenant),
                ARRAY(SELECT d.person_id FROM import_devices d
                      LEFT JOIN import_people i ON i.id = d.person_id AND i.created
                      GROUP BY d.person_id HAVING count(*) > 1 OR bool_or(i.id IS NULL)),
                ARRAY(SELECT token FROM import_devices))
            """)
        return ImportOutcome(
            imported: try created[0].decode(Int.self, "n"), updated: updated, rejected: rejected)
    }
}
