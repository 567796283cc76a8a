import COpenSSL
import Foundation
import Synchronization

/// Cryptographically secure random bytes from OpenSSL's DRBG (`RAND_bytes`).
public enum SecureRandom {
    /// Returns `count` random bytes. Traps if the system's random source fails, which is not recoverable.
    public static func bytes(_ count: Int) -> [UInt8] {
        precondition(count >= 0, "SecureRandom.bytes: negative count")
        guard count > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: count)
        let ok = out.withUnsafeMutableBufferPointer { RAND_bytes($0.baseAddress, Int32(count)) }
        precondition(ok == 1, "RAND_bytes failed; the system random source is unavailable")
        return out
    }

    /// A random (version 4, RFC 9562) UUID from OpenSSL's DRBG. Use it instead of Foundation's `UUID()` on hot
    /// paths: on Linux that opens, reads and closes `/dev/urandom` on every call (measured at 7% of the APNs
    /// simulator's CPU for two UUIDs per request).
    ///
    /// The bytes come from a 4 KiB pool refilled with one `RAND_bytes` call: each call also makes a `getpid` system
    /// call (OpenSSL's fork check), 2.4% of the APNs simulator's CPU when made per UUID. The pool is not fork-safe
    /// (a forked child would repeat its parent's next UUIDs); Marquee starts processes with `posix_spawn` only.
    public static func uuid() -> UUID {
        var id = uuidPool.withLock { pool in pool.next() }
        id.6 = (id.6 & 0x0F) | 0x40
        id.8 = (id.8 & 0x3F) | 0x80
        return UUID(uuid: id)
    }

    private static let uuidPool = Mutex(UUIDPool())

    private struct UUIDPool: ~Copyable {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16)
        var used = 4096

        mutating func next() -> uuid_t {
            if used == bytes.count {
                let ok = RAND_bytes(bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(bytes.count))
                precondition(ok == 1, "RAND_bytes failed; the system random source is unavailable")
                used = 0
            }
            var id: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            withUnsafeMutableBytes(of: &id) {
                $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[used..<used + 16]))
            }
            // The bytes handed out are not kept.
            bytes[used..<used + 16].initializeMemory(as: UInt8.self, repeating: 0)
            used += 16
            return id
        }

        deinit { bytes.deallocate() }
    }

    /// Returns `byteCount` random bytes as base64url without padding (32 bytes → 43 characters).
    public static func token(byteCount: Int = 32) -> String {
        Base64URL.encode(bytes(byteCount))
    }
}

/// Comparisons whose running time does not depend on where inputs differ.
public enum ConstantTime {
    /// True when `a` and `b` hold the same bytes, compared with `CRYPTO_memcmp`. Differing lengths are unequal
    /// (the length itself is not secret).
    public static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        guard !a.isEmpty else { return true }
        return a.withUnsafeBytes { left in
            b.withUnsafeBytes { right in
                CRYPTO_memcmp(left.baseAddress, right.baseAddress, a.count) == 0
            }
        }
    }
}
