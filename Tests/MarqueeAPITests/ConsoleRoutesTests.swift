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

    /// Sinks that parse a string as HTML, run it as script, navigate away or style the page, each with why it is
    /// refused. The console builds its DOM with `h`/`s` (nodes, `textContent`, `setAttribute` of names it spells
    /// itself): data from devices and providers never reaches one of these.
    static let unsafeSinks: [(pattern: String, why: String)] = [
        ("innerHTML", "parses HTML"), ("outerHTML", "parses HTML"), ("insertAdjacentHTML", "parses HTML"),
        ("document.write", "parses HTML"), ("createContextualFragment", "parses HTML"), ("DOMParser", "parses HTML"),
        ("srcdoc", "parses HTML"), ("eval(", "runs a string"), ("Function(", "runs a string"),
        ("setTimeout('", "runs a string"), ("setTimeout(`", "runs a string"), ("setTimeout(\"", "runs a string"),
        ("setInterval('", "runs a string"), ("setInterval(`", "runs a string"), ("setInterval(\"", "runs a string"),
        ("javascript:", "a script URL"), ("setAttribute('on", "an inline handler"),
        ("setAttribute(`on", "an inline handler"),
        ("window.open", "navigates elsewhere"), ("location.href =", "navigates elsewhere"),
        ("location.assign", "navigates elsewhere"), ("location.replace", "navigates elsewhere"),
        ("createElement('script'", "a script element"), ("h('script'", "a script element"),
        ("s('script'", "a script element"), ("h('iframe'", "a frame"), ("'style'", "inline style (CSS injection)"),
        ("style:", "inline style (CSS injection)"), (".style.", "inline style (CSS injection)"),
        ("cssText", "inline style (CSS injection)"),
    ]

    @Test("the console's scripts use no sink that parses or runs a string, and build every link within the page")
    func noUnsafeSinks() {
        for (name, asset) in ConsoleRoutes.assets where name.hasSuffix(".js") {
            let text = String(decoding: asset.body, as: UTF8.self)
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                if code.hasPrefix("//") || code.hasPrefix("*") || code.hasPrefix("/**") { continue }
                for sink in Self.unsafeSinks where line.contains(sink.pattern) {
                    Issue.record("\(name):\(number + 1): \(sink.pattern) (\(sink.why)): \(code)")
                }
                // A link stays within the page: every `href` is a literal fragment ('#…'), data only after it.
                for match in line.matches(of: /href\s*[:,]\s*(.{0,2})/) where !["'#", "`#"].contains(match.output.1) {
                    Issue.record("\(name):\(number + 1): an href that is not a literal '#…': \(code)")
                }
            }
        }
        // The page has no inline script or handler either.
        let page = String(decoding: ConsoleRoutes.assets["index.html"]?.body ?? [], as: UTF8.self)
        #expect(page.matches(of: /\son[a-z]+\s*=/).isEmpty, "an inline handler in index.html")
        #expect(page.components(separatedBy: "<script").count == 2, "one script element, the module")
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
