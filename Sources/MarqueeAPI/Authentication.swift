import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Synchronization

/// Checks API keys and the admin token.
struct Authenticator: Sendable {
    let tenants: TenantStore
    /// SHA-256 of `MARQUEE_ADMIN_TOKEN`, or nil when the admin API is off.
    let adminTokenHash: [UInt8]?

    /// Recently checked keys, so that a busy device fleet does not cost a key lookup per request: a revoked key stops
    /// working within `cacheTTL`. Keys found invalid are remembered as long, so that a fleet of apps still shipping a
    /// revoked sdk key (or anyone repeating a bad key) costs one lookup per key and period, not one per request.
    let cache: KeyCache
    /// The lookups under way of keys not in the cache, one per key.
    let lookups = KeyLookups()
    /// The request rate limits, checked right after a key is authenticated, and the client addresses' budgets of
    /// lookups of keys not in the cache, checked before the database is asked; nil: none.
    let rateGuard: RequestRateGuard?

    init(
        tenants: TenantStore, adminToken: String?, cacheTTL: Duration = .seconds(5), rateGuard: RequestRateGuard? = nil
    ) {
        self.tenants = tenants
        self.adminTokenHash = adminToken.map { SHA256.hash(Array($0.utf8)) }
        self.cache = KeyCache(ttl: cacheTTL)
        self.rateGuard = rateGuard
    }

    /// How a route accepts keys.
    enum Scheme {
        /// `Authorization: Bearer <key>`.
        case bearer
        /// Bearer, or Basic with the key as the user name (the Customer.io SDK's way), or a `writeKey` fallback.
        case bearerOrBasic
    }

    /// The caller, if the key is valid and of an allowed kind: 401 otherwise, 403 for a valid key of another kind,
    /// 429 when the tenant's requests with keys of this kind are over their rate (`RequestLimits`). With `spend`
    /// false the rate is only looked at (a body admission: the request takes its token when its handler runs).
    func require(
        _ request: HTTPRequest, kinds: Set<APIKeyKind>, scheme: Scheme = .bearer, fallbackKey: String? = nil,
        spend: Bool = true
    ) async throws -> Principal {
        guard let presented = Self.presentedKey(request, scheme: scheme) ?? fallbackKey else {
            throw Problems.unauthorized()
        }
        guard let principal = try await principal(presented, request) else {
            throw Problems.unauthorized("The API key is not valid.")
        }
        try rateGuard?.check(principal, request, spend: spend)
        guard kinds.contains(principal.kind) else {
            let allowed = kinds.map(\.rawValue).sorted().joined(separator: " or ")
            throw Problems.forbidden(
                "This endpoint needs a key of kind \(allowed); this key is \(principal.kind.rawValue).")
        }
        return principal
    }

    /// The principal of a presented key, from the cache or the database (which the cache then remembers, valid or
    /// not); nil when the key is not valid. A key not in the cache costs a database transaction, so it spends one of
    /// the client address's lookups first (429 `rate-limited` when none is left: `RequestRateGuard.admitLookup`;
    /// given back when the key is valid), and requests presenting the same key meanwhile wait for that one lookup.
    /// The request rate is not checked: callers go through `require` or `limit`.
    func principal(_ presented: String, _ request: HTTPRequest) async throws -> Principal? {
        let hash = SHA256.hash(Array(presented.utf8))
        switch cache.lookup(hash) {
        case .valid(let cached)?:
            return cached
        case .invalid?:
            return nil
        case nil:
            // A request that comes after this process revoked a key (or changed settings) joins no lookup begun
            // before: the lookups under way are told apart by the cache's generation too.
            let generation = cache.generation
            return try await lookups.run(
                hash + withUnsafeBytes(of: generation.littleEndian, Array.init),
                admit: { try rateGuard?.admitLookup(request) },
                lookup: {
                    // A lookup that fails (the database unreachable) caches nothing; one that read the keys before
                    // this process revoked one or changed the tenant's settings answers, but caches nothing either.
                    guard let checked = try await tenants.authenticate(presented) else {
                        cache.store(hash, .invalid, ifStill: generation)
                        return nil
                    }
                    rateGuard?.keyFound(request)
                    cache.store(hash, .valid(checked), ifStill: generation)
                    return checked
                })
        }
    }

    /// The request rate check of `require`, for a route that authenticates its key otherwise (or that looked with
    /// `spend` false, and takes `count` tokens once it knows how many writes the request carries).
    func limit(_ principal: Principal, _ request: HTTPRequest, count: Int = 1) throws {
        try rateGuard?.check(principal, request, count: count)
    }

    /// Forgets the cached keys of `tenant`, so that a settings change read with the key (its request rate limits)
    /// applies to this process's next request.
    func forgetKeys(of tenant: UUID) { cache.forget(tenant: tenant) }

    /// Route middleware: the app key is required (401 without a valid key, 403 with another kind) before `handler`
    /// runs, and the handler gets its principal. Routes declare who may call them where they are registered.
    func app(_ handler: @escaping @Sendable (HTTPRequest, Principal) async throws -> HTTPResponse) -> HTTPHandler {
        { request in try await handler(request, try await self.require(request, kinds: [.app])) }
    }

    /// Body admission (`BodyPolicy.admission`) for app-key routes whose bodies may exceed the server's limit: the key
    /// is checked from the headers before any of the body is read, so that no one without a valid app key can make
    /// the server buffer a large body. The route's handler still goes through `app` (a cache hit by then).
    func appAdmission() -> BodyPolicy.Admission {
        { request in _ = try await self.require(request, kinds: [.app], spend: false) }
    }

    /// Checks `Authorization: Bearer $MARQUEE_ADMIN_TOKEN`, comparing in constant time.
    func requireAdmin(_ request: HTTPRequest) throws {
        guard let expected = adminTokenHash else {
            throw Problems.forbidden("The admin API is disabled: set MARQUEE_ADMIN_TOKEN to enable it.")
        }
        guard let presented = Self.presentedKey(request, scheme: .bearer),
            ConstantTime.equals(SHA256.hash(Array(presented.utf8)), expected)
        else { throw Problems.unauthorized("A valid admin token is required.") }
    }

    static func presentedKey(_ request: HTTPRequest, scheme: Scheme) -> String? {
        guard let header = request.headers["Authorization"].map(HTTPHeaders.trimmed) else { return nil }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2 else { return nil }
        let value = String(HTTPHeaders.trimmed(parts[1]))
        switch parts[0].lowercased() {
        case "bearer":
            return value.isEmpty ? nil : value
        case "basic" where scheme == .bearerOrBasic:
            guard let data = Data(base64Encoded: value), let decoded = String(data: data, encoding: .utf8) else {
                return nil
            }
            let user = decoded.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            return user.isEmpty ? nil : String(user)
        default:
            return nil
        }
    }
}

/// A small time-bounded, size-bounded cache kept in memory only (verified keys, tenants' identity settings). A TTL of
/// zero turns it off. At `capacity`, the expired entries go, then the oldest tenth: a flood of new keys pushes out
/// the oldest entries, never the newer ones with them.
///
/// A value read from the database before an entry was removed must not be stored after: it would outlive the change
/// that removed the entry by the TTL. Such readers take `generation` before they read and store with `ifStill`.
final class ExpiringCache<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private struct Entry {
        var value: Value
        var expires: ContinuousClock.Instant
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        /// Counts the removals.
        var generation: UInt64 = 0
    }

    private let state = Mutex(State())
    private let ttl: Duration
    let capacity: Int

    init(ttl: Duration, capacity: Int = 10_000) {
        self.ttl = ttl
        self.capacity = max(1, capacity)
    }

    /// Entries held now (expired ones included until they are looked up or make room).
    var count: Int { state.withLock { $0.entries.count } }

    /// The number of removals (`remove`, `removeAll`) so far.
    var generation: UInt64 { state.withLock { $0.generation } }

    func lookup(_ key: Key) -> Value? {
        guard ttl > .zero else { return nil }
        let now = ContinuousClock.now
        return state.withLock { state in
            guard let entry = state.entries[key] else { return nil }
            if entry.expires <= now {
                state.entries[key] = nil
                return nil
            }
            return entry.value
        }
    }

    /// Stores `value` unless an entry was removed since `generation` was read (nil: whatever was removed).
    func store(_ key: Key, _ value: Value, ifStill generation: UInt64? = nil) {
        guard ttl > .zero else { return }
        let expires = ContinuousClock.now + ttl
        state.withLock { state in
            if let generation, generation != state.generation { return }
            if state.entries[key] == nil, state.entries.count >= capacity {
                Self.makeRoom(&state.entries, capacity: capacity)
            }
            state.entries[key] = Entry(value: value, expires: expires)
        }
    }

    /// Forgets the expired entries; if that is not room enough, the tenth stored longest ago (at least one) at once,
    /// so that a stream of new keys pays for one pass and one sort per tenth of the capacity
    /// (`RequestLimiter.makeRoom` does the same for its buckets). Every entry lives `ttl`, so the oldest expire first.
    private static func makeRoom(_ entries: inout [Key: Entry], capacity: Int) {
        let now = ContinuousClock.now
        entries = entries.filter { $0.value.expires > now }
        guard entries.count >= capacity else { return }
        let oldest = entries.sorted { $0.value.expires < $1.value.expires }
        for (key, _) in oldest.prefix(max(1, capacity / 10)) { entries[key] = nil }
    }

    func remove(_ key: Key) {
        state.withLock { state in
            state.entries[key] = nil
            state.generation &+= 1
        }
    }

    /// Forgets every entry whose value matches.
    func removeAll(where matches: (Value) -> Bool) {
        state.withLock { state in
            state.entries = state.entries.filter { !matches($1.value) }
            state.generation &+= 1
        }
    }
}

/// Checked keys, keyed by the SHA-256 of the key (the key text itself is not kept). Valid and invalid keys are kept
/// apart, so that a flood of made-up keys (each one a miss) pushes out only invalid ones when it fills its cache.
final class KeyCache: Sendable {
    enum Verdict: Sendable, Equatable {
        case valid(Principal)
        case invalid
    }

    private let valid: ExpiringCache<[UInt8], Principal>
    private let invalid: ExpiringCache<[UInt8], Bool>

    init(ttl: Duration) {
        valid = ExpiringCache(ttl: ttl)
        invalid = ExpiringCache(ttl: ttl)
    }

    /// The verdict on the key whose SHA-256 is `hash`, if checked lately.
    func lookup(_ hash: [UInt8]) -> Verdict? {
        if let principal = valid.lookup(hash) { return .valid(principal) }
        return invalid.lookup(hash) != nil ? .invalid : nil
    }

    /// The generation of the valid keys (`ExpiringCache.generation`): read before a lookup's query.
    var generation: UInt64 { valid.generation }

    /// Remembers `verdict` unless `forget` ran since `generation` was read (a key revoked while its lookup was under
    /// way stays out of the cache; a verdict of invalid is dropped too, which costs at most a lookup).
    func store(_ hash: [UInt8], _ verdict: Verdict, ifStill generation: UInt64) {
        switch verdict {
        case .valid(let principal): valid.store(hash, principal, ifStill: generation)
        case .invalid where self.generation == generation: invalid.store(hash, true)
        case .invalid: break
        }
    }

    /// Forgets the valid keys of `tenant` (at most the cache's capacity to look through; rare: a settings change).
    func forget(tenant: UUID) { valid.removeAll { $0.tenantID == tenant } }
}

/// The database lookups under way of keys not in the key cache, by the key's SHA-256: requests presenting a key whose
/// lookup is under way wait for its answer instead of starting another (a fleet of apps starting at once with a key
/// the cache just dropped, or one key repeated in a flood, costs one lookup).
final class KeyLookups: Sendable {
    private enum Turn: Sendable {
        /// No lookup of the key was under way: this request does it.
        case lead
        /// The answer of the lookup this request waited for.
        case answer(Principal?)
        /// The lookup waited for was cancelled with its request: try again.
        case again
    }

    private let waiting = Mutex<[[UInt8]: [CheckedContinuation<Turn, any Error>]]>([:])

    /// The requests waiting for the lookup under way of the key `hash` (0 also when there is none).
    func waiting(for hash: [UInt8]) -> Int { waiting.withLock { $0[hash]?.count ?? 0 } }

    /// The answer of `lookup` for the key `hash`: that of the lookup under way, if there is one (its error too);
    /// otherwise `admit` is asked (it refuses by throwing) and `lookup` runs, answering every request that came
    /// meanwhile too. `lookup` remembers its answer (the key cache) before the waiting requests get it.
    func run(
        _ hash: [UInt8], admit: () throws -> Void, lookup: () async throws -> Principal?
    ) async throws -> Principal? {
        while true {
            let turn: Turn = try await withCheckedThrowingContinuation { continuation in
                let decided: Result<Turn, any Error>? = waiting.withLock { waiting in
                    if waiting[hash] != nil {
                        waiting[hash]?.append(continuation)
                        return nil
                    }
                    do { try admit() } catch { return .failure(error) }
                    waiting[hash] = []
                    return .success(.lead)
                }
                if let decided { continuation.resume(with: decided) }
            }
            switch turn {
            case .answer(let principal): return principal
            case .again: continue
            case .lead: break
            }
            let result: Result<Principal?, any Error>
            do { result = .success(try await lookup()) } catch { result = .failure(error) }
            let waiters = waiting.withLock { $0.removeValue(forKey: hash) ?? [] }
            for waiter in waiters {
                switch result {
                case .success(let principal): waiter.resume(returning: .answer(principal))
                case .failure(let error) where error is CancellationError: waiter.resume(returning: .again)
                case .failure(let error): waiter.resume(throwing: error)
                }
            }
            return try result.get()
        }
    }
}
