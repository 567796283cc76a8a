import Crypto
import Foundation
import Synchronization

/// The APNs provider token (an ES256 JWT with `iss` = team ID, `iat`, header `kid`) for one key, cached.
///
/// Apple rejects tokens older than an hour and throttles refreshes more often than every 20 minutes
/// (`TooManyProviderTokenUpdates`), so a token is reused until it is `refreshAfter` old (default 40 minutes).
///
/// A token Apple calls expired (`ExpiredProviderToken`) is replaced once (`refresh(rejected:)`), but only when it is at
/// least `minimumAge` old (default 20 minutes) or dated ahead of this host's clock. A younger one was signed with this
/// host's clock a moment ago: Apple calls it expired only when the clocks disagree, so a new one would be refused too,
/// and every replacement would count as a token update on the key's connections, for every tenant of the key. It is
/// replaced once it is old enough (by then Apple may accept the new one); the deliveries wait and retry.
public final class ProviderTokenCache: Sendable {
    private struct Cached {
        var token: String
        var issuedAt: Date
    }

    public let teamID: String
    public let keyID: String
    /// What a connection authenticates as (`team/key/fingerprint`, the fingerprint of the public key): APNs takes one
    /// team's tokens per connection, and a second key on it counts as a token update, so each gets connections of its
    /// own (`ProviderConnections`). The fingerprint keeps a second private key filed under the same team and key ID
    /// (a mistake, or another tenant's upload) off this key's connections: its tokens would be updates there too, and
    /// Apple's TooManyProviderTokenUpdates would hit every tenant of the key. Made once: every send names it.
    public let connectionIdentity: String
    private let key: ES256PrivateKey
    private let refreshAfter: TimeInterval
    private let minimumAge: TimeInterval
    private let now: @Sendable () -> Date
    private let cached = Mutex<Cached?>(nil)

    public init(
        teamID: String, keyID: String, key: ES256PrivateKey, refreshAfter: Duration = .seconds(40 * 60),
        minimumAge: Duration = .seconds(20 * 60), now: @escaping @Sendable () -> Date = Date.init
    ) {
        self.teamID = teamID
        self.keyID = keyID
        self.connectionIdentity = Self.identity(teamID: teamID, keyID: keyID, key: key)
        self.key = key
        self.refreshAfter = Double(refreshAfter.components.seconds)
        self.minimumAge = Double(minimumAge.components.seconds)
        self.now = now
    }

    /// `team/key/fingerprint`: the name of a key's connections and of its cache in `ProviderTokenCaches`.
    static func identity(teamID: String, keyID: String, key: ES256PrivateKey) -> String {
        teamID + "/" + keyID + "/" + key.publicKey.fingerprint
    }

    /// The current token, signing a new one when there is none or it is due.
    public func token() throws -> String {
        // The clock after the cache: a token another sender has just installed is never dated after `now`.
        let current = cached.withLock { $0 }
        let now = self.now()
        if let current, now.timeIntervalSince(current.issuedAt) < refreshAfter {
            return current.token
        }
        // The token just judged due is the one to replace. Read again, the cache may already hold a concurrent
        // sender's new token, and replacing that would rotate twice at the boundary.
        return try issue(replacing: current?.token, at: now)
    }

    /// A replacement for `rejected`, a token Apple refused as expired: once (if another sender has replaced it already,
    /// that replacement). Nil while `rejected` is the current token and younger than `minimumAge`: see the type's
    /// comment; the caller retries later, when this gives a new token.
    public func refresh(rejected: String) throws -> String? {
        let current = cached.withLock { $0 }
        let now = self.now()
        if let current {
            guard current.token == rejected else { return current.token }
            let age = now.timeIntervalSince(current.issuedAt)
            // Negative: dated ahead of this clock (it was stepped back since), which Apple may rightly refuse.
            if age >= 0 && age < minimumAge { return nil }
        }
        return try issue(replacing: rejected, at: now)
    }

    /// When the cached token was signed (nil before the first send).
    public var issuedAt: Date? { cached.withLock { $0?.issuedAt } }

    /// Signs a token to replace `seen` (the token the caller found, nil when there was none). Signing happens outside
    /// the lock, so two senders may sign at once; only the first to install wins, and the other returns the winner's
    /// token, so a rejected token is replaced exactly once.
    private func issue(replacing seen: String?, at now: Date) throws -> String {
        let iat = Int64(now.timeIntervalSince1970)
        let token = try JWT.sign(
            claims: ["iss": .string(teamID), "iat": .int(iat)], header: ["kid": keyID], signer: key)
        return cached.withLock { current in
            if let current, current.token != seen { return current.token }
            current = Cached(token: token, issuedAt: Date(timeIntervalSince1970: Double(iat)))
            return token
        }
    }
}

/// The provider-token caches of a process, one per APNs key: tenants that upload the same key (a company's staging
/// and production tenants) send one token, as Apple asks (several tokens for one team at once are refused as
/// `TooManyProviderTokenUpdates`).
///
/// A key is its team, key ID and public key (`ProviderTokenCache.connectionIdentity`), never its PEM text: the same
/// key uploaded with CRLF line ends or as SEC1 rather than PKCS#8 is the same key, and must not sign tokens of its own
/// on the same connections.
///
/// While anything (a worker's credential cache) holds a key's cache, this registry hands out that one: it keeps every
/// cache it made weakly, so no eviction can make a second live cache for a key in use. It also holds the `maxKeys` most
/// recently asked-for caches strongly, so a key nobody holds for a moment keeps its token.
public final class ProviderTokenCaches: Sendable {
    private struct Held {
        weak var cache: ProviderTokenCache?
    }

    private struct State {
        /// Every cache made and still alive, by identity. Entries of freed caches are swept as the table grows.
        var live: [String: Held] = [:]
        /// The table size at which `live` is swept next.
        var sweepAt: Int
        /// The most recently asked-for caches with the tick of their last use.
        var recent: [String: (cache: ProviderTokenCache, used: UInt64)] = [:]
        var tick: UInt64 = 0
    }

    private let state: Mutex<State>
    /// Caches held strongly at most; past it the least recently used quarter is let go (still found while in use).
    let maxKeys: Int

    /// A registry that holds up to `maxKeys` unused caches (default 10,000; a cache is a key and one token).
    public init(maxKeys: Int = 10_000) {
        self.maxKeys = max(1, maxKeys)
        state = Mutex(State(sweepAt: self.maxKeys))
    }

    /// The cache of `teamID`, `keyID` and the private key `pem` (PEM), made on first use. Throws when the PEM is not an
    /// EC P-256 private key. Parses the key on every call: callers ask once per credential they load, not per push.
    public func cache(teamID: String, keyID: String, pem: [UInt8]) throws -> ProviderTokenCache {
        let key = try ES256PrivateKey(pem: String(decoding: pem, as: UTF8.self))
        let identity = ProviderTokenCache.identity(teamID: teamID, keyID: keyID, key: key)
        return state.withLock { state in
            state.tick += 1
            let cache: ProviderTokenCache
            if let found = state.live[identity]?.cache {
                cache = found
            } else {
                cache = ProviderTokenCache(teamID: teamID, keyID: keyID, key: key)
                state.live[identity] = Held(cache: cache)
            }
            state.recent[identity] = (cache, state.tick)
            if state.recent.count > maxKeys {
                // A quarter at a time (at least one), so that the sort is paid once per `maxKeys / 4` new keys.
                let oldest = state.recent.sorted { $0.value.used < $1.value.used }.prefix(max(1, maxKeys / 4))
                for (name, _) in oldest { state.recent.removeValue(forKey: name) }
            }
            if state.live.count >= state.sweepAt {
                state.live = state.live.filter { $0.value.cache != nil }
                state.sweepAt = max(maxKeys, state.live.count * 2)
            }
            return cache
        }
    }

    /// Caches alive (held here or elsewhere), for tests.
    var liveCount: Int { state.withLock { $0.live.values.filter { $0.cache != nil }.count } }
}
