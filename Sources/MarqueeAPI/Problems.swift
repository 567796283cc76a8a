import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// Marquee's problem types. Each `type` is stable: clients may branch on it.
public enum Problems {
    /// Prefix of every Marquee problem type.
    public static let typeBase = HTTPProblem.typeBase

    /// The database cannot be reached (readiness, or a request that needs it).
    public static func databaseUnavailable() -> HTTPProblem {
        HTTPProblem(
            status: 503, type: typeBase + "database-unavailable", title: "Database unavailable",
            detail: "PostgreSQL is not reachable from this process.", headers: ["Retry-After": "1"])
    }

    /// A statement ran past `MARQUEE_DB_STATEMENT_TIMEOUT` (or was cancelled by an operator): nothing was written.
    public static func databaseTimeout() -> HTTPProblem {
        HTTPProblem(
            status: 503, type: typeBase + "database-timeout", title: "Database timeout",
            detail: "The database took too long to answer; nothing was written. Retry later.",
            headers: ["Retry-After": "5"])
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

    /// 401: no key, or a key that is unknown, malformed or revoked (never saying which).
    public static func unauthorized(_ detail: String = "A valid API key is required: Authorization: Bearer <key>.")
        -> HTTPProblem
    {
        HTTPProblem(
            status: 401, type: typeBase + "unauthorized", title: "Unauthorized", detail: detail,
            headers: ["WWW-Authenticate": "Bearer realm=\"marquee\""])
    }

    /// 403: a valid key of the wrong kind.
    public static func forbidden(_ detail: String) -> HTTPProblem {
        HTTPProblem(status: 403, type: typeBase + "forbidden", title: "Forbidden", detail: detail)
    }

    /// 404 for a resource: the same answer whether it is another tenant's or does not exist.
    public static func notFound(_ resource: String) -> HTTPProblem {
        let name = resource.replacingOccurrences(of: "_", with: " ")
        return HTTPProblem(
            status: 404, type: typeBase + "not-found", title: "Not Found", detail: "No such \(name).")
    }

    /// 409: the request conflicts with the current state.
    public static func conflict(field: String, reason: String) -> HTTPProblem {
        HTTPProblem(
            status: 409, type: typeBase + "conflict", title: "Conflict", detail: "\(field) \(reason)", field: field)
    }

    /// 422 for a field, from the domain's validation error.
    public static func validation(_ error: ValidationError) -> HTTPProblem {
        HTTPProblem(
            status: 422, type: typeBase + error.code.rawValue, title: "Invalid request field",
            detail: error.field.isEmpty ? error.reason : "\(error.field) \(error.reason)",
            field: error.field.isEmpty ? nil : error.field)
    }
}

extension String {
    fileprivate func replacingOccurrences(of target: Character, with replacement: String) -> String {
        var out = ""
        for c in self { if c == target { out += replacement } else { out.append(c) } }
        return out
    }
}

/// Turns the errors the stores and rules throw into problems; anything else stays a 500.
func problem(for error: any Error) -> HTTPProblem? {
    switch error {
    case let p as HTTPProblem: return p
    case let v as ValidationError: return Problems.validation(v)
    case let n as NotFound: return Problems.notFound(n.resource)
    case let c as Conflict: return Problems.conflict(field: c.field, reason: c.reason)
    case let g as TenantSettingsStore.IdentitySecretInGrace: return Problems.identitySecretInGrace(g)
    case let c as ChannelManagementError: return Problems.channel(c)
    case let s as PayloadSizeError: return Problems.payloadTooLarge(s)
    case let u as UnansweredCommit: return Problems.unansweredCommit(u)
    case let p as PostgresError
    where p.code == .connectionFailed || p.code == .connectionLost || p.code == .poolTimeout:
        return Problems.databaseUnavailable()
    case let p as PostgresError where p.code == .queryCanceled:
        return Problems.databaseTimeout()
    case let p as PostgresError where p.sqlState == "23503" && p.constraint?.hasSuffix("_channel_id_fkey") == true:
        // The channel a start or a campaign names was deleted between the request's read and its write.
        return Problems.notFound("channel")
    default: return nil
    }
}

/// Wraps a handler so that domain errors render as problems. A database outage or timeout (a 503) is also logged
/// with the request ID and the error's value-free description (its code, e.g. `pool timeout`), so an operator can
/// tell an unreachable PostgreSQL from a pool too small for the load.
func guarded(_ handler: @escaping HTTPHandler, logger: Logger) -> HTTPHandler {
    { request in
        do {
            return try await handler(request)
        } catch {
            guard let p = problem(for: error) else { throw error }
            if p.status >= 500, error is PostgresError || error is UnansweredCommit {
                logger.warning(
                    "request failed: database",
                    metadata: [
                        "request.id": .string(request.requestID), "error": .string(String(describing: error)),
                    ])
            }
            throw p
        }
    }
}

extension Problems {
    /// 409: update or end of an instance that is over.
    static func closedInstance(instanceID: String, state: InstanceState) -> HTTPProblem {
        HTTPProblem(
            status: 409, type: typeBase + "instance-closed", title: "Live activity is over",
            detail: "The live activity is \(state.rawValue); it takes no more updates or ends.", field: "instance_id")
    }

    /// 409: a rotation of the identity secret while the previous one is still in its grace (it would be dropped at
    /// once, and the user tokens the tenant's servers still mint with it refused).
    static func identitySecretInGrace(_ error: TenantSettingsStore.IdentitySecretInGrace) -> HTTPProblem {
        let until = Timestamps.format(error.previousValidUntil)
        return HTTPProblem(
            status: 409, type: typeBase + "identity-secret-in-grace", title: "Previous identity secret still valid",
            detail:
                "The previous identity secret is accepted until \(until), so that user tokens already handed out keep working; rotating again now would refuse it at once. Rotate after that time, or with force=true to drop it now.",
            field: "force", extensions: ["previous_secret_valid_until": until])
    }

    /// 413: the composed push would not fit the provider's limit.
    static func payloadTooLarge(_ error: PayloadSizeError) -> HTTPProblem {
        let service = error.platform == .ios ? "APNs payload" : "FCM data message"
        return HTTPProblem(
            status: 413, type: typeBase + "push-too-large", title: "Push payload too large",
            detail:
                "The \(service) (\(error.platform.rawValue)) would be \(error.size) bytes, \(error.overBy) over the \(error.limit)-byte limit.",
            field: "content_state",
            extensions: [
                "platform": error.platform.rawValue, "size": String(error.size), "limit": String(error.limit),
                "over_by": String(error.overBy),
            ])
    }

    /// 500: the database connection was lost while the write's transaction committed (`UnansweredCommit`), so its
    /// answer was lost. The write was not made again. Not a 503 with Retry-After: retrying blindly could apply the
    /// write twice (a second version and push). When the commit is known to have happened, a start is never answered
    /// so (its answer is read back from its instance), nor a change with an Idempotency-Key (read back from the key's
    /// record); when it is not known (`write-outcome-unknown`), any write may be.
    static func unansweredCommit(_ error: UnansweredCommit) -> HTTPProblem {
        switch error.outcome {
        case .committed:
            return HTTPProblem(
                status: 500, type: typeBase + "write-committed-unanswered", title: "Write committed, answer lost",
                detail:
                    "The write's transaction committed, but the database connection was lost before its result was read. It was applied unless a concurrent change to the same live activity got in first: read it (GET) before sending it again. An Idempotency-Key makes such retries safe."
            )
        case .unknown:
            return HTTPProblem(
                status: 500, type: typeBase + "write-outcome-unknown", title: "Write outcome unknown",
                detail:
                    "The database connection was lost while the write was committing, and whether it committed could not be learned. A retry with the same Idempotency-Key is safe; without one, read the live activity (GET) before sending it again."
            )
        }
    }

    /// 503: too many concurrent changes to one instance (or to the devices a start plans for).
    static func contention(instanceID: String) -> HTTPProblem {
        HTTPProblem(
            status: 503, type: typeBase + "contention", title: "Instance busy",
            detail: "The live activity changed concurrently too many times; retry.", headers: ["Retry-After": "1"])
    }
}
