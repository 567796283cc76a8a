import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Synchronization

/// Identity verification: the one home of the rule that, when a tenant requires it, an sdk-key write about a person
/// carries `X-Marquee-User-Token`, an HS256 JWT minted by the tenant's server with its identity secret, whose `sub`
/// is that person. App-key calls are never affected.
///
/// The tenant's mode and secrets are cached per process for `cacheTTL` (the key cache's TTL); a change made through
/// this process drops its entry at once, other processes see it within `cacheTTL`.
struct IdentityGuard: Sendable {
    /// The request header that carries the user token.
    static let header = "X-Marquee-User-Token"

    let settings: TenantSettingsStore
    let cache: ExpiringCache<UUID, IdentityKeys>
    let now: @Sendable () -> Date

    init(settings: TenantSettingsStore, cacheTTL: Duration, now: @escaping @Sendable () -> Date = { Date() }) {
        self.settings = settings
        self.cache = ExpiringCache(ttl: cacheTTL)
        self.now = now
    }

    /// Checks a write by `principal` about `people` (the persons it names or reaches; nil entries, for a device
    /// not registered yet, are skipped). Throws a 401 problem for a missing or invalid token, 403 for a valid token
    /// of another person.
    func check(_ request: HTTPRequest, _ principal: Principal, about people: [String?]) async throws {
        try await check(request, principal) { people }
    }

    /// As above, with the persons found only when the check applies (e.g. a device's owner, which costs a query).
    func check(
        _ request: HTTPRequest, _ principal: Principal, about people: () async throws -> [String?]
    ) async throws {
        let verdict = try await verdict(request, principal)
        try verdict.check(verdict.needsPeople ? try await people() : [])
    }

    /// What the rule asks of one request, decided once: whether it applies and whose user token the request
    /// carries. Checks against it need no I/O, so they can run inside a transaction (a Customer.io batch).
    func verdict(_ request: HTTPRequest, _ principal: Principal) async throws -> Verdict {
        guard principal.kind == .sdk else { return Verdict(state: .unchecked) }
        let keys = try await identityKeys(principal.tenantID)
        guard keys.verification == .required else { return Verdict(state: .unchecked) }
        guard let token = request.headers[Self.header].map({ String(HTTPHeaders.trimmed($0)) }), !token.isEmpty else {
            return Verdict(state: .refused(Problems.userTokenRequired()))
        }
        let date = now()
        do {
            let claims = try HS256.verify(
                token, secrets: keys.secrets(at: date), now: Int64(date.timeIntervalSince1970.rounded(.down)))
            return Verdict(state: .subject(claims.subject, email: claims.email))
        } catch {
            return Verdict(state: .refused(Problems.userTokenInvalid(error)))
        }
    }

    /// The identity rule for one request (see `verdict`).
    struct Verdict: Sendable {
        enum State: Sendable {
            /// Not an sdk key, or the tenant does not require verification.
            case unchecked
            /// Required, and the request has no valid user token: every write about a person is refused this way.
            case refused(HTTPProblem)
            /// Required, and the user token is valid for this person (and, when it says so, for this email).
            case subject(String, email: String?)
        }
        let state: State

        /// Whether `check` looks at the persons (so a caller need not look them up otherwise).
        var needsPeople: Bool {
            if case .subject = state { true } else { false }
        }

        /// Checks a write about `people` (nil entries are skipped).
        func check(_ people: [String?]) throws {
            switch state {
            case .unchecked: return
            case .refused(let problem): throw problem
            case .subject(let subject, _):
                // Byte for byte, as PostgreSQL compares them: Swift's `==` takes canonically equivalent strings
                // ("jos\u{E9}", "jose\u{301}") for one, which would let a token of one write about the other.
                for case let person? in people where !person.utf8.elementsEqual(subject.utf8) {
                    throw Problems.userTokenWrongPerson()
                }
            }
        }

        /// Checks an email a write sets on its person (nil: none). Under verification it must be the token's `email`
        /// claim, byte for byte: an email is how a tenant's server may address a person (starts by email, email-domain
        /// segments), so a person cannot take on an address their token does not vouch for.
        func check(email: String?, field: String = "email") throws {
            guard let email, case .subject(_, let vouched) = state else { return }
            guard let vouched, email.utf8.elementsEqual(vouched.utf8) else {
                throw Problems.userTokenWrongEmail(field: field)
            }
        }

        /// As above, with the persons found only when the check looks at them (e.g. a device's owner).
        func check(_ people: () throws -> [String?]) throws {
            try check(needsPeople ? people() : [])
        }
    }

    /// Forgets the cached settings of `tenant` (after this process changed them).
    func invalidate(_ tenant: UUID) { cache.remove(tenant) }

    func identityKeys(_ tenant: UUID) async throws -> IdentityKeys {
        if let cached = cache.lookup(tenant) { return cached }
        // Keys read before this process changed them (`invalidate`) answer this request but are not cached.
        let generation = cache.generation
        let keys = try await settings.identityKeys(tenant: tenant)
        cache.store(tenant, keys, ifStill: generation)
        return keys
    }
}

extension Problems {
    /// 401: the tenant requires identity verification and the request has no user token.
    static func userTokenRequired() -> HTTPProblem {
        HTTPProblem(
            status: 401, type: typeBase + "user-token-required", title: "User token required",
            detail:
                "This workspace requires identity verification: send \(IdentityGuard.header) with a user token from your server.",
            field: IdentityGuard.header)
    }

    /// 401: the user token does not verify (never quoting it).
    static func userTokenInvalid(_ failure: HS256.Failure) -> HTTPProblem {
        HTTPProblem(
            status: 401, type: typeBase + "user-token-invalid", title: "User token invalid",
            detail: "The user token \(failure.description).", field: IdentityGuard.header)
    }

    /// 403: a valid user token of another person.
    static func userTokenWrongPerson() -> HTTPProblem {
        HTTPProblem(
            status: 403, type: typeBase + "user-token-wrong-person", title: "User token of another person",
            detail: "The user token's sub is not the person this request writes about.",
            field: IdentityGuard.header)
    }

    /// 403: under identity verification, an email the user token does not vouch for (its `email` claim).
    static func userTokenWrongEmail(field: String) -> HTTPProblem {
        HTTPProblem(
            status: 403, type: typeBase + "user-token-wrong-email", title: "Email not in the user token",
            detail:
                "This workspace requires identity verification: an email set from an app must be the user token's email claim.",
            field: field)
    }
}
