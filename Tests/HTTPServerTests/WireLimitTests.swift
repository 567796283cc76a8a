import Foundation
import Testing

@testable import HTTPServer

/// The limits a client meets on the wire: the request head (target and header fields), a body that goes over its
/// limit while it streams, and clients that send slowly.
@Suite("HTTPServer wire limits over sockets")
struct WireLimitTests {
    /// One request on a fresh connection, sent as given; `closed` says whether the server closed the connection after
    /// its answer (asked for with `awaitClose`, else false).
    static func exchange(_ port: Int, _ raw: String, awaitClose: Bool = true) async throws -> (
        RawResponse, closed: Bool
    ) {
        try await onThread {
            let connection = try RawConnection(port: port)
            try connection.send(raw)
            let response = try connection.readResponse()
            return (response, awaitClose && connection.isClosedByPeer())
        }
    }

    /// `count` header lines `X-Fill-n: value`.
    static func fill(_ count: Int, value: String = "v") -> String {
        (0..<count).map { "X-Fill-\($0): \(value)\r\n" }.joined()
    }

    @Test("a request target over the limit is answered 414 problem+json, up to well past the limit")
    func longTargetIs414() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            for length in [8_200, 20_000] {
                let target = "/hello?q=" + String(repeating: "a", count: length)
                let (response, closed) = try await Self.exchange(port, "GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
                #expect(response.status == 414, "target of \(target.utf8.count) bytes")
                #expect(response.headers["Content-Type"] == "application/problem+json")
                let problem = try response.problem()
                #expect(problem.type == HTTPProblem.typeBase + "uri-too-long")
                #expect(problem.field == "query")
                #expect(problem.detail?.contains("8192") == true, "\(problem.detail ?? "")")
                #expect(problem.extensions["limit_bytes"] == "8192")
                #expect(response.headers["X-Request-Id"] != nil)
                #expect(closed)
            }
            // The path alone over the limit names the path.
            let longPath = "/" + String(repeating: "p", count: 9_000)
            let (path, _) = try await Self.exchange(port, "GET \(longPath) HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(path.status == 414)
            #expect(try path.problem().field == "path")
        }
    }

    @Test("header fields over the limit (large, many, or many cookies) are answered 431 problem+json")
    func largeHeadsAre431() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            let cases: [(name: String, headers: String, field: String?)] = [
                ("one large field", "X-Large: \(String(repeating: "h", count: 17_000))\r\n", "X-Large"),
                ("one field, well past the limit", "X-Large: \(String(repeating: "h", count: 24_000))\r\n", "X-Large"),
                // 300 fields of 16 bytes: 5 KB of text, each field counting 64 bytes more.
                ("many small fields", Self.fill(300), nil),
                ("many cookies", "Cookie: " + (0..<300).map { "c\($0)=1" }.joined(separator: "; ") + "\r\n", "Cookie"),
            ]
            for (name, headers, field) in cases {
                let (response, closed) = try await Self.exchange(
                    port, "GET /hello HTTP/1.1\r\nHost: x\r\n\(headers)\r\n")
                #expect(response.status == 431, "\(name)")
                #expect(response.headers["Content-Type"] == "application/problem+json", "\(name)")
                let problem = try response.problem()
                #expect(problem.type == HTTPProblem.typeBase + "header-fields-too-large", "\(name)")
                #expect(problem.field == field, "\(name)")
                #expect(problem.extensions["limit_bytes"] == "16384", "\(name)")
                #expect(problem.detail?.contains("16384") == true, "\(name): \(problem.detail ?? "")")
                #expect(closed, "\(name)")
            }
        }
    }

    @Test("a head within the limits is served, however it spends them (the listener's memory never refuses it)")
    func headsWithinTheLimitsAreServed() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            // The longest target, and header text up to the limit.
            let target = "/hello?q=" + String(repeating: "a", count: 8_192 - 9)
            let (longest, _) = try await Self.exchange(
                port,
                "GET \(target) HTTP/1.1\r\nHost: x\r\nX-Large: \(String(repeating: "h", count: 7_900))\r\n\r\n",
                awaitClose: false)
            #expect(longest.status == 200, "\(longest.text)")
            // As many query parameters, fields and cookies as fit: what the listener stores for each, not their text.
            let query = "/hello?" + (0..<55).map { "p\($0)=\($0)" }.joined(separator: "&")
            let cookies = "Cookie: " + (0..<55).map { "c\($0)=1" }.joined(separator: "; ") + "\r\n"
            let (many, _) = try await Self.exchange(
                port, "GET \(query) HTTP/1.1\r\nHost: x\r\n\(cookies)\(Self.fill(90))\r\n", awaitClose: false)
            #expect(many.status == 200, "\(many.text)")
            // Nothing but fields without values: each costs its record, 4 bytes of text besides.
            let (fields, _) = try await Self.exchange(
                port, "GET /hello HTTP/1.1\r\nHost: x\r\n\(String(repeating: "a:\r\n", count: 239))\r\n",
                awaitClose: false)
            #expect(fields.status == 200, "\(fields.text)")
            // Kept alive: a head within the limits costs the connection nothing.
            let kept = try await onThread {
                let connection = try RawConnection(port: port)
                var statuses: [Int] = []
                for _ in 0..<3 {
                    try connection.send("GET \(query) HTTP/1.1\r\nHost: x\r\n\(cookies)\(Self.fill(90))\r\n")
                    statuses.append(try connection.readResponse().status)
                }
                return statuses
            }
            #expect(kept == [200, 200, 200])
        }
    }

    /// Pins what the README ("HTTP limits") says libmicrohttpd answers itself, before the server sees the request: no
    /// hook of libmicrohttpd 0.9.75 replaces these answers, so they are documented instead.
    @Test("the listener answers a head beyond its memory, and requests it cannot parse, itself")
    func listenerOwnAnswers() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            let huge = String(repeating: "h", count: 40_000)
            let cases: [(name: String, request: String, status: Int)] = [
                ("a header field beyond the pool", "GET /hello HTTP/1.1\r\nX-Huge: \(huge)\r\n\r\n", 431),
                ("a target beyond the pool", "GET /hello?q=\(huge) HTTP/1.1\r\nHost: x\r\n\r\n", 414),
                ("a version not HTTP/d.d", "GET /hello HTTX/1.1\r\nHost: x\r\n\r\n", 400),
                ("a version not 1.x", "GET /hello HTTP/2.0\r\nHost: x\r\n\r\n", 505),
                ("a header line without a colon", "GET /hello HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400),
                ("a Content-Length not a number", "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: ab\r\n\r\n", 400),
                (
                    "a malformed chunk size",
                    "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", 400
                ),
            ]
            for (name, raw, status) in cases {
                let (response, closed) = try await Self.exchange(port, raw)
                #expect(response.status == status, "\(name)")
                #expect(response.headers["Content-Type"] == nil, "\(name)")
                #expect(closed, "\(name)")
            }
        }
    }

    @Test("an HTTP/1.1 request without one well-formed Host is answered 400 problem+json naming Host")
    func hostIsRequired() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            let refused: [(name: String, request: String)] = [
                ("no Host", "GET /hello HTTP/1.1\r\n\r\n"),
                ("two Host fields", "GET /hello HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n"),
                ("a Host with a space", "GET /hello HTTP/1.1\r\nHost: a.example b.example\r\n\r\n"),
                ("a Host with userinfo", "GET /hello HTTP/1.1\r\nHost: user@a.example\r\n\r\n"),
                ("a Host with a path", "GET /hello HTTP/1.1\r\nHost: a.example/x\r\n\r\n"),
                ("a port not a number", "GET /hello HTTP/1.1\r\nHost: a.example:80x\r\n\r\n"),
                ("a body announced, no Host", "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"),
            ]
            for (name, raw) in refused {
                let (response, closed) = try await Self.exchange(port, raw)
                #expect(response.status == 400, "\(name)")
                #expect(response.headers["Content-Type"] == "application/problem+json", "\(name)")
                let problem = try response.problem()
                #expect(problem.type == HTTPProblem.typeBase + "bad-request", "\(name)")
                #expect(problem.field == "Host", "\(name)")
                #expect(closed, "\(name)")
            }
            let accepted: [(name: String, request: String)] = [
                ("HTTP/1.0 without Host", "GET /hello HTTP/1.0\r\n\r\n"),
                ("a name and port", "GET /hello HTTP/1.1\r\nHost: api.example.com:8443\r\n\r\n"),
                ("an IPv4 address", "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
                ("an IPv6 literal and port", "GET /hello HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"),
                ("an empty Host", "GET /hello HTTP/1.1\r\nHost:\r\n\r\n"),
                ("lower-case name", "GET /hello HTTP/1.1\r\nhost: x\r\n\r\n"),
            ]
            for (name, raw) in accepted {
                let (response, _) = try await Self.exchange(port, raw, awaitClose: false)
                #expect(response.status == 200, "\(name): \(response.text)")
            }
        }
    }

    @Test("a Host value is an authority: name, IPv4 or IP literal, optional port")
    func hostValues() {
        for good in [
            "", "x", "api.example.com", "api.example.com:443", "a.example:", "127.0.0.1:1", "[::1]",
            "[fe80::1%25en0]:80", "xn--bcher-kva.example", "a_b~c",
        ] {
            #expect(RequestHead.isAuthority(good), "\(good)")
        }
        for bad in [
            "a b", "a/b", "u@a", "a:b", "a:80:90", "[::1", "[]", "[::1]x", "a\u{0}", "\u{e9}.example", "a?b",
            "a#b",
        ] {
            #expect(!RequestHead.isAuthority(bad), "\(bad)")
        }
        #expect(RequestHead.hostProblem(http10: true, hosts: []) == nil)
        #expect(RequestHead.hostProblem(http10: false, hosts: ["x"]) == nil)
        #expect(RequestHead.hostProblem(http10: false, hosts: [])?.field == "Host")
        #expect(RequestHead.hostProblem(http10: true, hosts: ["x", "x"])?.status == 400)
    }

    @Test("a chunked body is answered 413 as soon as it passes the limit, while the client is still sending")
    func streamedBodyIsRefusedAtTheLimit() async throws {
        let records = RecordSink()
        let limit = 64 << 10
        let smallBodies: (inout HTTPServer.Configuration) -> Void = { $0.maxBodySize = limit }
        try await withServer(ServerTests.router(), configure: smallBodies, records: records) { server in
            let port = server.boundPort
            let (response, sentBeforeAnswer, total, closed) = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                // 64 chunks of 8 KiB, 20 ms apart: 512 KiB over more than a second, 8 times the limit.
                let chunk = Array("2000\r\n".utf8) + [UInt8](repeating: 0x61, count: 8_192) + Array("\r\n".utf8)
                var sent = 0
                var answered = false
                for _ in 0..<64 {
                    var probe = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
                    if poll(&probe, 1, 20) > 0 {
                        answered = true
                        break
                    }
                    guard (try? connection.send(chunk)) != nil else { break }  // closed: the answer is waiting
                    sent += 8_192
                }
                if !answered { try? connection.send("0\r\n\r\n") }
                let response = try connection.readResponse()
                return (response, sent, 64 * 8_192, connection.isClosedByPeer())
            }
            #expect(response.status == 413)
            #expect(try response.problem().type == HTTPProblem.typeBase + "payload-too-large")
            #expect(try response.problem().extensions["limit_bytes"] == String(limit))
            #expect(response.headers["Connection"]?.lowercased() == "close")
            #expect(response.headers["X-Request-Id"] != nil)
            #expect(response.headers["Date"] != nil)
            // Answered near the limit, long before the client was done (a loaded machine may take a few chunks more).
            #expect(sentBeforeAnswer < total / 2, "answered after \(sentBeforeAnswer) of \(total) bytes")
            #expect(sentBeforeAnswer > limit)
            #expect(closed)
            let record = try #require(await records.waitFor(1).first)
            #expect(record.status == 413)
            #expect(record.bodyRejection == .tooLarge)
            #expect(record.completed)
            #expect(server.bufferedBodyBytes == 0)
        }
    }

    @Test("a body framed two ways, or by a coding the server does not take, is refused 400 before any of it is read")
    func ambiguousFramingIsRefused() async throws {
        let budget: (inout HTTPServer.Configuration) -> Void = {
            $0.maxBodySize = 64 << 10
            $0.maxBufferedBodySize = 256 << 10
        }
        try await withServer(ServerTests.router(), configure: budget) { server in
            let port = server.boundPort
            let cases: [(name: String, head: String, field: String)] = [
                // libmicrohttpd reads the chunks and ignores the length: with `Content-Length: 0` the body was read
                // up to the route's limit with nothing of it reserved (the gauge read 0), and a proxy that goes by
                // the length would take the chunks for a second request.
                (
                    "Content-Length 0 and chunked", "Content-Length: 0\r\nTransfer-Encoding: chunked",
                    "Transfer-Encoding"
                ),
                (
                    "chunked and Content-Length 5", "Transfer-Encoding: chunked\r\nContent-Length: 5",
                    "Transfer-Encoding"
                ),
                ("a coding not chunked", "Transfer-Encoding: gzip", "Transfer-Encoding"),
                ("a coding list", "Transfer-Encoding: gzip, chunked", "Transfer-Encoding"),
                ("two codings", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", "Transfer-Encoding"),
                ("chunked and a space", "Transfer-Encoding: chunked ", "Transfer-Encoding"),
                ("lengths that disagree", "Content-Length: 5\r\nContent-Length: 6", "Content-Length"),
                ("a second length not a number", "Content-Length: 5\r\nContent-Length: 5x", "Content-Length"),
            ]
            for (name, fields, field) in cases {
                for path in ["/echo", "/nope"] {
                    let outcome = try await onThread {
                        let connection = try RawConnection(port: port, timeoutSeconds: 5)
                        try connection.send("POST \(path) HTTP/1.1\r\nHost: x\r\n\(fields)\r\n\r\n")
                        // Chunks keep coming (never the last): the answer must not wait for them. A server that reads
                        // them holds them, and its gauge must say so.
                        let chunk = Array("1000\r\n".utf8) + [UInt8](repeating: 0x61, count: 4_096) + Array("\r\n".utf8)
                        var sent = 0
                        var answered = false
                        var heldWhileUnanswered = 0
                        for _ in 0..<16 {
                            var probe = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
                            if poll(&probe, 1, 50) > 0 {
                                answered = true
                                break
                            }
                            guard (try? connection.send(chunk)) != nil else { break }
                            sent += 4_096
                        }
                        if !answered {
                            heldWhileUnanswered = server.bufferedBodyBytes
                            try? connection.send("0\r\n\r\n")
                        }
                        let response = try connection.readResponse()
                        return (response, answered, sent, heldWhileUnanswered, connection.isClosedByPeer())
                    }
                    let (response, answered, sent, held, closed) = outcome
                    let label = "\(name), \(path)"
                    #expect(answered, "\(label): unanswered after \(sent) bytes of chunks, the gauge at \(held)")
                    #expect(response.status == 400, "\(label): \(response.text.prefix(200))")
                    #expect(response.headers["Content-Type"] == "application/problem+json", "\(label)")
                    #expect(try response.problem().type == HTTPProblem.typeBase + "bad-request", "\(label)")
                    #expect(try response.problem().field == field, "\(label)")
                    #expect(closed, "\(label)")
                }
            }
            let released = try await onThread { waitUntil { server.bufferedBodyBytes == 0 } }
            #expect(released, "left: \(server.bufferedBodyBytes) bytes")
            // HTTP/1.0 has no chunked coding (RFC 9112 §6.1).
            let (old, oldClosed) = try await Self.exchange(
                port, "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
            #expect(old.status == 400)
            #expect(try old.problem().field == "Transfer-Encoding")
            #expect(oldClosed)
            // One framing, sent plainly, is taken (any case of `chunked`, equal repeated lengths).
            for fields in [
                "Transfer-Encoding: Chunked", "Content-Length: 3\r\nContent-Length: 3", "Content-Length: 003",
            ] {
                let body = fields.hasPrefix("Transfer") ? "3\r\nabc\r\n0\r\n\r\n" : "abc"
                let (taken, _) = try await Self.exchange(
                    port, "POST /echo HTTP/1.1\r\nHost: x\r\n\(fields)\r\n\r\n\(body)", awaitClose: false)
                #expect(taken.status == 200, "\(fields): \(taken.text)")
                #expect(taken.text == "abc", "\(fields)")
            }
        }
    }

    @Test("a Content-Length too large for Int is answered 413 before any of the body, on every route")
    func hugeContentLengthIs413() async throws {
        var router = ServerTests.router()
        router.add(.POST, "/bulk", body: ServerTests.bulkRoute(Counter())) { request in .text("\(request.body.count)") }
        try await withServer(router) { server in
            let port = server.boundPort
            // 2^63 and 2^64 − 1: libmicrohttpd takes both (it answers 413 itself only beyond 64 bits); `Int` neither.
            for length in ["9223372036854775808", "18446744073709551615", "00000000000000000000009223372036854775808"] {
                for (path, fields) in [
                    ("/echo", ""), ("/bulk", "Content-Type: application/x-ndjson\r\nAuthorization: Bearer ok\r\n"),
                ] {
                    let (response, closed) = try await onThread {
                        let connection = try RawConnection(port: port, timeoutSeconds: 5)
                        try connection.send(
                            "POST \(path) HTTP/1.1\r\nHost: x\r\n\(fields)Content-Length: \(length)\r\n\r\n")
                        return (try connection.readResponse(), connection.isClosedByPeer())
                    }
                    #expect(response.status == 413, "\(path), \(length)")
                    #expect(try response.problem().type == HTTPProblem.typeBase + "payload-too-large", "\(path)")
                    #expect(closed, "\(path), \(length)")
                }
            }
            #expect(server.bufferedBodyBytes == 0)
        }
    }

    @Test("body framing follows libmicrohttpd: Transfer-Encoding when present, else Content-Length")
    func framingRule() {
        func framing(_ fields: [(String, String)], http10: Bool = false) -> BodyFraming {
            BodyFraming(HTTPHeaders(fields), http10: http10)
        }
        #expect(framing([]) == .none)
        #expect(framing([("Content-Length", "0")]) == .length(0))
        #expect(framing([("content-length", "12"), ("Content-Length", "012")]) == .length(12))
        #expect(framing([("Content-Length", "9223372036854775807")]) == .length(Int.max))
        #expect(framing([("Content-Length", "9223372036854775808")]) == .tooLong)
        #expect(framing([("Transfer-Encoding", "CHUNKED")]) == .chunked)
        for refused in [
            [("Content-Length", "")], [("Content-Length", "+1")], [("Content-Length", "1 ")],
            [("Content-Length", "1"), ("Content-Length", "2")],
            [("Transfer-Encoding", "chunked"), ("Content-Length", "0")],
            [("Transfer-Encoding", "")], [("Transfer-Encoding", "identity")], [("Transfer-Encoding", "chunked, gzip")],
        ] {
            #expect(framing(refused).problem?.status == 400, "\(refused)")
        }
        #expect(framing([("Transfer-Encoding", "chunked")], http10: true).problem?.field == "Transfer-Encoding")
        #expect(BodyFraming.tooLong.exceeds(Int.max) && BodyFraming.tooLong.hasBody)
        #expect(!BodyFraming.length(0).hasBody && BodyFraming.length(2).exceeds(1) && !BodyFraming.chunked.exceeds(0))
    }

    @Test("a target's raw bytes that are not text (not UTF-8, or NUL) are refused 400 as their %-encoding is")
    func rawTargetBytes() async throws {
        try await withServer(ServerTests.router()) { server in
            let port = server.boundPort
            func get(_ target: [UInt8]) async throws -> RawResponse {
                try await onThread {
                    let connection = try RawConnection(port: port, timeoutSeconds: 5)
                    try connection.send(Array("GET ".utf8) + target + Array(" HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
                    return try connection.readResponse()
                }
            }
            let people = Array("/v1/people/".utf8)
            let devices = Array("/devices/d".utf8)
            let cases: [(name: String, raw: [UInt8], encoded: String, field: String)] = [
                ("0xFF", people + [0xFF] + devices, "/v1/people/%FF/devices/d", "path"),
                // Read lossily, caf\xE9 and caf\xE8 were both caf\u{FFFD}: one person for two names.
                ("caf\\xE9", people + Array("caf".utf8) + [0xE9] + devices, "/v1/people/caf%E9/devices/d", "path"),
                // Read as a C string, alice\0zz was alice.
                (
                    "a NUL", people + Array("alice".utf8) + [0] + Array("zz".utf8) + devices,
                    "/v1/people/alice%00zz/devices/d", "path"
                ),
                (
                    "a NUL, then a query", people + [0x61, 0] + devices + Array("?q=1".utf8),
                    "/v1/people/a%00/devices/d?q=1", "path"
                ),
                (
                    "0xFF in a query value", people + Array("a".utf8) + devices + Array("?q=".utf8) + [0xFF],
                    "/v1/people/a/devices/d?q=%FF", "q"
                ),
                (
                    "a NUL in a query value", people + Array("a".utf8) + devices + Array("?q=a".utf8) + [0, 0x62],
                    "/v1/people/a/devices/d?q=a%00b", "q"
                ),
            ]
            for (name, raw, encoded, field) in cases {
                let sent = try await get(raw)
                let escaped = try await get(Array(encoded.utf8))
                for (response, spelling) in [(sent, "raw"), (escaped, "encoded")] {
                    #expect(response.status == 400, "\(name), \(spelling): \(response.text)")
                    #expect(response.headers["Content-Type"] == "application/problem+json", "\(name), \(spelling)")
                    #expect(try response.problem().type == HTTPProblem.typeBase + "bad-request", "\(name), \(spelling)")
                    #expect(try response.problem().field == field, "\(name), \(spelling)")
                }
            }
            // UTF-8 sent raw is text: served as its percent-encoding is.
            let raw = try await get(people + Array("café".utf8) + devices + Array("?q=é".utf8))
            #expect(raw.status == 200, "\(raw.text)")
            #expect(try raw.json([String: String].self)["id"] == "café")
            #expect(try raw.json([String: String].self)["q"] == "é")
        }
    }

    @Test("a raw target that is not UTF-8 is written percent-encoded, and decodes to the bytes sent")
    func receivedTargetText() {
        func text(_ bytes: [UInt8]) -> String { bytes.withUnsafeBufferPointer { RequestTarget.text(received: $0) } }
        #expect(text(Array("/v1/people/café?q=1".utf8)) == "/v1/people/café?q=1")
        #expect(text(Array("/a/caf".utf8) + [0xE9]) == "/a/caf%E9")
        // Valid sequences around an invalid one decode back to themselves; a `%` before a raw byte stays a literal.
        #expect(text([0x2F, 0xC3, 0xA9, 0xFF, 0x25, 0xFF]) == "/%C3%A9%FF%%FF")
        #expect(PercentDecoding.decodeChecked("%C3%A9").text == "é")
        #expect(HTTPRequest(method: .GET, target: text([0x2F, 0xE9])).targetProblem?.field == "path")
        #expect(HTTPRequest(method: .GET, target: RequestTarget.cutAtNUL("/v1/people/alice")).targetProblem != nil)
        #expect(HTTPRequest(method: .GET, target: RequestTarget.cutAtNUL("/s?q=a")).targetProblem?.field == "q")
    }

    @Test("a body trickled byte by byte is cut off at the read deadline, unanswered; a prompt body is not")
    func trickledBodyIsCutOff() async throws {
        let oneSecond: (inout HTTPServer.Configuration) -> Void = {
            $0.requestReadTimeout = .seconds(1)
            $0.connectionTimeout = .seconds(60)  // each trickled byte comes well inside the idle timeout
        }
        try await withServer(ServerTests.router(), configure: oneSecond) { server in
            let port = server.boundPort
            let (cutOff, elapsed, prompt) = try await onThread {
                let clock = ContinuousClock()
                let slow = try RawConnection(port: port, timeoutSeconds: 15)
                let started = clock.now
                try slow.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
                // One body byte every 100 ms (1000 bytes would take 100 s): only the read deadline can end this.
                let cutOff = slow.trickle("b", from: started, for: .seconds(30))
                let elapsed = clock.now - started
                let prompt = try RawConnection(port: port)
                try prompt.sendRequest("POST", "/echo", body: [UInt8](repeating: 0x62, count: 1000))
                return (cutOff, elapsed, try prompt.readResponse().status)
            }
            #expect(cutOff, "the trickling client is disconnected unanswered")
            #expect(elapsed >= .milliseconds(900) && elapsed < .seconds(10), "cut off after \(elapsed)")
            #expect(prompt == 200)
        }
    }
}
