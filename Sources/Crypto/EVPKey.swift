import COpenSSL

/// Owns one OpenSSL `EVP_PKEY` and frees it on deinit.
///
/// `@unchecked Sendable` is safe here without a lock because the key is never mutated after `init`: every method
/// only reads it, and each sign/verify/export call creates its own `EVP_MD_CTX`/`BIO`. OpenSSL 3 documents that an
/// `EVP_PKEY` may be used concurrently from several threads as long as nobody modifies it (openssl-threads(7));
/// its internal provider-key cache takes its own lock.
final class EVPKey: @unchecked Sendable {
    let pointer: OpaquePointer

    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit {
        EVP_PKEY_free(pointer)
    }

    // MARK: Parsing

    /// Reads the first private key in `pem` (PKCS#8, SEC1 or PKCS#1). Encrypted keys are refused, never prompted.
    static func privateKey(pem: String) -> EVPKey? {
        let key = withMemoryBIO(pem) { bio in
            PEM_read_bio_PrivateKey(bio, nil, refusePassphrase, nil)
        }
        guard let key else { return nil }
        // Decoders may leave entries from formats they tried first; a success must not leave the queue dirty.
        ERR_clear_error()
        return EVPKey(taking: key)
    }

    /// Reads a `BEGIN PUBLIC KEY` (SubjectPublicKeyInfo) PEM, or the public key of a `BEGIN CERTIFICATE` PEM.
    static func publicKey(pem: String) -> EVPKey? {
        if let key = withMemoryBIO(pem, { PEM_read_bio_PUBKEY($0, nil, refusePassphrase, nil) }) {
            ERR_clear_error()
            return EVPKey(taking: key)
        }
        _ = drainOpenSSLErrors()
        let fromCertificate = withMemoryBIO(pem) { bio -> OpaquePointer? in
            guard let certificate = PEM_read_bio_X509(bio, nil, refusePassphrase, nil) else { return nil }
            defer { X509_free(certificate) }
            return X509_get_pubkey(certificate)
        }
        guard let fromCertificate else { return nil }
        ERR_clear_error()
        return EVPKey(taking: fromCertificate)
    }

    /// Generates a key with `EVP_PKEY_CTX_new_from_name`; `configure` sets parameters after `keygen_init`.
    static func generate(algorithm: String, configure: (OpaquePointer) -> Int32) -> EVPKey? {
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, algorithm, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_keygen_init(ctx) == 1, configure(ctx) == 1 else { return nil }
        var key: OpaquePointer?
        guard EVP_PKEY_generate(ctx, &key) == 1, let key else { return nil }
        return EVPKey(taking: key)
    }

    // MARK: Inspection

    func isA(_ name: String) -> Bool { EVP_PKEY_is_a(pointer, name) == 1 }

    var bits: Int { Int(EVP_PKEY_get_bits(pointer)) }

    /// The EC group name (`prime256v1` for P-256), or nil for non-EC keys.
    var groupName: String? {
        var buffer = [CChar](repeating: 0, count: 80)
        var length = 0
        guard EVP_PKEY_get_group_name(pointer, &buffer, buffer.count, &length) == 1 else {
            _ = drainOpenSSLErrors()
            return nil
        }
        return String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Whether the public key this private key carries is its own. OpenSSL takes the public half of a private key PEM
    /// as written (an EC point is only checked to be on the curve), so a PEM can pair one key's private half with
    /// another key's public key, and everything named after the public key would then name the other key.
    ///
    /// EC: the point must be the private scalar times the generator (`EVP_PKEY_pairwise_check`, one multiplication).
    /// RSA: a signature made with the private half must verify with the public half. (OpenSSL's pairwise check of an
    /// RSA key also tests both primes for primality: about a quarter of a second for a 4096-bit key.)
    var carriesItsOwnPublicKey: Bool {
        if isA("EC") {
            guard let ctx = EVP_PKEY_CTX_new_from_pkey(nil, pointer, nil) else {
                _ = drainOpenSSLErrors()
                return false
            }
            defer { EVP_PKEY_CTX_free(ctx) }
            let ok = EVP_PKEY_pairwise_check(ctx) == 1
            // A failed check leaves its reason on the thread's error queue; don't leak it to later calls.
            _ = drainOpenSSLErrors()
            return ok
        }
        let probe = Array("marquee: does the public key belong to the private key".utf8)
        guard let signature = signSHA256(probe) else {
            _ = drainOpenSSLErrors()
            return false
        }
        return verifySHA256(signature: signature, message: probe)
    }

    // MARK: Export

    var publicKeyPEM: String? {
        writeMemoryBIO { PEM_write_bio_PUBKEY($0, pointer) }
    }

    /// The public key as SubjectPublicKeyInfo DER: one encoding per key, whatever PEM (PKCS#8 or SEC1, LF or CRLF,
    /// wrapped at any width) it was read from.
    var publicKeyDER: [UInt8]? {
        // An EC key writes its point in the form it was read in, and a SEC1 PEM may hold it compressed: a copy set to
        // uncompressed (the key itself is never modified, see the type's comment) makes the DER one per key.
        var copy: OpaquePointer?
        if isA("EC") {
            guard let duplicate = EVP_PKEY_dup(pointer) else { return nil }
            copy = duplicate
            guard EVP_PKEY_set_utf8_string_param(duplicate, "point-format", "uncompressed") == 1 else {
                EVP_PKEY_free(duplicate)
                _ = drainOpenSSLErrors()
                return nil
            }
        }
        defer { if let copy { EVP_PKEY_free(copy) } }
        let source = copy ?? pointer
        let length = i2d_PUBKEY(source, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_PUBKEY(source, &cursor)
        }
        return written == length ? der : nil
    }

    var pkcs8PEM: String? {
        writeMemoryBIO { PEM_write_bio_PKCS8PrivateKey($0, pointer, nil, nil, 0, nil, nil) }
    }

    // MARK: Signing

    /// Signs SHA-256(`message`) with a fresh `EVP_MD_CTX`. ECDSA returns DER; RSA returns PKCS#1 v1.5.
    func signSHA256(_ message: [UInt8]) -> [UInt8]? {
        guard let ctx = EVP_MD_CTX_new() else { return nil }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, pointer) == 1 else { return nil }
        return withContiguousBytes(message) { input -> [UInt8]? in
            var length = 0
            guard EVP_DigestSign(ctx, nil, &length, input.baseAddress, input.count) == 1 else { return nil }
            var signature = [UInt8](repeating: 0, count: length)
            let ok = signature.withUnsafeMutableBufferPointer { out in
                EVP_DigestSign(ctx, out.baseAddress, &length, input.baseAddress, input.count)
            }
            guard ok == 1 else { return nil }
            return Array(signature[..<length])
        }
    }

    /// Verifies a signature over SHA-256(`message`) with a fresh `EVP_MD_CTX`.
    func verifySHA256(signature: [UInt8], message: [UInt8]) -> Bool {
        guard !signature.isEmpty, let ctx = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, pointer) == 1 else {
            _ = drainOpenSSLErrors()
            return false
        }
        let ok = withContiguousBytes(message) { input in
            EVP_DigestVerify(ctx, signature, signature.count, input.baseAddress, input.count)
        }
        // A failed verification leaves reasons on the thread's error queue; don't leak them to later calls.
        _ = drainOpenSSLErrors()
        return ok == 1
    }
}

/// The PEM passphrase callback: always refuses, so an encrypted key fails to load instead of prompting on a TTY.
func refusePassphrase(
    _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int32, _ rwflag: Int32, _ context: UnsafeMutableRawPointer?
) -> Int32 {
    0
}

/// Runs `body` with a read-only memory BIO over the UTF-8 of `text`.
func withMemoryBIO<R>(_ text: String, _ body: (OpaquePointer) -> R?) -> R? {
    var bytes = Array(text.utf8)
    guard bytes.count < Int(Int32.max) else { return nil }
    if bytes.isEmpty { bytes = [0] }
    return bytes.withUnsafeBytes { buffer -> R? in
        guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(text.utf8.count)) else { return nil }
        defer { BIO_free(bio) }
        return body(bio)
    }
}

/// Runs `body` with a writable memory BIO and returns what it wrote as a string, or nil if `body` failed.
func writeMemoryBIO(_ body: (OpaquePointer) -> Int32) -> String? {
    guard let bio = BIO_new(BIO_s_mem()) else { return nil }
    defer { BIO_free(bio) }
    guard body(bio) == 1 else { return nil }
    var data: UnsafeMutablePointer<CChar>?
    let length = copenssl_BIO_get_mem_data(bio, &data)
    guard length > 0, let data else { return nil }
    return data.withMemoryRebound(to: UInt8.self, capacity: length) {
        String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
    }
}
