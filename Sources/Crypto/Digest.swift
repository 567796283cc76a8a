import COpenSSL

/// SHA-256 (FIPS 180-4) through OpenSSL's EVP interface.
public enum SHA256 {
    /// The digest length in bytes.
    public static let byteCount = 32

    /// Returns the 32-byte SHA-256 digest of `data`.
    public static func hash(_ data: some Sequence<UInt8>) -> [UInt8] {
        withContiguousBytes(data) { input in
            var digest = [UInt8](repeating: 0, count: byteCount)
            var length: UInt32 = 0
            let ok = digest.withUnsafeMutableBufferPointer { out in
                EVP_Digest(input.baseAddress, input.count, out.baseAddress, &length, EVP_sha256(), nil)
            }
            precondition(ok == 1 && length == UInt32(byteCount), "EVP_Digest(SHA-256) failed")
            return digest
        }
    }

    /// Returns the SHA-256 digest of `data` as 64 lowercase hex characters.
    public static func hexDigest(_ data: some Sequence<UInt8>) -> String {
        Hex.encode(hash(data))
    }
}

/// HMAC-SHA256 (RFC 2104) through OpenSSL.
public enum HMACSHA256 {
    /// The authentication code length in bytes.
    public static let byteCount = 32

    /// Returns the 32-byte HMAC-SHA256 of `message` under `key`. Any key length is allowed.
    public static func authenticationCode(key: [UInt8], message: some Sequence<UInt8>) -> [UInt8] {
        // OpenSSL treats a NULL key as "reuse the previous key", so an empty key still gets a real pointer.
        let keyBytes = key.isEmpty ? [0] : key
        return withContiguousBytes(message) { input in
            var code = [UInt8](repeating: 0, count: byteCount)
            var length: UInt32 = 0
            let result = keyBytes.withUnsafeBufferPointer { keyBuffer in
                code.withUnsafeMutableBufferPointer { out in
                    HMAC(
                        EVP_sha256(), keyBuffer.baseAddress, Int32(key.count), input.baseAddress, input.count,
                        out.baseAddress, &length)
                }
            }
            precondition(result != nil && length == UInt32(byteCount), "HMAC-SHA256 failed")
            return code
        }
    }

    /// Checks `code` against the HMAC-SHA256 of `message` under `key` in constant time.
    public static func isValid(_ code: [UInt8], key: [UInt8], message: some Sequence<UInt8>) -> Bool {
        ConstantTime.equals(authenticationCode(key: key, message: message), code)
    }
}

/// Calls `body` with the bytes of `data`, copying only when the sequence has no contiguous storage.
/// The buffer's base address is never nil, so OpenSSL always gets a valid pointer (even for empty input).
func withContiguousBytes<R>(_ data: some Sequence<UInt8>, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
    if let result = data.withContiguousStorageIfAvailable({ buffer -> R? in
        guard buffer.baseAddress != nil else { return nil }
        return body(buffer)
    }), let result {
        return result
    }
    var copy = Array(data)
    if copy.isEmpty {
        copy = [0]
        return copy.withUnsafeBufferPointer { body(UnsafeBufferPointer(start: $0.baseAddress, count: 0)) }
    }
    return copy.withUnsafeBufferPointer(body)
}
