import Crypto
import Foundation
import Testing

@Suite("Test PKI")
struct TestPKITests {
    @Test("The server certificate chains to the CA and matches localhost and 127.0.0.1 per openssl")
    func chainAndNames() throws {
        let ca = try TestPKI.makeCA(commonName: "Marquee Test CA")
        let server = try TestPKI.makeServerCertificate(
            ca: ca, dnsNames: ["localhost", "apns.test"], ipAddresses: ["127.0.0.1", "::1"])
        #expect(server.certPEM.hasPrefix("-----BEGIN CERTIFICATE-----"))
        #expect(server.keyPEM.hasPrefix("-----BEGIN PRIVATE KEY-----"))

        let directory = try TemporaryDirectory()
        let caPath = try directory.write("ca.pem", ca.certificatePEM)
        let certPath = try directory.write("server.pem", server.certPEM)

        let verify = try openssl("verify", "-CAfile", caPath, "-purpose", "sslserver", certPath)
        #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
        #expect(verify.stdout.contains("OK"))

        let check = try openssl(
            "x509", "-in", certPath, "-noout", "-checkhost", "apns.test", "-checkip", "127.0.0.1", "-subject")
        #expect(check.status == 0)
        #expect(check.stdout.contains("Hostname apns.test does match certificate"))
        #expect(check.stdout.contains("IP 127.0.0.1 does match certificate"))
        #expect(check.stdout.contains("CN = localhost"))

        let miss = try openssl("x509", "-in", certPath, "-noout", "-checkhost", "example.com", "-checkip", "10.0.0.1")
        #expect(miss.stdout.contains("does NOT match certificate"))

        let caText = try openssl("x509", "-in", caPath, "-noout", "-subject", "-issuer", "-ext", "basicConstraints")
        #expect(caText.stdout.contains("subject=CN = Marquee Test CA"))
        #expect(caText.stdout.contains("issuer=CN = Marquee Test CA"))
        #expect(caText.stdout.contains("CA:TRUE"))
    }

    @Test("A certificate does not verify against a different CA")
    func otherCARejects() throws {
        let ca = try TestPKI.makeCA(commonName: "CA one")
        let other = try TestPKI.makeCA(commonName: "CA one")
        let server = try TestPKI.makeServerCertificate(ca: ca)
        let directory = try TemporaryDirectory()
        let verify = try openssl(
            "verify", "-CAfile", try directory.write("other.pem", other.certificatePEM),
            try directory.write("server.pem", server.certPEM))
        #expect(verify.status != 0)
    }

    @Test("The returned key belongs to the certificate, and certificate PEM loads as a verifier")
    func keyMatchesCertificate() throws {
        let ca = try TestPKI.makeCA(commonName: "Marquee Test CA")
        let server = try TestPKI.makeServerCertificate(ca: ca)
        let key = try ES256PrivateKey(pem: server.keyPEM)
        let verifier = try ES256PublicKey(pem: server.certPEM)
        #expect(verifier.pem == key.publicKey.pem)
        let token = try JWT.sign(claims: ["sub": "tls"], signer: key)
        #expect(try JWT.verify(token, verifier: verifier).claims["sub"] == "tls")
    }

    @Test("Invalid alternative names are rejected")
    func badNames() throws {
        let ca = try TestPKI.makeCA(commonName: "Marquee Test CA")
        #expect(throws: CryptoError.self) { try TestPKI.makeServerCertificate(ca: ca, ipAddresses: ["not-an-ip"]) }
        #expect(throws: CryptoError.self) {
            try TestPKI.makeServerCertificate(ca: ca, dnsNames: ["a,IP:1.2.3.4"], ipAddresses: [])
        }
        #expect(throws: CryptoError.self) { try TestPKI.makeServerCertificate(ca: ca, dnsNames: [], ipAddresses: []) }
    }
}
