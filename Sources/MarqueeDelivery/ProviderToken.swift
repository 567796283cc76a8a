import Crypto
import Foundation
import Synchronization

/// The APNs provider token (an ES256 JWT with `iss` = team ID, `iat`, header `kid`) for one key, cached.
///
/// Apple rejects tokens older than an hour and throttles refreshes more often than every 20 minutes
/// (`TooManyProviderTokenUpdates`), so a token is reused until it is `refreshAfter` old (default 40 minutes), and an
/// explicit refresh (after `ExpiredProviderToken`) is honoured only once the current token is `minimumAge` old —
/// except for one forced refresh when the current token is rejected outright.
public final class ProviderTokenCache: Sendable {
    private struct Cached {
        var token: String
        var issuedAt: Date
    }

    public let teamID: String
    public let keyID: String
    /// What a connection authenticates as (`team/key`): APNs takes one team's tokens per connection, and a second key
    /// on it counts as a token update, so each gets connections of its own (`ProviderConnections`). Made once: every
    /// send names it.
    public let connectionIdentity: String
    private let key: ES256PrivateKey
    private let refreshAfter: TimeInterval
    private let now: @Sendable () -> Date
    private let cached = Mutex<Cached?>(nil)

    public init(
        teamID: String, keyID: String, key: ES256PrivateKey, refreshAfter: Duration = .seconds(40 * 60),
        now: @escaping @Sendable () -> Date = Date.init
    ) {
        self.teamID = teamID
        self.keyID = keyID
        self.connectionIdentity = teamID + "/" + keyID
        self.key = key
        self.refreshAfter = Double(refreshAfter.components.seconds)
        self.now = now
    }

    /// The current token, signing a new one when there is none or it is due.
    public func token() throws -> String {
        let now = self.now()
        if let current = cached.withLock({ $0 }), now.timeIntervalSince(current.issuedAt) < refreshAfter {
            return current.token
        }
        return try issue(replacing: cached.withLock { $0?.token }, at: now)
    }

    /// Replaces `rejected` with a new token (once: if another sender already replaced it, that one is returned).
    public func refresh(rejected: String) throws -> String {
        if let current = cached.withLock({ $0 }), current.token != rejected { return current.token }
        return try issue(replacing: rejected, at: now())
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
/// `TooManyProviderTokenUpdates`), and a credential read again does not parse its key again.
public final class ProviderTokenCaches: Sendable {
    private let caches = Mutex<[String: ProviderTokenCache]>([:])
    /// Keys kept at most; past it the registry starts over (a cache holds a key and one token).
    static let maxKeys = 10_000

    public init() {}

    /// The cache of `teamID`, `keyID` and the private key `pem` (PKCS#8 PEM), made on first use. Throws when the PEM
    /// is not an EC P-256 private key.
    public func cache(teamID: String, keyID: String, pem: [UInt8]) throws -> ProviderTokenCache {
        // The key's own bytes are in the name: the same team and key ID with another (wrong) key is another cache.
        let name = teamID + "/" + keyID + "/" + SHA256.hexDigest(pem)
        if let found = caches.withLock({ $0[name] }) { return found }
        let key = try ES256PrivateKey(pem: String(decoding: pem, as: UTF8.self))
        return caches.withLock { caches in
            if let found = caches[name] { return found }
            if caches.count >= Self.maxKeys { caches.removeAll() }
            let made = ProviderTokenCache(teamID: teamID, keyID: keyID, key: key)
            caches[name] = made
            return made
        }
    }
}
