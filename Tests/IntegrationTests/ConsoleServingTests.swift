import Foundation
import HTTPServer
import PostgresClient
import Testing

/// `/console`: the embedded files with their headers, and nothing else reachable through it.
@Suite("Console files")
struct ConsoleServingTests {
    static let files: [(name: String, type: String)] = [
        ("index.html", "text/html; charset=utf-8"), ("console.css", "text/css; charset=utf-8"),
        ("app.js", "text/javascript; charset=utf-8"), ("api.js", "text/javascript; charset=utf-8"),
        ("ui.js", "text/javascript; charset=utf-8"), ("charts.js", "text/javascript; charset=utf-8"),
        ("overview.js", "text/javascript; charset=utf-8"), ("activities.js", "text/javascript; charset=utf-8"),
        ("campaigns.js", "text/javascript; charset=utf-8"), ("failures.js", "text/javascript; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ]

    static func expectSecurityHeaders(_ r: HTTP.Response, _ label: String) {
        let csp = r.header("Content-Security-Policy") ?? ""
        for directive in [
            "default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
            "frame-ancestors 'none'", "base-uri 'none'", "require-trusted-types-for 'script'", "trusted-types 'none'",
        ] {
            #expect(csp.contains(directive), "\(label): CSP \(csp) lacks \(directive)")
        }
        #expect(!csp.contains("unsafe"), "\(label): \(csp)")
        #expect(r.header("X-Frame-Options") == "DENY", "\(label)")
        #expect(r.header("X-Content-Type-Options") == "nosniff", "\(label)")
        #expect(r.header("Referrer-Policy") == "no-referrer", "\(label)")
    }

    @Test("every file: its content type, a strict CSP, no framing, revalidation with its ETag (304), HEAD")
    func headers() async throws {
        let api = try await RegistryFixture.get().api
        for (name, type) in Self.files {
            let r = try await api.call("GET", "/console/" + name)
            #expect(r.status == 200, "\(name)")
            #expect(r.header("Content-Type") == type, "\(name)")
            #expect(!r.body.isEmpty, "\(name)")
            Self.expectSecurityHeaders(r, name)
            #expect(r.header("Cache-Control") == "no-cache", "\(name)")
            let etag = try #require(r.header("ETag"), "\(name)")
            #expect(etag.hasPrefix("\"") && etag.hasSuffix("\""), "\(name): \(etag)")

            let again = try await api.call("GET", "/console/" + name, headers: ["If-None-Match": "\"x\", " + etag])
            #expect(again.status == 304, "\(name)")
            #expect(again.body.isEmpty, "\(name)")
            #expect(again.header("ETag") == etag, "\(name)")
            let stale = try await api.call("GET", "/console/" + name, headers: ["If-None-Match": "\"other\""])
            #expect(stale.status == 200, "\(name)")
            let head = try await api.call("HEAD", "/console/" + name)
            #expect(head.status == 200 && head.body.isEmpty, "\(name)")
            #expect(head.header("Content-Type") == type, "\(name)")
        }
        let page = try await api.call("GET", "/console")
        let index = try await api.call("GET", "/console/index.html")
        #expect(page.status == 200 && page.body == index.body)
        #expect(try await api.call("GET", "/console/").body == index.body)
        Self.expectSecurityHeaders(page, "/console")
    }

    @Test("the API's answers, which the console reads with the key: no cache keeps them, no browser sniffs them")
    func apiAnswers() async throws {
        let api = try await RegistryFixture.get().api
        let tenant = try await api.createTenant()
        for (method, path, key, status) in [
            ("GET", "/v1/overview", tenant.app, 200), ("GET", "/v1/delivery_failures", tenant.app, 200),
            ("GET", "/v1/live_notifications", tenant.app, 200), ("GET", "/v1/activity_types", tenant.app, 200),
            ("GET", "/v1/overview", nil, 401), ("GET", "/v1/overview", tenant.sdk, 403),
            ("GET", "/v1/people/nobody", tenant.app, 404), ("GET", "/v1/no-such-route", tenant.app, 404),
            ("DELETE", "/v1/overview", tenant.app, 405),
        ] as [(String, String, String?, Int)] {
            let r = try await api.call(method, path, key: key)
            #expect(r.status == status, "\(method) \(path): \(r.text)")
            #expect(r.header("Cache-Control") == "no-store", "\(method) \(path)")
            #expect(r.header("X-Content-Type-Options") == "nosniff", "\(method) \(path)")
        }
        // The console's own files are revalidated, not forbidden from caches: they hold no data.
        #expect(try await api.call("GET", "/console/app.js").header("Cache-Control") == "no-cache")
    }

    @Test("unknown names and path tricks are 404 problems, never a file from elsewhere")
    func unknownFiles() async throws {
        let api = try await RegistryFixture.get().api
        for path in [
            "/console/nope.js", "/console/app.js/extra", "/console/..%2F..%2Fetc%2Fpasswd", "/console/..%2fapp.js",
            "/console/%2e%2e/%2e%2e/etc/passwd", "/console/../../etc/passwd", "/console/.%2e/Migrations",
            "/console/ConsoleRoutes.swift", "/console/APP.JS", "/console/app.js%20",
            "/console/index.html%2F..%2Fapi.js",
        ] {
            let r = try await api.call("GET", path)
            expectProblem(r, 404, "not-found", path)
            #expect(!r.text.contains("root:"), "\(path)")
        }
        // A segment holding U+0000 (or bytes that are not UTF-8) is a bad request on any path.
        for path in ["/console/%00app.js", "/console/app.js%00", "/console/%FF"] {
            expectProblem(try await api.call("GET", path), 400, "bad-request", field: "path", path)
        }
        // A file's 404 keeps the console's headers.
        Self.expectSecurityHeaders(try await api.call("GET", "/console/nope.js"), "404")
        // Only GET and HEAD.
        let post = try await api.call("POST", "/console/app.js", json: [:])
        #expect(post.status == 405)
    }

    @Test("in process: the router sends /console paths to the file table only")
    func inProcess() async throws {
        let routes = try RegisteredRoutes()
        func get(_ target: String, _ headers: HTTPHeaders = [:]) async throws -> (Int, HTTPHeaders, [UInt8]) {
            var request = HTTPRequest(method: .GET, target: target, headers: headers)
            switch routes.router.route(request) {
            case .problem(let problem):
                return (problem.status, problem.headers, [])
            case .matched(let match):
                request.pathParameters = match.parameters
                let response = try await match.handler(request)
                return (response.status, response.headers, response.body)
            }
        }
        let (status, headers, body) = try await get("/console/app.js")
        #expect(status == 200 && !body.isEmpty)
        let etag = try #require(headers["ETag"])
        #expect(try await get("/console/app.js", ["If-None-Match": etag]).0 == 304)
        for target in [
            "/console/..%2Fapp.js", "/console/%2E%2E%2F%2E%2E%2FPackage.swift", "/console/./app.js", "/console/..",
            "/console/app.js/", "/console//", "/console/Console/ConsoleFiles.swift",
        ] {
            let (code, _, bytes) = try await get(target)
            let allowed: Set<Int> = target == "/console/app.js/" || target == "/console//" ? [200] : [404]
            #expect(allowed.contains(code), "\(target): \(code) \(String(decoding: bytes.prefix(80), as: UTF8.self))")
        }
    }

    @Test("the page loads only its own files: no inline script or style, no third-party URL, every import is served")
    func selfContained() async throws {
        let api = try await RegistryFixture.get().api
        let index = try await api.call("GET", "/console").text
        let scripts = index.components(separatedBy: "<script").dropFirst()
        #expect(!scripts.isEmpty)
        for script in scripts {
            let tag = script.prefix { $0 != ">" }
            #expect(tag.contains("src=\"/console/"), "script without a src of our own: \(tag)")
            #expect(script.dropFirst(tag.count + 1).hasPrefix("</script>"), "inline script: \(script.prefix(80))")
        }
        #expect(!index.contains(" style="), "inline style attribute")
        #expect(!index.contains("<style"), "inline style element")

        // Follow the module graph from app.js: every import is a file the server has.
        var pending = ["app.js"]
        var seen: Set<String> = []
        while let name = pending.popLast() {
            guard seen.insert(name).inserted else { continue }
            let r = try await api.call("GET", "/console/" + name)
            #expect(r.status == 200, "\(name) is imported but not served")
            for line in r.text.split(separator: "\n") where line.hasPrefix("import ") || line.contains("} from '") {
                guard let from = line.range(of: "from './") else { continue }
                let rest = line[from.upperBound...]
                pending.append(String(rest.prefix { $0 != "'" }))
            }
        }
        #expect(seen.count >= 8, "\(seen)")
        for (name, _) in Self.files {
            let text = try await api.call("GET", "/console/" + name).text
            // The SVG namespace is a name, not a request; nothing else may point off the origin.
            let outside = text.replacingOccurrences(of: "http://www.w3.org/2000/svg", with: "")
            #expect(!outside.contains("http://") && !outside.contains("https://"), "\(name) names another origin")
            #expect(!text.contains("localStorage.setItem"), "\(name) writes localStorage")
            #expect(!text.contains("innerHTML"), "\(name) parses HTML from strings")
        }
    }
}
