import Foundation
import Testing

@testable import Observability

@Suite("Prometheus exposition")
struct MetricsTests {
    @Test("a counter raised to sampled totals from many threads at once ends at the highest, never above")
    func raiseConcurrently() async {
        let registry = MetricsRegistry()
        let counter = registry.counter("sampled_total", help: "h")
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask { for total in 1...500 { counter.raise(to: Double(total)) } }
            }
        }
        #expect(counter.value() == 500)
        counter.raise(to: 10)
        #expect(counter.value() == 500, "a counter never goes down")
    }

    @Test("counters render HELP, TYPE and labelled samples")
    func counterExposition() {
        let registry = MetricsRegistry()
        let requests = registry.counter("http_requests_total", help: "Requests.", labels: ["route", "status"])
        requests.inc(1, ["/v1/x", "200"])
        requests.inc(2, ["/v1/x", "200"])
        requests.inc(labels: "/v1/y", "404")
        let text = registry.exposition()
        #expect(
            text == """
                # HELP http_requests_total Requests.
                # TYPE http_requests_total counter
                http_requests_total{route="/v1/x",status="200"} 3
                http_requests_total{route="/v1/y",status="404"} 1

                """)
    }

    @Test("label values and help text are escaped")
    func escaping() {
        let registry = MetricsRegistry()
        let c = registry.counter("odd_total", help: "Back\\slash\nnewline", labels: ["v"])
        c.inc(1, ["a\"b\\c\nd"])
        let text = registry.exposition()
        #expect(text.contains(#"# HELP odd_total Back\\slash\nnewline"#))
        #expect(text.contains(#"odd_total{v="a\"b\\c\nd"} 1"#))
    }

    @Test("histograms are cumulative with +Inf, sum and count")
    func histogram() {
        let registry = MetricsRegistry()
        let h = registry.histogram("latency_seconds", help: "L.", labels: ["op"], buckets: [0.1, 1])
        h.observe(0.05, ["send"])
        h.observe(0.1, ["send"])
        h.observe(0.5, ["send"])
        h.observe(3, ["send"])
        let text = registry.exposition()
        #expect(text.contains(#"latency_seconds_bucket{op="send",le="0.1"} 2"#))
        #expect(text.contains(#"latency_seconds_bucket{op="send",le="1"} 3"#))
        #expect(text.contains(#"latency_seconds_bucket{op="send",le="+Inf"} 4"#))
        #expect(text.contains(#"latency_seconds_sum{op="send"} 3.65"#))
        #expect(text.contains(#"latency_seconds_count{op="send"} 4"#))
        #expect(h.count(["send"]) == 4)
    }

    @Test("gauges set, add and are refreshed by collectors at scrape time")
    func gauges() {
        let registry = MetricsRegistry()
        let depth = registry.gauge("queue_depth", help: "Depth.")
        let counter = Counter(name: "x", help: "", labelNames: [])
        registry.onCollect {
            counter.inc()
            depth.set(counter.value())
        }
        #expect(registry.exposition().contains("queue_depth 1\n"))
        #expect(registry.exposition().contains("queue_depth 2\n"))
        depth.add(-0.5)
        #expect(depth.value() == 1.5)
    }

    @Test("registering a name twice returns the same family")
    func reRegister() {
        let registry = MetricsRegistry()
        let a = registry.counter("same_total", help: "x")
        let b = registry.counter("same_total", help: "x")
        a.inc()
        #expect(b.value() == 1)
    }

    @Test("families are sorted by name and unlabelled families render a zero sample")
    func ordering() {
        let registry = MetricsRegistry()
        _ = registry.counter("b_total", help: "b")
        _ = registry.gauge("a", help: "a")
        let text = registry.exposition()
        let a = text.range(of: "# HELP a ")!
        let b = text.range(of: "# HELP b_total")!
        #expect(a.lowerBound < b.lowerBound)
        #expect(text.contains("b_total 0\n"))
    }

    @Test("numbers: integers plain, fractions, infinities")
    func numbers() {
        #expect(Exposition.number(3) == "3")
        #expect(Exposition.number(0.25) == "0.25")
        #expect(Exposition.number(.infinity) == "+Inf")
        #expect(Exposition.number(-.infinity) == "-Inf")
        #expect(Exposition.number(.nan) == "NaN")
    }

    @Test("metric and label names are validated")
    func names() {
        #expect(MetricsRegistry.isValidName("marquee_http_requests_total"))
        #expect(MetricsRegistry.isValidName("a:b"))
        #expect(!MetricsRegistry.isValidName("9lives"))
        #expect(!MetricsRegistry.isValidName("has-dash"))
        #expect(!MetricsRegistry.isValidName(""))
    }
}

@Suite struct ProcessMetricsTests {
    @Test func parsesAStatLineWhoseCommandHasSpacesAndParentheses() throws {
        // Fields 3… as the kernel writes them; utime 250, stime 150 ticks; starttime 1000 ticks; vsize; rss 30 pages.
        let line =
            "4242 (marquee (worker) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 150 0 0 20 0 9 0 1000 "
            + "123456789 30 18446744073709551615 1 1 0 0 0 0 0 4096 17988 0 0 0 17 1 0 0 0 0 0"
        let sample = try #require(
            ProcessMetrics.parse(stat: line, bootTime: 1_700_000_000, ticksPerSecond: 100, pageSize: 4096))
        #expect(sample.cpuSeconds == 4)
        #expect(sample.startTimeSeconds == 1_700_000_010)
        #expect(sample.virtualBytes == 123_456_789)
        #expect(sample.residentBytes == 30 * 4096)
        #expect(ProcessMetrics.parse(stat: "4242 (x) S 1", bootTime: 0, ticksPerSecond: 100, pageSize: 4096) == nil)
    }

    @Test func exportsTheStandardFamiliesFromThisProcess() throws {
        let registry = MetricsRegistry()
        ProcessMetrics.register(in: registry)
        let text = registry.exposition()
        func value(_ name: String) -> Double? {
            text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap {
                Double($0.split(separator: " ")[1])
            }
        }
        #expect(try #require(value("process_resident_memory_bytes")) > 1_000_000)
        #expect(try #require(value("process_open_fds")) >= 3)
        #expect(try #require(value("process_max_fds")) >= 3)
        #expect(try #require(value("process_cpu_seconds_total")) > 0)
        let start = try #require(value("process_start_time_seconds"))
        let now = Date().timeIntervalSince1970
        #expect(start > now - 86_400 * 30 && start <= now + 5)
    }
}
