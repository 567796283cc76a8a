import Foundation

/// A numeric IPv4/IPv6 listen address, converted to `sockaddr` for MHD.
struct SocketAddress {
    private enum Storage {
        case v4(sockaddr_in)
        case v6(sockaddr_in6)
    }

    private var storage: Storage

    var isIPv6: Bool {
        if case .v6 = storage { return true }
        return false
    }

    /// Parses a numeric address (`localhost` is accepted as `127.0.0.1`); nil if it isn't one.
    init?(host: String, port: UInt16) {
        let name = host == "localhost" ? "127.0.0.1" : host
        if name.contains(":") {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            guard inet_pton(AF_INET6, name, &address.sin6_addr) == 1 else { return nil }
            storage = .v6(address)
        } else {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            guard inet_pton(AF_INET, name, &address.sin_addr) == 1 else { return nil }
            storage = .v4(address)
        }
    }

    /// Calls `body` with a `sockaddr` pointer valid for the duration of the call.
    mutating func withSockaddr<R>(_ body: (UnsafeMutablePointer<sockaddr>) -> R) -> R {
        switch storage {
        case .v4(var address):
            return withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1, body)
            }
        case .v6(var address):
            return withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1, body)
            }
        }
    }

    /// The numeric host of an IPv4/IPv6 `sockaddr`.
    static func numericHost(_ address: UnsafePointer<sockaddr>) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch Int32(address.pointee.sa_family) {
        case AF_INET:
            return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { pointer in
                var raw = pointer.pointee.sin_addr
                guard inet_ntop(AF_INET, &raw, &buffer, socklen_t(buffer.count)) != nil else { return nil }
                return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            }
        case AF_INET6:
            return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                var raw = pointer.pointee.sin6_addr
                guard inet_ntop(AF_INET6, &raw, &buffer, socklen_t(buffer.count)) != nil else { return nil }
                return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            }
        default:
            return nil
        }
    }
}
