import COpenSSL
import Foundation

/// A throwaway certificate authority and server certificates for local TLS simulators and tests.
///
/// Keys are ECDSA P-256, signatures ECDSA-SHA256, certificates X.509 v3 with random 127-bit serials. Nothing here is
/// meant for production trust: the private keys are returned as plain PEM.
public enum TestPKI {
    /// A self-signed CA certificate and its private key, both PEM.
    public struct CertificateAuthority: Sendable {
        /// The CA certificate (`BEGIN CERTIFICATE`); give it to clients as their trust root.
        public let certificatePEM: String
        /// The CA private key as PKCS#8 PEM.
        public let privateKeyPEM: String

        /// Wraps a CA made earlier (for example one saved to disk by a simulator).
        public init(certificatePEM: String, privateKeyPEM: String) {
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
        }
    }

    /// The default lifetime of generated certificates: 30 days.
    public static let defaultValidity: TimeInterval = 30 * 24 * 3600

    /// Makes a self-signed CA (`basicConstraints=critical,CA:TRUE,pathlen:0`, key usage `keyCertSign,cRLSign`).
    public static func makeCA(
        commonName: String, validity: TimeInterval = defaultValidity
    ) throws -> CertificateAuthority {
        let key = ES256PrivateKey.generate()
        let pem = try buildCertificate(
            commonName: commonName, subjectKey: key.key, issuer: nil, issuerKey: key.key, validity: validity,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
                (NID_authority_key_identifier, "keyid:always"),
            ])
        return CertificateAuthority(certificatePEM: pem, privateKeyPEM: key.pkcs8PEM)
    }

    /// Makes a server certificate signed by `ca`, with the given DNS and IP subject alternative names
    /// (`extendedKeyUsage=serverAuth`). Returns the certificate PEM and the server's PKCS#8 private key PEM.
    public static func makeServerCertificate(
        ca: CertificateAuthority, commonName: String? = nil, dnsNames: [String] = ["localhost"],
        ipAddresses: [String] = ["127.0.0.1"], validity: TimeInterval = defaultValidity
    ) throws -> (certPEM: String, keyPEM: String) {
        guard !dnsNames.isEmpty || !ipAddresses.isEmpty else {
            throw CryptoError(.certificateFailed, "a server certificate needs at least one DNS name or IP address")
        }
        for name in dnsNames + ipAddresses {
            let allowed = name.utf8.allSatisfy { char in
                char < 0x80 && char != UInt8(ascii: ",") && char > 0x20
            }
            guard allowed, !name.isEmpty else {
                throw CryptoError(
                    .certificateFailed, "subject alternative names must be non-empty ASCII without commas")
            }
        }
        guard let caKey = EVPKey.privateKey(pem: ca.privateKeyPEM) else {
            throw CryptoError.openSSL(.invalidKey, "expected the CA private key as PEM")
        }
        let caCertificate = withMemoryBIO(ca.certificatePEM) { PEM_read_bio_X509($0, nil, refusePassphrase, nil) }
        guard let caCertificate else {
            throw CryptoError.openSSL(.certificateFailed, "expected the CA certificate as PEM")
        }
        defer { X509_free(caCertificate) }

        let key = ES256PrivateKey.generate()
        let alternativeNames = (dnsNames.map { "DNS:" + $0 } + ipAddresses.map { "IP:" + $0 }).joined(separator: ",")
        let pem = try buildCertificate(
            commonName: commonName ?? dnsNames.first ?? ipAddresses[0], subjectKey: key.key, issuer: caCertificate,
            issuerKey: caKey, validity: validity,
            extensions: [
                (NID_basic_constraints, "critical,CA:FALSE"),
                (NID_key_usage, "critical,digitalSignature"),
                (NID_ext_key_usage, "serverAuth"),
                (NID_subject_alt_name, alternativeNames),
                (NID_subject_key_identifier, "hash"),
                (NID_authority_key_identifier, "keyid,issuer"),
            ])
        return (pem, key.pkcs8PEM)
    }

    /// Builds, signs and PEM-encodes one certificate. `issuer == nil` means self-signed.
    private static func buildCertificate(
        commonName: String, subjectKey: EVPKey, issuer: OpaquePointer?, issuerKey: EVPKey, validity: TimeInterval,
        extensions: [(Int32, String)]
    ) throws -> String {
        func fail(_ step: String) -> CryptoError {
            CryptoError.openSSL(.certificateFailed, "building a certificate failed at \(step)")
        }
        guard let certificate = X509_new() else { throw fail("allocation") }
        defer { X509_free(certificate) }
        guard X509_set_version(certificate, 2) == 1 else { throw fail("version") }

        var serial = SecureRandom.bytes(16)
        serial[0] = serial[0] & 0x7F | 0x01  // positive and never zero
        guard let serialNumber = BN_bin2bn(serial, Int32(serial.count), nil) else { throw fail("serial") }
        defer { BN_free(serialNumber) }
        guard BN_to_ASN1_INTEGER(serialNumber, X509_get_serialNumber(certificate)) != nil else {
            throw fail("serial")
        }

        guard X509_gmtime_adj(X509_getm_notBefore(certificate), -300) != nil,
            X509_gmtime_adj(X509_getm_notAfter(certificate), Int(validity)) != nil
        else { throw fail("validity") }
        guard X509_set_pubkey(certificate, subjectKey.pointer) == 1 else { throw fail("public key") }

        guard let subject = X509_get_subject_name(certificate) else { throw fail("subject") }
        let name = Array(commonName.utf8)
        guard !name.isEmpty,
            X509_NAME_add_entry_by_txt(subject, "CN", copenssl_MBSTRING_UTF8(), name, Int32(name.count), -1, 0) == 1
        else { throw fail("common name") }
        let issuerName = issuer.map { X509_get_subject_name($0) } ?? subject
        guard X509_set_issuer_name(certificate, issuerName) == 1 else { throw fail("issuer") }

        var context = X509V3_CTX()
        X509V3_set_ctx(&context, issuer ?? certificate, certificate, nil, nil, 0)
        for (nid, value) in extensions {
            guard let ext = X509V3_EXT_conf_nid(nil, &context, nid, value) else { throw fail("extension \(nid)") }
            defer { X509_EXTENSION_free(ext) }
            guard X509_add_ext(certificate, ext, -1) == 1 else { throw fail("extension \(nid)") }
        }

        guard X509_sign(certificate, issuerKey.pointer, EVP_sha256()) > 0 else { throw fail("signing") }
        guard let pem = writeMemoryBIO({ PEM_write_bio_X509($0, certificate) }) else { throw fail("encoding") }
        return pem
    }
}
