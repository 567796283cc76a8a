import Crypto
import Foundation
import PostgresClient

/// Whether the process's sealing keys (`MARQUEE_MASTER_KEY`, `MARQUEE_MASTER_KEYS_PREVIOUS`) open the secrets stored,
/// checked on the newest tenants' delivery secrets when `serve` and `worker` start: a mistyped or changed master key
/// would otherwise let the process run and fail every delivery of every tenant (`credential_load`, retried until its
/// attempts run out) and every credential read.
///
/// A key ID the ring does not hold is not proof of a wrong key (a process still on the old key while another, already
/// on a new one, created a tenant): only a secret that a held key fails to open, or none opening at all, is.
/// `marquee reseal --check` opens every secret.
public struct SealingKeyCheck: Sendable, Equatable {
    /// Secrets looked at, and how many opened.
    public var checked = 0
    public var opened = 0
    /// Key IDs held by the ring whose key failed to open a secret naming them.
    public var wrongKeyIDs: Set<String> = []
    /// Key IDs named by secrets that the ring does not hold.
    public var unknownKeyIDs: Set<String> = []

    /// How many of the newest tenants' secrets are tried.
    public static let sample = 20

    /// False when the ring is wrong for this database: a held key opens not what it sealed, or nothing opens.
    public var isSound: Bool { wrongKeyIDs.isEmpty && (checked == 0 || opened > 0) }

    public static func inspect(_ database: TenantDatabase, keyRing: SealingKeyRing) async throws -> SealingKeyCheck {
        let rows = try await database.systemTransaction { c in
            try c.query(
                """
                SELECT id, sealed_delivery_secret FROM tenants ORDER BY created_at DESC, id LIMIT \(Self.sample)
                """)
        }
        var check = SealingKeyCheck()
        for row in rows {
            let tenant = try row.decode(UUID.self, "id")
            let sealed = try row.decode([UInt8].self, "sealed_delivery_secret")
            check.checked += 1
            do {
                _ = try keyRing.open(sealed, associatedData: TenantStore.deliverySecretContext(tenant))
                check.opened += 1
            } catch let error as CryptoError where error.code == .unknownKeyID {
                check.unknownKeyIDs.insert(keyRing.keyID(of: sealed) ?? "(unreadable)")
            } catch let error as CryptoError where error.code == .openFailed {
                check.wrongKeyIDs.insert(keyRing.keyID(of: sealed) ?? "(unreadable)")
            }
        }
        return check
    }

    /// Key IDs and counts only: never a key or a secret.
    public var summary: String {
        var parts = ["\(opened) of the newest \(checked) tenants' delivery secrets opened"]
        if !wrongKeyIDs.isEmpty {
            parts.append(
                "the key held as ID(s) \(wrongKeyIDs.sorted().joined(separator: ", ")) is not the one that sealed "
                    + "secrets naming that ID")
        }
        if !unknownKeyIDs.isEmpty {
            parts.append("secrets name key ID(s) \(unknownKeyIDs.sorted().joined(separator: ", ")) the ring lacks")
        }
        return parts.joined(separator: "; ")
    }
}
