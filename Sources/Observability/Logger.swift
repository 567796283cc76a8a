import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Severity of a log record, ordered from most to least verbose.
public enum LogLevel: Int, Comparable, Sendable, CaseIterable, CustomStringConvertible {
    case trace = 0
    case debug
    case info
    case notice
    case warning
    case error
    case critical

    /// Parses `trace`, `debug`, `info`, `notice`, `warning` (or `warn`), `error`, `critical` in any case.
    public init?(string: String) {
        switch string.lowercased() {
        case "trace": self = .trace
        case "debug": self = .debug
        case "info": self = .info
        case "notice": self = .notice
        case "warning", "warn": self = .warning
        case "error": self = .error
        case "critical": self = .critical
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .trace: "trace"
        case .debug: "debug"
        case .info: "info"
        case .notice: "notice"
        case .warning: "warning"
        case .error: "error"
        case .critical: "critical"
        }
    }

    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A metadata value attached to a log record.
public enum LogValue: Sendable, Equatable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByFloatLiteral, CustomStringConvertible
{
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)

    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(floatLiteral value: Double) { self = .double(value) }

    public var description: String {
        switch self {
        case .string(let s): s
        case .int(let i): String(i)
        case .double(let d): String(d)
        case .bool(let b): String(b)
        }
    }
}

/// Log metadata: dotted keys such as `request.id`, `tenant.id`, `apns.reason`.
public typealias LogMetadata = [String: LogValue]

/// Where formatted log lines go. Each line is written whole, under a lock, so lines never interleave.
public final class LogSink: Sendable {
    private let writeLine: @Sendable (String) -> Void

    /// A sink that calls `write` with each complete JSON line (without the trailing newline).
    public init(write: @escaping @Sendable (String) -> Void) {
        self.writeLine = write
    }

    /// Lines to standard error.
    public static let standardError = LogSink.descriptor(STDERR_FILENO)
    /// Lines to standard output.
    public static let standardOutput = LogSink.descriptor(STDOUT_FILENO)
    /// Discards everything.
    public static let discard = LogSink(write: { _ in })

    /// Lines that could not be written whole (the reader of the descriptor went away, a full disk, a full
    /// non-blocking pipe), in this process. Exported as `marquee_log_lines_dropped_total`.
    public static var droppedLines: Int { dropped.load(ordering: .relaxed) }
    private static let dropped = Atomic<Int>(0)

    /// Lines written to file descriptor `fd`. A line that cannot be written is dropped and counted, never fatal:
    /// Foundation's `FileHandle.write(_:)` traps on any error, and with SIGPIPE ignored (as the process does) a log
    /// shipper that restarts would make the next line crash the process.
    public static func descriptor(_ fd: Int32) -> LogSink {
        let lock = Mutex(())
        return LogSink { line in
            var bytes = Array(line.utf8)
            bytes.append(0x0A)
            let written = lock.withLock { _ in
                bytes.withUnsafeBytes { buffer -> Bool in
                    var offset = 0
                    while offset < buffer.count {
                        let n = systemWrite(fd, buffer.baseAddress! + offset, buffer.count - offset)
                        if n > 0 {
                            offset += n
                        } else if n < 0 && errno == EINTR {
                            continue
                        } else {
                            return false
                        }
                    }
                    return true
                }
            }
            if !written { dropped.wrappingAdd(1, ordering: .relaxed) }
        }
    }

    func write(_ line: String) { writeLine(line) }
}

/// write(2), named apart from `LogSink.write`.
private func systemWrite(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    write(fd, bytes, count)
}

/// A structured logger that writes one JSON object per line.
///
/// Every line carries `ts` (RFC 3339 UTC with milliseconds), `level`, `logger` and `msg`, followed by the logger's
/// own metadata and the call's metadata (the call wins on conflicts). Values are never interpreted, so callers must
/// not pass secrets or tokens: log identifiers, not credentials.
public struct Logger: Sendable {
    /// The component name, e.g. `marquee.api`.
    public var label: String
    /// Records below this level are dropped before they are formatted.
    public var level: LogLevel
    /// Metadata added to every record of this logger.
    public var metadata: LogMetadata
    private let sink: LogSink

    /// Creates a logger writing to `sink` (standard error by default).
    public init(label: String, level: LogLevel = .info, metadata: LogMetadata = [:], sink: LogSink = .standardError) {
        self.label = label
        self.level = level
        self.metadata = metadata
        self.sink = sink
    }

    /// A copy of this logger with one more metadata entry.
    public func with(_ key: String, _ value: LogValue) -> Logger {
        var copy = self
        copy.metadata[key] = value
        return copy
    }

    /// A copy of this logger with more metadata entries.
    public func with(_ extra: LogMetadata) -> Logger {
        var copy = self
        copy.metadata.merge(extra) { _, new in new }
        return copy
    }

    /// A copy of this logger with another label.
    public func labelled(_ label: String) -> Logger {
        var copy = self
        copy.label = label
        return copy
    }

    /// Whether a record at `level` would be written.
    public func isEnabled(_ level: LogLevel) -> Bool { level >= self.level }

    /// Writes one record if `level` is enabled.
    public func log(_ level: LogLevel, _ message: @autoclosure () -> String, metadata extra: LogMetadata = [:]) {
        guard level >= self.level else { return }
        sink.write(Self.format(level: level, label: label, message: message(), metadata: metadata, extra: extra))
    }

    public func trace(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.trace, message(), metadata: metadata)
    }
    public func debug(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.debug, message(), metadata: metadata)
    }
    public func info(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.info, message(), metadata: metadata)
    }
    public func notice(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.notice, message(), metadata: metadata)
    }
    public func warning(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.warning, message(), metadata: metadata)
    }
    public func error(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.error, message(), metadata: metadata)
    }
    public func critical(_ message: @autoclosure () -> String, metadata: LogMetadata = [:]) {
        log(.critical, message(), metadata: metadata)
    }

    /// Formats one record as a JSON line. Keys are written in a stable order: the fixed fields, then metadata sorted.
    static func format(level: LogLevel, label: String, message: String, metadata: LogMetadata, extra: LogMetadata)
        -> String
    {
        var out = "{\"ts\":\""
        out += Timestamp.rfc3339(Date())
        out += "\",\"level\":\""
        out += level.description
        out += "\",\"logger\":"
        JSONText.appendString(label, to: &out)
        out += ",\"msg\":"
        JSONText.appendString(message, to: &out)
        var merged = metadata
        merged.merge(extra) { _, new in new }
        for key in merged.keys.sorted() where key != "ts" && key != "level" && key != "logger" && key != "msg" {
            out += ","
            JSONText.appendString(key, to: &out)
            out += ":"
            switch merged[key]! {
            case .string(let s): JSONText.appendString(s, to: &out)
            case .int(let i): out += String(i)
            case .double(let d): out += d.isFinite ? String(d) : "null"
            case .bool(let b): out += b ? "true" : "false"
            }
        }
        out += "}"
        return out
    }
}

/// Minimal JSON string escaping for log lines.
enum JSONText {
    static func appendString(_ s: String, to out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20 || c.value == 0x7F || c.value == 0x2028 || c.value == 0x2029:
                out += "\\u"
                let hex = String(c.value, radix: 16)
                out += String(repeating: "0", count: 4 - hex.count) + hex
            default:
                out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

/// RFC 3339 timestamps without Foundation's formatter (which is slow and not Sendable on Linux).
enum Timestamp {
    static func rfc3339(_ date: Date) -> String {
        let t = date.timeIntervalSince1970
        var secs = time_t(t.rounded(.down))
        let millis = Int((t - Double(secs)) * 1000)
        var tm = tm()
        gmtime_r(&secs, &tm)
        func pad(_ v: Int32, _ width: Int) -> String {
            let s = String(v)
            return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
        }
        return "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1, 2))-\(pad(tm.tm_mday, 2))T"
            + "\(pad(tm.tm_hour, 2)):\(pad(tm.tm_min, 2)):\(pad(tm.tm_sec, 2)).\(pad(Int32(millis), 3))Z"
    }
}
