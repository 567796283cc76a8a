import Crypto
import Foundation
import Testing

@Suite("SHA-256 and HMAC-SHA256")
struct DigestTests {
    @Test("SHA-256 matches FIPS 180-4 example vectors")
    func sha256Vectors() {
        #expect(
            SHA256.hexDigest("abc".utf8) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SHA256.hexDigest([]) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            SHA256.hexDigest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        // One million "a": exercises multi-block input and a non-contiguous sequence.
        #expect(
            SHA256.hexDigest(repeatElement(UInt8(ascii: "a"), count: 1_000_000))
                == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
        #expect(SHA256.hash(Data("abc".utf8)).count == 32)
    }

    @Test("HMAC-SHA256 matches RFC 4231 test cases 1, 2 and 6")
    func hmacVectors() {
        let case1 = HMACSHA256.authenticationCode(
            key: [UInt8](repeating: 0x0b, count: 20), message: "Hi There".utf8)
        #expect(Hex.encode(case1) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")

        let case2 = HMACSHA256.authenticationCode(
            key: Array("Jefe".utf8), message: "what do ya want for nothing?".utf8)
        #expect(Hex.encode(case2) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")

        let case6 = HMACSHA256.authenticationCode(
            key: [UInt8](repeating: 0xaa, count: 131),
            message: "Test Using Larger Than Block-Size Key - Hash Key First".utf8)
        #expect(Hex.encode(case6) == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")

        let case7 = HMACSHA256.authenticationCode(
            key: [UInt8](repeating: 0xaa, count: 131),
            message: ("This is a test using a larger than block-size key and a larger than block-size data. The key "
                + "needs to be hashed before being used by the HMAC algorithm.").utf8)
        #expect(Hex.encode(case7) == "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2")
    }

    @Test("HMAC keys of exactly a block and one byte more (values from Python's hmac module)")
    func hmacBlockSizedKeys() {
        let block = HMACSHA256.authenticationCode(
            key: (0..<64).map(UInt8.init), message: Array(repeating: 0x78, count: 200))
        #expect(Hex.encode(block) == "52fd44b1fdd78b34d0f057a61b148eaed55fa024e2a0422e5182887b367f7727")
        let longer = HMACSHA256.authenticationCode(key: (0..<65).map(UInt8.init), message: [UInt8]())
        #expect(Hex.encode(longer) == "93ff3114f20ef700222fc1c0334737a51a88740dc0dd2ce0ab3151f0a4a0e85a")
    }

    @Test("HMAC with an empty key works and equals a zero-byte key (RFC 2104 zero padding)")
    func hmacEmptyKey() {
        let code = HMACSHA256.authenticationCode(key: [], message: "message".utf8)
        // Value from Python's hmac module.
        #expect(Hex.encode(code) == "eb08c1f56d5ddee07f7bdf80468083da06b64cf4fac64fe3a90883df5feacae4")
        #expect(code == HMACSHA256.authenticationCode(key: [0], message: "message".utf8))
        #expect(code != HMACSHA256.authenticationCode(key: [1], message: "message".utf8))
    }

    @Test("isValid accepts the right code and rejects altered or truncated ones")
    func hmacValidation() {
        let key = Array("delivery-key".utf8)
        let code = HMACSHA256.authenticationCode(key: key, message: "d_123".utf8)
        #expect(HMACSHA256.isValid(code, key: key, message: "d_123".utf8))
        #expect(!HMACSHA256.isValid(code, key: key, message: "d_124".utf8))
        var altered = code
        altered[31] ^= 1
        #expect(!HMACSHA256.isValid(altered, key: key, message: "d_123".utf8))
        #expect(!HMACSHA256.isValid(Array(code.prefix(16)), key: key, message: "d_123".utf8))
    }
}

@Suite("Encodings, randomness and constant-time comparison")
struct EncodingTests {
    @Test("Base64URL matches RFC 4648 vectors without padding and round-trips every length")
    func base64URLVectors() {
        let vectors = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE"]
        for (plain, encoded) in vectors {
            #expect(Base64URL.encode(plain.utf8) == encoded)
            #expect(Base64URL.decode(encoded) == Array(plain.utf8))
        }
        #expect(Base64URL.encode([0xfb, 0xff, 0xbf]) == "-_-_")
        for length in 0..<40 {
            let bytes = SecureRandom.bytes(length)
            #expect(Base64URL.decode(Base64URL.encode(bytes)) == bytes)
        }
    }

    @Test(
        "Base64URL rejects padding, foreign characters, impossible lengths and non-canonical trailing bits",
        arguments: ["Zg==", "Zm9v+", "Zm9v/", "Z", "Zm9vY", "Zh", "Zm9 v", "é"])
    func base64URLRejects(_ input: String) {
        #expect(Base64URL.decode(input) == nil)
    }

    @Test("Hex encodes lowercase, decodes either case, rejects bad input")
    func hex() {
        #expect(Hex.encode([0x00, 0x0f, 0xa5, 0xff]) == "000fa5ff")
        #expect(Hex.decode("000FA5ff") == [0x00, 0x0f, 0xa5, 0xff])
        #expect(Hex.decode("") == [])
        #expect(Hex.decode("abc") == nil)
        #expect(Hex.decode("zz") == nil)
    }

    @Test("SecureRandom gives the requested length and does not repeat")
    func random() {
        #expect(SecureRandom.bytes(0).isEmpty)
        #expect(SecureRandom.bytes(33).count == 33)
        #expect(SecureRandom.bytes(32) != SecureRandom.bytes(32))
        let token = SecureRandom.token(byteCount: 32)
        #expect(token.count == 43)
        #expect(Base64URL.decode(token)?.count == 32)
        #expect(!token.contains("="))
        #expect(Set((0..<100).map { _ in SecureRandom.token(byteCount: 16) }).count == 100)
    }

    @Test("ConstantTime.equals compares bytes and treats a length mismatch as unequal")
    func constantTime() {
        #expect(ConstantTime.equals([], []))
        #expect(ConstantTime.equals([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2]))
        #expect(!ConstantTime.equals([], [0]))
    }
}
