import Foundation
import Testing

/// Headless Chromium driven through the W3C WebDriver protocol: Debian's `chromedriver` on a free port, spoken to with
/// the tests' own HTTP client. Every wait is a poll with a deadline; nothing sleeps a fixed time.
///
/// `Browser.run` starts chromedriver in a process group of its own (through `setsid`) with a private Chromium profile
/// directory, and always stops both: the session is deleted, the group killed, and any process still naming the
/// profile directory killed by its PID; a watchdog does the same if the test process dies first.
struct Browser: Sendable {
    let endpoint: String
    let session: String
    let profile: String

    static let chromedriver = ProcessInfo.processInfo.environment["MARQUEE_CHROMEDRIVER"] ?? "/usr/bin/chromedriver"
    static let chromium = ProcessInfo.processInfo.environment["MARQUEE_CHROMIUM"] ?? "/usr/bin/chromium"
    /// Generous: a cold Chromium on a loaded 2-core machine takes seconds to start.
    static let defaultTimeout: Duration = .seconds(30)

    /// Where screenshots go: `$MARQUEE_TEST_ARTIFACTS`, else `.build/test-artifacts/console/` in the repository.
    static var artifacts: String {
        let base =
            ProcessInfo.processInfo.environment["MARQUEE_TEST_ARTIFACTS"].flatMap { $0.isEmpty ? nil : $0 }
            ?? TestEnvironment.repositoryRoot + "/.build/test-artifacts/console"
        try? FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        return base
    }

    /// Runs `body` with a fresh browser; saves `<name>-failed.png` when it throws; stops everything either way.
    static func run<T: Sendable>(_ name: String, _ body: @Sendable (Browser) async throws -> T) async throws -> T {
        let profile = NSTemporaryDirectory() + "chromium-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: profile, withIntermediateDirectories: true)
        let port = TestEnvironment.freePort()
        let driver = try Subprocess(
            "/usr/bin/setsid", [chromedriver, "--port=\(port)", "--allowed-ips=127.0.0.1"], environment: [:],
            outputPath: profile + ".driver.log")
        // If this test process dies before cleaning up, the driver's group goes too.
        let watchdog = try? Subprocess(
            "/bin/sh",
            // dash's `kill` takes no `--`: `-9 -<pgid>` names the group.
            ["-c", "while kill -0 \(getpid()) 2>/dev/null; do sleep 1; done; kill -9 -\(driver.pid) 2>/dev/null"],
            environment: [:], outputPath: "/dev/null")
        var browser: Browser?
        do {
            let endpoint = "http://127.0.0.1:\(port)"
            try await waitForDriver(endpoint, driver)
            let started = try await startSession(endpoint, profile: profile)
            browser = started
            let result = try await body(started)
            await stop(browser, driver: driver, watchdog: watchdog, profile: profile)
            return result
        } catch {
            if let browser { _ = try? await browser.screenshot(name + "-failed") }
            await stop(browser, driver: driver, watchdog: watchdog, profile: profile)
            throw error
        }
    }

    private static func waitForDriver(_ endpoint: String, _ driver: Subprocess) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + defaultTimeout
        while clock.now < deadline {
            if !driver.isRunning { throw TestFailure("chromedriver exited: \(driver.output)") }
            if let status = try? await HTTP.send("GET", endpoint + "/status", body: nil, timeout: 5),
                status.status == 200,
                ((try? status.json())?["value"] as? [String: Any])?["ready"] as? Bool == true
            {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestFailure("chromedriver did not become ready: \(driver.output)")
    }

    private static func startSession(_ endpoint: String, profile: String) async throws -> Browser {
        let arguments = [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--window-size=1280,960", "--user-data-dir=" + profile,
            "--lang=en-US",
        ]
        let capabilities: [String: Any] = [
            "capabilities": [
                "alwaysMatch": [
                    "browserName": "chrome",
                    "goog:chromeOptions": ["binary": chromium, "args": arguments],
                    "timeouts": ["script": 30_000, "pageLoad": 60_000, "implicit": 0],
                    "goog:loggingPrefs": ["browser": "ALL"],
                ]
            ]
        ]
        let response = try await HTTP.send(
            "POST", endpoint + "/session", headers: ["Content-Type": "application/json"],
            body: try JSONSerialization.data(withJSONObject: capabilities), timeout: 90)
        guard response.status == 200, let value = try response.json()["value"] as? [String: Any],
            let session = value["sessionId"] as? String
        else { throw TestFailure("WebDriver session: \(response.status) \(response.text)") }
        return Browser(endpoint: endpoint, session: session, profile: profile)
    }

    private static func stop(_ browser: Browser?, driver: Subprocess, watchdog: Subprocess?, profile: String) async {
        if let browser {
            _ = try? await HTTP.send("DELETE", browser.base, body: nil, timeout: 20)
        }
        kill(-driver.pid, SIGKILL)
        _ = await driver.wait()
        // Chromium helpers that left the group (none should) are found by their profile directory.
        for pid in processes(naming: profile) { kill(pid, SIGKILL) }
        if let watchdog {
            watchdog.signal(SIGKILL)
            _ = await watchdog.wait()
        }
        try? FileManager.default.removeItem(atPath: profile)
        try? FileManager.default.removeItem(atPath: profile + ".driver.log")
    }

    /// PIDs whose command line contains `text` (read from /proc).
    static func processes(naming text: String) -> [pid_t] {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
        return entries.compactMap { entry -> pid_t? in
            guard let pid = pid_t(entry), pid != getpid(),
                let data = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline")
            else { return nil }
            let line = String(decoding: data.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
            return line.contains(text) ? pid : nil
        }
    }

    // MARK: Commands

    var base: String { endpoint + "/session/" + session }

    /// Sends one command; returns its `value`; a WebDriver error becomes a `WebDriverError`.
    @discardableResult
    func command(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any? {
        let payload = try body.map { try JSONSerialization.data(withJSONObject: $0) }
        let response = try await HTTP.send(
            method, base + path, headers: payload == nil ? [:] : ["Content-Type": "application/json"],
            body: payload ?? (method == "POST" ? Data("{}".utf8) : nil), timeout: 60)
        let object = (try? JSONSerialization.jsonObject(with: response.body)) as? [String: Any]
        let value = object?["value"]
        if response.status != 200 {
            let error = value as? [String: Any]
            throw WebDriverError(
                code: error?["error"] as? String ?? "http \(response.status)",
                message: String((error?["message"] as? String ?? response.text).prefix(500)))
        }
        return value
    }

    func open(_ url: String) async throws {
        try await command("POST", "/url", ["url": url])
    }

    var url: String {
        get async throws { try await command("GET", "/url") as? String ?? "" }
    }

    /// Runs `script` (a function body; `arguments[i]` are the arguments) and returns its result.
    func execute(_ script: String, _ arguments: [Any] = []) async throws -> Any? {
        try await command("POST", "/execute/sync", ["script": script, "args": arguments])
    }

    /// The first element matching `css`, or nil.
    func find(_ css: String) async throws -> Element? {
        do {
            let value = try await command("POST", "/element", ["using": "css selector", "value": css])
            guard let object = value as? [String: Any], let id = object[Element.key] as? String else { return nil }
            return Element(browser: self, id: id)
        } catch let error as WebDriverError where error.code == "no such element" {
            return nil
        }
    }

    /// Every element matching `css`.
    func findAll(_ css: String) async throws -> [Element] {
        let value = try await command("POST", "/elements", ["using": "css selector", "value": css])
        return (value as? [[String: Any]] ?? []).compactMap { object in
            (object[Element.key] as? String).map { Element(browser: self, id: $0) }
        }
    }

    /// Waits until `css` matches an element (whose text contains `text`, when given) and returns it.
    @discardableResult
    func wait(
        for css: String, containing text: String? = nil, timeout: Duration = Browser.defaultTimeout,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Element {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        var lastText = ""
        while clock.now < deadline {
            for element in try await findAll(css) {
                guard let text else { return element }
                // The element may be replaced by a refresh between finding and reading it.
                if let shown = try? await element.text {
                    lastText = shown
                    if shown.contains(text) { return element }
                }
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        let main = try? await find("main")
        let page = await main?.textIfAny ?? ""
        throw TestFailure(
            "waited \(timeout) for \(css)\(text.map { " containing \"\($0)\"" } ?? "") (last seen: \"\(lastText)\"); "
                + "page: \(page.prefix(1500))")
    }

    /// Waits until `condition` (a JavaScript expression) is truthy.
    func wait(until condition: String, timeout: Duration = Browser.defaultTimeout) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while clock.now < deadline {
            if let value = try await execute("return Boolean(\(condition));") as? Bool, value { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestFailure("waited \(timeout) for \(condition)")
    }

    /// Makes the page see `prefers-color-scheme: <scheme>` (Chromium's DevTools protocol through chromedriver).
    func emulateColorScheme(_ scheme: String) async throws {
        try await command(
            "POST", "/goog/cdp/execute",
            [
                "cmd": "Emulation.setEmulatedMedia",
                "params": ["features": [["name": "prefers-color-scheme", "value": scheme]]],
            ])
    }

    static let tab = "\u{E004}"
    static let enter = "\u{E007}"

    /// Presses and releases `key` (a character or a WebDriver key code such as `Browser.tab`) where the focus is.
    func press(_ key: String) async throws {
        try await command(
            "POST", "/actions",
            [
                "actions": [
                    [
                        "type": "key", "id": "keyboard",
                        "actions": [["type": "keyDown", "value": key], ["type": "keyUp", "value": key]],
                    ]
                ]
            ])
    }

    /// Saves a PNG of the viewport (or, with `fullPage`, of the whole page up to 2,400 pixels high, by making the
    /// window that tall for the shot) to `artifacts/<name>.png` and returns its path.
    @discardableResult
    func screenshot(_ name: String, fullPage: Bool = false) async throws -> String {
        var restore: [String: Any]?
        if fullPage, let rect = try await command("GET", "/window/rect") as? [String: Any],
            let height = try await execute("return document.documentElement.scrollHeight;") as? Int
        {
            restore = ["width": rect["width"] ?? 1280, "height": rect["height"] ?? 960]
            try await command(
                "POST", "/window/rect", ["width": rect["width"] ?? 1280, "height": min(height + 140, 2400)])
        }
        let shot = try await command("GET", "/screenshot") as? String
        if let restore { try await command("POST", "/window/rect", restore) }
        guard let base64 = shot, let png = Data(base64Encoded: base64) else { throw TestFailure("no screenshot") }
        let path = Browser.artifacts + "/" + name + ".png"
        try png.write(to: URL(fileURLWithPath: path))
        return path
    }

    /// The browser's console messages of level SEVERE (script errors, CSP violations).
    func severeLogs() async throws -> [String] {
        let value = try await command("POST", "/se/log", ["type": "browser"])
        return (value as? [[String: Any]] ?? []).filter { $0["level"] as? String == "SEVERE" }.compactMap {
            $0["message"] as? String
        }
    }
}

struct WebDriverError: Error, CustomStringConvertible {
    var code: String
    var message: String
    var description: String { "WebDriver \(code): \(message)" }
}

/// An element of the page.
struct Element: Sendable {
    static let key = "element-6066-11e4-a52e-4f735466cecf"
    let browser: Browser
    let id: String

    var text: String {
        get async throws { try await browser.command("GET", "/element/\(id)/text") as? String ?? "" }
    }

    var textIfAny: String {
        get async { (try? await text) ?? "" }
    }

    func attribute(_ name: String) async throws -> String? {
        try await browser.command("GET", "/element/\(id)/attribute/\(name)") as? String
    }

    func click() async throws {
        try await browser.command("POST", "/element/\(id)/click")
    }

    func clear() async throws {
        try await browser.command("POST", "/element/\(id)/clear")
    }

    func type(_ text: String) async throws {
        try await browser.command("POST", "/element/\(id)/value", ["text": text])
    }
}
