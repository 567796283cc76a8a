import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import Synchronization

/// API request rate limits: the one home of the rule.
///
/// Each `marquee serve` process keeps, in memory, a token bucket per tenant and kind of key (`app`, `sdk`), and checks
/// it right after the key is authenticated (`Authenticator.require`): a request takes a token, and one that finds none
/// is answered 429 `rate-limited` with `Retry-After`. A bucket refills at the tenant's rate for that kind (its own
/// setting, `PATCH /v1/settings`, read and cached with the key; else the operator's default) and holds `burstSeconds`
/// of it, so a quiet tenant may send that many seconds' worth at once. The check touches no database.
///
/// The limit is per process, not global: with N API processes a tenant may make up to N times the rate in all. A
/// global count would cost a PostgreSQL round trip (and a hot row per tenant) on every request — the load the limit
/// is there to keep off the database, and the round trip the key cache spares requests.
public struct RequestLimits: Sendable, Equatable {
    /// Requests a second per tenant and process with app keys, for tenants that set no limit of their own
    /// (`MARQUEE_RATE_LIMIT_APP`); 0: none.
    public var appPerSecond: Int
    /// The same for sdk keys (`MARQUEE_RATE_LIMIT_SDK`).
    public var sdkPerSecond: Int
    /// A bucket holds this many seconds' worth of its rate (`MARQUEE_RATE_LIMIT_BURST`).
    public var burstSeconds: Int
    /// Requests a second per tenant, process and client address with sdk keys (`MARQUEE_RATE_LIMIT_SDK_PER_ADDRESS`);
    /// 0: none. Checked before the tenant's bucket, so one client flooding with the public sdk key runs out of its
    /// own share and leaves the tenant's to everyone else. An IPv6 client's address counts by its /64 (one
    /// subscriber's network), within its /56 (`addressGroups`). Behind a proxy, only as good as
    /// `MARQUEE_TRUSTED_PROXIES`: untrusted, the proxy is the only address.
    public var sdkPerAddressPerSecond: Int
    /// Lookups a second per process and client address of keys the key cache does not hold
    /// (`MARQUEE_KEY_LOOKUPS_PER_ADDRESS`), in bursts of twice that; 0: none. Each such key costs a database
    /// transaction, and anyone can make up well-formed keys (the sdk key, so the tenant part, is public): this keeps a
    /// flood of them off the database. A lookup that finds a valid key gives its token back, so only keys that turn
    /// out unknown or revoked count (a valid key is looked up at most once per key cache period anyway).
    public var keyLookupsPerAddressPerSecond: Int

    public init(
        appPerSecond: Int, sdkPerSecond: Int, burstSeconds: Int, sdkPerAddressPerSecond: Int = 0,
        keyLookupsPerAddressPerSecond: Int = 0
    ) {
        self.appPerSecond = appPerSecond
        self.sdkPerSecond = sdkPerSecond
        self.burstSeconds = max(1, burstSeconds)
        self.sdkPerAddressPerSecond = sdkPerAddressPerSecond
        self.keyLookupsPerAddressPerSecond = keyLookupsPerAddressPerSecond
    }

    /// No limits at all.
    public static let off = RequestLimits(appPerSecond: 0, sdkPerSecond: 0, burstSeconds: 1)

    /// The buckets of one client address's requests with a key of `kind`, each with its group (`addressGroups`);
    /// none when not limited by address, or for an address that is not numeric.
    func addressLimits(_ kind: APIKeyKind, address: String?) -> [(limit: TokenBucket.Limit, group: String)] {
        guard kind == .sdk, sdkPerAddressPerSecond > 0 else { return [] }
        let rate = Double(sdkPerAddressPerSecond)
        return Self.addressGroups(address).map { group, shares in
            (TokenBucket.Limit(perSecond: rate * shares, burst: rate * shares * Double(burstSeconds)), group)
        }
    }

    /// The buckets of one client address's lookups of keys not in the key cache (none: not limited), each with its
    /// group, as `addressLimits`.
    func lookupLimits(address: String?) -> [(limit: TokenBucket.Limit, group: String)] {
        guard keyLookupsPerAddressPerSecond > 0 else { return [] }
        let rate = Double(keyLookupsPerAddressPerSecond)
        return Self.addressGroups(address).map { group, shares in
            (TokenBucket.Limit(perSecond: rate * shares, burst: rate * shares * 2), group)
        }
    }

    /// The prefix of the network an IPv6 client's /64 is counted within (`addressGroups`).
    static let ipv6NetworkPrefix = 56
    /// How many shares of one address that network has.
    static let ipv6NetworkShares = 16.0

    /// The groups a client address counts in, each with its shares of the per-address rate: an IPv4 address alone
    /// (one share); an IPv6 address's /64 (one subscriber's network: one share) and its /56 (`ipv6NetworkShares`).
    /// Whoever holds a larger block has a /64 for every request (a /48 is 65,536 of them, each a full share): the /56
    /// bounds what its /64s take together, while 256 strangers in one /56 (a carrier's pool) still have 16 full shares
    /// between them. Nothing for an address that is not numeric.
    static func addressGroups(_ address: String?) -> [(group: String, shares: Double)] {
        guard let address, let parsed = IPAddress(address) else { return [] }
        guard parsed.isIPv6 else { return [(parsed.description, 1)] }
        return [
            ("\(parsed.prefix(64))/64", 1),
            ("\(parsed.prefix(ipv6NetworkPrefix))/\(ipv6NetworkPrefix)", ipv6NetworkShares),
        ]
    }

    /// The operator's limit for keys of `kind` (nil: none). It is also the ceiling of a tenant's own setting: the
    /// limits protect the service from its tenants, so a tenant's key may lower its rate (a leaked sdk key, a server
    /// with a bug), never raise it.
    public func ceiling(_ kind: APIKeyKind) -> Int? {
        let rate = kind == .app ? appPerSecond : sdkPerSecond
        return rate > 0 ? rate : nil
    }

    /// The requests a second a key of `kind` may make on this process: the tenant's `setting` for that kind up to
    /// the operator's `ceiling`, else the ceiling; nil when not limited.
    public func perSecond(_ kind: APIKeyKind, setting: Int?) -> Int? {
        guard let setting else { return ceiling(kind) }
        return min(setting, ceiling(kind) ?? setting)
    }

    /// The bucket of a key of `kind`, as `perSecond` says.
    func limit(_ kind: APIKeyKind, setting: Int?) -> TokenBucket.Limit? {
        perSecond(kind, setting: setting).map {
            TokenBucket.Limit(perSecond: Double($0), burst: Double($0) * Double(burstSeconds))
        }
    }
}

/// A token bucket: it starts full, refills at `limit.perSecond` and holds at most `limit.burst` tokens; a request
/// takes one. Pure: the caller says what time it is.
struct TokenBucket: Sendable, Equatable {
    struct Limit: Sendable, Equatable {
        var perSecond: Double
        var burst: Double
    }

    private(set) var limit: Limit
    private(set) var tokens: Double
    private(set) var updated: ContinuousClock.Instant

    init(limit: Limit, now: ContinuousClock.Instant) {
        self.limit = limit
        self.tokens = limit.burst
        self.updated = now
    }

    /// The tokens the bucket holds at `now` (time never runs backwards here).
    func tokens(at now: ContinuousClock.Instant) -> Double {
        guard now > updated else { return tokens }
        return min(limit.burst, tokens + (now - updated).inSeconds * limit.perSecond)
    }

    /// Whether the bucket is full at `now`: it then behaves as a new one would, so it may be forgotten.
    func isFull(at now: ContinuousClock.Instant) -> Bool { tokens(at: now) >= limit.burst }

    /// Brings the bucket to `now`. A changed limit applies from now on: what the bucket holds is kept, up to the new
    /// burst.
    mutating func advance(to now: ContinuousClock.Instant, limit newLimit: Limit) {
        tokens = tokens(at: now)
        updated = max(updated, now)
        if newLimit != limit {
            limit = newLimit
            tokens = min(tokens, newLimit.burst)
        }
    }

    /// Takes `count` tokens at `now` (with `spend` false, only looks whether there are), under `newLimit` if given
    /// (as `advance` applies it). A request that counts for more than the burst takes the burst: a full bucket lets it
    /// through, and it leaves the bucket empty. Returns nil when there are; otherwise the whole seconds until there
    /// will be, at least 1: what `Retry-After` says.
    mutating func take(
        at now: ContinuousClock.Instant, limit newLimit: Limit? = nil, spend: Bool = true, count: Int = 1
    ) -> Int? {
        advance(to: now, limit: newLimit ?? limit)
        let needed = max(1, min(Double(count), limit.burst))
        if tokens >= needed {
            if spend { tokens -= needed }
            return nil
        }
        return Self.retryAfter(missing: needed - tokens, perSecond: limit.perSecond)
    }

    /// Gives back `count` tokens taken before (at most up to the burst): what they were taken for did not happen.
    mutating func giveBack(_ count: Int, at now: ContinuousClock.Instant) {
        advance(to: now, limit: limit)
        tokens = min(limit.burst, tokens + Double(count))
    }

    /// Whole seconds (rounded up, at least 1, at most a day) until `missing` tokens have come back at `perSecond`.
    static func retryAfter(missing: Double, perSecond: Double) -> Int {
        let seconds = perSecond > 0 ? missing / perSecond : .infinity
        return max(1, Int(min(seconds, 86_400).rounded(.up)))
    }
}

/// The buckets of one process, per tenant and kind of key (or per client address: `Key`), at most `capacity` of them.
///
/// Their number is bounded (client addresses are many): to make room, buckets that have filled up again are forgotten
/// first (a full bucket is what a new one would be, so nothing changes), then those closest to full (forgotten, a
/// bucket comes back full: a spent one is kept, so a flood from ever new addresses cannot refill it).
final class RequestLimiter: Sendable {
    struct Key: Hashable, Sendable {
        /// Nil (with `kind`): a client address's key lookups (`RequestLimits.lookupLimits`), of no tenant.
        var tenant: UUID?
        var kind: APIKeyKind?
        /// A client address's own bucket, or its network's, within the tenant's (`RequestLimits.addressLimits`);
        /// nil for the tenant's.
        var address: String? = nil
    }

    enum Decision: Sendable, Equatable {
        case allowed
        /// Refused: retry after so many seconds. `report` is set on a bucket's first refusal and then at most once
        /// every `reportInterval` while refusals go on: the refusals since the previous report, for one log line
        /// instead of one per request.
        case limited(retryAfter: Int, report: Int?)
    }

    private struct Entry {
        var bucket: TokenBucket
        var refused = 0
        var reported: ContinuousClock.Instant?

        /// A refusal: reported on the bucket's first, then at most once every `interval` with the count since.
        mutating func refuse(retryAfter: Int, at now: ContinuousClock.Instant, interval: Duration) -> Decision {
            refused += 1
            if let reported, now - reported < interval { return .limited(retryAfter: retryAfter, report: nil) }
            defer {
                refused = 0
                reported = now
            }
            return .limited(retryAfter: retryAfter, report: refused)
        }
    }

    let capacity: Int
    let reportInterval: Duration
    private let entries = Mutex<[Key: Entry]>([:])

    init(capacity: Int = 10_000, reportInterval: Duration = .seconds(10)) {
        self.capacity = max(1, capacity)
        self.reportInterval = reportInterval
    }

    /// Buckets held now.
    var count: Int { entries.withLock { $0.count } }

    /// Takes `count` tokens from `key`'s bucket under `limit` (with `spend` false, only looks whether there are).
    func check(
        _ key: Key, limit: TokenBucket.Limit, at now: ContinuousClock.Instant, spend: Bool = true, count: Int = 1
    ) -> Decision {
        check([(key, limit)], at: now, spend: spend, count: count).decision
    }

    /// Takes `count` tokens from each of the buckets of `keys` (nested ones: an address and its network), or from
    /// none: the first that has too few refuses (its `index`; `keys.count` when allowed), and nothing is taken.
    func check(
        _ keys: [(key: Key, limit: TokenBucket.Limit)], at now: ContinuousClock.Instant, spend: Bool = true,
        count: Int = 1
    ) -> (index: Int, decision: Decision) {
        entries.withLock { entries in
            var new = 0
            for (key, _) in keys where entries[key] == nil { new += 1 }
            if new > 0, entries.count + new > capacity {
                Self.makeRoom(&entries, capacity: capacity, needed: new, at: now)
            }
            var held = keys.map { entries[$0.key] ?? Entry(bucket: TokenBucket(limit: $0.limit, now: now)) }
            var outcome = (index: keys.count, decision: Decision.allowed)
            for i in held.indices {
                guard let retryAfter = held[i].bucket.take(at: now, limit: keys[i].limit, spend: false, count: count)
                else { continue }
                outcome = (i, held[i].refuse(retryAfter: retryAfter, at: now, interval: reportInterval))
                break
            }
            if outcome.decision == .allowed, spend {
                for i in held.indices { _ = held[i].bucket.take(at: now, limit: keys[i].limit, count: count) }
            }
            // The buckets asked (those after a refusing one were not): each is kept.
            for i in held.indices where i <= outcome.index { entries[keys[i].key] = held[i] }
            return outcome
        }
    }

    /// Gives `count` tokens back to `key`'s bucket (`TokenBucket.giveBack`), if it is still held.
    func giveBack(_ key: Key, count: Int = 1, at now: ContinuousClock.Instant) {
        entries.withLock { entries in entries[key]?.bucket.giveBack(count, at: now) }
    }

    /// Forgets the buckets that filled up again; if that is not room enough for `needed` more, the tenth (at least
    /// `needed`) that miss the fewest tokens, at once: forgotten, a bucket comes back full, so those lose least, and
    /// the spent ones stay. A stream of new keys (client addresses, one after another) then pays for one pass and one
    /// sort per tenth of the capacity, not for a pass over every bucket at each new key.
    private static func makeRoom(
        _ entries: inout [Key: Entry], capacity: Int, needed: Int, at now: ContinuousClock.Instant
    ) {
        entries = entries.filter { !$0.value.bucket.isFull(at: now) }
        guard entries.count + needed > capacity else { return }
        func missing(_ entry: Entry) -> Double { entry.bucket.limit.burst - entry.bucket.tokens(at: now) }
        let fullest = entries.sorted { missing($0.value) < missing($1.value) }
        for (key, _) in fullest.prefix(max(needed, capacity / 10)) { entries[key] = nil }
    }
}

/// Applies `RequestLimits` to authenticated requests: the buckets, the metrics and the log lines.
struct RequestRateGuard: Sendable {
    let limits: RequestLimits
    let limiter: RequestLimiter
    /// The client addresses' buckets, apart from the tenants': a flood from many addresses cannot push a tenant's
    /// spent bucket out (which would refill it).
    let addressLimiter: RequestLimiter
    /// The client addresses' buckets of key lookups (`RequestLimits.lookupLimits`), apart again.
    let lookupLimiter: RequestLimiter
    /// `marquee_http_rate_limited_total{kind}`.
    let refused: Counter
    /// `marquee_http_rate_limited_addresses_total`.
    let refusedAddresses: Counter
    /// `marquee_http_key_lookups_limited_total`.
    let refusedLookups: Counter
    let logger: Logger
    let now: @Sendable () -> ContinuousClock.Instant

    init(
        limits: RequestLimits, limiter: RequestLimiter = RequestLimiter(),
        addressLimiter: RequestLimiter = RequestLimiter(capacity: 50_000),
        lookupLimiter: RequestLimiter = RequestLimiter(capacity: 50_000), metrics: MetricsRegistry, logger: Logger,
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.limits = limits
        self.limiter = limiter
        self.addressLimiter = addressLimiter
        self.lookupLimiter = lookupLimiter
        self.refused = metrics.counter(
            "marquee_http_rate_limited_total",
            help: "Requests answered 429 rate-limited: the tenant's requests with keys of this kind went over its "
                + "rate on this process.", labels: ["kind"])
        for kind in APIKeyKind.allCases { refused.inc(0, [kind.rawValue]) }
        self.refusedAddresses = metrics.counter(
            "marquee_http_rate_limited_addresses_total",
            help: "Requests answered 429 rate-limited: one client address's requests with a tenant's sdk keys went "
                + "over MARQUEE_RATE_LIMIT_SDK_PER_ADDRESS on this process.")
        refusedAddresses.inc(0)
        self.refusedLookups = metrics.counter(
            "marquee_http_key_lookups_limited_total",
            help: "Requests answered 429 rate-limited: one client address presented more keys the key cache did not "
                + "hold than MARQUEE_KEY_LOOKUPS_PER_ADDRESS lets this process look up.")
        refusedLookups.inc(0)
        self.logger = logger
        self.now = now
    }

    /// Throws 429 `rate-limited` when the bucket of `principal`'s client address (sdk keys, when limited by address)
    /// or of its tenant is empty; otherwise takes a token from each (with `spend` false, only looks: a body
    /// admission, whose request takes its tokens when its handler runs). The address's bucket is asked first: a
    /// client over its own share spends nothing of the tenant's. A request that carries `count` writes (a batch of
    /// events) takes `count` tokens from each, so that batching does not multiply the rate.
    func check(_ principal: Principal, _ request: HTTPRequest, spend: Bool = true, count: Int = 1) throws {
        let now = now()
        let groups = limits.addressLimits(principal.kind, address: request.remoteAddress)
        if !groups.isEmpty {
            let keys = groups.map {
                (RequestLimiter.Key(tenant: principal.tenantID, kind: principal.kind, address: $0.group), $0.limit)
            }
            let (index, decision) = addressLimiter.check(keys, at: now, spend: spend, count: count)
            if case .limited(let retryAfter, let report) = decision {
                let (limit, group) = groups[index]
                refusedAddresses.inc(1)
                if let report { log(principal, request, limit: limit, refused: report, address: group) }
                throw Problems.rateLimited(kind: principal.kind, limit: limit, retryAfter: retryAfter, perAddress: true)
            }
        }
        guard let limit = limits.limit(principal.kind, setting: principal.requestsPerSecond) else { return }
        let key = RequestLimiter.Key(tenant: principal.tenantID, kind: principal.kind)
        guard
            case .limited(let retryAfter, let report) = limiter.check(
                key, limit: limit, at: now, spend: spend, count: count)
        else { return }
        refused.inc(1, [principal.kind.rawValue])
        if let report { log(principal, request, limit: limit, refused: report, address: nil) }
        throw Problems.rateLimited(kind: principal.kind, limit: limit, retryAfter: retryAfter, perAddress: false)
    }

    /// Throws 429 `rate-limited` (`scope: key_lookup`) when the client address of `request` has no token left for a
    /// lookup of a key not in the key cache; otherwise takes one. Checked before the database is asked
    /// (`Authenticator.principal`), which gives the token back when the key turns out valid (`keyFound`).
    func admitLookup(_ request: HTTPRequest) throws {
        let groups = limits.lookupLimits(address: request.remoteAddress)
        guard !groups.isEmpty else { return }
        let (index, decision) = lookupLimiter.check(
            groups.map { (RequestLimiter.Key(tenant: nil, kind: nil, address: $0.group), $0.limit) }, at: now())
        guard case .limited(let retryAfter, let report) = decision else { return }
        let (limit, group) = groups[index]
        refusedLookups.inc(1)
        if let report {
            logger.warning(
                "key lookups rate limited for a client address",
                metadata: [
                    "rate_limit.client_address": .string(group), "rate_limit.per_second": .int(Int(limit.perSecond)),
                    "rate_limit.burst": .int(Int(limit.burst)), "rate_limit.refused": .int(report),
                    "request.id": .string(request.requestID), "http.route": .string(request.route ?? "unmatched"),
                ])
        }
        throw Problems.keyLookupsLimited(limit: limit, retryAfter: retryAfter)
    }

    /// The lookup `admitLookup` let through found a valid key: its token goes back, so that only keys that turn out
    /// unknown or revoked spend the address's lookups.
    func keyFound(_ request: HTTPRequest) {
        let now = now()
        for (_, group) in limits.lookupLimits(address: request.remoteAddress) {
            lookupLimiter.giveBack(RequestLimiter.Key(tenant: nil, kind: nil, address: group), at: now)
        }
    }

    /// A bucket's refusals since its previous line (never the key itself: its ID names it).
    private func log(
        _ principal: Principal, _ request: HTTPRequest, limit: TokenBucket.Limit, refused: Int, address: String?
    ) {
        var metadata: LogMetadata = [
            "tenant.id": .string(principal.tenantID.uuidString.lowercased()),
            "api_key.kind": .string(principal.kind.rawValue),
            "api_key.id": .string(principal.keyID.uuidString.lowercased()),
            "rate_limit.per_second": .int(Int(limit.perSecond)), "rate_limit.burst": .int(Int(limit.burst)),
            "rate_limit.refused": .int(refused), "request.id": .string(request.requestID),
            "http.route": .string(request.route ?? "unmatched"),
        ]
        if let address { metadata["rate_limit.client_address"] = .string(address) }
        logger.warning(
            address == nil ? "request rate limited" : "request rate limited for a client address", metadata: metadata)
    }
}

extension Problems {
    /// 429: the tenant's requests with keys of this kind (`perAddress`: from this client address) went over their
    /// rate on this process.
    static func rateLimited(kind: APIKeyKind, limit: TokenBucket.Limit, retryAfter: Int, perAddress: Bool)
        -> HTTPProblem
    {
        let perSecond = Int(limit.perSecond)
        let burst = Int(limit.burst)
        let what =
            perAddress
            ? "Requests from this client address with this workspace's \(kind.rawValue) key are over their rate"
            : "This workspace's \(kind.rawValue) key is over its request rate"
        return HTTPProblem(
            status: 429, type: typeBase + "rate-limited", title: "Too Many Requests",
            detail: "\(what) on this server (\(perSecond) a second, bursts of \(burst)). Retry after \(retryAfter) s.",
            extensions: [
                "key_kind": kind.rawValue, "limit_per_second": String(perSecond), "burst": String(burst),
                "retry_after": String(retryAfter), "scope": perAddress ? "client_address" : "workspace",
            ],
            headers: ["Retry-After": String(retryAfter)])
    }

    /// 429: this client address presented more keys that this process had not checked lately (each a database
    /// lookup) than `MARQUEE_KEY_LOOKUPS_PER_ADDRESS` lets through.
    static func keyLookupsLimited(limit: TokenBucket.Limit, retryAfter: Int) -> HTTPProblem {
        let perSecond = Int(limit.perSecond)
        let burst = Int(limit.burst)
        return HTTPProblem(
            status: 429, type: typeBase + "rate-limited", title: "Too Many Requests",
            detail: "This client address presented too many API keys that are not valid or not checked lately on "
                + "this server (\(perSecond) a second, bursts of \(burst)). Retry after \(retryAfter) s.",
            extensions: [
                "limit_per_second": String(perSecond), "burst": String(burst), "retry_after": String(retryAfter),
                "scope": "key_lookup",
            ],
            headers: ["Retry-After": String(retryAfter)])
    }
}
