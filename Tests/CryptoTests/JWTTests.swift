import Crypto
import Foundation
import Testing

/// Checks `signature` over `input` with `openssl dgst -sha256 -verify`, the independent verifier.
private func opensslVerifies(publicKeyPEM: String, input: [UInt8], derOrRSASignature: [UInt8]) throws -> Bool {
    let directory = try TemporaryDirectory()
    let pub = try directory.write("pub.pem", publicKeyPEM)
    let sig = try directory.write("sig.bin", derOrRSASignature)
    let data = try directory.write("input.txt", input)
    let result = try openssl("dgst", "-sha256", "-verify", pub, "-signature", sig, data)
    return result.status == 0 && result.stdout.contains("Verified OK")
}

/// Splits a compact JWT into its signing input and decoded signature.
private func parts(of token: String) throws -> (input: [UInt8], signature: [UInt8], header: [String: Any]) {
    let segments = token.split(separator: ".", omittingEmptySubsequences: false)
    try #require(segments.count == 3)
    let signature = try #require(Base64URL.decode(segments[2]))
    let header = try #require(decodeSegment(segments[0]))
    return (Array("\(segments[0]).\(segments[1])".utf8), signature, header)
}

/// Generates a key with the openssl CLI and returns the private key PEM and its public key PEM (from openssl).
private func cliKey(_ generate: [String], pkcs8: Bool = false) throws -> (privatePEM: String, publicPEM: String) {
    let directory = try TemporaryDirectory()
    // `-out` goes right after the subcommand: `genrsa` wants its bit count last.
    let arguments = [generate[0], "-out", directory.path("key.pem")] + generate.dropFirst()
    let generated = try runCommand("/usr/bin/openssl", arguments)
    try #require(generated.status == 0, "\(generated.stderr)")
    var keyFile = "key.pem"
    if pkcs8 {
        let converted = try openssl(
            "pkcs8", "-topk8", "-nocrypt", "-in", directory.path("key.pem"), "-out", directory.path("p8.pem"))
        try #require(converted.status == 0, "\(converted.stderr)")
        keyFile = "p8.pem"
    }
    let pub = try openssl("pkey", "-in", directory.path(keyFile), "-pubout", "-out", directory.path("pub.pem"))
    try #require(pub.status == 0, "\(pub.stderr)")
    return (try directory.read(keyFile), try directory.read("pub.pem"))
}

private let sampleClaims: [String: JSONClaim] = [
    "iss": "TEAM123456", "iat": 1_700_000_000, "scope": "https://www.googleapis.com/auth/firebase.messaging",
    "nested": .object(["ok": true, "list": .array([1, 2.5, .null])]),
]

@Suite("JWT ES256 and RS256")
struct JWTTests {
    @Test("ES256: 64-byte R||S signature, alg/kid header, verified by openssl and by us")
    func es256() throws {
        let key = ES256PrivateKey.generate()
        let token = try JWT.sign(claims: sampleClaims, header: ["kid": "ABC123DEFG"], signer: key)
        let (input, signature, header) = try parts(of: token)
        #expect(signature.count == 64)
        #expect(header["alg"] as? String == "ES256")
        #expect(header["kid"] as? String == "ABC123DEFG")
        #expect(header["typ"] as? String == "JWT")

        let der = TestDER.ecdsaSignature(raw: signature)
        #expect(try opensslVerifies(publicKeyPEM: key.publicKey.pem, input: input, derOrRSASignature: der))

        let verified = try JWT.verify(token, verifier: key.publicKey)
        #expect(verified.claims == sampleClaims)
        #expect(verified.header["kid"] == "ABC123DEFG")
    }

    @Test("RS256: verified by openssl and by us; header cannot override alg")
    func rs256() throws {
        let key = try RS256PrivateKey.generate()
        let token = try JWT.sign(claims: sampleClaims, header: ["alg": "none", "kid": "k"], signer: key)
        let (input, signature, header) = try parts(of: token)
        #expect(signature.count == 256)
        #expect(header["alg"] as? String == "RS256")
        #expect(try opensslVerifies(publicKeyPEM: key.publicKey.pem, input: input, derOrRSASignature: signature))
        #expect(try JWT.verify(token, verifier: key.publicKey).claims == sampleClaims)
    }

    @Test("openssl-signed input verifies with our ES256 and RS256 verifiers")
    func opensslSignsWeVerify() throws {
        let directory = try TemporaryDirectory()
        let message = Array("header.claims".utf8)
        let input = try directory.write("input.txt", message)

        let ec = ES256PrivateKey.generate()
        try directory.write("ec.pem", ec.pkcs8PEM)
        let ecSign = try openssl(
            "dgst", "-sha256", "-sign", directory.path("ec.pem"), "-out", directory.path("ec.sig"), input)
        try #require(ecSign.status == 0, "\(ecSign.stderr)")
        let ecDER = Array(try Data(contentsOf: URL(fileURLWithPath: directory.path("ec.sig"))))
        let raw = try #require(TestDER.rawSignature(der: ecDER))
        #expect(ec.publicKey.verify(signature: raw, message: message))
        #expect(!ec.publicKey.verify(signature: raw, message: Array("header.claimz".utf8)))
        #expect(!ec.publicKey.verify(signature: ecDER, message: message), "DER must not be accepted as raw")
        #expect(!ec.publicKey.verify(signature: Array(raw.dropLast()), message: message))

        let rsa = try RS256PrivateKey.generate()
        try directory.write("rsa.pem", rsa.pkcs8PEM)
        let rsaSign = try openssl(
            "dgst", "-sha256", "-sign", directory.path("rsa.pem"), "-out", directory.path("rsa.sig"), input)
        try #require(rsaSign.status == 0, "\(rsaSign.stderr)")
        let rsaSig = Array(try Data(contentsOf: URL(fileURLWithPath: directory.path("rsa.sig"))))
        #expect(rsa.publicKey.verify(signature: rsaSig, message: message))
        #expect(!rsa.publicKey.verify(signature: rsaSig, message: Array("header.claimz".utf8)))
    }

    /// One way of making a key with the openssl CLI.
    struct CLIKeyCase: Sendable, CustomTestStringConvertible {
        var generate: [String]
        var pkcs8: Bool
        var label: String
        var testDescription: String { "\(generate.joined(separator: " ")) → \(label)" }
    }

    @Test(
        "Keys made by the openssl CLI load, sign, and openssl verifies the result",
        arguments: [
            CLIKeyCase(
                generate: ["ecparam", "-name", "prime256v1", "-genkey", "-noout"], pkcs8: true,
                label: "BEGIN PRIVATE KEY"),
            CLIKeyCase(
                generate: ["ecparam", "-name", "prime256v1", "-genkey", "-noout"], pkcs8: false,
                label: "BEGIN EC PRIVATE KEY"),
            CLIKeyCase(
                generate: ["ecparam", "-name", "prime256v1", "-genkey"], pkcs8: false,
                label: "BEGIN EC PARAMETERS"),
            CLIKeyCase(
                generate: ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], pkcs8: false,
                label: "BEGIN PRIVATE KEY"),
            CLIKeyCase(generate: ["genrsa", "-traditional"], pkcs8: false, label: "BEGIN RSA PRIVATE KEY"),
        ])
    func cliKeys(_ keyCase: CLIKeyCase) throws {
        let generate = keyCase.generate
        let label = keyCase.label
        let arguments = generate.first == "genrsa" ? generate + ["2048"] : generate
        let (privatePEM, publicPEM) = try cliKey(arguments, pkcs8: keyCase.pkcs8)
        try #require(privatePEM.contains(label))
        let signer: any JWTSigner
        let verifier: any JWTVerifier
        if generate.first == "ecparam" {
            let key = try ES256PrivateKey(pem: privatePEM)
            #expect(key.publicKey.pem == publicPEM)
            signer = key
            verifier = try ES256PublicKey(pem: publicPEM)
        } else {
            let key = try RS256PrivateKey(pem: privatePEM)
            #expect(key.publicKey.pem == publicPEM)
            signer = key
            verifier = try RS256PublicKey(pem: publicPEM)
        }
        let token = try JWT.sign(claims: ["sub": "cli"], signer: signer)
        let (input, signature, _) = try parts(of: token)
        let opensslSignature = signer.algorithm == "ES256" ? TestDER.ecdsaSignature(raw: signature) : signature
        #expect(try opensslVerifies(publicKeyPEM: publicPEM, input: input, derOrRSASignature: opensslSignature))
        #expect(try JWT.verify(token, verifier: verifier).claims["sub"] == "cli")
    }

    @Test("A generated key survives a PKCS#8 PEM round trip")
    func pkcs8RoundTrip() throws {
        let ec = ES256PrivateKey.generate()
        #expect(ec.pkcs8PEM.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let reloaded = try ES256PrivateKey(pem: ec.pkcs8PEM)
        #expect(reloaded.publicKey.pem == ec.publicKey.pem)
        let rsa = try RS256PrivateKey.generate()
        #expect(try RS256PrivateKey(pem: rsa.pkcs8PEM).publicKey.pem == rsa.publicKey.pem)
        #expect(try ES256PublicKey(pem: ec.publicKey.pem).pem == ec.publicKey.pem)
    }

    @Test("A public key's fingerprint is one per key: PKCS#8, SEC1, a compressed point and CRLF agree")
    func fingerprints() throws {
        let directory = try TemporaryDirectory()
        let (sec1, publicPEM) = try cliKey(["ecparam", "-name", "prime256v1", "-genkey", "-noout"])
        let path = try directory.write("sec1.pem", sec1)
        let pkcs8 = try openssl("pkcs8", "-topk8", "-nocrypt", "-in", path, "-out", directory.path("p8.pem"))
        try #require(pkcs8.status == 0, "\(pkcs8.stderr)")
        let compressed = try openssl("ec", "-in", path, "-conv_form", "compressed", "-out", directory.path("c.pem"))
        try #require(compressed.status == 0, "\(compressed.stderr)")
        let crlf = sec1.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\r\n")
        let fingerprint = try ES256PrivateKey(pem: sec1).publicKey.fingerprint
        #expect(fingerprint.count == 64)
        for pem in [try directory.read("p8.pem"), try directory.read("c.pem"), crlf] {
            #expect(try ES256PrivateKey(pem: pem).publicKey.fingerprint == fingerprint)
        }
        #expect(try ES256PublicKey(pem: publicPEM).fingerprint == fingerprint)
        // SHA-256 of the SubjectPublicKeyInfo DER, as `openssl pkey -pubout -outform DER | sha256sum` prints it.
        let der = try openssl("pkey", "-in", path, "-pubout", "-outform", "DER", "-out", directory.path("pub.der"))
        try #require(der.status == 0, "\(der.stderr)")
        let bytes = try Data(contentsOf: URL(fileURLWithPath: directory.path("pub.der")))
        #expect(SHA256.hexDigest(bytes) == fingerprint)
        #expect(ES256PrivateKey.generate().publicKey.fingerprint != fingerprint)
    }

    @Test("A tampered payload, a foreign key, or a swapped signature fails verification")
    func tampering() throws {
        let key = ES256PrivateKey.generate()
        let token = try JWT.sign(claims: ["sub": "device-1"], signer: key)
        let segments = token.split(separator: ".").map(String.init)
        let forged = segments[0] + "." + Base64URL.encode(#"{"sub":"device-2"}"#.utf8) + "." + segments[2]
        let tampered = #expect(throws: CryptoError.self) { try JWT.verify(forged, verifier: key.publicKey) }
        #expect(tampered?.code == .badSignature)

        let other = ES256PrivateKey.generate()
        let foreign = #expect(throws: CryptoError.self) { try JWT.verify(token, verifier: other.publicKey) }
        #expect(foreign?.code == .badSignature)

        var signature = try #require(Base64URL.decode(segments[2]))
        signature[10] ^= 1
        let flipped = segments[0] + "." + segments[1] + "." + Base64URL.encode(signature)
        #expect(throws: CryptoError.self) { try JWT.verify(flipped, verifier: key.publicKey) }
    }

    @Test("alg must match the verifier; alg none and RS256-for-ES256 are refused")
    func algorithmMismatch() throws {
        let ec = ES256PrivateKey.generate()
        let rsa = try RS256PrivateKey.generate()
        let esToken = try JWT.sign(claims: ["a": 1], signer: ec)
        let mismatch = #expect(throws: CryptoError.self) { try JWT.verify(esToken, verifier: rsa.publicKey) }
        #expect(mismatch?.code == .algorithmMismatch)

        let noneHeader = Base64URL.encode(#"{"alg":"none","typ":"JWT"}"#.utf8)
        let noneToken = noneHeader + "." + Base64URL.encode(#"{"a":1}"#.utf8) + "."
        let none = #expect(throws: CryptoError.self) { try JWT.verify(noneToken, verifier: ec.publicKey) }
        #expect(none?.code == .algorithmMismatch)
    }

    @Test(
        "Malformed tokens are rejected as malformedToken",
        arguments: [
            "", "abc", "a.b", "a.b.c.d", "!!.e30.AA", "e30.e30.AA",
            Base64URL.encode(#"["ES256"]"#.utf8) + ".e30.AA",
            Base64URL.encode(#"{"alg":"ES256"}"#.utf8) + ".e30.A",
        ])
    func malformed(_ token: String) throws {
        let key = ES256PrivateKey.generate()
        let error = #expect(throws: CryptoError.self) { try JWT.verify(token, verifier: key.publicKey) }
        #expect(error?.code == .malformedToken)
    }

    @Test("A validly signed token whose claims are not a JSON object is malformed")
    func nonObjectClaims() throws {
        let key = ES256PrivateKey.generate()
        let input = Base64URL.encode(#"{"alg":"ES256"}"#.utf8) + "." + Base64URL.encode("[1,2]".utf8)
        let token = input + "." + Base64URL.encode(try key.sign(Array(input.utf8)))
        let error = #expect(throws: CryptoError.self) { try JWT.verify(token, verifier: key.publicKey) }
        #expect(error?.code == .malformedToken)
    }

    @Test(
        "PyJWT verifies our ES256 and RS256 tokens",
        .enabled(if: pythonHasPyJWT, "PyJWT is not installed; the openssl checks are the required ones"))
    func pyJWT() throws {
        let es = ES256PrivateKey.generate()
        let rs = try RS256PrivateKey.generate()
        for (signer, pem) in [(es as any JWTSigner, es.publicKey.pem), (rs, rs.publicKey.pem)] {
            let token = try JWT.sign(claims: ["sub": "py"], header: ["kid": "x"], signer: signer)
            let script = """
                import sys, jwt
                print(jwt.decode(sys.argv[1], sys.argv[2], algorithms=[sys.argv[3]])["sub"])
                """
            let result = try runCommand("/usr/bin/env", ["python3", "-c", script, token, pem, signer.algorithm])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout == "py\n")
        }
    }

    @Test(
        "Python's cryptography package verifies our ES256 and RS256 signatures",
        .enabled(if: pythonHasCryptography, "needs python3 with the cryptography package"))
    func pythonCryptography() throws {
        let es = ES256PrivateKey.generate()
        let rs = try RS256PrivateKey.generate()
        let script = """
            import sys
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec, padding
            from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
            token, pem = sys.argv[1], sys.argv[2].encode()
            head, body, sig = token.split(".")
            sig = __import__("base64").urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
            key = serialization.load_pem_public_key(pem)
            data = (head + "." + body).encode()
            if isinstance(key, ec.EllipticCurvePublicKey):
                assert len(sig) == 64
                der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
                key.verify(der, data, ec.ECDSA(hashes.SHA256()))
            else:
                key.verify(sig, data, padding.PKCS1v15(), hashes.SHA256())
            print("ok")
            """
        for (signer, pem) in [(es as any JWTSigner, es.publicKey.pem), (rs, rs.publicKey.pem)] {
            let token = try JWT.sign(claims: ["sub": "py"], signer: signer)
            let result = try runCommand("/usr/bin/env", ["python3", "-c", script, token, pem])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout == "ok\n")
        }
    }
}

@Suite("Key loading errors")
struct KeyErrorTests {
    @Test("Garbage PEM is invalidKey, and the message says what was expected without echoing input")
    func badPEM() {
        let input = "-----BEGIN PRIVATE KEY-----\nTUlJQmFkS2V5U2VjcmV0\n-----END PRIVATE KEY-----\n"
        let es = #expect(throws: CryptoError.self) { try ES256PrivateKey(pem: input) }
        #expect(es?.code == .invalidKey)
        #expect(es?.description.contains("expected a P-256") == true)
        #expect(es?.description.contains("TUlJ") == false)
        #expect(es?.debugDescription.contains("TUlJ") == false)
        let rs = #expect(throws: CryptoError.self) { try RS256PrivateKey(pem: "not a pem") }
        #expect(rs?.code == .invalidKey)
        #expect(rs?.description.contains("expected an RSA private key") == true)
        #expect(throws: CryptoError.self) { try ES256PublicKey(pem: "") }
        #expect(throws: CryptoError.self) { try RS256PublicKey(pem: input) }
    }

    @Test("An RSA key given to ES256 and an EC key given to RS256 are unsupportedKeyType")
    func wrongKeyType() throws {
        let rsa = try RS256PrivateKey.generate()
        let ec = ES256PrivateKey.generate()
        let es = #expect(throws: CryptoError.self) { try ES256PrivateKey(pem: rsa.pkcs8PEM) }
        #expect(es?.code == .unsupportedKeyType)
        #expect(es?.description.contains("expected a P-256 private key") == true)
        let rs = #expect(throws: CryptoError.self) { try RS256PrivateKey(pem: ec.pkcs8PEM) }
        #expect(rs?.code == .unsupportedKeyType)
        #expect(throws: CryptoError.self) { try ES256PublicKey(pem: rsa.publicKey.pem) }
        #expect(throws: CryptoError.self) { try RS256PublicKey(pem: ec.publicKey.pem) }
        let privateAsPublic = #expect(throws: CryptoError.self) { try ES256PublicKey(pem: ec.pkcs8PEM) }
        #expect(privateAsPublic?.code == .invalidKey)
    }

    @Test("A P-384 key is refused by ES256")
    func p384() throws {
        let (privatePEM, publicPEM) = try cliKey(["ecparam", "-name", "secp384r1", "-genkey", "-noout"], pkcs8: true)
        let error = #expect(throws: CryptoError.self) { try ES256PrivateKey(pem: privatePEM) }
        #expect(error?.code == .unsupportedKeyType)
        let sec1 = try cliKey(["ecparam", "-name", "secp384r1", "-genkey", "-noout"])
        #expect(throws: CryptoError.self) { try ES256PrivateKey(pem: sec1.privatePEM) }
        let pub = #expect(throws: CryptoError.self) { try ES256PublicKey(pem: publicPEM) }
        #expect(pub?.code == .unsupportedKeyType)
    }

    @Test("RSA keys under 2048 bits are keyTooSmall")
    func smallRSA() throws {
        let (privatePEM, publicPEM) = try cliKey(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"])
        let error = #expect(throws: CryptoError.self) { try RS256PrivateKey(pem: privatePEM) }
        #expect(error?.code == .keyTooSmall)
        let pub = #expect(throws: CryptoError.self) { try RS256PublicKey(pem: publicPEM) }
        #expect(pub?.code == .keyTooSmall)
        let generated = #expect(throws: CryptoError.self) { try RS256PrivateKey.generate(bits: 1024) }
        #expect(generated?.code == .keyTooSmall)
    }

    @Test("RSA keys over 4096 bits are keyTooLarge; 4096 bits load")
    func largeRSA() throws {
        // Just over the bound: every bit more costs signing time, and the limit is on the size, not a round number.
        let (privatePEM, publicPEM) = (LargeRSAKeys.private4160, LargeRSAKeys.public4160)
        let error = #expect(throws: CryptoError.self) { try RS256PrivateKey(pem: privatePEM) }
        #expect(error?.code == .keyTooLarge)
        #expect(error?.description.contains("4160 bits") == true)
        let pub = #expect(throws: CryptoError.self) { try RS256PublicKey(pem: publicPEM) }
        #expect(pub?.code == .keyTooLarge)
        let generated = #expect(throws: CryptoError.self) { try RS256PrivateKey.generate(bits: 16384) }
        #expect(generated?.code == .keyTooLarge)
        let largest = try RS256PrivateKey(pem: LargeRSAKeys.private4096)
        #expect(largest.publicKey.pem.trimmingCharacters(in: .whitespacesAndNewlines) == LargeRSAKeys.public4096)
    }

    /// `donor`'s PKCS#8 PEM with its public point replaced by `owner`'s: `donor`'s private scalar filed under `owner`'s
    /// public key. OpenSSL writes a P-256 PKCS#8 key with its uncompressed point (65 bytes) last.
    static func mismatched(privateOf donor: ES256PrivateKey, publicOf owner: ES256PrivateKey) throws -> String {
        func der(_ pem: String) throws -> [UInt8] {
            let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
            return Array(try #require(Data(base64Encoded: body)))
        }
        let donorDER = try der(donor.pkcs8PEM)
        let ownerPoint = try der(owner.pkcs8PEM).suffix(65)
        try #require(ownerPoint.first == 0x04 && donorDER.suffix(65).first == 0x04)
        try #require(try der(owner.publicKey.pem).suffix(65) == ownerPoint, "the point is the owner's public key")
        let spliced = Data(donorDER.dropLast(65) + ownerPoint).base64EncodedString(options: .lineLength64Characters)
        return "-----BEGIN PRIVATE KEY-----\n\(spliced)\n-----END PRIVATE KEY-----\n"
    }

    @Test("A P-256 key whose public point is not its private scalar's (another key's) is refused, PKCS#8 and SEC1")
    func mismatchedECKey() throws {
        let owner = ES256PrivateKey.generate()
        let donor = ES256PrivateKey.generate()
        let directory = try TemporaryDirectory()
        let pkcs8 = try directory.write("mixed.pem", try Self.mismatched(privateOf: donor, publicOf: owner))
        // OpenSSL itself reads the owner's public key from it, and converts it to SEC1 as it is.
        let sec1 = try openssl("ec", "-in", pkcs8, "-out", directory.path("sec1.pem"))
        try #require(sec1.status == 0, "\(sec1.stderr)")
        for file in ["mixed.pem", "sec1.pem"] {
            let pub = try openssl("pkey", "-in", directory.path(file), "-pubout")
            try #require(pub.status == 0 && pub.stdout == owner.publicKey.pem, "\(file): \(pub.stderr)")
            let pem = try directory.read(file)
            let error = #expect(throws: CryptoError.self, "\(file)") { try ES256PrivateKey(pem: pem) }
            #expect(error?.code == .invalidKey)
            #expect(error?.description.contains("public key does not belong to its private key") == true)
        }
        // A SEC1 key without its public point is completed from the scalar, and loads as the donor's.
        let bare = try openssl(
            "ec", "-in", directory.path("sec1.pem"), "-no_public", "-out", directory.path("bare.pem"))
        try #require(bare.status == 0, "\(bare.stderr)")
        let completed = try ES256PrivateKey(pem: try directory.read("bare.pem"))
        #expect(completed.publicKey.fingerprint == donor.publicKey.fingerprint)
    }

    @Test("An RSA key whose public exponent is not the one its private exponent pairs with is refused")
    func mismatchedRSAKey() throws {
        let directory = try TemporaryDirectory()
        let source = try directory.write("key.pem", try RS256PrivateKey.generate().pkcs8PEM)
        let converted = try openssl(
            "rsa", "-in", source, "-traditional", "-outform", "DER", "-out", directory.path("key.der"))
        try #require(converted.status == 0, "\(converted.stderr)")
        var der = Array(try Data(contentsOf: URL(fileURLWithPath: directory.path("key.der"))))
        // RSAPrivateKey { version, n, e, d, … }: e = 65537 (INTEGER 01 00 01) right after n; make it 65539.
        let exponent: [UInt8] = [0x02, 0x03, 0x01, 0x00, 0x01]
        let at = try #require((0..<(der.count - 5)).first { Array(der[$0..<$0 + 5]) == exponent })
        der[at + 4] = 0x03
        try directory.write("mixed.der", der)
        let mixed = try openssl(
            "rsa", "-inform", "DER", "-in", directory.path("mixed.der"), "-traditional", "-out",
            directory.path("mixed.pem"))
        try #require(mixed.status == 0, "\(mixed.stderr)")
        let error = #expect(throws: CryptoError.self) { try RS256PrivateKey(pem: try directory.read("mixed.pem")) }
        #expect(error?.code == .invalidKey)
        #expect(error?.description.contains("public key does not belong to its private key") == true)
    }

    @Test("An encrypted PKCS#8 key fails to load instead of prompting for a passphrase")
    func encryptedKey() throws {
        let directory = try TemporaryDirectory()
        let plain = try directory.write(
            "plain.pem", try cliKey(["ecparam", "-name", "prime256v1", "-genkey", "-noout"]).privatePEM)
        let encrypted = try openssl(
            "pkcs8", "-topk8", "-v2", "aes256", "-passout", "pass:secret", "-in", plain, "-out",
            directory.path("enc.pem"))
        try #require(encrypted.status == 0, "\(encrypted.stderr)")
        let privatePEM = try directory.read("enc.pem")
        try #require(privatePEM.contains("ENCRYPTED PRIVATE KEY"))
        let error = #expect(throws: CryptoError.self) { try ES256PrivateKey(pem: privatePEM) }
        #expect(error?.code == .invalidKey)
    }
}

@Suite("Keys under concurrency")
struct KeyConcurrencyTests {
    @Test("One key signs and verifies from many tasks at once")
    func concurrentSigning() async throws {
        let es = ES256PrivateKey.generate()
        let rs = try RS256PrivateKey.generate()
        let results = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<64 {
                group.addTask {
                    let message = Array("message-\(index)".utf8)
                    guard let esSignature = try? es.sign(message), let rsSignature = try? rs.sign(message) else {
                        return false
                    }
                    return es.publicKey.verify(signature: esSignature, message: message)
                        && rs.publicKey.verify(signature: rsSignature, message: message)
                        && !es.publicKey.verify(signature: esSignature, message: message + [0])
                }
            }
            var all: [Bool] = []
            for await result in group { all.append(result) }
            return all
        }
        #expect(results.count == 64)
        #expect(results.allSatisfy { $0 })
    }
}
