import Foundation

/// A numeric IPv4 or IPv6 address, as 4 or 16 bytes. An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) is its IPv4
/// address: the same client, whichever socket family it arrived on.
public struct IPAddress: Sendable, Hashable, CustomStringConvertible {
    /// 4 bytes (IPv4) or 16 (IPv6), network order.
    public let bytes: [UInt8]

    /// Parses a numeric address (`inet_pton`'s forms); nil for anything else.
    public init?(_ text: some StringProtocol) {
        let host = Substring(text)
        guard !host.isEmpty, host.utf8.count <= 45 else { return nil }
        let name = String(host)
        if name.contains(":") {
            var raw = in6_addr()
            guard inet_pton(AF_INET6, name, &raw) == 1 else { return nil }
            let v6 = withUnsafeBytes(of: &raw) { Array($0) }
            let mapped: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]
            bytes = Array(v6.prefix(12)) == mapped ? Array(v6.suffix(4)) : v6
        } else {
            var raw = in_addr()
            guard inet_pton(AF_INET, name, &raw) == 1 else { return nil }
            bytes = withUnsafeBytes(of: &raw) { Array($0) }
        }
    }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    /// Parses an `X-Forwarded-For` entry: a numeric address, also written `[v6]`, `[v6]:port` or `v4:port` by some
    /// proxies. Nil for anything else (host names, `unknown`, obfuscated identifiers).
    public init?(forwardedEntry text: some StringProtocol) {
        var host = Substring(text)
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            guard rest.isEmpty || (rest.hasPrefix(":") && Self.isPort(rest.dropFirst())) else { return nil }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.firstIndex(of: ":"), host[host.index(after: colon)...].firstIndex(of: ":") == nil {
            // One colon: IPv4 with a port (an IPv6 address has at least two).
            guard Self.isPort(host[host.index(after: colon)...]) else { return nil }
            host = host[..<colon]
        }
        self.init(host)
    }

    private static func isPort(_ text: Substring) -> Bool {
        (1...5).contains(text.count) && text.allSatisfy(\.isASCIIDigitCharacter)
    }

    public var isIPv6: Bool { bytes.count == 16 }

    /// The address with all but its first `bits` bits cleared.
    public func prefix(_ bits: Int) -> IPAddress {
        IPAddress(
            bytes: bytes.enumerated().map { index, byte in
                let kept = min(8, max(0, bits - index * 8))
                return kept == 8 ? byte : byte & UInt8(truncatingIfNeeded: 0xFF00 >> kept)
            })
    }

    /// The canonical text (`inet_ntop`).
    public var description: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let family = isIPv6 ? AF_INET6 : AF_INET
        let written = bytes.withUnsafeBytes { raw in
            inet_ntop(family, raw.baseAddress, &buffer, socklen_t(buffer.count)) != nil
        }
        guard written else { return "?" }
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}

/// An address block, `192.0.2.0/24` or `2001:db8::/32` (a bare address is one host).
public struct IPNetwork: Sendable, Hashable, CustomStringConvertible {
    public let address: IPAddress
    public let prefixLength: Int

    /// Parses `address[/length]`; nil when either part is not one.
    public init?(_ text: some StringProtocol) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = IPAddress(parts[0]) else { return nil }
        var length = address.bytes.count * 8
        if parts.count == 2 {
            let written = parts[0].contains(":") ? 128 : 32
            guard parts[1].count <= 3, parts[1].allSatisfy(\.isASCIIDigitCharacter), let n = Int(parts[1]),
                (0...written).contains(n)
            else { return nil }
            // An IPv4-mapped block (::ffff:10.0.0.0/104) is that IPv4 block.
            length = written == 128 && address.bytes.count == 4 ? n - 96 : n
            guard length >= 0 else { return nil }
        }
        self.address = address.prefix(length)
        self.prefixLength = length
    }

    public func contains(_ candidate: IPAddress) -> Bool {
        candidate.bytes.count == address.bytes.count && candidate.prefix(prefixLength) == address
    }

    public var description: String { "\(address)/\(prefixLength)" }
}

/// The proxies in front of the server whose `X-Forwarded-For` is believed, and the one home of the rule that finds a
/// request's client address behind them.
///
/// A request whose peer is not a trusted proxy comes from that peer, whatever its headers say (anyone can write an
/// `X-Forwarded-For`). From a trusted proxy, the client is the nearest address in `X-Forwarded-For` (read from the
/// right: each proxy appends the address it got the request from) that is not itself a trusted proxy; entries
/// further left were written by that client and are not believed. An entry that is not an address ends the walk at
/// the last one believed.
public struct TrustedProxies: Sendable, Equatable {
    public let networks: [IPNetwork]

    /// No proxy is trusted: the peer is always the client.
    public static let empty = TrustedProxies(networks: [])

    public init(networks: [IPNetwork]) { self.networks = networks }

    /// Parses a list of addresses and blocks separated by commas (spaces allowed); nil when an entry is neither.
    public init?(parsing list: String) {
        var networks: [IPNetwork] = []
        for entry in list.split(separator: ",") {
            let text = entry.trimmingCharacters(in: .whitespaces)
            if text.isEmpty { continue }
            guard let network = IPNetwork(text) else { return nil }
            networks.append(network)
        }
        self.networks = networks
    }

    public func trusts(_ address: IPAddress) -> Bool { networks.contains { $0.contains(address) } }

    /// The client address of a request from `peer` carrying these `X-Forwarded-For` field values (in order).
    public func client(peer: String?, forwardedFor: [String]) -> String? {
        guard !networks.isEmpty, let peer, let peerAddress = IPAddress(peer), trusts(peerAddress) else { return peer }
        var client = peerAddress
        for value in forwardedFor.reversed() {
            for entry in value.split(separator: ",").reversed() {
                guard let address = IPAddress(forwardedEntry: entry.trimmingCharacters(in: .whitespaces)) else {
                    return client.description
                }
                client = address
                if !trusts(address) { return address.description }
            }
        }
        return client.description
    }
}

extension Character {
    fileprivate var isASCIIDigitCharacter: Bool { isASCII && isNumber }
}
