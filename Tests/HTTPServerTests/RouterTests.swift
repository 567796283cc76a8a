import Foundation
import Testing

@testable import HTTPServer

@Suite("Router (no sockets)")
struct RouterTests {
    static func ok(_ tag: String) -> HTTPHandler {
        { _ in .text(tag) }
    }

    static func tag(of result: RouteResult) async throws -> String {
        guard case .matched(let match) = result else {
            Issue.record("expected a match, got \(result)")
            return ""
        }
        let response = try await match.handler(HTTPRequest(method: .GET, target: "/"))
        return String(decoding: response.body, as: UTF8.self)
    }

    @Test func pathParametersArePercentDecodedPerSegment() throws {
        var router = Router()
        router.get("/v1/people/{id}/devices/{device_token}", Self.ok("device"))
        let request = HTTPRequest(method: .GET, target: "/v1/people/a%20b%C3%A9/devices/x%2Fy?z=1")
        guard case .matched(let match) = router.route(request) else {
            Issue.record("no match")
            return
        }
        #expect(match.pattern == "/v1/people/{id}/devices/{device_token}")
        #expect(match.parameters == ["id": "a bé", "device_token": "x/y"])
        #expect(request.path == "/v1/people/a bé/devices/x/y")
        #expect(request.rawPath == "/v1/people/a%20b%C3%A9/devices/x%2Fy")
    }

    @Test func middlewareWrapsEveryRouteRegisteredSoFarAndRoutesAreListed() async throws {
        var router = Router()
        router.get("/a", Self.ok("a"))
        router.post("/b/{id}", Self.ok("b"))
        router.wrapHandlers { inner in
            { request in
                let response = try await inner(request)
                return .text("wrapped " + String(decoding: response.body, as: UTF8.self))
            }
        }
        router.get("/c", Self.ok("c"))
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "/a"))) == "wrapped a")
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .POST, target: "/b/1"))) == "wrapped b")
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "/c"))) == "c")
        #expect(
            router.registered.map { "\($0.method.rawValue) \($0.pattern)" } == ["GET /a", "POST /b/{id}", "GET /c"])
    }

    @Test func literalSegmentsBeatParameters() async throws {
        var router = Router()
        router.get("/v1/people/{id}", Self.ok("param"))
        router.get("/v1/people/me", Self.ok("literal"))
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "/v1/people/me"))) == "literal")
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "/v1/people/42"))) == "param")
        // trailing and doubled slashes are ignored
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "//v1/people/me/"))) == "literal")
    }

    @Test("a path segment or query value that is not UTF-8 or holds U+0000 once decoded is a 400, never routed")
    func undecodableTargetIs400() {
        var router = Router()
        router.put("/v1/people/{id}", Self.ok("person"))
        router.get("/v1/live_notifications", Self.ok("list"))
        for (method, target, field) in [
            (HTTPMethod.PUT, "/v1/people/%FF", "path"), (.PUT, "/v1/people/a%00b", "path"),
            (.PUT, "/v1/people/%C3", "path"), (.GET, "/v1/live_notifications?person=alice%00zz", "person"),
            (.GET, "/v1/live_notifications?person=%FE%FF", "person"), (.GET, "/v1/live_notifications?%FF=1", "query"),
            (.GET, "/v1/live_notifications?limit=10&cursor=a%00", "cursor"),
        ] {
            guard case .problem(let problem) = router.route(HTTPRequest(method: method, target: target)) else {
                Issue.record("\(target) should not be routed")
                continue
            }
            #expect(problem.status == 400, "\(target)")
            #expect(problem.type == HTTPProblem.typeBase + "bad-request", "\(target)")
            #expect(problem.field == field, "\(target)")
        }
        // Escaped UTF-8 and escaped reserved characters are still fine.
        for target in ["/v1/people/b%C3%A9", "/v1/people/a%2Fb"] {
            guard case .matched = router.route(HTTPRequest(method: .PUT, target: target)) else {
                Issue.record("\(target) should be routed")
                continue
            }
        }
        let query = HTTPRequest(method: .GET, target: "/v1/live_notifications?person=b%C3%A9+x")
        #expect(query.query["person"] == "bé x")
        guard case .matched = router.route(query) else {
            Issue.record("a UTF-8 query value should be routed")
            return
        }
    }

    @Test func unknownPathIs404Problem() {
        var router = Router()
        router.get("/v1/people/{id}", Self.ok("x"))
        for target in ["/v1/people", "/v1/people/1/extra", "/nope"] {
            guard case .problem(let problem) = router.route(HTTPRequest(method: .GET, target: target)) else {
                Issue.record("\(target) should not match")
                continue
            }
            #expect(problem.status == 404)
            #expect(problem.type == HTTPProblem.typeBase + "not-found")
        }
    }

    @Test func wrongMethodIs405WithAllow() {
        var router = Router()
        router.get("/v1/things/{id}", Self.ok("get"))
        router.delete("/v1/things/{id}", Self.ok("delete"))
        guard case .problem(let problem) = router.route(HTTPRequest(method: .POST, target: "/v1/things/1")) else {
            Issue.record("POST should not match")
            return
        }
        #expect(problem.status == 405)
        #expect(problem.type == HTTPProblem.typeBase + "method-not-allowed")
        #expect(problem.headers["Allow"] == "GET, HEAD, DELETE, OPTIONS")
        #expect(HTTPResponse.problem(problem).headers["allow"] == "GET, HEAD, DELETE, OPTIONS")
    }

    @Test func headFallsBackToGetAndOptionsIsAnswered() async throws {
        var router = Router()
        router.get("/r", Self.ok("get"))
        router.post("/r", Self.ok("post"))
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .HEAD, target: "/r"))) == "get")
        guard case .matched(let options) = router.route(HTTPRequest(method: .OPTIONS, target: "/r")) else {
            Issue.record("OPTIONS should be answered")
            return
        }
        let response = try await options.handler(HTTPRequest(method: .OPTIONS, target: "/r"))
        #expect(response.status == 204)
        #expect(response.headers["Allow"] == "GET, HEAD, POST, OPTIONS")
    }

    @Test func reAddingARouteReplacesIt() async throws {
        var router = Router()
        router.get("/x/{a}", Self.ok("first"))
        router.get("/x/{b}", Self.ok("second"))
        #expect(try await Self.tag(of: router.route(HTTPRequest(method: .GET, target: "/x/1"))) == "second")
    }

    @Test func bodyPolicyRejectsNonJSONBodies() {
        let text = HTTPRequest(
            method: .POST, target: "/", headers: ["Content-Type": "text/plain"], body: Array("hi".utf8))
        #expect(BodyPolicy.json.violation(for: text)?.status == 415)
        #expect(BodyPolicy.any.violation(for: text) == nil)
        let json = HTTPRequest(
            method: .POST, target: "/", headers: ["content-type": "application/merge-patch+json; charset=utf-8"],
            body: Array("{}".utf8))
        #expect(BodyPolicy.json.violation(for: json) == nil)
        let empty = HTTPRequest(method: .POST, target: "/", headers: ["Content-Type": "text/plain"])
        #expect(BodyPolicy.json.violation(for: empty) == nil)
    }
}

@Suite("Request parsing and JSON problems (no sockets)")
struct RequestTests {
    @Test func queryIsDecoded() {
        let request = HTTPRequest(method: .GET, target: "/s?a=1&b=x+y&c=%26%3D&a=2&flag")
        #expect(request.path == "/s")
        #expect(request.query == ["a": "1", "b": "x y", "c": "&=", "flag": ""])
        #expect(request.queryItems.map(\.name) == ["a", "b", "c", "a", "flag"])
        #expect(request.queryItems[3].value == "2")
    }

    @Test func requestIDIsEchoedOnlyWhenSane() {
        let sane = HTTPRequest(method: .GET, target: "/", headers: ["x-request-id": "abc-123_X.y"])
        #expect(sane.requestID == "abc-123_X.y")
        for bad in ["", "has space", "semi;colon", String(repeating: "a", count: 129), "ünicode"] {
            let request = HTTPRequest(method: .GET, target: "/", headers: ["X-Request-Id": bad])
            #expect(request.requestID != bad)
            #expect(request.requestID.count == 32)
            #expect(request.requestID.allSatisfy { $0.isHexDigit })
        }
        #expect(RequestID.generate() != RequestID.generate())
        // Generated IDs: 32 lowercase hex digits, none repeated.
        var seen = Set<String>()
        for _ in 0..<100_000 {
            let id = RequestID.generate()
            #expect(
                id.utf8.count == 32 && id.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
            seen.insert(id)
        }
        #expect(seen.count == 100_000)
    }

    @Test("plain paths (the fast path) and the others are taken apart alike")
    func targets() {
        for (target, raw, decoded) in [
            ("/v1/live_notifications/update", "/v1/live_notifications/update", "/v1/live_notifications/update"),
            ("/v1/people/a+b", "/v1/people/a+b", "/v1/people/a+b"),
            ("/v1/people/a%20b", "/v1/people/a%20b", "/v1/people/a b"),
            ("/v1/people/x?limit=2", "/v1/people/x", "/v1/people/x"),
            ("/v1/people/x#frag", "/v1/people/x", "/v1/people/x"),
            ("http://example.com/v1/x", "/v1/x", "/v1/x"),
            ("/v1/people/ü", "/v1/people/ü", "/v1/people/ü"),
        ] {
            let request = HTTPRequest(method: .GET, target: target)
            #expect(request.rawPath == raw, "\(target)")
            #expect(request.path == decoded, "\(target)")
            #expect(request.targetProblem == nil, "\(target)")
        }
        #expect(HTTPRequest(method: .GET, target: "/v1/people/x?limit=2").query["limit"] == "2")
        #expect(HTTPRequest(method: .GET, target: "/v1/people/a%00b").targetProblem != nil)
        #expect(HTTPRequest(method: .GET, target: "/v1/people/%FF").targetProblem != nil)
    }

    @Test func headersAreCaseInsensitive() {
        var headers: HTTPHeaders = ["Content-Type": "a", "X-One": "1"]
        headers.add("x-one", "2")
        #expect(headers["content-type"] == "a")
        #expect(headers.values("X-ONE") == ["1", "2"])
        headers["X-One"] = "3"
        #expect(headers.values("x-one") == ["3"])
        headers["CONTENT-TYPE"] = nil
        #expect(!headers.contains("Content-Type"))
        #expect(headers.count == 1)
    }

    @Test("header values lose the spaces and tabs around them, and nothing else")
    func headerValuesAreTrimmed() {
        #expect(HTTPHeaders.trimmed(" \t Bearer  mq_app_x \t") == "Bearer  mq_app_x")
        #expect(HTTPHeaders.trimmed("plain") == "plain")
        #expect(HTTPHeaders.trimmed(" \t ").isEmpty)
        #expect(HTTPHeaders.trimmed("").isEmpty)
        // Only HTTP's optional whitespace: a newline or a no-break space is part of the value.
        #expect(HTTPHeaders.trimmed("\nx\u{A0}") == "\nx\u{A0}")
        #expect(HTTPHeaders.trimmed(" é ") == "é")
        let request = HTTPRequest(
            method: .POST, target: "/", headers: ["Content-Type": " \tApplication/JSON ; charset=utf-8"])
        #expect(request.mediaType == "application/json")
    }

    static func jsonRequest(_ body: String, contentType: String? = "application/json") -> HTTPRequest {
        var headers = HTTPHeaders()
        if let contentType { headers["Content-Type"] = contentType }
        return HTTPRequest(method: .POST, target: "/", headers: headers, body: Array(body.utf8))
    }

    static func problem<T: Decodable>(_ request: HTTPRequest, _ type: T.Type) -> HTTPProblem? {
        do {
            _ = try request.decodeJSON(type)
            return nil
        } catch {
            return error
        }
    }

    struct Device: Codable { var token: String }
    struct Registration: Codable {
        var person: Person
        var devices: [Device]
    }

    @Test func decodeJSONSucceeds() throws {
        let person = try Self.jsonRequest(#"{"name":"Ada","age":36}"#).decodeJSON(Person.self)
        #expect(person == Person(name: "Ada", age: 36))
    }

    @Test func decodeJSONRejectsWrongContentType() {
        let problem = Self.problem(Self.jsonRequest(#"{"name":"Ada","age":1}"#, contentType: "text/plain"), Person.self)
        #expect(problem?.status == 415)
        #expect(problem?.type == HTTPProblem.typeBase + "unsupported-media-type")
        let missing = Self.problem(Self.jsonRequest("{}", contentType: nil), Person.self)
        #expect(missing?.status == 415)
    }

    @Test func decodeJSONMalformedIs400() {
        for body in ["{", "", "nul", #"{"name" "a"}"#, "{\"name\": tru}"] {
            let problem = Self.problem(Self.jsonRequest(body), Person.self)
            #expect(problem?.status == 400, "body \(body)")
            #expect(problem?.type == HTTPProblem.typeBase + "malformed-json")
        }
    }

    @Test func decodeJSONShapeErrorsAre422WithField() {
        let missing = Self.problem(Self.jsonRequest(#"{"name":"Ada"}"#), Person.self)
        #expect(missing?.status == 422)
        #expect(missing?.field == "/age")
        #expect(missing?.type == HTTPProblem.typeBase + "validation-failed")

        let nested = Self.problem(
            Self.jsonRequest(#"{"person":{"name":"A","age":1},"devices":[{"token":"t"},{"token":5}]}"#),
            Registration.self)
        #expect(nested?.status == 422)
        #expect(nested?.field == "/devices/1/token")
        #expect(nested?.detail?.contains("string") == true)

        let null = Self.problem(Self.jsonRequest(#"{"name":null,"age":1}"#), Person.self)
        #expect(null?.status == 422)
        #expect(null?.field == "/name")
    }

    @Test func jsonObjectHelper() throws {
        let object = try Self.jsonRequest(#"{"a":1,"b":[true]}"#).jsonObject()
        #expect(object?["a"] as? Int == 1)
        #expect(try HTTPRequest(method: .POST, target: "/").jsonObject() == nil)
        #expect(throws: HTTPProblem.self) { try Self.jsonRequest("[1]").jsonObject() }
        #expect(throws: HTTPProblem.self) { try Self.jsonRequest("{").jsonObject() }
    }

    @Test func problemRendersAsRFC9457() throws {
        var problem = HTTPProblem.validation(field: "/name", detail: "too long")
        problem.extensions["limit"] = "10"
        problem.extensions["status"] = "ignored: clashes with a standard member"
        let response = HTTPResponse.problem(problem)
        #expect(response.status == 422)
        #expect(response.headers["Content-Type"] == "application/problem+json")
        let object = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        #expect(object?["status"] as? Int == 422)
        #expect(object?["type"] as? String == "https://marquee.dev/problems/validation-failed")
        #expect(object?["title"] as? String == "Validation Failed")
        #expect(object?["field"] as? String == "/name")
        #expect(object?["limit"] as? String == "10")
        let decoded = try JSONDecoder().decode(HTTPProblem.self, from: Data(response.body))
        var expected = problem
        expected.extensions["status"] = nil
        expected.headers = [:]
        #expect(decoded == expected)
    }

    @Test func internalErrorOnlyCarriesTheRequestID() {
        let problem = HTTPProblem.internalError(requestID: "req-1")
        #expect(problem.status == 500)
        #expect(problem.detail == "Internal error. Request ID: req-1.")
        #expect(problem.extensions == ["request_id": "req-1"])
    }
}
