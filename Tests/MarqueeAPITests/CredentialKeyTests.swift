import Foundation
import HTTPServer
import MarqueeCore
import Testing

@testable import MarqueeAPI

/// The keys `PUT /v1/credentials/fcm` takes, checked without a database.
@Suite("credential keys at upload")
struct CredentialKeyTests {
    @Test("a service-account key over 4096 bits is a 422 for service_account.private_key that says why; 2048 is taken")
    func oversizedServiceAccountKey() throws {
        try CredentialRoutes.checkServiceAccountKey(try opensslRSAKey(bits: 2048))
        do {
            try CredentialRoutes.checkServiceAccountKey(try opensslRSAKey(bits: 4160))
            Issue.record("a 4160-bit key was accepted")
        } catch {
            let rendered = try #require(problem(for: error))
            #expect(rendered.status == 422)
            #expect(rendered.field == "service_account.private_key")
            #expect(rendered.detail?.contains("2048 to 4096 bits") == true, "\(rendered.detail ?? "")")
            #expect(rendered.detail?.contains("4160 bits") == true, "\(rendered.detail ?? "")")
        }
    }
}

/// An RSA private key of `bits` bits as PKCS#8 PEM, made by the openssl tool: `RS256PrivateKey.generate` refuses the
/// sizes this suite needs refused.
///
/// posix_spawn and `waitpid` rather than Foundation's `Process`, whose `waitUntilExit` was seen to hang on Linux
/// (CryptoTests' `runCommand`).
private func opensslRSAKey(bits: Int) throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("api-key-\(UUID().uuidString).pem").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    let arguments = ["/usr/bin/openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:\(bits)"]
    let argv = (arguments + ["-out", path]).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    for fd: Int32 in [0, 1, 2] { posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0) }
    var pid: pid_t = 0
    guard posix_spawn(&pid, arguments[0], &actions, nil, argv, environ) == 0 else {
        throw CocoaError(.executableLoad)
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
    return try String(contentsOfFile: path, encoding: .utf8)
}
