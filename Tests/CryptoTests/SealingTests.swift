import Crypto
import Foundation
import Testing

@Suite("AES-256-GCM key ring")
struct SealingTests {
    let keyA = (id: "k1", key: SecureRandom.bytes(32))
    let keyB = (id: "2025-06", key: SecureRandom.bytes(32))

    @Test("Seal then open returns the plaintext, with and without associated data, including empty input")
    func roundTrip() throws {
        let ring = try SealingKeyRing(current: keyA)
        let secret = Array("-----BEGIN PRIVATE KEY-----\nsecret\n".utf8)
        #expect(try ring.open(ring.seal(secret)) == secret)
        let aad = Array("tenant:42:apns".utf8)
        #expect(try ring.open(ring.seal(secret, associatedData: aad), associatedData: aad) == secret)
        #expect(try ring.open(ring.seal([])) == [])
        let large = SecureRandom.bytes(100_000)
        #expect(try ring.open(ring.seal(large)) == large)
    }

    @Test("The sealed layout is version | id length | id | 12-byte nonce | ciphertext | 16-byte tag")
    func layout() throws {
        let ring = try SealingKeyRing(current: keyB)
        let plaintext = Array("hello".utf8)
        let sealed = try ring.seal(plaintext)
        #expect(sealed[0] == 0x01)
        #expect(sealed[1] == 7)
        #expect(Array(sealed[2..<9]) == Array("2025-06".utf8))
        #expect(sealed.count == 1 + 1 + 7 + 12 + plaintext.count + 16)
        #expect(ring.keyID(of: sealed) == "2025-06")
        #expect(ring.keyID(of: [0x02, 1, 65] + [UInt8](repeating: 0, count: 28)) == nil)
        #expect(ring.keyID(of: [0x01]) == nil)
        // The ciphertext is not the plaintext, and two seals of one plaintext differ (random nonce).
        #expect(Array(sealed[21..<26]) != plaintext)
        #expect(try ring.seal(plaintext) != sealed)
    }

    @Test("Flipping any single bit of a sealed blob makes open fail")
    func tamper() throws {
        let ring = try SealingKeyRing(current: keyA)
        let sealed = try ring.seal(Array("p8 key material".utf8), associatedData: Array("tenant:1:apns".utf8))
        for index in sealed.indices {
            var altered = sealed
            altered[index] ^= 0x01
            #expect(throws: CryptoError.self) {
                try ring.open(altered, associatedData: Array("tenant:1:apns".utf8))
            }
        }
        let error = #expect(throws: CryptoError.self) {
            var altered = sealed
            altered[altered.count - 1] ^= 0x80
            return try ring.open(altered, associatedData: Array("tenant:1:apns".utf8))
        }
        #expect(error?.code == .openFailed)
        #expect(throws: CryptoError.self) { try ring.open(Array(sealed.dropLast())) }
        #expect(throws: CryptoError.self) { try ring.open([]) }
    }

    @Test("Wrong or missing associated data fails to open")
    func wrongAssociatedData() throws {
        let ring = try SealingKeyRing(current: keyA)
        let sealed = try ring.seal(Array("fcm json".utf8), associatedData: Array("tenant:1:fcm".utf8))
        let wrong = #expect(throws: CryptoError.self) {
            try ring.open(sealed, associatedData: Array("tenant:2:fcm".utf8))
        }
        #expect(wrong?.code == .openFailed)
        #expect(throws: CryptoError.self) { try ring.open(sealed) }
        #expect(try ring.open(sealed, associatedData: Array("tenant:1:fcm".utf8)) == Array("fcm json".utf8))
    }

    @Test("Rotation: old blobs open through `previous`, new seals use the current key")
    func rotation() throws {
        let oldRing = try SealingKeyRing(current: keyA)
        let oldBlob = try oldRing.seal(Array("old".utf8))

        let newRing = try SealingKeyRing(current: keyB, previous: [keyA])
        #expect(newRing.currentKeyID == "2025-06")
        #expect(try newRing.open(oldBlob) == Array("old".utf8))
        #expect(newRing.keyID(of: oldBlob) == "k1")
        #expect(newRing.needsReseal(oldBlob))

        let newBlob = try newRing.seal(Array("new".utf8))
        #expect(newRing.keyID(of: newBlob) == "2025-06")
        #expect(!newRing.needsReseal(newBlob))

        let error = #expect(throws: CryptoError.self) { try oldRing.open(newBlob) }
        #expect(error?.code == .unknownKeyID)
    }

    @Test("A blob relabelled with another key ID in the ring does not open")
    func relabelledKeyID() throws {
        let ring = try SealingKeyRing(current: (id: "k2", key: keyB.key), previous: [keyA])
        var blob = try ring.seal(Array("x".utf8))
        blob[3] = UInt8(ascii: "1")  // "k2" -> "k1"
        let error = #expect(throws: CryptoError.self) { try ring.open(blob) }
        #expect(error?.code == .openFailed)
    }

    @Test("Keys that are not 32 bytes, empty or duplicate IDs are rejected", arguments: [0, 16, 31, 33, 64])
    func wrongKeySize(_ size: Int) throws {
        let error = #expect(throws: CryptoError.self) {
            try SealingKeyRing(current: (id: "k1", key: [UInt8](repeating: 7, count: size)))
        }
        #expect(error?.code == .invalidKey)
        #expect(error?.description.contains("32-byte") == true)
    }

    @Test("Empty, oversized and duplicate key IDs are rejected")
    func badKeyIDs() {
        let key = SecureRandom.bytes(32)
        #expect(throws: CryptoError.self) { try SealingKeyRing(current: (id: "", key: key)) }
        #expect(throws: CryptoError.self) {
            try SealingKeyRing(current: (id: String(repeating: "a", count: 256), key: key))
        }
        #expect(throws: CryptoError.self) {
            try SealingKeyRing(current: (id: "k1", key: key), previous: [(id: "k1", key: SecureRandom.bytes(32))])
        }
    }

    @Test("fromBase64 accepts a standard or base64url 32-byte key and rejects others")
    func fromBase64() throws {
        let key = SecureRandom.bytes(32)
        let standard = Data(key).base64EncodedString()
        let ring = try SealingKeyRing.fromBase64(standard + "\n")
        #expect(ring.currentKeyID == "k1")
        let sealed = try ring.seal(Array("x".utf8))
        let same = try SealingKeyRing(current: (id: "k1", key: key))
        #expect(try same.open(sealed) == Array("x".utf8))
        #expect(try SealingKeyRing.fromBase64(Base64URL.encode(key), id: "k9").currentKeyID == "k9")

        let short = #expect(throws: CryptoError.self) {
            try SealingKeyRing.fromBase64(Data(SecureRandom.bytes(16)).base64EncodedString())
        }
        #expect(short?.code == .invalidKey)
        let garbage = #expect(throws: CryptoError.self) { try SealingKeyRing.fromBase64("not base64!") }
        #expect(garbage?.code == .invalidKey)
        #expect(garbage?.description.contains("not base64") == false)
    }

    @Test(
        "An independent AES-GCM implementation opens our blobs",
        .enabled(if: pythonHasCryptography, "needs python3 with the cryptography package"))
    func independentDecryption() throws {
        let ring = try SealingKeyRing(current: keyB)
        let aad = Array("tenant:7:apns".utf8)
        let sealed = try ring.seal(Array("interop".utf8), associatedData: aad)
        let script = """
            import sys
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            key, blob, aad = (bytes.fromhex(a) for a in sys.argv[1:4])
            n = blob[1]
            header, rest = blob[:2 + n], blob[2 + n:]
            sys.stdout.write(AESGCM(key).decrypt(rest[:12], rest[12:], header + aad).decode())
            """
        let result = try runCommand(
            "/usr/bin/env",
            ["python3", "-c", script, Hex.encode(keyB.key), Hex.encode(sealed), Hex.encode(aad)])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == "interop")
    }
}

@Suite("Key ring redaction")
struct SealingRedactionTests {
    @Test("print, debugPrint and dump of a key ring show IDs but never key bytes")
    func redacted() throws {
        let key = [UInt8](repeating: 0xAB, count: 32)
        let ring = try SealingKeyRing(
            current: (id: "k2", key: key), previous: [(id: "k1", key: SecureRandom.bytes(32))])
        var dumped = ""
        dump(ring, to: &dumped)
        for text in [String(describing: ring), String(reflecting: ring), dumped] {
            #expect(text.contains("k2"))
            #expect(!text.contains("171"), "decimal key byte leaked: \(text)")
            #expect(!text.lowercased().contains("abab"))
        }
        #expect(String(describing: ring) == "SealingKeyRing(current: k2, previous: [\"k1\"])")
    }
}
