import Foundation
import MarqueeCore
import MarqueeSimulators
import PostgresClient
import Testing

/// The operator console in headless Chromium (WebDriver), against `marquee serve`, a worker and the simulators: the
/// way an operator uses it. Each test keeps screenshots in `Browser.artifacts` (the README's are copied from there).
@Suite("Console in a browser", .serialized)
struct ConsoleBrowserTests {
    struct Setup {
        var fixture: FCMDeliveryFixture.Running
        var tenant: TestTenant
        var type: String
        var api: API { fixture.api }
        var console: String { fixture.serve.baseURL + "/console" }

        /// A person with an iPhone and a push-to-start token for `type`; returns (device, push-to-start token).
        func iphone(_ person: String, tokenPrefix: String = "") async throws -> (device: String, pushToStart: String) {
            try await api.iphone(tenant, person: person, type: type, tokenPrefix: tokenPrefix)
        }

        func start(_ instance: String, person: String, state: [String: Any] = ["step": 1]) async throws {
            try ok(
                await api.call(
                    "POST", "/v1/live_notifications/start", key: tenant.app,
                    json: [
                        "identifiers": ["id": person], "notification_type": type, "instance_id": instance,
                        "attributes": ["order": instance], "content_state": state,
                        "push_payload": ["alert": ["title": "Order", "body": "Preparing"]],
                    ]))
        }

        func deliveries(_ instance: String) async throws -> [[String: Any]] {
            let r = try await api.call("GET", "/v1/live_notifications/\(instance)/deliveries", key: tenant.app)
            try ok(r)
            return try r.json().array("data")
        }

        /// Waits until `instance` has a delivery in `status`.
        func waitForDelivery(_ instance: String, status: String) async throws {
            try await eventually("a \(status) delivery of \(instance)") {
                try await deliveries(instance).contains { $0.string("status") == status }
            }
        }

        func campaign(_ id: String) async throws -> [String: Any] {
            let r = try await api.call("GET", "/v1/campaigns/\(id)", key: tenant.app, timeout: 60)
            try ok(r)
            return try r.json()
        }

        /// Opens the console through a `#key=` link, says yes to signing in with it, and waits for the overview.
        func signIn(_ browser: Browser) async throws {
            try await browser.open(console + "#key=" + tenant.app)
            try await browser.wait(for: "[data-testid=switch-key]").click()
            try await browser.wait(for: "[data-testid=instances-total]")
        }

        /// Makes the page's next `count` calls whose URL contains `path` (and whose method is `method`) fail as a lost
        /// connection does, before they reach the server.
        func failNextCalls(
            _ browser: Browser, to path: String, method: String = "GET", count: Int = 1
        ) async throws {
            _ = try await browser.execute(
                """
                const [path, method] = [arguments[0], arguments[1]];
                let left = arguments[2];
                const original = window.fetch;
                window.fetch = (url, init) => {
                  if (left > 0 && String(url).includes(path) && (init?.method ?? 'GET') === method) {
                    left -= 1;
                    return Promise.reject(new TypeError('Failed to fetch'));
                  }
                  return original(url, init);
                };
                """, [path, method, count])
        }
    }

    static func setup() async throws -> Setup {
        let fixture = try await FCMDeliveryFixture.console.running()
        let api = fixture.api
        let tenant = try await api.createTenant("console-" + Fake.hex(6))
        try ok(await api.call("PUT", "/v1/credentials/apns", key: tenant.app, json: fixture.apnsCredentials))
        try ok(await api.call("PUT", "/v1/credentials/fcm", key: tenant.app, json: fixture.fcmCredentials))
        let type = Fake.activityType()
        try ok(await api.call("PUT", "/v1/activity_types/\(type)", key: tenant.app, json: ["attributes_type": "Order"]))
        return Setup(fixture: fixture, tenant: tenant, type: type)
    }

    @Test(
        "sign in with #key=: asked first, the fragment is cleared, the key is in sessionStorage only, the overview shows the counts"
    )
    func signInAndOverview() async throws {
        let t = try await Self.setup()
        for index in 0..<3 {
            let person = Fake.id("p\(index)")
            _ = try await t.iphone(person)
            try await t.start("order-\(index)-" + Fake.hex(6), person: person)
            if index == 2 {
                let list = try await t.api.call("GET", "/v1/live_notifications?person=\(person)", key: t.tenant.app)
                let id = try #require(try list.json().array("data").first?.string("instance_id"))
                try ok(
                    await t.api.call("POST", "/v1/live_notifications/end", key: t.tenant.app, json: ["instance_id": id])
                )
            }
        }
        let overview = try await t.api.call("GET", "/v1/overview", key: t.tenant.app).json()
        let queued = try #require(overview.object("queue")?["due"] as? Int)

        try await Browser.run("overview") { browser in
            // A link signs a fresh tab in only once the operator says so, having seen whose tenant it is: anyone can send
            // a link that signs its reader in to their own tenant.
            try await browser.open(t.console + "#key=" + t.tenant.app)
            try await browser.wait(
                for: "[data-testid=confirm-switch]", containing: "tenant " + t.tenant.id.lowercased().prefix(8))
            #expect(!(try await browser.url).contains(t.tenant.app))
            #expect(try await browser.execute("return sessionStorage.length;") as? Int == 0, "nothing kept yet")
            #expect(try await browser.execute("return document.activeElement.dataset.testid;") as? String == "keep-key")
            try await browser.wait(for: "[data-testid=switch-key]", containing: "Sign in").click()
            try await browser.wait(for: "[data-testid=instances-total]", containing: "3")
            try await browser.wait(for: "[data-state=pending]", containing: "2")
            try await browser.wait(for: "[data-state=ended]", containing: "1")
            try await browser.wait(for: "[data-testid=queue-due]", containing: String(queued))
            try await browser.wait(for: "[data-credential=apns]", containing: "ok")
            try await browser.wait(for: "[data-testid=deliveries-chart] svg")

            let url = try await browser.url
            #expect(!url.contains(t.tenant.app), "the key left the address bar: \(url)")
            #expect(url.hasSuffix("/console#/overview"), "\(url)")
            let stored = try await browser.execute("return sessionStorage.getItem('marquee.console.appKey');")
            #expect(stored as? String == t.tenant.app)
            let local = try await browser.execute("return [localStorage.length, document.cookie];") as? [Any]
            #expect(local?.first as? Int == 0, "nothing in localStorage")
            #expect(local?.last as? String == "", "no cookie")
            // Script errors and CSP violations are logged as SEVERE.
            let severe = try await browser.severeLogs()
            #expect(severe.isEmpty, "\(severe)")
            try await browser.screenshot("overview")

            // A credential Apple refused shows as broken, with the reason.
            _ = try await t.fixture.pool.query(
                """
                UPDATE apns_credentials SET status = 'broken', status_reason = 'InvalidProviderToken'
                WHERE tenant_id = \(t.tenant.uuid)
                """)
            try await browser.wait(for: ".page-head button").click()
            try await browser.wait(for: "[data-credential=apns]", containing: "broken")
            try await browser.wait(for: "[data-testid=credentials]", containing: "InvalidProviderToken")
            try await browser.wait(for: "[data-credential=fcm]", containing: "ok")

            // Dark mode follows the system: other colours, the same page.
            let background = "return getComputedStyle(document.body).backgroundColor;"
            let light = try await browser.execute(background) as? String
            try await browser.emulateColorScheme("dark")
            try await browser.wait(until: "matchMedia('(prefers-color-scheme: dark)').matches")
            let dark = try await browser.execute(background) as? String
            #expect(light != nil && dark != nil && light != dark, "\(light ?? "?") / \(dark ?? "?")")
            try await browser.wait(for: "[data-state=pending]", containing: "2")
            try await browser.screenshot("overview-dark")
        }
        // The fragment never reached the server, so the key is in no log line.
        #expect(!t.fixture.serve.log.contains(t.tenant.app))
    }

    @Test("an instance started through the API is in the list; its page shows its deliveries and refreshes itself")
    func activityListAndPage() async throws {
        let t = try await Self.setup()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let person = Fake.id("ann")
        let (device, _) = try await t.iphone(person)
        let instance = "order-42-" + Fake.hex(6)
        try await t.start(instance, person: person, state: ["status": "preparing", "eta_minutes": 25])
        try await t.waitForDelivery(instance, status: "sent")
        // 50 newer ones of the same person, so her list has three pages: 49 to 25, 24 to 0, and the first one.
        for index in 0..<50 { try await t.start("order-\(index)-" + Fake.hex(6), person: person) }

        try await Browser.run("activities") { browser in
            try await t.signIn(browser)
            try await browser.wait(for: "nav a[data-section=activities]").click()
            try await browser.wait(for: "[data-testid=activities-table]", containing: "order-")
            // The activity type field suggests the tenant's types.
            try await browser.wait(until: "document.querySelector('#activity-types option[value=\"\(t.type)\"]')")
            // Filter by person: only hers, 51, so two pages of 25, then the last page has the oldest one, and back.
            let field = try await browser.wait(for: "#filter-person")
            try await field.type(person)
            try await browser.wait(for: "form.filters button[type=submit]").click()
            try await browser.wait(until: "location.hash.includes('person=')")
            let rows = "document.querySelectorAll('[data-testid=activities-table] tbody tr').length"
            let second = "document.querySelector('[data-testid=activities-table]')?.textContent.includes('order-0-')"
            try await browser.wait(until: "\(rows) === 25")
            try await browser.screenshot("activities")
            let next = "nav.pager button:not([disabled])"
            try await browser.wait(for: next, containing: "Next page").click()
            try await browser.wait(until: "location.hash.includes('cursor=') && \(rows) === 25 && \(second)")
            let secondPage = try #require(try await browser.execute("return location.hash;") as? String)
            try await browser.wait(for: next, containing: "Next page").click()
            try await browser.wait(until: "\(rows) === 1")
            try await browser.wait(for: "[data-testid=activities-table]", containing: instance)
            try await browser.wait(for: next, containing: "Previous page").click()
            try await browser.wait(until: "location.hash === '\(secondPage)' && \(rows) === 25")
            // The browser's Back, then "Previous page": the page before the one shown, whatever was clicked before.
            try await browser.wait(for: next, containing: "Next page").click()
            try await browser.wait(until: "\(rows) === 1")
            _ = try await browser.execute("history.back();")
            try await browser.wait(until: "location.hash === '\(secondPage)' && \(rows) === 25")
            try await browser.wait(for: next, containing: "Previous page").click()
            try await browser.wait(until: "!location.hash.includes('cursor=') && \(rows) === 25 && !\(second)")
            try await browser.wait(for: next, containing: "Next page").click()
            try await browser.wait(until: "location.hash === '\(secondPage)' && \(rows) === 25")
            try await browser.wait(for: next, containing: "Next page").click()
            try await browser.wait(until: "\(rows) === 1")

            try await browser.wait(for: "[data-testid=activities-table] a[href*='\(instance)']").click()
            try await browser.wait(for: "[data-testid=content-state]", containing: "preparing")
            try await browser.wait(for: "[data-testid=deliveries-table]", containing: "sent")
            try await browser.wait(for: "[data-testid=deliveries-table]", containing: "start")

            // While it is open the page follows it: an update through the API shows up by itself.
            let token = Fake.hex()
            try ok(
                await t.api.call(
                    "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: t.tenant.sdk,
                    json: ["token": token]))
            try ok(
                await t.api.call(
                    "POST", "/v1/live_notifications/update", key: t.tenant.app,
                    json: ["instance_id": instance, "content_state_patch": ["status": "on_the_way"]]))
            try await browser.wait(for: "[data-testid=instance-version]", containing: "2")
            try await browser.wait(for: "[data-testid=content-state]", containing: "on_the_way")
            try await browser.wait(for: "[data-testid=deliveries-table]", containing: "update")
            try await browser.screenshot("activity", fullPage: true)
            let severe = try await browser.severeLogs()
            #expect(severe.isEmpty, "\(severe)")
        }
    }

    /// A running campaign over `people` iPhone owners (one push-to-start each): its ID, the people, their devices and
    /// push-to-start tokens.
    static func runningCampaign(_ t: Setup, people: Int, state: [String: Any] = ["step": 0]) async throws -> (
        id: String, persons: [String], devices: [String], tokens: [String]
    ) {
        var persons: [String] = []
        var devices: [String] = []
        var tokens: [String] = []
        for index in 0..<people {
            let person = Fake.id("fan\(index)")
            let phone = try await t.iphone(person)
            persons.append(person)
            devices.append(phone.device)
            tokens.append(phone.pushToStart)
        }
        let id = Fake.id("cup")
        try ok(
            await t.api.call(
                "POST", "/v1/campaigns", key: t.tenant.app,
                json: [
                    "campaign_id": id, "name": "Cup final", "notification_type": t.type,
                    "audience": ["people": persons],
                    "attributes": ["match": "A-B"], "content_state": state,
                    "push_payload": ["alert": ["title": "Kick-off", "body": "A v B"]],
                ]))
        try await eventually("campaign \(id) started and sent") {
            let c = try await t.campaign(id)
            let sent = c.array("funnel").reduce(0) { $0 + ($1["sent"] as? Int ?? 0) }
            return c.string("state") == "active" && sent == people
        }
        return (id, persons, devices, tokens)
    }

    @Test("a campaign page shows its funnel: targeted, sent, delivered, opened per platform")
    func campaignFunnel() async throws {
        let t = try await Self.setup()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let campaign = try await Self.runningCampaign(t, people: 3)
        // One phone reports the start push delivered and opened, as the SDK does.
        let push = try #require(t.fixture.apns.pushes(token: campaign.tokens[0]).first)
        let metadata = try #require(push["payload"]?["aps"]?["content-state"]?["marqueeMetadata"])
        for metric in ["delivered", "opened"] {
            try ok(
                await t.api.call(
                    "POST", "/v1/deliveries/\(metadata["deliveryId"]?.stringValue ?? "")/metrics", key: t.tenant.sdk,
                    json: ["metric": metric, "delivery_token": metadata["deliveryToken"]?.stringValue ?? ""]))
        }

        try await Browser.run("campaign") { browser in
            try await t.signIn(browser)
            try await browser.wait(for: "nav a[data-section=campaigns]").click()
            try await browser.wait(for: "[data-testid=campaigns-table]", containing: "Cup final")
            try await browser.screenshot("campaigns")
            try await browser.wait(for: "[data-testid=campaigns-table] a[href*='\(campaign.id)']").click()
            try await browser.wait(for: "h1", containing: "Cup final")
            try await browser.wait(for: "[data-testid=funnel-start]")
            for (bar, value) in [("Targeted", 3), ("Sent", 3), ("Delivered", 1), ("Opened", 1)] {
                try await browser.wait(
                    until: "document.querySelector('[data-bar=\"iOS/\(bar)\"]')?.textContent === '\(value)'")
            }
            try await browser.wait(for: "[data-testid=schedules-table]", containing: "done")
            try await browser.screenshot("campaign", fullPage: true)
            let severe = try await browser.severeLogs()
            #expect(severe.isEmpty, "\(severe)")
        }
    }

    @Test("a campaign-wide update sent from the console, after its confirmation, reaches the APNs simulator")
    func campaignUpdateFromConsole() async throws {
        let t = try await Self.setup()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let campaign = try await Self.runningCampaign(t, people: 1)
        // The phone's activity started and reported its update token.
        let person = campaign.persons[0]
        let device = campaign.devices[0]
        let activityToken = Fake.hex()
        try ok(
            await t.api.call(
                "PUT", "/v1/live_notifications/\(campaign.id).\(person)/tokens/\(device)", key: t.tenant.sdk,
                json: ["token": activityToken]))

        try await Browser.run("campaign-update") { browser in
            try await t.signIn(browser)
            try await browser.open(t.console + "#/campaigns/" + campaign.id)
            try await browser.wait(for: "[data-testid=campaign-update]").click()
            let editor = try await browser.wait(for: "#change-json")
            try await editor.clear()
            // Not JSON first: refused in the page, nothing sent.
            try await editor.type("{\"content_state_patch\": {\"step\": ")
            try await browser.wait(for: "[data-testid=change-review]").click()
            try await browser.wait(for: "#change-error", containing: "Not valid JSON")
            try await editor.clear()
            try await editor.type("{\"content_state_patch\": {\"step\": 7}}")
            try await browser.wait(for: "[data-testid=change-review]").click()
            try await browser.wait(for: "[data-testid=confirm-dialog]", containing: "Send this update")
            try await browser.screenshot("campaign-confirm")
            try await browser.wait(for: "[data-testid=change-confirm]").click()
            try await browser.wait(for: "[data-testid=change-result]", containing: "accepted")
            try await eventually("the update at the simulator") {
                t.fixture.apns.pushes(token: activityToken).contains {
                    $0["payload"]?["aps"]?["event"]?.stringValue == "update"
                        && $0["payload"]?["aps"]?["content-state"]?["step"]?.intValue == 7
                }
            }
            try await browser.wait(for: "[data-testid=schedules-table]", containing: "update")
            try await browser.screenshot("campaign-update")

            // End all: going back from the confirmation sends nothing; confirming ends every instance.
            try await browser.wait(for: "[data-testid=campaign-end]:not([disabled])").click()
            try await browser.wait(for: "[data-testid=change-review]").click()
            try await browser.wait(for: "[data-testid=confirm-dialog]", containing: "End the whole campaign")
            try await browser.wait(for: "[data-testid=confirm-dialog] button[value=cancel]").click()
            try await browser.wait(until: "!document.querySelector('[data-testid=confirm-dialog]').open")
            #expect(try await t.campaign(campaign.id).array("schedules").count == 2, "nothing was scheduled")
            try await browser.wait(for: "[data-testid=change-review]").click()
            try await browser.wait(for: "[data-testid=change-confirm]").click()
            try await browser.wait(for: "[data-testid=change-result]", containing: "end accepted")
            try await eventually("the end at the simulator") {
                t.fixture.apns.pushes(token: activityToken).contains {
                    $0["payload"]?["aps"]?["event"]?.stringValue == "end"
                }
            }
            // Over: the page refreshes to ended and offers no more changes.
            try await browser.wait(for: "[data-testid=campaign-update][disabled]", timeout: .seconds(60))
        }
    }

    @Test(
        "a campaign-wide update starts from an empty patch, and sent again after its answer was lost it is taken once; a failed refresh is retried"
    )
    func campaignUpdateOnce() async throws {
        let t = try await Self.setup()
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let campaign = try await Self.runningCampaign(t, people: 1, state: ["home": 0, "away": 0])
        let instance = "\(campaign.id).\(campaign.persons[0])"
        try ok(
            await t.api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(campaign.devices[0])", key: t.tenant.sdk,
                json: ["token": Fake.hex()]))
        @Sendable func score() async throws -> [String: Any] {
            let r = try await t.api.call("GET", "/v1/live_notifications/\(instance)", key: t.tenant.app)
            try ok(r)
            return try #require(try r.json().object("content_state"), "\(r.text)")
        }

        try await Browser.run("campaign-update-once") { browser in
            try await t.signIn(browser)
            try await browser.open(t.console + "#/campaigns/" + campaign.id)
            try await browser.wait(for: "[data-testid=schedules-table]", containing: "done")
            // A refresh that gets no answer is shown, and the page tries again: it shows the home team's goal, scored
            // through the API meanwhile.
            try await t.failNextCalls(browser, to: "/v1/campaigns/\(campaign.id)")
            try await browser.wait(for: "main", containing: "Could not load the campaign")
            try ok(
                await t.api.call(
                    "POST", "/v1/campaigns/\(campaign.id)/update", key: t.tenant.app,
                    json: ["content_state_patch": ["home": 2]]))
            try await eventually("the API's update applied") { try await score()["home"] as? Int == 2 }
            try await browser.wait(for: "[data-testid=schedules-table]", containing: "update")

            // The operator changes one field of what the editor starts with: the away score.
            try await browser.wait(for: "[data-testid=campaign-update]:not([disabled])").click()
            _ = try await browser.execute(
                """
                const editor = document.querySelector('#change-json');
                const body = JSON.parse(editor.value);
                body.content_state_patch.away = 1;
                editor.value = JSON.stringify(body);
                """)
            try await browser.wait(for: "[data-testid=change-review]").click()
            // The first send reaches the server, but its answer is lost on the way back.
            _ = try await browser.execute(
                """
                window.sentKeys = [];
                const original = window.fetch;
                let lose = true;
                window.fetch = async (url, init) => {
                  if (!String(url).endsWith('/update') || init?.method !== 'POST') return original(url, init);
                  window.sentKeys.push(init.headers['Idempotency-Key']);
                  const response = await original(url, init);
                  if (lose) {
                    lose = false;
                    throw new TypeError('Failed to fetch');
                  }
                  return response;
                };
                """)
            try await browser.wait(for: "[data-testid=change-confirm]").click()
            try await browser.wait(for: "#change-error", containing: "unknown")
            // Sent again as it was: with the same Idempotency-Key, so the campaign takes it once.
            try await browser.wait(for: "[data-testid=change-review]").click()
            try await browser.wait(for: "[data-testid=change-confirm]").click()
            try await browser.wait(for: "[data-testid=change-result]", containing: "accepted")
            let keys = try await browser.execute("return window.sentKeys;") as? [String] ?? []
            #expect(keys.count == 2 && keys.first == keys.last, "\(keys)")
        }
        try await eventually("the console's update applied") { try await score()["away"] as? Int == 1 }
        #expect(try await score()["home"] as? Int == 2, "the home score is kept")
        let updates = try await t.campaign(campaign.id).array("schedules").filter { $0.string("operation") == "update" }
        #expect(updates.count == 2, "the API's update and the console's, once: \(updates)")
    }

    @Test(
        "an instance page shows every delivery as new ones arrive after older ones were loaded; a failed refresh is retried"
    )
    func olderDeliveries() async throws {
        let t = try await Self.setup()
        let person = Fake.id("bea")
        let (device, _) = try await t.iphone(person)
        let instance = "order-7-" + Fake.hex(6)
        try await t.start(instance, person: person)
        try ok(
            await t.api.call(
                "PUT", "/v1/live_notifications/\(instance)/tokens/\(device)", key: t.tenant.sdk,
                json: ["token": Fake.hex()]))
        // Each update names a step the state has not had (it starts at 1), so each is a change and a push.
        @Sendable func update(_ steps: Range<Int>) async throws {
            for step in steps {
                try ok(
                    await t.api.call(
                        "POST", "/v1/live_notifications/update", key: t.tenant.app,
                        json: ["instance_id": instance, "content_state_patch": ["step": step]]))
            }
        }
        @Sendable func count() async throws -> Int {
            var total = 0
            var cursor: String?
            repeat {
                let r = try await t.api.call(
                    "GET",
                    "/v1/live_notifications/\(instance)/deliveries?limit=100" + (cursor.map { "&cursor=" + $0 } ?? ""),
                    key: t.tenant.app)
                try ok(r)
                let page = try r.json()
                total += page.array("data").count
                cursor = page.string("next_cursor")
            } while cursor != nil
            return total
        }
        // The start and 59 updates: a page of 50 and 10 older.
        try await update(2..<61)
        let initial = try await count()
        #expect(initial == 60)

        try await Browser.run("older-deliveries") { browser in
            try await t.signIn(browser)
            try await browser.open(t.console + "#/activities/" + instance)
            let rows = "document.querySelectorAll('[data-testid=deliveries-table] tbody tr').length"
            try await browser.wait(until: "\(rows) === 50")
            try await browser.wait(for: "main button", containing: "Load older deliveries").click()
            try await browser.wait(until: "\(rows) === 60")
            // A refresh that gets no answer is shown, and the page tries again.
            try await t.failNextCalls(browser, to: "/v1/live_notifications/\(instance)")
            try await browser.wait(for: "[data-testid=refresh-status]", containing: "trying again")
            // 10 more: the newest 50 are no longer the 50 before the older ones held; the 10 between them are shown.
            try await update(61..<71)
            try await browser.wait(for: "[data-testid=instance-version]", containing: "70")
            try await browser.wait(until: "\(rows) === 70")
            let total = try await count()
            #expect(total == 70)
            try await browser.wait(for: "[data-testid=refresh-status]", containing: "Refreshing every 5 s")
        }
    }

    @Test("the failures screen groups undeliverable pushes by the provider's reason and links to the instance")
    func failures() async throws {
        let t = try await Self.setup()
        // Tokens starting "dead" are unregistered at the simulator (only this test's tokens start so).
        t.fixture.apns.setFaults([.init(tokenPrefix: "dead", action: .unregistered)])
        defer { t.fixture.apns.setFaults([]) }
        let worker = try t.fixture.worker()
        defer { worker.signal(SIGKILL) }
        let person = Fake.id("gone")
        _ = try await t.iphone(person, tokenPrefix: "dead")
        let instance = "order-gone-" + Fake.hex(6)
        try await t.start(instance, person: person)
        try await t.waitForDelivery(instance, status: "undeliverable")

        try await Browser.run("failures") { browser in
            try await t.signIn(browser)
            try await browser.wait(for: "nav a[data-section=failures]").click()
            let group = try await browser.wait(for: "[data-testid=failure-group]", containing: "Unregistered")
            #expect(try await group.text.contains(instance))
            try await browser.screenshot("failures", fullPage: true)
            try await browser.wait(for: "[data-testid=failure-group] a[href*='\(instance)']").click()
            try await browser.wait(for: "[data-testid=deliveries-table]", containing: "undeliverable")
            // A link to a period the list does not offer shows that period, not the list's first.
            try await browser.open(t.console + "#/failures?hours=48")
            try await browser.wait(for: "[data-testid=failure-group]", containing: "Unregistered")
            try await browser.wait(for: "main p", containing: "in the last 48 hours")
            let period =
                "const s = document.getElementById('failures-window'); return [s.value, s.selectedOptions[0].text];"
            #expect(try await browser.execute(period) as? [String] == ["48", "last 48 hours"])
        }
    }

    @Test("what devices and providers wrote is text: no markup runs, a reason called `constructor` finds no advice")
    func hostileStrings() async throws {
        let t = try await Self.setup()
        // The sdk key ships in the app, so a person ID is anyone's to choose.
        let person = #"<img src=x onerror="window.__xss='person'">"# + Fake.hex(4)
        let path = try #require(person.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
        var instances: [String: String] = [:]
        // A tenant's endpoint answers what it likes: reasons that are names every JavaScript object has.
        for reason in ["constructor", "__proto__", "Unregistered"] {
            _ = try await t.api.iphone(t.tenant, person: path, type: t.type)
            let instance = "order-" + reason.filter(\.isLetter).lowercased() + "-" + Fake.hex(6)
            try await t.start(
                instance, person: person,
                state: ["note": #"</pre><script>window.__xss='state'</script><img src=x onerror="window.__xss='img'">"#]
            )
            try await t.fixture.pool.recordOutcome(
                tenant: t.tenant.uuid, instance: instance, status: "failed", reason: reason, httpStatus: 400)
            instances[reason] = instance
        }
        let reasons = instances
        let noScriptRan = """
            return `${window.__xss ?? 'nothing ran'}, ${document.querySelectorAll('img[src=x], script:not([src])').length}`;
            """

        try await Browser.run("hostile") { browser in
            try await t.signIn(browser)
            try await browser.open(t.console + "#/activities")
            try await browser.wait(for: "[data-testid=activities-table]", containing: #"<img src=x onerror="#)
            #expect(try await browser.execute(noScriptRan) as? String == "nothing ran, 0")

            let instance = try #require(reasons["constructor"])
            try await browser.open(t.console + "#/activities/" + instance)
            try await browser.wait(for: "[data-testid=content-state]", containing: "</pre><script>")
            try await browser.wait(for: "[data-testid=deliveries-table]", containing: "constructor")
            #expect(try await browser.execute(noScriptRan) as? String == "nothing ran, 0")
            // The person link keeps the ID in the fragment, encoded.
            let href = try await browser.wait(for: "dl.facts a[href^='#/activities?person=']").attribute("href")
            let query = try #require(href?.split(separator: "=", maxSplits: 1).last)
            #expect(!query.contains("<") && !query.contains("\""), "\(href ?? "")")
            #expect(query.removingPercentEncoding == person, "\(href ?? "")")

            try await browser.open(t.console + "#/failures")
            try await browser.wait(for: "[data-testid=failure-group]", containing: "__proto__")
            try await browser.wait(for: "[data-testid=failure-group]", containing: "constructor")
            let advice = """
                return [...document.querySelectorAll('[data-testid=failure-group]')].map((group) =>
                  [group.querySelector('h2 .mono').textContent, group.querySelector(':scope > p')?.textContent ?? '']);
                """
            let groups = try #require(try await browser.execute(advice) as? [[String]])
            #expect(groups.count == 3, "\(groups)")
            for group in groups {
                switch group.first {
                case "Unregistered": #expect(group.last?.contains("Marquee retired the token") == true, "\(group)")
                default: #expect(group.last == "", "advice for \(group.first ?? "?"): \(group.last ?? "")")
                }
            }
            #expect(try await browser.execute(noScriptRan) as? String == "nothing ran, 0")

            // Trusted Types without a policy: a string handed to an HTML sink is refused.
            let sink = """
                try { document.createElement('div').innerHTML = '<img src=x>'; return 'parsed'; }
                catch (error) { return error.name; }
                """
            #expect(try await browser.execute(sink) as? String == "TypeError")
            let severe = try await browser.severeLogs().filter { !$0.contains("TrustedHTML") }
            #expect(severe.isEmpty, "\(severe)")
        }
    }

    @Test("a wrong key shows a clear error and is not kept; an sdk key is refused; the app key then signs in")
    func wrongKey() async throws {
        let t = try await Self.setup()
        try await Browser.run("sign-in-error") { browser in
            try await browser.open(t.console + "#key=mq_app_0000_not-a-real-key")
            try await browser.wait(for: "[data-testid=confirm-switch]", containing: "an unrecognised key")
            try await browser.wait(for: "[data-testid=switch-key]").click()
            try await browser.wait(for: "[data-testid=sign-in-error]", containing: "was not accepted")
            #expect(!(try await browser.url).contains("not-a-real-key"))
            #expect(try await browser.execute("return sessionStorage.length;") as? Int == 0)
            try await browser.screenshot("sign-in-error")

            // Signed out, the sections are not offered.
            #expect(
                try await browser.execute("return document.getElementById('nav').offsetParent === null;") as? Bool
                    == true)

            let field = try await browser.wait(for: "#app-key")
            try await field.type(t.tenant.sdk)
            try await browser.wait(for: "form button[type=submit]").click()
            try await browser.wait(for: "[data-testid=sign-in-error]", containing: "not an app key")
            #expect(try await browser.execute("return sessionStorage.length;") as? Int == 0)

            // With the keyboard alone: the field has the focus after an error, Enter submits.
            #expect(try await browser.execute("return document.activeElement.id;") as? String == "app-key")
            try await field.clear()
            try await field.type(t.tenant.app + "\u{E007}")
            try await browser.wait(for: "[data-testid=instances-total]")
            #expect(
                try await browser.execute("return document.getElementById('nav').offsetParent !== null;") as? Bool
                    == true)
            // Each screen starts with the focus on its heading; Tab goes on to its controls, with a focus ring; links
            // work with Enter.
            try await browser.wait(until: "document.activeElement.tagName === 'H1'")
            try await browser.press(Browser.tab)
            #expect(try await browser.execute("return document.activeElement.textContent;") as? String == "Refresh")
            let ring = try await browser.execute("return getComputedStyle(document.activeElement).outlineStyle;")
            #expect(ring as? String == "solid", "a visible focus ring")
            _ = try await browser.execute("document.querySelector('nav a[data-section=activities]').focus();")
            try await browser.press(Browser.enter)
            try await browser.wait(for: "h1", containing: "Live activities")
            // A key revoked while the console is open signs it out at its next call, saying why.
            let appKey = try await t.api.keyIDs(t.tenant).app
            try ok(
                await t.api.call(
                    "DELETE", "/admin/v1/tenants/\(t.tenant.id)/keys/\(appKey)", key: MarqueeProcess.adminToken))
            try await browser.open(t.console + "#/overview")
            try await browser.wait(for: "[data-testid=sign-in-error]", containing: "no longer accepted")
            #expect(try await browser.execute("return sessionStorage.length;") as? Int == 0)
            let fresh = try await t.api.call(
                "POST", "/admin/v1/tenants/\(t.tenant.id)/keys", key: MarqueeProcess.adminToken, json: ["kind": "app"]
            ).json()
            let newKey = try #require(fresh.string("key"), "\(fresh)")
            try await browser.wait(for: "#app-key").type(newKey + Browser.enter)
            try await browser.wait(for: "[data-testid=instances-total]")

            // Signing out forgets the key.
            try await browser.wait(for: "#sign-out").click()
            try await browser.wait(for: "#app-key")
            #expect(try await browser.execute("return sessionStorage.length;") as? Int == 0)
        }
    }

    @Test("a #key= link with another tenant's key changes nothing until the operator chooses to switch")
    func linkWithAnotherKey() async throws {
        let t = try await Self.setup()
        let other = try await t.api.createTenant("console-other-" + Fake.hex(6))
        let stored = "return sessionStorage.getItem('marquee.console.appKey');"
        try await Browser.run("switch-key") { browser in
            try await t.signIn(browser)
            try await browser.wait(for: "#key-hint", containing: "tenant " + t.tenant.id.lowercased().prefix(8))

            // Another tenant's link in the same tab: asked, not switched; the link's key is out of the address bar.
            try await browser.open(t.console + "#key=" + other.app)
            try await browser.wait(
                for: "[data-testid=confirm-switch]", containing: String(other.id.lowercased().prefix(8)))
            #expect(try await browser.execute(stored) as? String == t.tenant.app)
            #expect(!(try await browser.url).contains(other.app))
            #expect(try await browser.execute("return document.activeElement.dataset.testid;") as? String == "keep-key")
            try await browser.screenshot("switch-key")
            try await browser.wait(for: "[data-testid=keep-key]").click()
            try await browser.wait(for: "[data-testid=instances-total]")
            #expect(try await browser.execute(stored) as? String == t.tenant.app)

            // A switch to a key the API refuses keeps the current one.
            try await browser.open(t.console + "#key=mq_app_0000_not-a-real-key")
            try await browser.wait(for: "[data-testid=switch-key]").click()
            try await browser.wait(for: "[data-testid=switch-error]", containing: "current key is kept")
            #expect(try await browser.execute(stored) as? String == t.tenant.app)

            // Chosen: the other tenant's key is used.
            try await browser.open(t.console + "#key=" + other.app)
            try await browser.wait(for: "[data-testid=switch-key]").click()
            try await browser.wait(for: "[data-testid=instances-total]")
            #expect(try await browser.execute(stored) as? String == other.app)
            try await browser.wait(for: "#key-hint", containing: "tenant " + other.id.lowercased().prefix(8))

            // The same key again signs in without asking.
            try await browser.open(t.console + "#key=" + other.app)
            try await browser.wait(for: "[data-testid=instances-total]")
            #expect(try await browser.execute(stored) as? String == other.app)
            // The same key while its check gets no answer (a lost connection; a 429 or 503 alike): still signed in.
            try await t.failNextCalls(browser, to: "/v1/overview")
            _ = try await browser.execute("location.hash = arguments[0];", ["#key=" + other.app])
            try await browser.wait(until: "location.hash === '#/overview'")
            try await browser.wait(for: "[data-testid=instances-total]")
            #expect(try await browser.find("#app-key") == nil, "not signed out")
            #expect(try await browser.execute(stored) as? String == other.app)
            try await browser.wait(for: "#key-hint", containing: "tenant " + other.id.lowercased().prefix(8))
            // No script error (the refused key's 401 and the other tenant's missing credentials are logged as failed
            // loads).
            let severe = try await browser.severeLogs().filter { !$0.contains("Failed to load resource") }
            #expect(severe.isEmpty, "\(severe)")
        }
    }
}

extension API {
    /// Registers an iPhone of `person` with a push-to-start token for `type` (sdk key); returns both tokens.
    func iphone(_ tenant: TestTenant, person: String, type: String, tokenPrefix: String = "") async throws -> (
        device: String, pushToStart: String
    ) {
        let device = Fake.hex()
        let token = tokenPrefix + Fake.hex(64 - tokenPrefix.count)
        try ok(await call("PUT", "/v1/people/\(person)/devices/\(device)", key: tenant.sdk, json: ["platform": "ios"]))
        try ok(
            await call(
                "PUT", "/v1/people/\(person)/devices/\(device)/push_to_start/\(type)", key: tenant.sdk,
                json: ["token": token]))
        return (device, token)
    }
}

/// Fails the test with `response` unless it is a 2xx.
func ok(_ response: HTTP.Response) throws {
    guard (200..<300).contains(response.status) else { throw TestFailure("\(response.status) \(response.text)") }
}

/// Polls `condition` until it holds (deadline `timeout`). The condition is checked once more after the deadline: on
/// a loaded machine the poller itself may sleep past it while the condition came true.
func eventually(
    _ what: String, timeout: Duration = .seconds(60), _ condition: () async throws -> Bool
) async throws {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while clock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(100))
    }
    if try await condition() { return }
    throw TestFailure("waited \(timeout) for \(what)")
}
