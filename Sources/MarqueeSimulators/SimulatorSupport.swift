import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization

/// The TLS side shared by both simulators: a fresh CA and server certificate, the CA written out for clients.
struct SimulatorTLS: Sendable {
    let caCertificatePEM: String
    let server: TLSServerConfiguration

    init(name: String, dnsNames: [String], ipAddresses: [String]) throws {
        do {
            let ca = try TestPKI.makeCA(commonName: "Marquee \(name) Simulator CA")
            let (certificate, key) = try TestPKI.makeServerCertificate(
                ca: ca, commonName: dnsNames.first ?? ipAddresses.first, dnsNames: dnsNames, ipAddresses: ipAddresses
            )
            caCertificatePEM = ca.certificatePEM
            server = TLSServerConfiguration(certificateChainPEM: certificate, privateKeyPEM: key)
        } catch {
            throw SimulatorError(.certificateFailed, "cannot create the simulator's certificates", details: "\(error)")
        }
    }

    /// The SANs for a listen host: always `localhost`, `127.0.0.1` and `::1`, plus the host itself.
    static func subjectAlternativeNames(host: String) -> (dns: [String], ip: [String]) {
        var ip = ["127.0.0.1", "::1"]
        if !ip.contains(host) && host != "0.0.0.0" && host != "::" && host.contains(where: { $0 == "." || $0 == ":" }) {
            ip.append(host)
        }
        return (["localhost"], ip)
    }

    /// Writes the CA certificate to `path`, creating parent directories.
    func writeCA(to path: String) throws {
        do {
            let directory = (path as NSString).deletingLastPathComponent
            if !directory.isEmpty {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            }
            try caCertificatePEM.write(toFile: path, atomically: true, encoding: .utf8)
        } catch {
            throw SimulatorError(.ioFailed, "cannot write the CA certificate", details: "\(path): \(error)")
        }
    }
}

/// Accepted requests (in memory, per token, and as JSON lines in a file) and counters.
///
/// A record is kept as a closure that builds its JSON, run only when it is read (`/_sim/…`) or written to the records
/// file: formatting times and building objects for every accepted push cost more than the rest of a request.
final class Recorder: Sendable {
    /// A record's JSON, built on demand.
    typealias Record = @Sendable () -> JSONValue

    private struct State {
        /// The kept records with their tokens, oldest first, from `head` on. One append per accepted push; a read
        /// for one token walks them (reads are rare, accepts are every request).
        var kept: [(token: String, record: Record)] = []
        var head = 0
        var accepted = 0
        /// When the last push was accepted (seconds since 1970), for measuring a fan-out's end without polling fast.
        var lastAcceptedAt: Double?
        var rejected: [String: Int] = [:]
        var injected: [String: Int] = [:]
    }

    private let state = Mutex(State())
    /// The records file descriptor (-1 without a file); writes are serialized by the lock.
    private let file: Mutex<Int32>
    /// Whether there is a records file (then each record is serialized as it is accepted).
    private let hasFile: Bool
    private let memoryLimit: Int

    init(path: String?, memoryLimit: Int) throws {
        self.memoryLimit = max(1, memoryLimit)
        hasFile = path != nil
        guard let path else {
            file = Mutex(-1)
            return
        }
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw SimulatorError(
                .ioFailed, "cannot open the records file", details: "\(path): \(String(cString: strerror(errno)))")
        }
        file = Mutex(fd)
    }

    deinit {
        file.withLock { fd in
            if fd >= 0 { close(fd) }
        }
    }

    /// What a record past the memory limit is replaced with until its slot is compacted away (frees what it held).
    private static let dropped: Record = { .null }

    /// Keeps `record` for `token` and, with a records file, appends its JSON to the file as one line.
    func accept(token: String, record: @escaping Record) {
        let at = Date().timeIntervalSince1970
        state.withLock { state in
            state.accepted += 1
            state.lastAcceptedAt = at
            state.kept.append((token, record))
            if state.kept.count - state.head > memoryLimit {
                state.kept[state.head].record = Self.dropped
                state.head += 1
                if state.head > 4096 && state.head * 2 > state.kept.count {
                    state.kept.removeFirst(state.head)
                    state.head = 0
                }
            }
        }
        guard hasFile else { return }
        let line = Array((record().serialized() + "\n").utf8)
        file.withLock { fd in
            guard fd >= 0 else { return }
            line.withUnsafeBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    let written = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                    if written < 0 && errno == EINTR { continue }
                    if written <= 0 { return }
                    offset += written
                }
            }
        }
    }

    /// Counts a rejected request by its reason (APNs reason or FCM error code).
    func reject(reason: String) {
        state.withLock { $0.rejected[reason, default: 0] += 1 }
    }

    /// Counts an injected fault by action name.
    func inject(_ action: FaultRule.Action) {
        state.withLock { $0.injected[action.rawValue, default: 0] += 1 }
    }

    /// The kept records for `token`, or all kept records (oldest first) when `nil`.
    func records(token: String?) -> [JSONValue] {
        let kept: [Record] = state.withLock { state in
            let live = state.kept[state.head...]
            guard let token else { return live.map(\.record) }
            return live.compactMap { $0.token == token ? $0.record : nil }
        }
        return kept.map { $0() }
    }

    /// Forgets records and counters (the file is kept).
    func reset() {
        state.withLock { $0 = State() }
    }

    /// Counters as JSON: `accepted`, `last_accepted_at` (seconds since 1970, once one was), `rejected` (by reason),
    /// `rejected_total`, `injected` (by action).
    var statistics: [String: JSONValue] {
        state.withLock { state in
            var statistics: [String: JSONValue] = [
                "accepted": .int(Int64(state.accepted)),
                "rejected": .object(state.rejected.mapValues { .int(Int64($0)) }),
                "rejected_total": .int(Int64(state.rejected.values.reduce(0, +))),
                "injected": .object(state.injected.mapValues { .int(Int64($0)) }),
            ]
            if let last = state.lastAcceptedAt { statistics["last_accepted_at"] = .double(last) }
            return statistics
        }
    }

    var acceptedCount: Int { state.withLock { $0.accepted } }

    func rejectedCount(_ reason: String) -> Int { state.withLock { $0.rejected[reason] ?? 0 } }
}

/// Request-target and body helpers.
enum HTTPText {
    /// Splits `/a/b?x=1&y=2` into the path and its decoded query parameters.
    static func splitTarget(_ target: String) -> (path: String, query: [String: String]) {
        guard let mark = target.firstIndex(of: "?") else { return (target, [:]) }
        let path = String(target[..<mark])
        return (path, parseForm(String(target[target.index(after: mark)...])))
    }

    /// Parses `application/x-www-form-urlencoded` text (also query strings); the first value of a name wins.
    static func parseForm(_ text: String) -> [String: String] {
        var result: [String: String] = [:]
        for pair in text.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = percentDecode(parts[0]) else { continue }
            let value = parts.count > 1 ? percentDecode(parts[1]) : ""
            if result[name] == nil, let value { result[name] = value }
        }
        return result
    }

    /// Decodes `%XX` escapes and `+` as space; `nil` for a broken escape or invalid UTF-8.
    static func percentDecode(_ text: some StringProtocol) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"): bytes.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                    return nil
                }
                bytes.append(high << 4 | low)
            default: bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// A JSON response with `content-type: application/json`.
    static func json(_ status: Int, _ body: JSONValue, headers: [(String, String)] = []) -> HTTP2ServerResponse {
        HTTP2ServerResponse(
            status: status, headers: [("content-type", "application/json")] + headers, body: body.bytes)
    }

    /// The token of an `authorization: Bearer <token>` header (scheme case-insensitive), or `nil`.
    static func bearerToken(_ header: String?) -> String? {
        guard let header else { return nil }
        // Byte-level (every push): spaces, the scheme in any case, a space, then the token without surrounding blanks.
        var text = header[...]
        while text.utf8.first == 0x20 { text = text.dropFirst() }
        let scheme = "bearer".utf8
        guard text.utf8.count > scheme.count,
            zip(text.utf8, scheme).allSatisfy({ $0 | 0x20 == $1 }),
            text.utf8.dropFirst(scheme.count).first == 0x20
        else { return nil }
        let token = trimmed(Substring(text.utf8.dropFirst(scheme.count)))
        return token.isEmpty ? nil : String(token)
    }

    /// `text` without leading and trailing spaces and tabs (byte-level: `trimmingCharacters` cost microseconds).
    static func trimmed(_ text: Substring) -> Substring {
        var text = text
        while let first = text.utf8.first, first == 0x20 || first == 0x09 { text = text.dropFirst() }
        while let last = text.utf8.last, last == 0x20 || last == 0x09 { text = text.dropLast() }
        return text
    }

    /// ISO 8601 UTC with milliseconds.
    static func timestamp(_ date: Date) -> String {
        date.ISO8601Format(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
    }
}

/// The header and claims of a compact JWT, decoded without verifying it (to find `kid` / `iss` first).
struct UnverifiedJWT {
    var header: [String: JSONValue]
    var claims: [String: JSONValue]

    init?(_ token: String) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
            let headerBytes = Base64URL.decode(parts[0]), let claimsBytes = Base64URL.decode(parts[1]),
            let header = (try? JSONValue.parse(headerBytes))?.objectValue,
            let claims = (try? JSONValue.parse(claimsBytes))?.objectValue
        else { return nil }
        self.header = header
        self.claims = claims
    }
}

/// The handler and server shared by both simulators.
final class SimulatorHost: Sendable {
    let tls: SimulatorTLS
    let server: HTTP2Server
    let caOutputPath: String?

    init(
        name: String, host: String, port: Int, caOutputPath: String?, ioThreads: Int,
        responder: @escaping @Sendable (HTTP2ServerRequest) -> HTTP2ServerReply
    ) throws {
        let names = SimulatorTLS.subjectAlternativeNames(host: host)
        tls = try SimulatorTLS(name: name, dnsNames: names.dns, ipAddresses: names.ip)
        self.caOutputPath = caOutputPath
        server = HTTP2Server(
            host: host, port: port, tls: tls.server, maxConcurrentStreams: 1000, ioThreads: ioThreads,
            responder: responder)
    }

    private let started = Atomic<Bool>(false)

    /// Writes the CA file and binds the port, once (later calls do nothing).
    func start() throws {
        guard !started.exchange(true, ordering: .sequentiallyConsistent) else { return }
        if let caOutputPath { try tls.writeCA(to: caOutputPath) }
        do {
            try server.start()
        } catch {
            throw SimulatorError(.invalidConfiguration, "cannot start the server", details: "\(error)")
        }
    }

    /// The bound port (after `start()`).
    var port: Int { server.boundPort }

    /// Starts if needed and serves until `stop()` or cancellation (then stops gracefully).
    func run() async throws {
        try start()
        try await server.run()
    }

    /// Stops gracefully (GOAWAY, in-flight streams finish).
    func stop() async { await server.stop() }
}

extension FaultRule {
    /// The reply to a request this rule matched: `answer` at once, or after the rule's latency in a task (never a
    /// sleep on the connection's I/O thread).
    func reply(_ answer: @escaping @Sendable () -> HTTP2ServerResponse) -> HTTP2ServerReply {
        guard let latency = latencyMilliseconds, latency > 0 else { return .now(answer()) }
        return .later {
            try? await Task.sleep(for: .milliseconds(latency))
            return answer()
        }
    }
}
