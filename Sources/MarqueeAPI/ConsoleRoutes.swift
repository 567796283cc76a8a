import Crypto
import Foundation
import HTTPServer

/// `GET /console` and `GET /console/{asset}`: the operator console, static files that call the JSON API with the app
/// key the operator signs in with. No key, tenant data or server state is in these files, so they need no key.
///
/// The files are embedded in the binary (`Console/*.swift`, one string per file) rather than installed beside it
/// like `Migrations/`: one artefact to ship, nothing to locate at run time (the Docker image, the systemd units and
/// `make run` serve the console with no change), and a console that always matches the API it calls. There is no
/// build step: each file is the plain HTML, CSS or JavaScript module the browser gets.
struct ConsoleRoutes: Sendable {
    /// One embedded file.
    struct Asset: Sendable {
        var contentType: String
        var body: [UInt8]
        /// A strong validator: the SHA-256 of the body.
        var etag: String

        init(_ contentType: String, _ text: String) {
            self.contentType = contentType
            self.body = Array(text.utf8)
            self.etag = "\"" + String(Hex.encode(SHA256.hash(body)).prefix(32)) + "\""
        }
    }

    /// The console's files by name; `index.html` is the page at `/console`.
    static let assets: [String: Asset] = [
        "index.html": Asset("text/html; charset=utf-8", ConsoleFiles.indexHTML),
        "console.css": Asset("text/css; charset=utf-8", ConsoleFiles.css),
        "app.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.appJS),
        "api.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.apiJS),
        "ui.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.uiJS),
        "charts.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.chartsJS),
        "overview.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.overviewJS),
        "activities.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.activitiesJS),
        "campaigns.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.campaignsJS),
        "failures.js": Asset("text/javascript; charset=utf-8", ConsoleFiles.failuresJS),
        "favicon.svg": Asset("image/svg+xml", ConsoleFiles.faviconSVG),
    ]

    /// Sent with every console response. Scripts, styles and connections only from this origin (no inline script or
    /// style, no third party), never framed, no referrer (a console URL names instances), no MIME sniffing. Trusted
    /// Types with no policy: the browser refuses a string for any sink that parses HTML or runs script (`innerHTML`,
    /// `outerHTML`, `insertAdjacentHTML`, `document.write`, a script's `src` or text…), so the console can only build
    /// its DOM from nodes and `textContent`, whatever a device or a provider wrote.
    static let securityHeaders: HTTPHeaders = [
        "Content-Security-Policy":
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; "
            + "trusted-types 'none'",
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin",
        "Cross-Origin-Resource-Policy": "same-origin",
        "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
        // Revalidated on every load (a 304 when unchanged), so an upgraded server never runs with stale modules.
        "Cache-Control": "no-cache",
    ]

    func register(in router: inout Router) {
        router.add(.GET, "/console") { request in Self.serve("index.html", request) }
        router.add(.GET, "/console/{asset}") { request in
            Self.serve(request.pathParameters["asset"] ?? "", request)
        }
    }

    /// The asset, a 304 when the client's copy is current, or a 404 problem for any other name (names are looked up
    /// in the embedded table, never on a file system, so no path reaches outside it).
    static func serve(_ name: String, _ request: HTTPRequest) -> HTTPResponse {
        guard let asset = assets[name] else {
            var response = HTTPResponse.problem(Problems.notFound("console_file"))
            for (field, value) in securityHeaders { response.headers[field] = value }
            return response
        }
        var headers = securityHeaders
        headers["ETag"] = asset.etag
        if let tags = request.headers["If-None-Match"], matches(tags, asset.etag) {
            return HTTPResponse(status: 304, headers: headers)
        }
        headers["Content-Type"] = asset.contentType
        return HTTPResponse(status: 200, headers: headers, body: asset.body)
    }

    /// RFC 9110 §13.1.2: `*`, or a list of tags one of which equals `etag` (weak comparison).
    static func matches(_ header: String, _ etag: String) -> Bool {
        header.split(separator: ",").contains { part in
            let tag = part.trimmingCharacters(in: .whitespaces)
            return tag == "*" || tag == etag || tag == "W/" + etag
        }
    }
}
