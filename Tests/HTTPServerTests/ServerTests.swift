import Foundation
import Synchronization
import Testing

@testable import HTTPServer

struct SecretError: Error, CustomStringConvertible {
    var description: String { "db password is hunter2" }
}

struct TeapotError: HTTPProblemConvertible {
    var problem: HTTPProblem { HTTPProblem(status: 418, slug: "teapot", title: "I'm a teapot") }
}

@Suite("HTTPServer over sockets")
struct ServerTests {
    static func router(handlerRuns: Counter = Counter()) -> Router {
        var router = Router()
        router.get("/v1/people/{id}/devices/{device_token}") { request in
            .json([
                "id": request.pathParameters["id"] ?? "", "token": request.pathParameters["device_token"] ?? "",
                "route": request.route ?? "", "q": request.query["q"] ?? "",
            ])
        }
        router.post("/v1/people") { request in
            handlerRuns.enter()
            let person = try request.decodeJSON(Person.self)
            return .json(person, status: 201)
        }
        router.get("/boom") { _ in throw SecretError() }
        router.get("/teapot") { _ in throw TeapotError() }
        router.get("/hello") { _ in .text("hello world") }
        router.post("/echo", body: .any) { request in
            HTTPResponse(status: 200, headers: ["Content-Type": "application/octet-stream"], body: request.body)
        }
        return router
    }

    @Test func routesWithDecodedPathParameters() async throws {
        try await withServer(Self.router()) { server in
            let response = try await request(server.boundPort, "GET", "/v1/people/a%20b/devices/x%2Fy?q=%C3%A9")
            #expect(response.status == 200)
            #expect(response.headers["Content-Type"] == "application/json")
            let body = try response.json([String: String].self)
            #expect(body == ["id": "a b", "token": "x/y", "route": "/v1/people/{id}/devices/{device_token}", "q": "é"])
            let id = try #require(response.headers["X-Request-Id"])
            #expect(id.count == 32 && id.allSatisfy { $0.isHexDigit })
        }
    }

    @Test func requestIDIsEchoedOrGenerated() async throws {
        try await withServer(Self.router()) { server in
            let echoed = try await request(server.boundPort, "GET", "/hello", headers: [("X-Request-Id", "client-42")])
            #expect(echoed.headers["X-Request-Id"] == "client-42")
            let replaced = try await request(server.boundPort, "GET", "/hello", headers: [("X-Request-Id", "bad id!")])
            #expect(replaced.headers["X-Request-Id"] != "bad id!")
            #expect(replaced.headers["X-Request-Id"]?.count == 32)
            // on error responses too
            let missing = try await request(server.boundPort, "GET", "/nope", headers: [("X-Request-Id", "r-404")])
            #expect(missing.headers["X-Request-Id"] == "r-404")
        }
    }

    @Test("default headers go on every answer that does not set them, the server's own problems included")
    func defaultHeaders() async throws {
        var router = Self.router()
        router.get("/cached") { _ in
            HTTPResponse(
                status: 200, headers: ["Cache-Control": "max-age=60", "Content-Type": "text/plain"],
                body: Array("x".utf8))
        }
        let configure: (inout HTTPServer.Configuration) -> Void = {
            $0.defaultHeaders = ["Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"]
        }
        try await withServer(router, configure: configure) { server in
            // A handler's answer, its thrown problem, its hidden error, no route, a method the route does not take.
            for (method, path, status) in [
                ("GET", "/hello", 200), ("GET", "/teapot", 418), ("GET", "/boom", 500), ("GET", "/nope", 404),
                ("DELETE", "/hello", 405),
            ] {
                let response = try await request(server.boundPort, method, path)
                #expect(response.status == status, "\(method) \(path)")
                #expect(response.headers["Cache-Control"] == "no-store", "\(method) \(path)")
                #expect(response.headers["X-Content-Type-Options"] == "nosniff", "\(method) \(path)")
            }
            // A header the handler set is kept, once.
            let cached = try await request(server.boundPort, "GET", "/cached")
            #expect(cached.headers.values("Cache-Control") == ["max-age=60"])
            #expect(cached.headers["X-Content-Type-Options"] == "nosniff")
        }
        // None unless configured.
        try await withServer(Self.router()) { server in
            let response = try await request(server.boundPort, "GET", "/hello")
            #expect(response.headers["Cache-Control"] == nil && response.headers["X-Content-Type-Options"] == nil)
        }
    }

    @Test func errorsAreProblemJSON() async throws {
        let runs = Counter()
        try await withServer(Self.router(handlerRuns: runs)) { server in
            let port = server.boundPort
            let json = [("Content-Type", "application/json")]
            let cases: [(String, String, [(String, String)], String, Int, String)] = [
                ("GET", "/nope", [], "", 404, "not-found"),
                ("DELETE", "/v1/people", [], "", 405, "method-not-allowed"),
                ("POST", "/v1/people", json, "{", 400, "malformed-json"),
                ("POST", "/v1/people", [("Content-Type", "text/plain")], "name=Ada", 415, "unsupported-media-type"),
                ("POST", "/v1/people", json, #"{"name":"Ada"}"#, 422, "validation-failed"),
            ]
            for (method, target, headers, body, status, slug) in cases {
                let response = try await request(port, method, target, headers: headers, body: Array(body.utf8))
                #expect(response.status == status, "\(method) \(target)")
                #expect(response.headers["Content-Type"] == "application/problem+json")
                let problem = try response.problem()
                #expect(problem.status == status)
                #expect(problem.type == HTTPProblem.typeBase + slug)
            }
            let notAllowed = try await request(port, "DELETE", "/v1/people")
            #expect(notAllowed.headers["Allow"] == "POST, OPTIONS")
            // the 415 was decided centrally: the handler ran only for the 400 and the 422
            #expect(runs.total == 2)
            let created = try await request(
                port, "POST", "/v1/people", headers: json, body: Array(#"{"name":"Ada","age":36}"#.utf8))
            #expect(created.status == 201)
            #expect(try created.json(Person.self) == Person(name: "Ada", age: 36))
        }
    }

    /// A bulk route's admission: `Authorization: Bearer ok` only, counting its runs.
    static func bulkRoute(_ runs: Counter) -> BodyPolicy {
        .ndjson(maxSize: 3 << 20) { request in
            runs.enter()
            guard request.headers["Authorization"] == "Bearer ok", request.body.isEmpty else {
                throw HTTPProblem(status: 401, slug: "unauthorized", title: "Unauthorized", detail: "No key.")
            }
        }
    }

    @Test("a route's own body limit (ndjson bulk route) above the server's, and its media types")
    func routeBodyLimit() async throws {
        var router = Router()
        router.add(.POST, "/bulk", body: Self.bulkRoute(Counter())) { request in .text("\(request.body.count)") }
        router.add(.POST, "/small") { request in .text("\(request.body.count)") }
        try await withServer(router) { server in
            let port = server.boundPort
            let ndjson = [("Content-Type", "application/x-ndjson"), ("Authorization", "Bearer ok")]
            let two = [UInt8](repeating: 0x61, count: 2 << 20)
            let bulk = try await request(port, "POST", "/bulk", headers: ndjson, body: two)
            #expect(bulk.status == 200)
            #expect(bulk.text == "\(2 << 20)")
            let jsonl = try await request(
                port, "POST", "/bulk", headers: [("Content-Type", "application/jsonl")], body: [0x61])
            #expect(jsonl.status == 200)
            // Over the route's limit: up front (Content-Length) and while streaming (chunked), naming its limit.
            let over = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: \(4 << 20)\r\n\r\n"
                )
                return try connection.readResponse()
            }
            #expect(over.status == 413)
            #expect(try over.problem().detail?.contains("\(3 << 20)") == true, "\(over.text)")
            let streamed = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                connection.sendChunks(64, of: 65_536)
                return try connection.readResponse()
            }
            #expect(streamed.status == 413)
            // Other routes keep the server's 1 MiB.
            let small = try await onThread {
                let connection = try RawConnection(port: port)
                try? connection.sendRequest(
                    "POST", "/small", headers: [("Content-Type", "application/json")], body: two)
                return try connection.readResponse()
            }
            #expect(small.status == 413)
            // JSON is not NDJSON.
            let json = try await request(
                port, "POST", "/bulk", headers: [("Content-Type", "application/json")], body: [0x61])
            #expect(json.status == 415)
        }
    }

    @Test("a body over the server's limit to a bulk route is read only once the route's admission let it through")
    func bulkBodiesNeedAdmission() async throws {
        let runs = Counter()
        let handled = Counter()
        var router = Router()
        router.add(.POST, "/bulk", body: Self.bulkRoute(runs)) { request in
            handled.enter()
            return .text("\(request.body.count)")
        }
        try await withServer(router) { server in
            let port = server.boundPort
            // Refused from the headers alone: the answer comes although none of the 3 MiB announced was sent.
            let refused = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: \(3 << 20)\r\n\r\n"
                )
                return try connection.readResponse()
            }
            #expect(refused.status == 401)
            #expect(try refused.problem().type == HTTPProblem.typeBase + "unauthorized")
            #expect(refused.headers["Connection"]?.lowercased() == "close")
            // Chunked: refused before the first chunk, too.
            let chunked = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                return try connection.readResponse()
            }
            #expect(chunked.status == 401)
            #expect(handled.total == 0 && runs.total == 2)
            // Admitted: the body is read up to the route's limit, with and without Expect: 100-continue.
            let body = [UInt8](repeating: 0x61, count: 2 << 20)
            let admitted = try await request(
                port, "POST", "/bulk",
                headers: [("Content-Type", "application/x-ndjson"), ("Authorization", "Bearer ok")],
                body: body)
            #expect(admitted.status == 200)
            #expect(admitted.text == "\(2 << 20)")
            let continued = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nContent-Type: application/x-ndjson\r\nExpect: 100-continue\r\nContent-Length: \(body.count)\r\n\r\n"
                )
                let interim = try connection.readResponse(head: true)  // 100 Continue has no body
                try connection.send(body)
                return (interim.status, try connection.readResponse())
            }
            #expect(continued.0 == 100)
            #expect(continued.1.status == 200)
            #expect(continued.1.text == "\(2 << 20)")
            // Within the server's own limit no admission runs (the handler authenticates as for any route).
            let small = try await request(
                port, "POST", "/bulk", headers: [("Content-Type", "application/x-ndjson")], body: [0x61])
            #expect(small.status == 200)
            #expect(runs.total == 4 && handled.total == 3)
        }
    }

    @Test func bodyOverTheLimitIs413() async throws {
        let records = RecordSink()
        try await withServer(Self.router(), records: records) { server in
            let port = server.boundPort
            // Content-Length checked up front: the answer comes before the body is sent.
            let upFront = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(2 << 20)\r\n\r\n")
                return try connection.readResponse()
            }
            #expect(upFront.status == 413)
            #expect(try upFront.problem().type == HTTPProblem.typeBase + "payload-too-large")
            #expect(upFront.headers["X-Request-Id"] != nil)

            // A client that sends the whole 2 MiB body before reading still gets the 413.
            let naive = try await onThread {
                let connection = try RawConnection(port: port)
                try? connection.sendRequest("POST", "/echo", body: [UInt8](repeating: 0x63, count: 2 << 20))
                return try connection.readResponse()
            }
            #expect(naive.status == 413)

            // Chunked (no Content-Length): counted while streaming, answered once over the limit, and the connection
            // closed (sending the rest may fail); 2 MiB in 64 KiB chunks, sent before reading.
            let streamed = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                connection.sendChunks(32, of: 65_536)
                return try connection.readResponse()
            }
            #expect(streamed.status == 413)
            #expect(try streamed.problem().status == 413)

            // Just under the limit is fine.
            let body = [UInt8](repeating: 0x62, count: 1 << 20)
            let fits = try await request(port, "POST", "/echo", body: body)
            #expect(fits.status == 200)
            #expect(fits.body == body)
        }
        let statuses = await records.waitFor(4).map(\.status).sorted()
        #expect(statuses == [200, 413, 413, 413])
    }

    @Test("a body to an unknown path, or with a method its path does not take, is answered before it is read")
    func unroutedBodiesAreNotRead() async throws {
        let records = RecordSink()
        try await withServer(Self.router(), records: records) { server in
            let port = server.boundPort
            // None of the bodies announced is sent: without an answer from the headers alone, each read times out.
            let (notFound, notFoundClosed, notAllowed, chunked, keptAlive) = try await onThread {
                let unknown = try RawConnection(port: port)
                try unknown.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: \(1 << 20)\r\n\r\n")
                let notFound = try unknown.readResponse()
                let notFoundClosed = unknown.isClosedByPeer()
                let wrongMethod = try RawConnection(port: port)
                try wrongMethod.send("PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
                let notAllowed = try wrongMethod.readResponse()
                let streamed = try RawConnection(port: port)
                try streamed.send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                let chunked = try streamed.readResponse()
                // Without a body, a 404 keeps the connection alive.
                let plain = try RawConnection(port: port)
                var keptAlive: [Int] = []
                for _ in 0..<2 {
                    try plain.sendRequest("GET", "/x")
                    keptAlive.append(try plain.readResponse().status)
                }
                return (notFound, notFoundClosed, notAllowed, chunked, keptAlive)
            }
            #expect(notFound.status == 404)
            #expect(try notFound.problem().type == HTTPProblem.typeBase + "not-found")
            #expect(notFound.headers["Connection"]?.lowercased() == "close")
            #expect(notFoundClosed)
            #expect(notAllowed.status == 405)
            #expect(notAllowed.headers["Allow"] == "POST, OPTIONS")
            #expect(chunked.status == 404)
            #expect(keptAlive == [404, 404])
            let all = await records.waitFor(5)
            #expect(all.map(\.status).sorted() == [404, 404, 404, 404, 405])
            #expect(all.allSatisfy { $0.bytesIn == 0 && $0.route == nil })
        }
    }

    @Test("a body's share of the budget is reserved as its bytes come, not for the length it announces")
    func announcedBodiesHoldNothing() async throws {
        let budget: (inout HTTPServer.Configuration) -> Void = {
            $0.maxBodySize = 64 << 10
            $0.maxBufferedBodySize = 256 << 10
        }
        try await withServer(Self.router(), configure: budget) { server in
            let port = server.boundPort
            let outcome = try await onThread {
                // Four connections announce the largest body and send one byte of it.
                let head = Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(64 << 10)\r\n\r\na".utf8)
                let idle = try (0..<4).map { _ in
                    let connection = try RawConnection(port: port)
                    try connection.send(head)
                    return connection
                }
                let seen = waitUntil { server.bufferedBodyBytes >= 4 }
                let held = server.bufferedBodyBytes
                // A whole body still fits.
                let other = try RawConnection(port: port)
                try other.sendRequest("POST", "/echo", body: [UInt8](repeating: 0x62, count: 64 << 10))
                let answer = try other.readResponse()
                _ = idle
                return (seen: seen, held: held, answer: answer)
            }
            #expect(outcome.seen)
            #expect(outcome.held < 1 << 10, "held \(outcome.held) bytes for four one-byte bodies")
            #expect(outcome.answer.status == 200)
        }
    }

    @Test("bodies held at once are capped server-wide: over the budget is 503 at once, and shares come back")
    func bodyBudget() async throws {
        let records = RecordSink()
        var router = Self.router()
        router.add(.POST, "/bulk", body: .ndjson(maxSize: 1 << 20) { _ in }) { request in .text("\(request.body.count)")
        }
        let budget: (inout HTTPServer.Configuration) -> Void = {
            $0.maxBodySize = 64 << 10
            $0.maxBufferedBodySize = 256 << 10
        }
        try await withServer(router, configure: budget, records: records) { server in
            let port = server.boundPort
            let outcome = try await onThread {
                let head = Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(64 << 10)\r\n\r\n".utf8)
                // Four uploads that stall one byte short of their end hold the whole budget.
                var held = try (0..<4).map { _ in
                    let connection = try RawConnection(port: port)
                    try connection.send(head + [UInt8](repeating: 0x61, count: (64 << 10) - 1))
                    return connection
                }
                let full = waitUntil { server.bufferedBodyBytes == 256 << 10 }
                // The fifth is refused from its headers: 503 at once, and the connection closed.
                let fifth = try RawConnection(port: port)
                try fifth.send(head)
                let refused = try fifth.readResponse()
                let refusedClosed = fifth.isClosedByPeer()
                // A chunked body reserves as it grows: refused too (answered at its end, MHD cannot answer before).
                let streamed = try RawConnection(port: port)
                try streamed.send(
                    "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"
                )
                let chunked = try streamed.readResponse()
                // A route's own limit is capped by the budget: a body the budget can never hold is too large.
                let bulk = try RawConnection(port: port)
                try bulk.send(
                    "POST /bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: \(512 << 10)\r\n\r\n"
                )
                let tooLarge = try bulk.readResponse()
                // Two held uploads finish, two are abandoned: all four shares come back.
                var finished: [Int] = []
                for connection in held.prefix(2) {
                    try connection.send([0x61])
                    finished.append(try connection.readResponse().status)
                }
                held.removeAll()  // closes the sockets
                let released = waitUntil { server.bufferedBodyBytes == 0 }
                let after = try RawConnection(port: port)
                try after.sendRequest("POST", "/echo", body: [UInt8](repeating: 0x62, count: 64 << 10))
                let afterwards = try after.readResponse()
                return (
                    full: full, refused: refused, refusedClosed: refusedClosed, chunked: chunked, tooLarge: tooLarge,
                    finished: finished, released: released, afterwards: afterwards
                )
            }
            #expect(outcome.full, "the four stalled uploads hold the budget")
            #expect(outcome.refused.status == 503)
            #expect(try outcome.refused.problem().type == HTTPProblem.typeBase + "service-unavailable")
            #expect(outcome.refused.headers["Retry-After"] == "1")
            #expect(outcome.refused.headers["Connection"]?.lowercased() == "close")
            #expect(outcome.refusedClosed)
            #expect(outcome.chunked.status == 503)
            #expect(outcome.tooLarge.status == 413)
            #expect(try outcome.tooLarge.problem().extensions["limit_bytes"] == "\(256 << 10)")
            #expect(outcome.finished == [200, 200])
            #expect(outcome.released, "left: \(server.bufferedBodyBytes) bytes")
            #expect(outcome.afterwards.status == 200)
            #expect(outcome.afterwards.body.count == 64 << 10)
            let all = await records.waitFor(8)
            #expect(all.filter { $0.bodyRejection == .overBudget }.map(\.status) == [503, 503])
            #expect(all.filter { $0.bodyRejection == .tooLarge }.map(\.status) == [413])
        }
    }

    @Test("every way a request ends gives its body's share of the budget back")
    func bodyBudgetIsReleased() async throws {
        var router = Self.router()
        router.post("/fail", body: .any) { _ in throw SecretError() }
        let configure: (inout HTTPServer.Configuration) -> Void = {
            $0.maxBodySize = 64 << 10
            $0.maxBufferedBodySize = 256 << 10
            $0.requestReadTimeout = .seconds(1)
        }
        try await withServer(router, configure: configure) { server in
            let port = server.boundPort
            let statuses = try await onThread {
                var statuses: [Int] = []
                let body = [UInt8](repeating: 0x61, count: 40 << 10)
                for target in ["/echo", "/fail"] {  // answered by the handler, or by a handler that threw
                    let connection = try RawConnection(port: port)
                    try connection.sendRequest("POST", target, body: body)
                    statuses.append(try connection.readResponse().status)
                }
                // Over the limit part-way through a chunked body: answered 413 once the fifth chunk passes it, and the
                // connection closed without reading the rest, so what the client sends after may already meet the
                // closed socket (send() failed, now and then, on a loaded machine).
                let chunked = try RawConnection(port: port)
                try chunked.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                let chunk = Array("4000\r\n".utf8) + body.prefix(16 << 10) + Array("\r\n".utf8)
                for _ in 0..<4 { try chunked.send(chunk) }
                try? chunked.send(chunk)
                try? chunked.send("0\r\n\r\n")
                statuses.append(try chunked.readResponse().status)
                // Abandoned part-way, by the client and by the read deadline.
                let head = Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(64 << 10)\r\n\r\n".utf8)
                do {
                    let abandoned = try RawConnection(port: port)
                    try abandoned.send(head + body)
                    _ = waitUntil { server.bufferedBodyBytes >= 64 << 10 }
                }
                let stalled = try RawConnection(port: port, timeoutSeconds: 15)
                try stalled.send(head + body)
                let clock = ContinuousClock()
                let started = clock.now
                let answered = (try? stalled.readResponse()) != nil  // EOF or reset, not the 15 s receive timeout
                statuses.append(!answered && clock.now - started < .seconds(10) ? 0 : -1)  // cut off unanswered
                return statuses
            }
            #expect(statuses == [200, 500, 413, 0])
            let released = try await onThread { waitUntil { server.bufferedBodyBytes == 0 } }
            #expect(released, "left: \(server.bufferedBodyBytes) bytes")
        }
    }

    @Test func handlerErrorsAreHidden() async throws {
        let records = RecordSink()
        try await withServer(Self.router(), records: records) { server in
            let response = try await request(server.boundPort, "GET", "/boom", headers: [("X-Request-Id", "req-500")])
            #expect(response.status == 500)
            #expect(!response.text.contains("hunter2"))
            let problem = try response.problem()
            #expect(problem.type == HTTPProblem.typeBase + "internal-error")
            #expect(problem.detail == "Internal error. Request ID: req-500.")
            #expect(response.headers["X-Request-Id"] == "req-500")

            let teapot = try await request(server.boundPort, "GET", "/teapot")
            #expect(teapot.status == 418)
            #expect(try teapot.problem().type == HTTPProblem.typeBase + "teapot")
        }
        let failures = await records.waitFor(2).compactMap(\.handlerError)
        #expect(failures == ["db password is hunter2"])
    }

    @Test func keepAliveServesTwoRequestsOnOneConnection() async throws {
        try await withServer(Self.router()) { server in
            let port = server.boundPort
            let (first, second, third) = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.sendRequest("GET", "/hello")
                let first = try connection.readResponse()
                try connection.sendRequest("HEAD", "/hello")
                let second = try connection.readResponse(head: true)
                try connection.sendRequest("GET", "/nope")
                let third = try connection.readResponse()
                return (first, second, third)
            }
            #expect(first.status == 200)
            #expect(first.text == "hello world")
            #expect(first.headers["Connection"]?.lowercased() != "close")
            #expect(second.status == 200)
            #expect(second.headers["Content-Length"] == "11")  // HEAD: length of the GET body, no body bytes
            #expect(third.status == 404)  // parsed cleanly, so HEAD sent no stray body
        }
    }

    @Test func manySlowHandlersRunConcurrently() async throws {
        let inFlight = Counter()
        var router = Router()
        router.get("/slow/{n}") { request in
            inFlight.enter()
            defer { inFlight.leave() }
            try await Task.sleep(for: .milliseconds(200))
            return .text(request.pathParameters["n"] ?? "")
        }
        let count = 200
        let twoThreads: (inout HTTPServer.Configuration) -> Void = { $0.threadCount = 2 }
        try await withServer(router, configure: twoThreads) { server in
            let port = server.boundPort
            let clock = ContinuousClock()
            let started = clock.now
            let bodies = try await onThread {
                var connections: [RawConnection] = []
                for index in 0..<count {
                    let connection = try RawConnection(port: port, timeoutSeconds: 60)
                    try connection.sendRequest("GET", "/slow/\(index)")
                    connections.append(connection)
                }
                return try connections.map { try $0.readResponse().text }
            }
            let elapsed = clock.now - started
            #expect(bodies == (0..<count).map(String.init))
            // Sequentially this would take 40 s; two MHD threads can only finish it fast if connections are
            // suspended while handlers sleep. (Alone it takes about 0.3 s; the bound leaves room for a loaded CI: a
            // load of 15 once made one answer take more than 15 s.)
            #expect(elapsed < .seconds(30), "took \(elapsed)")
            #expect(inFlight.peak >= count / 2, "peak concurrency \(inFlight.peak)")
        }
    }

    @Test func gracefulStopFinishesInFlightAndRefusesNew() async throws {
        let entered = Counter()
        let released = Counter()
        let records = RecordSink()
        var router = Router()
        router.get("/slow") { _ in
            entered.enter()
            // Still running when the stop begins, however late a loaded machine schedules it: the test releases
            // the handler only once new connections are refused.
            let deadline = ContinuousClock.now + .seconds(10)
            while released.total == 0 && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(5))
            }
            return .text("finished")
        }
        let server = HTTPServer(
            configuration: .init(port: 0, threadCount: 2, drainTimeout: .seconds(30)), router: router,
            onRequestCompleted: { records.append($0) })
        try server.start()
        let port = server.boundPort
        let inFlight = Task { try await request(port, "GET", "/slow") }
        while entered.total == 0 { try await Task.sleep(for: .milliseconds(5)) }

        let clock = ContinuousClock()
        let stopStarted = clock.now
        let stopping = Task { await server.stop() }
        // New connections are refused soon after stop begins, while the slow request is still running.
        var refused = false
        for _ in 0..<100 {
            do {
                _ = try RawConnection(port: port)
                try await Task.sleep(for: .milliseconds(5))
            } catch let error as ClientError {
                refused = error.errno == ECONNREFUSED
                break
            }
        }
        #expect(refused)
        #expect(entered.total == 1)
        released.enter()

        let response = try await inFlight.value
        #expect(response.status == 200)
        #expect(response.text == "finished")
        #expect(response.headers["Connection"]?.lowercased() == "close")
        await stopping.value
        // The stop ended with the request, not at the 30 s drain timeout (a 3 s bound failed once on a loaded
        // machine: 4.0 s).
        #expect(clock.now - stopStarted < .seconds(20))
        #expect(records.all.count == 1)
        #expect(records.all.first?.completed == true)
        #expect(server.liveRequestCount == 0)
        #expect(throws: ClientError.self) { try RawConnection(port: port) }
    }

    @Test func drainTimeoutAnswersStragglersWith503() async throws {
        var router = Router()
        let entered = Counter()
        router.get("/forever") { _ in
            entered.enter()
            try? await Task.sleep(for: .seconds(30))
            return .text("too late")
        }
        let server = HTTPServer(
            configuration: .init(port: 0, threadCount: 2, drainTimeout: .milliseconds(200)), router: router)
        try server.start()
        let port = server.boundPort
        let inFlight = Task { try await request(port, "GET", "/forever") }
        while entered.total == 0 { try await Task.sleep(for: .milliseconds(5)) }
        let clock = ContinuousClock()
        let started = clock.now
        await server.stop()
        // The 200 ms drain timeout and the 1 s close grace, not the handler's 30 s (room for a loaded machine).
        #expect(clock.now - started < .seconds(10))
        let response = try await inFlight.value
        #expect(response.status == 503)
        #expect(try response.problem().type == HTTPProblem.typeBase + "service-unavailable")
    }

    @Test func runServesUntilCancelled() async throws {
        let server = HTTPServer(configuration: .init(port: 0, threadCount: 2), router: Self.router())
        let running = Task { try await server.run() }
        while server.boundPort == 0 { try await Task.sleep(for: .milliseconds(5)) }
        let port = server.boundPort
        #expect(try await request(port, "GET", "/hello").status == 200)
        running.cancel()
        try await running.value
        #expect(throws: ClientError.self) { try RawConnection(port: port) }
    }

    @Test func bindFailureThrows() async throws {
        try await withServer(Self.router()) { server in
            let second = HTTPServer(configuration: .init(port: server.boundPort), router: Router())
            #expect {
                try second.start()
            } throws: { error in
                (error as? HTTPServerError)?.code == .bindFailed
            }
        }
        let badHost = HTTPServer(configuration: .init(host: "example.com", port: 0), router: Router())
        #expect(throws: HTTPServerError.self) { try badHost.start() }
    }

    @Test func everyRequestIsReportedOnce() async throws {
        let records = RecordSink()
        let router = Self.router()
        try await withServer(router, records: records) { server in
            let port = server.boundPort
            _ = try await request(port, "GET", "/hello", headers: [("User-Agent", "tests/1")])
            _ = try await request(port, "GET", "/v1/people/1/devices/2")
            _ = try await request(port, "GET", "/missing")
            _ = try await request(port, "POST", "/echo", body: Array("abc".utf8))
            // a request MHD itself rejects (malformed header line) must not leak its context
            _ = try? await onThread {
                let connection = try RawConnection(port: port)
                try connection.send("GET /hello HTTP/1.1\r\nHost: x\r\nbroken header line\r\n\r\n")
                return try connection.readResponse()
            }
            // nor one whose client hangs up in the middle of the headers
            _ = try await onThread {
                let connection = try RawConnection(port: port)
                try connection.send("GET /hello HTTP/1.1\r\nHost: x\r\nUser-")
                usleep(50_000)
                return 0
            }
            let all = await records.waitFor(4)
            #expect(all.count == 4)
            let byPath = Dictionary(grouping: all, by: \.path)
            let hello = try #require(byPath["/hello"]?.first)
            #expect(hello.status == 200)
            #expect(hello.route == "/hello")
            #expect(hello.userAgent == "tests/1")
            #expect(hello.bytesOut == 11)
            #expect(hello.remoteAddress == "127.0.0.1")
            #expect(byPath["/v1/people/1/devices/2"]?.first?.route == "/v1/people/{id}/devices/{device_token}")
            #expect(byPath["/missing"]?.first?.status == 404)
            #expect(byPath["/missing"]?.first?.route == nil)
            #expect(byPath["/echo"]?.first?.bytesIn == 3)
            for _ in 0..<200 where server.liveRequestCount != 0 { try await Task.sleep(for: .milliseconds(5)) }
            #expect(server.liveRequestCount == 0)
        }
    }

    @Test func idleKeepAliveConnectionsTimeOut() async throws {
        let oneSecond: (inout HTTPServer.Configuration) -> Void = { $0.connectionTimeout = .seconds(1) }
        try await withServer(Self.router(), configure: oneSecond) { server in
            let port = server.boundPort
            let (status, closed, elapsed) = try await onThread {
                let connection = try RawConnection(port: port, timeoutSeconds: 15)
                try connection.sendRequest("GET", "/hello")
                let status = try connection.readResponse().status
                let clock = ContinuousClock()
                let start = clock.now
                let closed = connection.isClosedByPeer()
                return (status, closed, clock.now - start)
            }
            #expect(status == 200)
            #expect(closed)
            // Closed by the 1 s idle timeout, not at once and not never (the upper bound allows a loaded CI).
            #expect(elapsed > .milliseconds(500) && elapsed < .seconds(10), "closed after \(elapsed)")
        }
    }

    // It once failed only beside the integration tests: their child processes inherited this test's client
    // socket, so closing it here never reached the server and the slot stayed taken. Sockets in the tests are
    // close-on-exec now and children inherit nothing beyond stdio.
    @Test func connectionLimitHoldsBackExtraConnections() async throws {
        let singleConnection: (inout HTTPServer.Configuration) -> Void = {
            $0.connectionLimit = 1
            $0.threadCount = 1
        }
        try await withServer(Self.router(), configure: singleConnection) { server in
            let port = server.boundPort
            let (first, servedWhileFull, afterwards) = try await onThread {
                var first: RawConnection? = try RawConnection(port: port)
                try first!.sendRequest("GET", "/hello")
                let status = try first!.readResponse().status
                var second: RawConnection? = try RawConnection(port: port, timeoutSeconds: 1)  // in the backlog
                try second!.sendRequest("GET", "/hello")
                let servedWhileFull = (try? second!.readResponse()) != nil
                first = nil  // frees the slot
                // The freed slot is taken on MHD's next poll; under a loaded machine that can exceed one read
                // timeout, so allow a few before calling it a failure.
                var afterwards: Int?
                for _ in 0..<5 where afterwards == nil {
                    afterwards = try? second!.readResponse().status
                }
                // Not answered yet (a loaded machine): closed, as a client that gave up would. Left open, it kept the
                // only slot (its late answer, then keep-alive for the 60 s idle timeout) from every connection below.
                second = nil
                // Under load the backlogged connection can be dropped instead of accepted late; the slot must
                // still be free for a new connection once the server has seen the first one close (until then a
                // new one is closed at once: recv() fails), within a deadline.
                let deadline = ContinuousClock.now + .seconds(15)
                while afterwards == nil && ContinuousClock.now < deadline {
                    let third = try RawConnection(port: port, timeoutSeconds: 5)
                    try third.sendRequest("GET", "/hello")
                    afterwards = try? third.readResponse().status
                    if afterwards == nil { usleep(50_000) }
                }
                return (status, servedWhileFull, afterwards ?? -1)
            }
            #expect(first == 200)
            #expect(!servedWhileFull)
            #expect(afterwards == 200)
        }
    }

    @Test("the connection beyond the per-address cap is closed at once; another address is still served")
    func perAddressConnectionLimit() async throws {
        let twoPerAddress: (inout HTTPServer.Configuration) -> Void = { $0.perAddressConnectionLimit = 2 }
        try await withServer(Self.router(), configure: twoPerAddress) { server in
            let port = server.boundPort
            let (held, extraAnswered, extraClosed, other, afterwards) = try await onThread {
                // Two served connections from 127.0.0.1, kept open: the cap for that address is reached.
                let held = try (0..<2).map { _ in try RawConnection(port: port) }
                var statuses: [Int] = []
                for connection in held {
                    try connection.sendRequest("GET", "/hello")
                    statuses.append(try connection.readResponse().status)
                }
                // The third from the same address is accepted by the kernel and closed by the server unanswered.
                let clock = ContinuousClock()
                let started = clock.now
                let extra = try RawConnection(port: port, timeoutSeconds: 15)
                try? extra.sendRequest("GET", "/hello")
                let extraAnswered = (try? extra.readResponse()) != nil  // EOF or reset, not the 15 s read timeout
                let extraClosed = clock.now - started < .seconds(10)
                // Another client address is not held back by the first one's connections.
                let second = try RawConnection(port: port, source: "127.0.0.2")
                try second.sendRequest("GET", "/hello")
                let other = try second.readResponse().status
                // The held connections still work.
                try held[0].sendRequest("GET", "/hello")
                let afterwards = try held[0].readResponse().status
                return (statuses, extraAnswered, extraClosed, other, afterwards)
            }
            #expect(held == [200, 200])
            #expect(!extraAnswered)
            #expect(extraClosed, "closed by the server, not left to time out")
            #expect(other == 200)
            #expect(afterwards == 200)
        }
    }

    @Test("a client dribbling its request is cut off at the read deadline; a prompt client and a slow handler are not")
    func requestReadDeadline() async throws {
        var router = Self.router()
        router.get("/handler-slower-than-deadline") { _ in
            try await Task.sleep(for: .milliseconds(1500))
            return .text("done")
        }
        let oneSecond: (inout HTTPServer.Configuration) -> Void = {
            $0.requestReadTimeout = .seconds(1)
            $0.connectionTimeout = .seconds(60)  // each dribbled byte comes well inside the idle timeout
        }
        try await withServer(router, configure: oneSecond) { server in
            let port = server.boundPort
            let (cutOff, elapsed, prompt, slowHandler) = try await onThread {
                let clock = ContinuousClock()
                let slow = try RawConnection(port: port, timeoutSeconds: 15)
                let started = clock.now
                try slow.send("GET /hello HTTP/1.1\r\nHost: x\r\n")
                // A prompt client is served while the slow one is still dribbling.
                let other = try RawConnection(port: port)
                try other.sendRequest("GET", "/hello")
                let prompt = try other.readResponse().status
                // One header byte every 100 ms, for at most 30 s: the idle timeout (60 s) never fires, so only the
                // read deadline can end this.
                let cutOff = slow.trickle("X", from: started, for: .seconds(30))
                let elapsed = clock.now - started
                // Time a handler runs does not count against the deadline.
                let patient = try RawConnection(port: port)
                try patient.sendRequest("GET", "/handler-slower-than-deadline")
                let slowHandler = try patient.readResponse().status
                return (cutOff, elapsed, prompt, slowHandler)
            }
            #expect(cutOff, "the dribbling client is disconnected unanswered")
            #expect(elapsed >= .milliseconds(900), "cut off after \(elapsed), not before the deadline")
            #expect(prompt == 200)
            #expect(slowHandler == 200)
        }
    }

    @Test func droppingARunningServerStopsIt() async throws {
        var port = 0
        do {
            let server = HTTPServer(configuration: .init(port: 0, threadCount: 2), router: Self.router())
            try server.start()
            port = server.boundPort
            #expect(try await request(port, "GET", "/hello").status == 200)
        }
        #expect(throws: ClientError.self) { try RawConnection(port: port) }
    }
}
