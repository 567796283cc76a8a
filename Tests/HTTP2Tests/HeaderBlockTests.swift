import CNGHTTP2
import Testing

@testable import HTTP2

/// The header list as the client built it before `HeaderBlock`: pseudo-headers, names through `lowercased()`, and
/// `content-length` for a body unless a header (in any case) already is one.
private func referenceFields(_ request: HTTP2Request, authority: String) -> [(String, String)] {
    var fields: [(String, String)] = [
        (":method", request.method), (":scheme", "https"), (":authority", authority), (":path", request.path),
    ]
    for (name, value) in request.headers { fields.append((name.lowercased(), value)) }
    if !request.body.isEmpty && !request.headers.contains(where: { $0.0.lowercased() == "content-length" }) {
        fields.append(("content-length", String(request.body.count)))
    }
    return fields
}

/// What nghttp2 is handed: every name and value as bytes, read back through the `nghttp2_nv` array.
private func nameValueBytes(_ block: HeaderBlock) -> [([UInt8], [UInt8])] {
    block.withNameValues { entries, count in
        (0..<count).map { index in
            let entry = entries[index]
            return (
                Array(UnsafeBufferPointer(start: entry.name, count: entry.namelen)),
                Array(UnsafeBufferPointer(start: entry.value, count: entry.valuelen))
            )
        }
    }
}

private func bytes(_ fields: [(String, String)]) -> [([UInt8], [UInt8])] {
    fields.map { (Array($0.0.utf8), Array($0.1.utf8)) }
}

private func same(_ a: [([UInt8], [UInt8])], _ b: [([UInt8], [UInt8])]) -> Bool {
    a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
}

@Suite struct HeaderBlockTests {
    static let requests: [HTTP2Request] = [
        HTTP2Request(
            path: "/3/device/abc",
            headers: [
                ("authorization", "bearer eyJ.x.y"), ("apns-push-type", "liveactivity"), ("apns-topic", "com.a.b"),
                ("apns-priority", "10"), ("apns-expiration", "1764683600"),
                ("apns-id", "0d3f7a5e-8b1c-4e2f-9a6d-1c2b3a4d5e6f"), ("content-type", "application/json"),
            ], body: Array(repeating: 0x41, count: 274)),
        HTTP2Request(
            method: "GET", path: "/x?y=Z", authority: "Example.COM:8443",
            headers: [("Accept", "*/*"), ("X-Mixed-Case", "Value Stays"), ("ÄPFEL-Header", "ü"), ("İd", "i")]),
        HTTP2Request(path: "/upload", headers: [("Content-Length", "3")], body: [1, 2, 3]),
        HTTP2Request(path: "/upload", headers: [("content-length", "3"), ("x", "")], body: [1, 2, 3]),
        HTTP2Request(path: "/upload", headers: [("content-lengthx", "3"), ("content-lengt", "3")], body: [1, 2, 3]),
        HTTP2Request(path: "/empty", headers: [("@[`{", "edges of A-Z and a-z")]),
        HTTP2Request(path: "/", headers: []),
    ]

    @Test("a request's header list has the bytes of the lowercased() list", arguments: requests)
    func requestBytes(_ request: HTTP2Request) {
        let authority = request.authority ?? "api.push.apple.com"
        let block = HeaderBlock(request: request, authority: authority)
        let expected = bytes(referenceFields(request, authority: authority))
        #expect(same(nameValueBytes(block), expected))
        #expect(block.fields.map(\.0) == expected.map { String(decoding: $0.0, as: UTF8.self) })
    }

    @Test func everyASCIINameLowercasesLikeLowercased() {
        for byte in UInt8(0x20)..<0x7F {
            let name = "x" + String(UnicodeScalar(byte)) + "Y"
            let block = HeaderBlock(status: 200, headers: [(name, "v")], bodyCount: 0)
            #expect(block.fields.map(\.0) == [":status", name.lowercased(), "content-length"])
        }
    }

    @Test func responseHeaderListAddsContentLengthUnlessSet() {
        let plain = HeaderBlock(status: 200, headers: [("APNS-ID", "a")], bodyCount: 5)
        #expect(same(nameValueBytes(plain), bytes([(":status", "200"), ("apns-id", "a"), ("content-length", "5")])))
        let set = HeaderBlock(status: 204, headers: [("Content-Length", "0")], bodyCount: 0)
        #expect(same(nameValueBytes(set), bytes([(":status", "204"), ("content-length", "0")])))
    }

    @Test func emptyListHasNoEntries() {
        #expect(nameValueBytes(HeaderBlock([])).isEmpty)
    }

    @Test func headerLookupIgnoresCase() {
        let response = HTTP2Response(status: 200, headers: [("apns-id", "a"), ("retry-after", "5")])
        #expect(response.header("apns-id") == "a")
        #expect(response.header("Retry-After") == "5")
        #expect(response.header("apns-unique-id") == nil)
    }
}

extension HTTP2Request: CustomTestStringConvertible {
    public var testDescription: String { "\(method) \(path) \(headers.map(\.0))" }
}
