import Foundation
import HTTPServer
import Testing

@testable import MarqueeAPI

/// The console's embedded files as `ConsoleRoutes` serves them, without a server.
@Suite("Console files in process")
struct ConsoleRoutesTests {
    static func get(_ name: String, ifNoneMatch: String? = nil) -> HTTPResponse {
        var headers: HTTPHeaders = [:]
        if let ifNoneMatch { headers["If-None-Match"] = ifNoneMatch }
        return ConsoleRoutes.serve(name, HTTPRequest(method: .GET, target: "/console/" + name, headers: headers))
    }

    @Test("every file: a type of its kind, the security headers, its own ETag; the page's modules are all there")
    func files() {
        let types = [
            "html": "text/html; charset=utf-8", "css": "text/css; charset=utf-8",
            "js": "text/javascript; charset=utf-8", "svg": "image/svg+xml",
        ]
        var etags: Set<String> = []
        for (name, asset) in ConsoleRoutes.assets {
            let response = Self.get(name)
            #expect(response.status == 200, "\(name)")
            #expect(response.body == asset.body && !asset.body.isEmpty, "\(name)")
            #expect(response.headers["Content-Type"] == types[String(name.split(separator: ".").last ?? "")], "\(name)")
            for (field, value) in ConsoleRoutes.securityHeaders {
                #expect(response.headers[field] == value, "\(name): \(field)")
            }
            etags.insert(response.headers["ETag"] ?? "")
        }
        #expect(etags.count == ConsoleRoutes.assets.count, "one validator per file")
        let page = String(decoding: ConsoleRoutes.assets["index.html"]?.body ?? [], as: UTF8.self)
        #expect(page.contains("<script type=\"module\" src=\"/console/app.js\"></script>"))
        for name in ConsoleRoutes.assets.keys where name.hasSuffix(".js") {
            let text = String(decoding: ConsoleRoutes.assets[name]?.body ?? [], as: UTF8.self)
            for line in text.split(separator: "\n") {
                guard let from = line.range(of: "from './") else { continue }
                let module = String(line[from.upperBound...].prefix { $0 != "'" })
                #expect(ConsoleRoutes.assets[module] != nil, "\(name) imports \(module), which is not served")
            }
        }
    }

    @Test("If-None-Match: the file's tag, its weak form, one of a list, or * answer 304 with no body")
    func revalidation() {
        let etag = Self.get("app.js").headers["ETag"] ?? ""
        for header in [etag, "W/" + etag, "\"x\", " + etag, " \"x\" ,\(etag) ", "*"] {
            let response = Self.get("app.js", ifNoneMatch: header)
            #expect(response.status == 304 && response.body.isEmpty, "\(header)")
            #expect(response.headers["ETag"] == etag)
            #expect(response.headers["Content-Security-Policy"] != nil)
        }
        for header in [
            "\"x\"", "", etag.replacingOccurrences(of: "\"", with: ""), Self.get("ui.js").headers["ETag"] ?? "",
        ] {
            #expect(Self.get("app.js", ifNoneMatch: header).status == 200, "\(header)")
        }
    }

    @Test("names outside the table are 404 problems with the console's headers, whatever they look like")
    func unknownNames() {
        for name in [
            "", "nope.js", "../app.js", "..", "./app.js", "app.js/", "APP.JS", "app.js\0", "/etc/passwd", "%2e%2e",
        ] {
            let response = Self.get(name)
            #expect(response.status == 404, "\(name)")
            #expect(response.headers["Content-Type"] == "application/problem+json", "\(name)")
            #expect(response.headers["X-Frame-Options"] == "DENY", "\(name)")
        }
    }
}
