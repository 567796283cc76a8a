import COpenSSL
import Foundation
import Synchronization

/// TLS settings of `HTTP2Client`. Certificate verification is always on: the peer's chain must verify against the
/// system trust store (plus `caFile`) and its certificate must match the host name or IP address.
public struct TLSClientConfiguration: Sendable, Hashable {
    /// An extra PEM file of trusted CA certificates (e.g. the value of `MARQUEE_CA_FILE`), added to the system store.
    public var caFile: String?
    /// The name sent as SNI and checked against the certificate; `nil` uses the client's host.
    public var serverName: String?

    /// Creates a configuration.
    public init(caFile: String? = nil, serverName: String? = nil) {
        self.caFile = caFile
        self.serverName = serverName
    }
}

/// TLS settings of `HTTP2Server`.
public struct TLSServerConfiguration: Sendable {
    /// The certificate chain, leaf first, as PEM.
    public var certificateChainPEM: String
    /// The private key of the leaf as PEM.
    public var privateKeyPEM: String

    /// Creates a configuration from PEM text.
    public init(certificateChainPEM: String, privateKeyPEM: String) {
        self.certificateChainPEM = certificateChainPEM
        self.privateKeyPEM = privateKeyPEM
    }

    /// Reads the chain and key from PEM files.
    public init(certificateChainFile: String, privateKeyFile: String) throws {
        do {
            certificateChainPEM = try String(contentsOfFile: certificateChainFile, encoding: .utf8)
            privateKeyPEM = try String(contentsOfFile: privateKeyFile, encoding: .utf8)
        } catch {
            throw HTTP2Error(
                .invalidConfiguration, "cannot read the certificate or key file", details: "\(error)")
        }
    }
}

/// The OpenSSL error queue of this thread as text (and cleared).
func openSSLErrors() -> String {
    var messages: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        messages.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return messages.isEmpty ? "no OpenSSL error" : messages.joined(separator: "; ")
}

/// An `SSL_CTX` shared by the connections of one client or server.
///
/// The pointer sits in a `Mutex`: OpenSSL allows `SSL_new` from several threads, but the lock keeps every use of
/// the context serialized without relying on that, and it is only taken when a connection is set up.
final class TLSContext: Sendable {
    private let context: Mutex<OpaquePointer>

    private init(_ context: sending OpaquePointer) {
        self.context = Mutex(context)
    }

    deinit {
        context.withLock { SSL_CTX_free($0) }
    }

    /// A new `SSL` object, or `nil` when OpenSSL is out of memory.
    func makeSSL() -> OpaquePointer? {
        context.withLock { SSL_new($0) }
    }

    /// A client context: TLS 1.2+, ALPN `h2`, peer verification against the system store plus `caFile`.
    static func client(_ configuration: TLSClientConfiguration) throws -> TLSContext {
        ERR_clear_error()
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw HTTP2Error(.tlsFailed, "cannot create a TLS context", details: openSSLErrors())
        }
        do {
            try configureClient(context, configuration)
        } catch {
            SSL_CTX_free(context)
            throw error
        }
        return TLSContext(context)
    }

    private static func configureClient(_ context: OpaquePointer, _ configuration: TLSClientConfiguration) throws {
        try configureCommon(context)
        guard SSL_CTX_set_default_verify_paths(context) == 1 else {
            throw HTTP2Error(.invalidConfiguration, "cannot load the system trust store", details: openSSLErrors())
        }
        if let caFile = configuration.caFile {
            guard SSL_CTX_load_verify_locations(context, caFile, nil) == 1 else {
                throw HTTP2Error(.invalidConfiguration, "cannot load the CA file", details: openSSLErrors())
            }
        }
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        let protocols: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        guard SSL_CTX_set_alpn_protos(context, protocols, UInt32(protocols.count)) == 0 else {
            throw HTTP2Error(.tlsFailed, "cannot set ALPN", details: openSSLErrors())
        }
    }

    /// A server context: TLS 1.2+, the given chain and key, ALPN selecting `h2` only.
    static func server(_ configuration: TLSServerConfiguration) throws -> TLSContext {
        ERR_clear_error()
        guard let context = SSL_CTX_new(TLS_server_method()) else {
            throw HTTP2Error(.tlsFailed, "cannot create a TLS context", details: openSSLErrors())
        }
        do {
            try configureServer(context, configuration)
        } catch {
            SSL_CTX_free(context)
            throw error
        }
        return TLSContext(context)
    }

    private static func configureServer(_ context: OpaquePointer, _ configuration: TLSServerConfiguration) throws {
        try configureCommon(context)
        var certificates: [OpaquePointer] = []
        withMemoryBIO(configuration.certificateChainPEM) { bio in
            while let certificate = PEM_read_bio_X509(bio, nil, nil, nil) { certificates.append(certificate) }
        }
        ERR_clear_error()  // the loop ends on a "no start line" error
        guard let leaf = certificates.first else {
            throw HTTP2Error(.invalidConfiguration, "the certificate chain PEM holds no certificate")
        }
        defer { X509_free(leaf) }
        guard SSL_CTX_use_certificate(context, leaf) == 1 else {
            for certificate in certificates.dropFirst() { X509_free(certificate) }
            throw HTTP2Error(.invalidConfiguration, "the certificate was rejected", details: openSSLErrors())
        }
        for certificate in certificates.dropFirst() {
            // ownership passes to the context on success
            if copenssl_SSL_CTX_add_extra_chain_cert(context, certificate) != 1 { X509_free(certificate) }
        }
        let key = withMemoryBIO(configuration.privateKeyPEM) { PEM_read_bio_PrivateKey($0, nil, nil, nil) }
        guard let key else {
            throw HTTP2Error(.invalidConfiguration, "the private key PEM is unreadable", details: openSSLErrors())
        }
        defer { EVP_PKEY_free(key) }
        guard SSL_CTX_use_PrivateKey(context, key) == 1, SSL_CTX_check_private_key(context) == 1 else {
            throw HTTP2Error(
                .invalidConfiguration, "the private key does not match the certificate", details: openSSLErrors())
        }
        SSL_CTX_set_alpn_select_cb(context, selectH2, nil)
    }

    private static func configureCommon(_ context: OpaquePointer) throws {
        guard copenssl_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) == 1 else {
            throw HTTP2Error(.tlsFailed, "cannot require TLS 1.2", details: openSSLErrors())
        }
        _ = copenssl_SSL_CTX_set_nonblocking_write_modes(context)
        // RFC 9113 §9.2.2 forbids renegotiation under HTTP/2
        _ = copenssl_SSL_CTX_disable_renegotiation(context)
    }

    private static func withMemoryBIO<R>(_ text: String, _ body: (OpaquePointer) -> R) -> R {
        var bytes = Array(text.utf8)
        return bytes.withUnsafeMutableBytes { buffer in
            let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count))!
            defer { BIO_free(bio) }
            return body(bio)
        }
    }
}

/// ALPN selection for the server: `h2` or a fatal `no_application_protocol` alert.
private func selectH2(
    _ ssl: OpaquePointer?, _ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
    _ outLength: UnsafeMutablePointer<UInt8>?, _ input: UnsafePointer<UInt8>?, _ inputLength: UInt32,
    _ argument: UnsafeMutableRawPointer?
) -> Int32 {
    guard let input, let out, let outLength else { return SSL_TLSEXT_ERR_ALERT_FATAL }
    var index = 0
    let count = Int(inputLength)
    while index < count {
        let length = Int(input[index])
        let start = index + 1
        if start + length > count { break }
        if length == 2 && input[start] == UInt8(ascii: "h") && input[start + 1] == UInt8(ascii: "2") {
            out.pointee = input + start
            outLength.pointee = 2
            return SSL_TLSEXT_ERR_OK
        }
        index = start + length
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL
}

/// Whether `host` is an IPv4 or IPv6 literal.
func isIPAddress(_ host: String) -> Bool {
    var v4 = in_addr()
    var v6 = in6_addr()
    return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
}
