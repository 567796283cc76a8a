import Foundation
import Testing

@testable import HTTPServer

@Suite("Client addresses behind trusted proxies (no sockets)")
struct ClientAddressTests {
    @Test("addresses: numeric IPv4 and IPv6 only, canonical text, IPv4-mapped IPv6 as IPv4")
    func addresses() {
        #expect(IPAddress("192.0.2.1")?.description == "192.0.2.1")
        #expect(IPAddress("2001:DB8:0:0::1")?.description == "2001:db8::1")
        #expect(IPAddress("::ffff:192.0.2.1")?.description == "192.0.2.1")
        #expect(IPAddress("::ffff:192.0.2.1") == IPAddress("192.0.2.1"))
        for bad in [
            "", "unknown", "example.com", "192.0.2", "192.0.2.1:80", "[2001:db8::1]", "fe80::1%eth0", "1.2.3.4 ",
        ] {
            #expect(IPAddress(bad) == nil, "\(bad)")
        }
        // X-Forwarded-For entries may carry a port or brackets.
        #expect(IPAddress(forwardedEntry: "192.0.2.1:8443")?.description == "192.0.2.1")
        #expect(IPAddress(forwardedEntry: "[2001:db8::1]:443")?.description == "2001:db8::1")
        #expect(IPAddress(forwardedEntry: "[2001:db8::1]")?.description == "2001:db8::1")
        for bad in ["192.0.2.1:", "192.0.2.1:x", "[2001:db8::1", "[2001:db8::1]x", "_hidden", "unknown"] {
            #expect(IPAddress(forwardedEntry: bad) == nil, "\(bad)")
        }
        #expect(IPAddress("2001:db8:1:2:3:4:5:6")?.prefix(64).description == "2001:db8:1:2::")
        #expect(IPAddress("192.0.2.255")?.prefix(25).description == "192.0.2.128")
    }

    @Test("blocks: a bare address is one host; lengths within the family; IPv4 never inside an IPv6 block")
    func networks() throws {
        let ten = try #require(IPNetwork("10.0.0.0/8"))
        #expect(ten.contains(IPAddress("10.255.1.2")!))
        #expect(!ten.contains(IPAddress("11.0.0.1")!))
        #expect(IPNetwork("10.1.2.3/8")?.description == "10.0.0.0/8")
        let host = try #require(IPNetwork("192.0.2.7"))
        #expect(host.contains(IPAddress("192.0.2.7")!) && !host.contains(IPAddress("192.0.2.8")!))
        let v6 = try #require(IPNetwork("2001:db8::/32"))
        #expect(v6.contains(IPAddress("2001:db8:ffff::1")!))
        #expect(!v6.contains(IPAddress("192.0.2.1")!))
        #expect(try #require(IPNetwork("::/0")).contains(IPAddress("::1")!))
        #expect(try #require(IPNetwork("::ffff:10.0.0.0/104")).contains(IPAddress("10.9.9.9")!))
        for bad in ["10.0.0.0/33", "2001:db8::/129", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8/8", "10.0.0.0:80", "x/8"] {
            #expect(IPNetwork(bad) == nil, "\(bad)")
        }
        #expect(TrustedProxies(parsing: "10.0.0.0/8, 192.0.2.1 ,2001:db8::/32")?.networks.count == 3)
        #expect(TrustedProxies(parsing: "10.0.0.0/8, proxy.internal") == nil)
        #expect(TrustedProxies(parsing: "")?.networks.isEmpty == true)
    }

    @Test("the client: the peer unless it is a trusted proxy; then the nearest untrusted X-Forwarded-For entry")
    func client() throws {
        let proxies = try #require(TrustedProxies(parsing: "10.0.0.0/8, 2001:db8::/32"))
        // An untrusted peer is the client, whatever it wrote.
        #expect(proxies.client(peer: "203.0.113.9", forwardedFor: ["198.51.100.1"]) == "203.0.113.9")
        #expect(TrustedProxies.empty.client(peer: "10.0.0.1", forwardedFor: ["198.51.100.1"]) == "10.0.0.1")
        // A trusted peer: the rightmost entry that is not a trusted proxy; what the client wrote to its left is not
        // believed.
        #expect(proxies.client(peer: "10.0.0.1", forwardedFor: ["198.51.100.1, 203.0.113.9"]) == "203.0.113.9")
        #expect(
            proxies.client(peer: "10.0.0.1", forwardedFor: ["198.51.100.1, 203.0.113.9, 10.1.1.1", "10.2.2.2"])
                == "203.0.113.9")
        #expect(proxies.client(peer: "2001:db8::5", forwardedFor: ["[2001:db8::7]:443, 192.0.2.4:5555"]) == "192.0.2.4")
        // No header, or every hop trusted: the last one believed.
        #expect(proxies.client(peer: "10.0.0.1", forwardedFor: []) == "10.0.0.1")
        #expect(proxies.client(peer: "10.0.0.1", forwardedFor: ["10.3.3.3, 10.4.4.4"]) == "10.3.3.3")
        // An entry that is no address ends the walk at the last hop believed.
        #expect(proxies.client(peer: "10.0.0.1", forwardedFor: ["203.0.113.9, unknown, 10.4.4.4"]) == "10.4.4.4")
        #expect(proxies.client(peer: "10.0.0.1", forwardedFor: ["203.0.113.9, "]) == "10.0.0.1")
        #expect(proxies.client(peer: nil, forwardedFor: ["203.0.113.9"]) == nil)
    }
}
