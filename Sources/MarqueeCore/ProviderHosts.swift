import Foundation

/// The operator's allowlist of provider hosts (`MARQUEE_PROVIDER_HOSTS`): where a tenant's credential `endpoint`
/// (APNs, FCM) and FCM `token_uri` may point. The one home of this rule: the API checks it at upload and the worker
/// again before it connects.
///
/// Entries are `host` (any port) or `host:port` (`[v6]:port` for IPv6), comma-separated, case-insensitive. Apple's
/// and Google's hosts (`defaultHosts`) must resolve to public addresses; any other host the operator lists is
/// trusted to resolve wherever it does (a simulator on loopback, a proxy on a private network).
public struct ProviderHosts: Sendable, Equatable, CustomStringConvertible {
    /// One allowed host, optionally restricted to a port.
    public struct Entry: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int?

        public init(host: String, port: Int? = nil) {
            self.host = host.lowercased()
            self.port = port
        }

        public var description: String {
            guard let port else { return host }
            return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        }
    }

    /// Apple's and Google's hosts, the default: APNs production and sandbox, APNs broadcast channel management
    /// (production and sandbox), FCM, Google's OAuth2 token endpoint.
    public static let defaultHosts: [String] = [
        "api.push.apple.com", "api.sandbox.push.apple.com", "api-manage-broadcast.push.apple.com",
        "api-manage-broadcast.sandbox.push.apple.com", "fcm.googleapis.com", "oauth2.googleapis.com",
    ]

    /// The default allowlist.
    public static let standard = ProviderHosts(entries: defaultHosts.map { Entry(host: $0) })

    public var entries: [Entry]

    public init(entries: [Entry]) { self.entries = entries }

    /// Parses the comma-separated form; nil when an entry is not a host name, IP address or `host:port`.
    public init?(_ text: String) {
        var entries: [Entry] = []
        for part in text.split(separator: ",") {
            let item = part.trimmingCharacters(in: .whitespaces)
            if item.isEmpty { continue }
            guard let entry = Self.parseEntry(item) else { return nil }
            entries.append(entry)
        }
        guard !entries.isEmpty else { return nil }
        self.entries = entries
    }

    public var description: String { entries.map(\.description).joined(separator: ",") }

    /// Whether `host:port` is allowed.
    public func allows(host: String, port: Int) -> Bool {
        let host = Self.normalize(host)
        return entries.contains { $0.host == host && ($0.port == nil || $0.port == port) }
    }

    /// Whether connections to `host` must reach a public address (true for Apple's and Google's hosts).
    public func requiresPublicAddress(host: String) -> Bool {
        Self.defaultHosts.contains(Self.normalize(host))
    }

    /// Why a tenant-supplied endpoint URL is refused, or nil when it is an `https` URL to an allowed host.
    public func check(url text: String) -> Refusal? {
        guard let url = URLComponents(string: text), url.scheme?.lowercased() == "https", let host = url.host,
            !host.isEmpty, url.user == nil, url.password == nil
        else { return .notHTTPS }
        guard allows(host: host, port: url.port ?? 443) else { return .hostNotAllowed }
        return nil
    }

    /// Why an endpoint is refused (stable codes for problem types and log fields).
    public enum Refusal: String, Sendable, Equatable {
        case notHTTPS = "not_https"
        case hostNotAllowed = "host_not_allowed"
    }

    /// The key under which a worker pools connections to `host:port`: the host in lower case, then the port.
    public static func poolKey(host: String, port: Int) -> String {
        lowercased(host) + ":" + String(port)
    }

    static func normalize(_ host: String) -> String {
        var h = lowercased(host)
        if h.hasPrefix("[") && h.hasSuffix("]") { h = String(h.dropFirst().dropLast()) }
        if h.hasSuffix(".") { h = String(h.dropLast()) }
        return h
    }

    /// `host.lowercased()`, without making a new string when there is nothing to change (every send checks its host).
    private static func lowercased(_ host: String) -> String {
        host.utf8.contains { $0 &- UInt8(ascii: "A") < 26 || $0 >= 0x80 } ? host.lowercased() : host
    }

    static func parseEntry(_ item: String) -> Entry? {
        var host = item
        var port: Int?
        if item.hasPrefix("[") {
            guard let close = item.firstIndex(of: "]") else { return nil }
            host = String(item[item.index(after: item.startIndex)..<close])
            let rest = item[item.index(after: close)...]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let p = Int(rest.dropFirst()) else { return nil }
                port = p
            }
        } else if let colon = item.lastIndex(of: ":") {
            if item[..<colon].contains(":") {
                host = item  // a bare IPv6 address
            } else {
                host = String(item[..<colon])
                guard let p = Int(item[item.index(after: colon)...]) else { return nil }
                port = p
            }
        }
        if let port, !(1...65_535).contains(port) { return nil }
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.:")
        guard !host.isEmpty, host.utf8.count <= 253, host.allSatisfy({ allowed.contains($0) }) else { return nil }
        return Entry(host: normalize(host), port: port)
    }
}

extension ValidationError.Code {
    /// A credential's `endpoint` or `token_uri` points at a host outside `MARQUEE_PROVIDER_HOSTS`.
    public static let endpointNotAllowed = ValidationError.Code("endpoint-not-allowed")
}
