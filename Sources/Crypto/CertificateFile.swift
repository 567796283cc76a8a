import COpenSSL
import Foundation

/// A file of trusted CA certificates (`MARQUEE_CA_FILE`), checked the way TLS contexts load it
/// (`SSL_CTX_load_verify_locations`, which reads PEM certificates and CRLs and fails on a file with none), so that a
/// wrong file stops the process at start instead of failing every connection later.
public enum CertificateFile {
    /// Nil when `path` loads; otherwise why not.
    public static func problem(path: String) -> String? {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory),
            FileManager.default.isReadableFile(atPath: path)
        else { return "is not a readable file" }
        guard !isDirectory.boolValue else { return "is a directory, not a file of PEM certificates" }
        guard let store = X509_STORE_new() else { return "could not be checked (out of memory)" }
        defer { X509_STORE_free(store) }
        guard X509_STORE_load_file(store, path) == 1 else {
            _ = drainOpenSSLErrors()
            return "holds no PEM certificate (a CA file is one or more BEGIN CERTIFICATE blocks)"
        }
        return nil
    }
}
