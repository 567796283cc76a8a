import Foundation
import MarqueeCore
import PostgresClient

/// A saved segment (migration 0040).
public struct Segment: Sendable, Equatable {
    public var id: String
    public var name: String
    /// The filter as the client wrote it (validated by `SegmentFilter`).
    public var filter: JSONValue
    public var createdAt: Date
    public var updatedAt: Date
}

/// Who a filter matches right now: how many, and the first few person IDs.
public struct SegmentPreview: Sendable, Equatable {
    public var count: Int
    public var sample: [String]
}

/// Segments: saved, read, listed, deleted and evaluated against the tenant's people.
public struct SegmentStore: Sendable {
    let database: TenantDatabase

    public init(database: TenantDatabase) {
        self.database = database
    }

    /// Creates or replaces a segment; `created` tells which.
    public func put(tenant: UUID, id: String, name: String, filter: JSONValue) async throws -> (Segment, Bool) {
        let rows = try await database.tenantStatement(
            tenant,
            """
            INSERT INTO segments (tenant_id, id, name, filter) VALUES (\(tenant), \(id), \(name), \(filter))
            ON CONFLICT (tenant_id, id) DO UPDATE SET name = EXCLUDED.name, filter = EXCLUDED.filter
            RETURNING \(unsafeRaw: Self.columns), (xmax = 0) AS created
            """)
        return (try Self.segment(rows[0]), try rows[0].decode(Bool.self, "created"))
    }

    /// One segment; `NotFound("segment")` when the tenant has none by that ID.
    public func get(tenant: UUID, id: String) async throws -> Segment {
        let rows = try await database.tenantStatement(
            tenant, "SELECT \(unsafeRaw: Self.columns) FROM segments WHERE tenant_id = \(tenant) AND id = \(id)")
        guard let row = rows.first else { throw NotFound("segment") }
        return try Self.segment(row)
    }

    /// Segments in ID order, after `after` (a cursor: the last ID of the previous page).
    public func list(tenant: UUID, after: String?, limit: Int) async throws -> [Segment] {
        let rows = try await database.tenantStatement(
            tenant,
            """
            SELECT \(unsafeRaw: Self.columns) FROM segments
            WHERE tenant_id = \(tenant) AND (\(after)::text IS NULL OR id > \(after))
            ORDER BY id LIMIT \(limit)
            """)
        return try rows.map(Self.segment)
    }

    /// Removes a segment; false when there was none.
    public func delete(tenant: UUID, id: String) async throws -> Bool {
        !(try await database.tenantStatement(
            tenant, "DELETE FROM segments WHERE tenant_id = \(tenant) AND id = \(id) RETURNING 1"
        ).isEmpty)
    }

    /// How many of the tenant's people match `filter`, and the first `sampleSize` of them by ID.
    public func preview(tenant: UUID, filter: SegmentFilter, sampleSize: Int = 10) async throws -> SegmentPreview {
        var query = SegmentSQL.Builder()
        query.append("SELECT count(*) OVER () AS n, p.id FROM people p WHERE p.tenant_id = ")
        query.append(bind: tenant)
        query.append(" AND ")
        SegmentSQL.condition(filter, into: &query)
        query.append(" ORDER BY p.id LIMIT ")
        query.append(bind: sampleSize)
        let rows = try await database.tenantStatement(tenant, query.query)
        return SegmentPreview(
            count: try rows.first.map { Int(try $0.decode(Int64.self, "n")) } ?? 0,
            sample: try rows.map { try $0.decode(String.self, "id") })
    }

    static let columns = "id, name, filter, created_at, updated_at"

    static func segment(_ row: PostgresRow) throws -> Segment {
        Segment(
            id: try row.decode(String.self, "id"), name: try row.decode(String.self, "name"),
            filter: try row.decode(JSONValue.self, "filter"), createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"))
    }
}

/// Compiles a `SegmentFilter` to a condition over `people p`. The one home of what each operator means in SQL.
///
/// Every value (attribute paths, comparison values, domains, platforms, activity types) is a bind parameter; the
/// SQL text comes only from this file's constants. Every condition is true or false, never NULL (a missing attribute
/// makes `eq` false, not unknown), so `not` is the exact complement of what it wraps.
public enum SegmentSQL {
    /// SQL text and binds, built in order.
    public struct Builder: Sendable {
        var sql = ""
        var binds: [PostgresBind] = []

        public init() {}

        mutating func append(_ text: String) { sql += text }

        /// Binds `value` and returns its placeholder (`$n`), for use once or several times.
        mutating func parameter(_ value: some PostgresEncodable) -> String {
            binds.append(value.encodePostgres())
            return "$\(binds.count)"
        }

        mutating func append(bind value: some PostgresEncodable) { sql += parameter(value) }

        public var query: PostgresQuery { PostgresQuery(unsafeSQL: sql, binds: binds) }
    }

    /// Appends the condition for `filter` (a boolean expression over the row `p` of `people`).
    public static func condition(_ filter: SegmentFilter, into q: inout Builder) {
        switch filter {
        case .and(let items), .or(let items):
            let joiner: String
            if case .and = filter { joiner = " AND " } else { joiner = " OR " }
            q.append("(")
            for (index, item) in items.enumerated() {
                if index > 0 { q.append(joiner) }
                condition(item, into: &q)
            }
            q.append(")")
        case .not(let inner):
            q.append("(NOT ")
            condition(inner, into: &q)
            q.append(")")
        case .emailDomain(let domain):
            let d = q.parameter(domain)
            q.append("COALESCE(lower(substring(p.email FROM '@([^@]*)$')) = lower(\(d)::text), false)")
        case .hasDevice(let platform):
            q.append("EXISTS (SELECT 1 FROM devices d WHERE d.tenant_id = p.tenant_id AND d.person_id = p.id")
            if let platform {
                let v = q.parameter(platform.rawValue)
                q.append(" AND d.platform = \(v)::text")
            }
            q.append(")")
        case .hasPushToStart(let activityType):
            let t = q.parameter(activityType)
            q.append(
                """
                EXISTS (SELECT 1 FROM devices d JOIN push_to_start_tokens s \
                ON s.tenant_id = d.tenant_id AND s.device_token = d.token \
                WHERE d.tenant_id = p.tenant_id AND d.person_id = p.id AND s.activity_type = \(t)::text \
                AND s.status = 'active')
                """)
        case .attribute(let pointer, let comparison):
            // A step at a time, as RFC 6901 walks it: `#>` only for a token that names an array element (or a
            // member: `JSONPointer.arrayIndex`), `->` for any other, which finds nothing in an array (`#>` would read
            // `-1` as the last element, and `01`, `+1` or ` 1` as element 1).
            var a = "p.attributes"
            for token in pointer.tokens {
                let p = q.parameter(token)
                a = JSONPointer.arrayIndex(token) != nil ? "(\(a) #> ARRAY[\(p)::text])" : "(\(a) -> \(p)::text)"
            }
            attribute(a, comparison, into: &q)
        }
    }

    private static func attribute(_ a: String, _ comparison: SegmentFilter.Comparison, into q: inout Builder) {
        switch comparison {
        case .eq(let value):
            let v = q.parameter(value)
            q.append("COALESCE(\(a) = \(v)::jsonb, false)")
        case .ne(let value):
            let v = q.parameter(value)
            q.append("(\(a) IS DISTINCT FROM \(v)::jsonb)")
        case .in(let values):
            let list = q.parameter(JSONValue.array(values))
            q.append("EXISTS (SELECT 1 FROM jsonb_array_elements(\(list)::jsonb) AS e(v) WHERE e.v = \(a))")
        case .lt(let bound): ordered(a, "<", bound, into: &q)
        case .lte(let bound): ordered(a, "<=", bound, into: &q)
        case .gt(let bound): ordered(a, ">", bound, into: &q)
        case .gte(let bound): ordered(a, ">=", bound, into: &q)
        case .exists(let present):
            q.append("(\(a) IS \(present ? "NOT NULL" : "NULL"))")
        case .contains(let needle):
            // An element equal to the needle (jsonb's `=`: numbers by value). For a scalar needle that is exactly
            // containment of `[needle]`, tested in C without a subquery per person; an object or array needle is
            // compared element by element, as containment would also match an element that merely contains it.
            let n = q.parameter(needle)
            q.append(
                """
                COALESCE(CASE jsonb_typeof(\(a)) \
                WHEN 'array' THEN CASE WHEN jsonb_typeof(\(n)::jsonb) IN ('object', 'array') \
                THEN EXISTS (SELECT 1 FROM jsonb_array_elements(\(a)) AS e(v) WHERE e.v = \(n)::jsonb) \
                ELSE \(a) @> jsonb_build_array(\(n)::jsonb) END \
                WHEN 'string' THEN jsonb_typeof(\(n)::jsonb) = 'string' \
                AND strpos(\(a) #>> '{}', \(n)::jsonb #>> '{}') > 0 \
                ELSE false END, false)
                """)
        }
    }

    /// `op` between the attribute and a number or a string; an attribute of the other type is false.
    private static func ordered(_ a: String, _ op: String, _ bound: SegmentFilter.Bound, into q: inout Builder) {
        switch bound {
        case .number(let n):
            // As jsonb, cast to numeric: exact (a float8 parameter reaches numeric rounded to 15 significant digits).
            let v = q.parameter(n)
            q.append(
                "COALESCE(CASE WHEN jsonb_typeof(\(a)) = 'number' THEN (\(a))::numeric \(op) \(v)::jsonb::numeric END, false)"
            )
        case .string(let s):
            let v = q.parameter(s)
            q.append(
                "COALESCE(CASE WHEN jsonb_typeof(\(a)) = 'string' THEN (\(a) #>> '{}') COLLATE \"C\" \(op) \(v)::text END, false)"
            )
        }
    }
}
