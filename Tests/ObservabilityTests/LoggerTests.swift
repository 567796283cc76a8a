import Foundation
import Synchronization
import Testing

@testable import Observability

/// Collects what a logger writes.
final class CapturedLines: Sendable {
    let lines = Mutex<[String]>([])
    var sink: LogSink { LogSink { line in self.lines.withLock { $0.append(line) } } }
    var all: [String] { lines.withLock { $0 } }
}

@Suite("JSON-lines logger")
struct LoggerTests {
    @Test("a line that cannot be written (its reader went away) is dropped and counted, never fatal")
    func unwritableLog() throws {
        // As the marquee process does: a closed pipe then answers EPIPE instead of killing the process.
        signal(SIGPIPE, SIG_IGN)
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        defer { close(fds[1]) }
        close(fds[0])
        let before = LogSink.droppedLines
        let logger = Logger(label: "marquee.test", sink: .descriptor(fds[1]))
        logger.info("nobody reads this")
        logger.warning("nor this")
        #expect(LogSink.droppedLines - before >= 2)
        let registry = MetricsRegistry()
        ProcessMetrics.register(in: registry)
        #expect(registry.exposition().contains("marquee_log_lines_dropped_total "))
    }

    @Test("a line goes whole to its descriptor")
    func descriptorLine() throws {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        defer { close(fds[0]) }
        Logger(label: "marquee.test", sink: .descriptor(fds[1])).info("hello")
        close(fds[1])
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = read(fds[0], &buffer, buffer.count)
        let text = String(decoding: buffer.prefix(max(0, n)), as: UTF8.self)
        #expect(text.hasSuffix("\n") && text.contains(#""msg":"hello""#), "\(text)")
    }

    @Test("each record is one JSON object with ts, level, logger, msg and dotted metadata")
    func jsonLine() throws {
        let captured = CapturedLines()
        let logger = Logger(label: "marquee.test", level: .info, sink: captured.sink).with("request.id", "r-1")
        logger.info("hello \"world\"\n", metadata: ["http.status": 200, "ok": true, "ratio": 0.5])
        let lines = captured.all
        try #require(lines.count == 1)
        #expect(!lines[0].contains("\n"))
        let object = try #require(
            JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(object["level"] as? String == "info")
        #expect(object["logger"] as? String == "marquee.test")
        #expect(object["msg"] as? String == "hello \"world\"\n")
        #expect(object["request.id"] as? String == "r-1")
        #expect(object["http.status"] as? Int == 200)
        #expect(object["ok"] as? Bool == true)
        let ts = try #require(object["ts"] as? String)
        #expect(ts.count == 24 && ts.hasSuffix("Z"))
    }

    @Test("records below the level are dropped without evaluating the message")
    func levels() {
        let captured = CapturedLines()
        let logger = Logger(label: "t", level: .warning, sink: captured.sink)
        let evaluated = Mutex(false)
        logger.debug(
            { () -> String in
                evaluated.withLock { $0 = true }
                return "x"
            }())
        logger.error("kept")
        #expect(captured.all.count == 1)
        #expect(!evaluated.withLock { $0 })
    }

    @Test("call metadata overrides logger metadata; fixed fields cannot be overwritten")
    func precedence() throws {
        let captured = CapturedLines()
        let logger = Logger(label: "t", sink: captured.sink).with(["a": "logger", "msg": "spoof"])
        logger.info("real", metadata: ["a": "call"])
        let object = try #require(
            JSONSerialization.jsonObject(with: Data(captured.all[0].utf8)) as? [String: Any])
        #expect(object["a"] as? String == "call")
        #expect(object["msg"] as? String == "real")
    }

    @Test("control characters are escaped")
    func controlCharacters() throws {
        let captured = CapturedLines()
        Logger(label: "t", sink: captured.sink).info("a\u{01}b\u{2028}c")
        #expect(captured.all[0].contains(#"a\u0001b\u2028c"#))
        _ = try JSONSerialization.jsonObject(with: Data(captured.all[0].utf8))
    }

    @Test("level names parse")
    func parse() {
        #expect(LogLevel(string: "WARN") == .warning)
        #expect(LogLevel(string: "debug") == .debug)
        #expect(LogLevel(string: "loud") == nil)
    }
}
