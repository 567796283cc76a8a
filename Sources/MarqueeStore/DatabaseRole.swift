import Foundation
import PostgresClient

/// The login role the API and workers connect as, checked against least privilege (migration 0010): it must not be
/// a superuser, have BYPASSRLS, or own (or be able to become the owner of) Marquee's tables, because each of those
/// can read every tenant's rows past row-level security.
public struct DatabaseRoleCheck: Sendable, Equatable {
    /// The session's login role.
    public var role: String
    /// Why the role is too privileged; empty when it is fine.
    public var problems: [String]

    public var isLeastPrivilege: Bool { problems.isEmpty }

    /// Inspects the connecting role.
    public static func inspect(_ pool: PostgresPool) async throws -> DatabaseRoleCheck {
        let rows = try await pool.query(
            """
            SELECT session_user::text AS role, r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
                   EXISTS (SELECT 1 FROM pg_roles o
                           WHERE o.oid <> r.oid AND (o.rolsuper OR o.rolbypassrls)
                             AND pg_has_role(session_user, o.oid, 'MEMBER')) AS becomes_privileged,
                   (SELECT count(*) FROM pg_class c
                    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
                      AND pg_has_role(session_user, c.relowner, 'MEMBER'))::int AS owned_tables
            FROM pg_roles r WHERE r.rolname = session_user
            """)
        guard let row = rows.first else { return DatabaseRoleCheck(role: "?", problems: ["role not found"]) }
        var problems: [String] = []
        if try row.decode(Bool.self, "superuser") { problems.append("is a superuser") }
        if try row.decode(Bool.self, "bypassrls") { problems.append("has BYPASSRLS") }
        if try row.decode(Bool.self, "becomes_privileged") {
            problems.append("is a member of a superuser or BYPASSRLS role")
        }
        let owned = try row.decode(Int.self, "owned_tables")
        if owned > 0 { problems.append("owns \(owned) table(s) of the schema (or may become their owner)") }
        return DatabaseRoleCheck(role: try row.decode(String.self, "role"), problems: problems)
    }

    /// A one-line explanation for logs and the refusal message.
    public var summary: String {
        "database role \"\(role)\" " + problems.joined(separator: ", ")
    }
}
