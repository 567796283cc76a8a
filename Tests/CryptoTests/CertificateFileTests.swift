import Foundation
import Testing

@testable import Crypto

/// `MARQUEE_CA_FILE` is checked as TLS loads it, so that a wrong file stops the process at start.
@Suite("CA files")
struct CertificateFileTests {
    @Test("a PEM certificate loads; a directory, a key, text and a missing file are refused, each saying why")
    func checked() throws {
        let dir = NSTemporaryDirectory() + "ca-files-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let ca = try TestPKI.makeCA(commonName: "Test CA")
        func file(_ name: String, _ text: String) throws -> String {
            try text.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
            return dir + "/" + name
        }
        #expect(CertificateFile.problem(path: try file("ca.pem", ca.certificatePEM)) == nil)
        // Two certificates with text between them (a bundle) load too.
        let other = try TestPKI.makeCA(commonName: "Test CA")
        let bundle = "# one\n" + ca.certificatePEM + "\n# two\n" + other.certificatePEM
        #expect(CertificateFile.problem(path: try file("bundle.pem", bundle)) == nil)
        #expect(CertificateFile.problem(path: dir)?.contains("directory") == true)
        #expect(
            CertificateFile.problem(path: try file("key.pem", ca.privateKeyPEM))?.contains("no PEM certificate") == true
        )
        #expect(CertificateFile.problem(path: try file("hello.txt", "hello"))?.contains("no PEM certificate") == true)
        #expect(CertificateFile.problem(path: dir + "/missing.pem") == "is not a readable file")
    }
}
