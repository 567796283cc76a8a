import COpenSSL
import Foundation

/// AES-256-GCM sealing of secrets at rest, with key IDs so keys can rotate.
///
/// Sealed format, version 1:
///
/// ```
/// 0x01 | keyID length (1 byte, 1...255) | keyID (UTF-8) | nonce (12 random bytes) | ciphertext | tag (16 bytes)
/// ```
///
/// The ciphertext is as long as the plaintext. GCM authenticates the header (version, key ID length, key ID) and
/// then the caller's associated data, so neither the key ID nor the context (e.g. `tenant:<id>:apns`) can be changed
/// without `open` failing. Nonces are random; NIST SP 800-38D allows 2^32 random-nonce seals per key, far beyond what
/// a secret store needs, but rotate keys if a key seals hot data at high volume.
public struct SealingKeyRing: Sendable {
    /// The format version byte written by `seal`.
    public static let formatVersion: UInt8 = 1
    /// The key length AES-256 requires.
    public static let keyByteCount = 32
    static let nonceByteCount = 12
    static let tagByteCount = 16

    private struct Key: Sendable {
        var id: String
        var idBytes: [UInt8]
        var material: [UInt8]
    }

    private let current: Key
    private let keys: [String: Key]

    /// The ID of the key new seals use.
    public var currentKeyID: String { current.id }

    /// Creates a ring that seals with `current` and opens blobs sealed under `current` or any of `previous`.
    /// Keys must be 32 bytes; IDs must be 1–255 bytes of UTF-8 and distinct.
    public init(current: (id: String, key: [UInt8]), previous: [(id: String, key: [UInt8])] = []) throws {
        let currentKey = try SealingKeyRing.validated(current)
        var keys = [currentKey.id: currentKey]
        for entry in previous {
            let key = try SealingKeyRing.validated(entry)
            guard keys[key.id] == nil else {
                throw CryptoError(.invalidKey, "sealing key IDs must be distinct")
            }
            keys[key.id] = key
        }
        self.current = currentKey
        self.keys = keys
    }

    /// Builds a single-key ring from a base64 (standard or base64url) 32-byte master key (`masterKey(base64:)`).
    public static func fromBase64(_ masterKey: String, id: String = "k1") throws -> SealingKeyRing {
        guard let key = Self.masterKey(base64: masterKey) else {
            throw CryptoError(.invalidKey, "expected a base64-encoded 32-byte master key")
        }
        return try SealingKeyRing(current: (id: id, key: key))
    }

    /// The 32 bytes of a master key written in base64, standard or base64url (padded or not), with whitespace and
    /// newlines around it ignored (a key read from a file, such as a Kubernetes Secret made from one, ends in a
    /// newline); nil for anything else. The one reader of `MARQUEE_MASTER_KEY` and `MARQUEE_MASTER_KEYS_PREVIOUS`.
    public static func masterKey(base64 text: some StringProtocol) -> [UInt8]? {
        let trimmed = String(text).trimmingCharacters(in: .whitespacesAndNewlines)
        let decoded =
            Data(base64Encoded: trimmed).map { [UInt8]($0) }
            ?? Base64URL.decode(trimmed.hasSuffix("=") ? String(trimmed.prefix { $0 != "=" }) : trimmed)
        guard let decoded, decoded.count == keyByteCount else { return nil }
        return decoded
    }

    private static func validated(_ entry: (id: String, key: [UInt8])) throws -> Key {
        guard entry.key.count == keyByteCount else {
            throw CryptoError(
                .invalidKey, "expected a 32-byte AES-256 sealing key", details: "got \(entry.key.count) bytes")
        }
        let idBytes = Array(entry.id.utf8)
        guard (1...255).contains(idBytes.count) else {
            throw CryptoError(.invalidKey, "a sealing key ID must be 1 to 255 bytes of UTF-8")
        }
        return Key(id: entry.id, idBytes: idBytes, material: entry.key)
    }

    /// Encrypts `plaintext` under the current key, binding `associatedData` (which must be given again to `open`).
    public func seal(_ plaintext: [UInt8], associatedData: [UInt8] = []) throws -> [UInt8] {
        guard plaintext.count < Int(Int32.max) - 64, associatedData.count < Int(Int32.max) - 512 else {
            throw CryptoError(.sealFailed, "input too large to seal")
        }
        let header = [SealingKeyRing.formatVersion, UInt8(current.idBytes.count)] + current.idBytes
        let nonce = SecureRandom.bytes(SealingKeyRing.nonceByteCount)
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + 16)
        var tag = [UInt8](repeating: 0, count: SealingKeyRing.tagByteCount)

        guard let ctx = EVP_CIPHER_CTX_new() else { throw CryptoError.openSSL(.sealFailed, "cipher setup failed") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        guard EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nil, nil, nil) == 1,
            EVP_CIPHER_CTX_ctrl(ctx, copenssl_EVP_CTRL_GCM_SET_IVLEN(), Int32(nonce.count), nil) == 1,
            EVP_EncryptInit_ex(ctx, nil, nil, current.material, nonce) == 1
        else { throw CryptoError.openSSL(.sealFailed, "cipher setup failed") }

        var length: Int32 = 0
        for aad in [header, associatedData] where !aad.isEmpty {
            guard EVP_EncryptUpdate(ctx, nil, &length, aad, Int32(aad.count)) == 1 else {
                throw CryptoError.openSSL(.sealFailed, "encryption failed")
            }
        }
        var written = 0
        if !plaintext.isEmpty {
            let ok = ciphertext.withUnsafeMutableBufferPointer { out in
                EVP_EncryptUpdate(ctx, out.baseAddress, &length, plaintext, Int32(plaintext.count))
            }
            guard ok == 1 else { throw CryptoError.openSSL(.sealFailed, "encryption failed") }
            written = Int(length)
        }
        let finalOK = ciphertext.withUnsafeMutableBufferPointer { out in
            EVP_EncryptFinal_ex(ctx, out.baseAddress! + written, &length)
        }
        guard finalOK == 1 else { throw CryptoError.openSSL(.sealFailed, "encryption failed") }
        written += Int(length)
        let tagOK = tag.withUnsafeMutableBytes { out in
            EVP_CIPHER_CTX_ctrl(ctx, copenssl_EVP_CTRL_GCM_GET_TAG(), Int32(out.count), out.baseAddress)
        }
        guard tagOK == 1, written == plaintext.count else {
            throw CryptoError.openSSL(.sealFailed, "encryption failed")
        }
        return header + nonce + ciphertext[..<written] + tag
    }

    /// Decrypts a blob from `seal`, choosing the key by the blob's key ID. Throws `.unknownKeyID` when the ring
    /// lacks that key, and `.openFailed` when the blob is malformed, altered, or the associated data differs.
    public func open(_ sealed: [UInt8], associatedData: [UInt8] = []) throws -> [UInt8] {
        guard let parsed = SealingKeyRing.parse(sealed) else {
            throw CryptoError(.openFailed, "sealed data is malformed or has an unsupported version")
        }
        guard let keyID = String(validating: parsed.keyID, as: UTF8.self), let key = keys[keyID] else {
            throw CryptoError(.unknownKeyID, "sealed data names a key ID this key ring does not hold")
        }
        let header = Array(sealed[..<parsed.headerEnd])
        let nonce = Array(sealed[parsed.headerEnd..<parsed.headerEnd + SealingKeyRing.nonceByteCount])
        let ciphertext = Array(sealed[(parsed.headerEnd + SealingKeyRing.nonceByteCount)..<parsed.tagStart])
        var tag = Array(sealed[parsed.tagStart...])
        let failure = CryptoError(
            .openFailed, "authentication failed: the sealed data was altered, or the key or associated data is wrong")

        guard associatedData.count < Int(Int32.max) - 512 else { throw failure }
        guard let ctx = EVP_CIPHER_CTX_new() else { throw CryptoError.openSSL(.openFailed, "cipher setup failed") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        guard EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nil, nil, nil) == 1,
            EVP_CIPHER_CTX_ctrl(ctx, copenssl_EVP_CTRL_GCM_SET_IVLEN(), Int32(nonce.count), nil) == 1,
            EVP_DecryptInit_ex(ctx, nil, nil, key.material, nonce) == 1
        else { throw CryptoError.openSSL(.openFailed, "cipher setup failed") }

        var length: Int32 = 0
        for aad in [header, associatedData] where !aad.isEmpty {
            guard EVP_DecryptUpdate(ctx, nil, &length, aad, Int32(aad.count)) == 1 else {
                _ = drainOpenSSLErrors()
                throw failure
            }
        }
        var plaintext = [UInt8](repeating: 0, count: ciphertext.count + 16)
        var written = 0
        if !ciphertext.isEmpty {
            let ok = plaintext.withUnsafeMutableBufferPointer { out in
                EVP_DecryptUpdate(ctx, out.baseAddress, &length, ciphertext, Int32(ciphertext.count))
            }
            guard ok == 1 else {
                _ = drainOpenSSLErrors()
                throw failure
            }
            written = Int(length)
        }
        let tagOK = tag.withUnsafeMutableBytes { buffer in
            EVP_CIPHER_CTX_ctrl(ctx, copenssl_EVP_CTRL_GCM_SET_TAG(), Int32(buffer.count), buffer.baseAddress)
        }
        let finalOK = plaintext.withUnsafeMutableBufferPointer { out in
            EVP_DecryptFinal_ex(ctx, out.baseAddress! + written, &length)
        }
        guard tagOK == 1, finalOK == 1 else {
            _ = drainOpenSSLErrors()
            throw failure
        }
        written += Int(length)
        return Array(plaintext[..<written])
    }

    /// The key ID a sealed blob names, or nil if it is not a version-1 sealed blob. Use it to find blobs that
    /// still need re-sealing under `currentKeyID`.
    public func keyID(of sealed: [UInt8]) -> String? {
        guard let parsed = SealingKeyRing.parse(sealed) else { return nil }
        return String(validating: parsed.keyID, as: UTF8.self)
    }

    /// True when `sealed` was sealed under a key other than the current one.
    public func needsReseal(_ sealed: [UInt8]) -> Bool {
        keyID(of: sealed) != current.id
    }

    private struct Parsed {
        var keyID: ArraySlice<UInt8>
        var headerEnd: Int
        var tagStart: Int
    }

    private static func parse(_ sealed: [UInt8]) -> Parsed? {
        guard sealed.count >= 2, sealed[0] == formatVersion else { return nil }
        let idLength = Int(sealed[1])
        guard idLength > 0 else { return nil }
        let headerEnd = 2 + idLength
        guard sealed.count >= headerEnd + nonceByteCount + tagByteCount else { return nil }
        return Parsed(
            keyID: sealed[2..<headerEnd], headerEnd: headerEnd, tagStart: sealed.count - tagByteCount)
    }
}

extension SealingKeyRing: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// Names the key IDs only; key material never appears in logs, `print` or `dump`.
    public var description: String {
        let others = keys.keys.filter { $0 != current.id }.sorted()
        return "SealingKeyRing(current: \(current.id), previous: \(others))"
    }

    /// Same as `description`.
    public var debugDescription: String { description }

    /// A mirror without key material, so `dump` and reflection cannot leak keys.
    public var customMirror: Mirror {
        Mirror(self, children: ["currentKeyID": current.id], displayStyle: .struct)
    }
}
