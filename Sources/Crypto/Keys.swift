import COpenSSL

/// Something that signs a JWT signing input (`base64url(header).base64url(claims)`).
public protocol JWTSigner: Sendable {
    /// The JWS `alg` value, e.g. `ES256`.
    var algorithm: String { get }
    /// Returns the JWS signature bytes for `message`.
    func sign(_ message: [UInt8]) throws -> [UInt8]
}

/// Something that checks a JWT signature.
public protocol JWTVerifier: Sendable {
    /// The JWS `alg` value this verifier accepts, e.g. `RS256`.
    var algorithm: String { get }
    /// True when `signature` is valid for `message`.
    func verify(signature: [UInt8], message: [UInt8]) -> Bool
}

private let p256Names: Set<String> = ["prime256v1", "P-256", "secp256r1"]
private let ecPrivateExpectation =
    "expected a P-256 private key as PKCS#8 PEM (BEGIN PRIVATE KEY, as in an Apple .p8 file) or SEC1 PEM (BEGIN EC PRIVATE KEY)"
private let ecPublicExpectation = "expected a P-256 public key as PEM (BEGIN PUBLIC KEY or BEGIN CERTIFICATE)"
private let rsaPrivateExpectation =
    "expected an RSA private key of 2048 to 4096 bits as PKCS#8 PEM (BEGIN PRIVATE KEY) or PKCS#1 PEM (BEGIN RSA PRIVATE KEY)"
private let rsaPublicExpectation =
    "expected an RSA public key of 2048 to 4096 bits as PEM (BEGIN PUBLIC KEY or BEGIN CERTIFICATE)"

/// The RSA key sizes accepted. Below 2048 bits is too weak; above 4096 is refused because signing cost grows with the
/// cube of the size (a 16,384-bit key takes about half a second per RS256 signature, on the cooperative thread pool,
/// for every FCM access token), and Google's service-account keys are 2048 bits.
let rsaKeyBits = 2048...4096

/// Checks that `key` is an EC key on P-256.
private func requireP256(_ key: EVPKey, expectation: String) throws {
    guard key.isA("EC") else {
        throw CryptoError(.unsupportedKeyType, expectation, details: "key is not an EC key")
    }
    guard let group = key.groupName, p256Names.contains(group) else {
        throw CryptoError(.unsupportedKeyType, expectation, details: "EC key is on a different curve")
    }
}

/// Checks that the public key `key` carries belongs to its private key (`EVPKey.carriesItsOwnPublicKey`). A provider
/// token cache and its connections are named after the public key (`ProviderTokenCache.connectionIdentity`): a PEM
/// pairing one private key with another key's public key would be taken for that other key.
private func requireOwnPublicKey(_ key: EVPKey, expectation: String) throws {
    guard key.carriesItsOwnPublicKey else {
        throw CryptoError(
            .invalidKey, "the PEM's public key does not belong to its private key; " + expectation)
    }
}

/// Checks that `key` is an RSA key (not RSA-PSS-restricted) of 2048 to 4096 bits (`rsaKeyBits`).
private func requireRSA(_ key: EVPKey, expectation: String) throws {
    guard key.isA("RSA") else {
        throw CryptoError(.unsupportedKeyType, expectation, details: "key is not an RSA key")
    }
    guard key.bits >= rsaKeyBits.lowerBound else {
        throw CryptoError(.keyTooSmall, expectation, details: "RSA key has \(key.bits) bits")
    }
    guard key.bits <= rsaKeyBits.upperBound else {
        throw CryptoError(.keyTooLarge, expectation + "; this key has \(key.bits) bits")
    }
}

// MARK: - ES256

/// An ECDSA P-256 private key that signs ES256 JWTs (APNs provider tokens).
public struct ES256PrivateKey: JWTSigner {
    let key: EVPKey
    /// The matching public key.
    public let publicKey: ES256PublicKey

    /// `ES256`.
    public var algorithm: String { "ES256" }

    /// Loads a P-256 private key from PKCS#8 PEM (`BEGIN PRIVATE KEY`, Apple's .p8) or SEC1 PEM
    /// (`BEGIN EC PRIVATE KEY`). Throws `.invalidKey` for unreadable PEM or a public point that is not the private
    /// key's own, and `.unsupportedKeyType` for any other key type or curve.
    public init(pem: String) throws {
        guard let key = EVPKey.privateKey(pem: pem) else {
            throw CryptoError.openSSL(.invalidKey, ecPrivateExpectation)
        }
        try requireP256(key, expectation: ecPrivateExpectation)
        try requireOwnPublicKey(key, expectation: ecPrivateExpectation)
        try self.init(key: key)
    }

    private init(key: EVPKey) throws {
        guard let publicPEM = key.publicKeyPEM, let publicKey = EVPKey.publicKey(pem: publicPEM) else {
            throw CryptoError.openSSL(.invalidKey, ecPrivateExpectation)
        }
        self.key = key
        self.publicKey = ES256PublicKey(key: publicKey, pem: publicPEM)
    }

    /// Generates a fresh P-256 key. Traps if OpenSSL cannot generate keys, which is not recoverable.
    public static func generate() -> ES256PrivateKey {
        let key = EVPKey.generate(algorithm: "EC") { EVP_PKEY_CTX_set_group_name($0, "P-256") }
        guard let key, let result = try? ES256PrivateKey(key: key) else {
            fatalError("OpenSSL failed to generate a P-256 key: \(drainOpenSSLErrors())")
        }
        return result
    }

    /// The key as unencrypted PKCS#8 PEM (`BEGIN PRIVATE KEY`), the .p8 format. This is secret material.
    public var pkcs8PEM: String {
        guard let pem = key.pkcs8PEM else { fatalError("OpenSSL failed to encode a private key") }
        return pem
    }

    /// Signs SHA-256(`message`) and returns the raw 64-byte `R || S` signature (RFC 7518 §3.4).
    public func sign(_ message: [UInt8]) throws -> [UInt8] {
        guard let der = key.signSHA256(message), let raw = ECDSASignature.rawFromDER(der) else {
            throw CryptoError.openSSL(.signFailed, "ES256 signing failed")
        }
        return raw
    }
}

/// An ECDSA P-256 public key that verifies ES256 JWTs.
public struct ES256PublicKey: JWTVerifier {
    let key: EVPKey
    /// The key as SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
    public let pem: String

    /// `ES256`.
    public var algorithm: String { "ES256" }

    init(key: EVPKey, pem: String) {
        self.key = key
        self.pem = pem
    }

    /// SHA-256 of the key's SubjectPublicKeyInfo DER, as 64 lowercase hex characters: the same for one key in any
    /// encoding, and different for different keys (unlike the PEM text, which varies in line endings and format).
    public var fingerprint: String {
        guard let der = key.publicKeyDER else { preconditionFailure("OpenSSL failed to encode a loaded public key") }
        return SHA256.hexDigest(der)
    }

    /// Loads a P-256 public key from `BEGIN PUBLIC KEY` PEM or from a `BEGIN CERTIFICATE` PEM.
    public init(pem: String) throws {
        guard let key = EVPKey.publicKey(pem: pem) else {
            throw CryptoError.openSSL(.invalidKey, ecPublicExpectation)
        }
        try requireP256(key, expectation: ecPublicExpectation)
        guard let normalized = key.publicKeyPEM else { throw CryptoError.openSSL(.invalidKey, ecPublicExpectation) }
        self.init(key: key, pem: normalized)
    }

    /// Verifies a raw 64-byte `R || S` signature over SHA-256(`message`). Any other length is rejected.
    public func verify(signature: [UInt8], message: [UInt8]) -> Bool {
        guard let der = ECDSASignature.derFromRaw(signature) else { return false }
        return key.verifySHA256(signature: der, message: message)
    }
}

/// Conversion between OpenSSL's DER ECDSA signatures and JOSE's fixed-size `R || S`.
enum ECDSASignature {
    static let componentSize = 32

    /// DER `ECDSA-Sig-Value` → 64-byte `R || S`, left-padding each integer to 32 bytes.
    static func rawFromDER(_ der: [UInt8]) -> [UInt8]? {
        der.withUnsafeBufferPointer { buffer -> [UInt8]? in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            guard let signature = d2i_ECDSA_SIG(nil, &cursor, buffer.count) else { return nil }
            defer { ECDSA_SIG_free(signature) }
            var r: OpaquePointer?
            var s: OpaquePointer?
            ECDSA_SIG_get0(signature, &r, &s)
            guard let r, let s else { return nil }
            var raw = [UInt8](repeating: 0, count: componentSize * 2)
            let ok = raw.withUnsafeMutableBufferPointer { out -> Bool in
                BN_bn2binpad(r, out.baseAddress, Int32(componentSize)) == Int32(componentSize)
                    && BN_bn2binpad(s, out.baseAddress! + componentSize, Int32(componentSize)) == Int32(componentSize)
            }
            return ok ? raw : nil
        }
    }

    /// 64-byte `R || S` → DER `ECDSA-Sig-Value`; nil for any other length.
    static func derFromRaw(_ raw: [UInt8]) -> [UInt8]? {
        guard raw.count == componentSize * 2 else { return nil }
        guard let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, Int32(componentSize), nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + componentSize, Int32(componentSize), nil) }
        guard let r, let s, ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == length ? der : nil
    }
}

// MARK: - RS256

/// An RSA private key (2048 to 4096 bits) that signs RS256 JWTs (Google service-account assertions).
public struct RS256PrivateKey: JWTSigner {
    let key: EVPKey
    /// The matching public key.
    public let publicKey: RS256PublicKey

    /// `RS256`.
    public var algorithm: String { "RS256" }

    /// Loads an RSA private key from PKCS#8 PEM (`BEGIN PRIVATE KEY`, as in a Google service-account JSON) or
    /// PKCS#1 PEM (`BEGIN RSA PRIVATE KEY`). Throws `.invalidKey` (also for a public key that is not the private
    /// key's own), `.unsupportedKeyType`, `.keyTooSmall` or `.keyTooLarge`.
    public init(pem: String) throws {
        guard let key = EVPKey.privateKey(pem: pem) else {
            throw CryptoError.openSSL(.invalidKey, rsaPrivateExpectation)
        }
        try requireRSA(key, expectation: rsaPrivateExpectation)
        try requireOwnPublicKey(key, expectation: rsaPrivateExpectation)
        try self.init(key: key)
    }

    private init(key: EVPKey) throws {
        guard let publicPEM = key.publicKeyPEM, let publicKey = EVPKey.publicKey(pem: publicPEM) else {
            throw CryptoError.openSSL(.invalidKey, rsaPrivateExpectation)
        }
        self.key = key
        self.publicKey = RS256PublicKey(key: publicKey, pem: publicPEM)
    }

    /// Generates a fresh RSA key with public exponent 65537. Throws `.keyTooSmall` below 2048 bits and
    /// `.keyTooLarge` above 4096 (a key that `init(pem:)` would refuse).
    public static func generate(bits: Int = 2048) throws -> RS256PrivateKey {
        guard bits >= rsaKeyBits.lowerBound else {
            throw CryptoError(.keyTooSmall, "RSA keys must have at least 2048 bits", details: "asked for \(bits)")
        }
        guard bits <= rsaKeyBits.upperBound else {
            throw CryptoError(.keyTooLarge, "RSA keys must have at most 4096 bits", details: "asked for \(bits)")
        }
        let key = EVPKey.generate(algorithm: "RSA") { EVP_PKEY_CTX_set_rsa_keygen_bits($0, Int32(bits)) }
        guard let key else { throw CryptoError.openSSL(.keyGenerationFailed, "RSA key generation failed") }
        return try RS256PrivateKey(key: key)
    }

    /// The key as unencrypted PKCS#8 PEM (`BEGIN PRIVATE KEY`). This is secret material.
    public var pkcs8PEM: String {
        guard let pem = key.pkcs8PEM else { fatalError("OpenSSL failed to encode a private key") }
        return pem
    }

    /// Signs SHA-256(`message`) with RSASSA-PKCS1-v1_5 (RFC 7518 §3.3).
    public func sign(_ message: [UInt8]) throws -> [UInt8] {
        guard let signature = key.signSHA256(message) else {
            throw CryptoError.openSSL(.signFailed, "RS256 signing failed")
        }
        return signature
    }
}

/// An RSA public key that verifies RS256 JWTs.
public struct RS256PublicKey: JWTVerifier {
    let key: EVPKey
    /// The key as SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
    public let pem: String

    /// `RS256`.
    public var algorithm: String { "RS256" }

    init(key: EVPKey, pem: String) {
        self.key = key
        self.pem = pem
    }

    /// Loads an RSA public key (2048 to 4096 bits) from `BEGIN PUBLIC KEY` PEM or a `BEGIN CERTIFICATE` PEM
    /// (Google publishes service-account keys as certificates).
    public init(pem: String) throws {
        guard let key = EVPKey.publicKey(pem: pem) else {
            throw CryptoError.openSSL(.invalidKey, rsaPublicExpectation)
        }
        try requireRSA(key, expectation: rsaPublicExpectation)
        guard let normalized = key.publicKeyPEM else { throw CryptoError.openSSL(.invalidKey, rsaPublicExpectation) }
        self.init(key: key, pem: normalized)
    }

    /// Verifies an RSASSA-PKCS1-v1_5 SHA-256 signature over `message`.
    public func verify(signature: [UInt8], message: [UInt8]) -> Bool {
        key.verifySHA256(signature: signature, message: message)
    }
}
