import HTTPServer

/// Marquee's problem types. Each `type` is stable: clients may branch on it.
public enum Problems {
    /// Prefix of every Marquee problem type.
    public static let typeBase = "https://marquee.dev/problems/"

    /// The database cannot be reached (readiness).
    public static func databaseUnavailable() -> HTTPProblem {
        HTTPProblem(
            status: 503, type: typeBase + "database-unavailable", title: "Database unavailable",
            detail: "PostgreSQL is not reachable from this process.")
    }

    /// Migrations known to this build are not all applied (readiness).
    public static func migrationsPending(_ versions: [Int], changed: [Int]) -> HTTPProblem {
        var detail = "The database schema is behind this build"
        if !versions.isEmpty { detail += "; pending: " + versions.map(String.init).joined(separator: ", ") }
        if !changed.isEmpty { detail += "; changed after apply: " + changed.map(String.init).joined(separator: ", ") }
        detail += ". Run `marquee migrate`."
        return HTTPProblem(
            status: 503, type: typeBase + "migrations-pending", title: "Migrations pending", detail: detail)
    }
}
