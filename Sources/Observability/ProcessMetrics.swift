import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The standard `process_*` families every Prometheus client exports (CPU seconds, resident and virtual memory,
/// open and maximum file descriptors, start time), sampled from `/proc/self` at each scrape.
///
/// On a system without `/proc` the families are registered but stay at zero.
public enum ProcessMetrics {
    /// One reading of `/proc/self`.
    public struct Sample: Sendable, Equatable {
        public var cpuSeconds: Double
        public var residentBytes: Double
        public var virtualBytes: Double
        public var startTimeSeconds: Double
    }

    /// Registers the families in `registry` (and `marquee_log_lines_dropped_total`, `LogSink.droppedLines`) and
    /// refreshes them before every exposition.
    public static func register(in registry: MetricsRegistry) {
        let cpu = registry.counter(
            "process_cpu_seconds_total", help: "Total user and system CPU time spent in seconds.")
        let resident = registry.gauge("process_resident_memory_bytes", help: "Resident memory size in bytes.")
        let virtual = registry.gauge("process_virtual_memory_bytes", help: "Virtual memory size in bytes.")
        let openFDs = registry.gauge("process_open_fds", help: "Number of open file descriptors.")
        let maxFDs = registry.gauge("process_max_fds", help: "Maximum number of open file descriptors.")
        let start = registry.gauge(
            "process_start_time_seconds", help: "Start time of the process since unix epoch in seconds.")
        let droppedLines = registry.counter(
            "marquee_log_lines_dropped_total",
            help: "Log lines that could not be written (the log's reader went away, a full disk or pipe).")
        registry.onCollect {
            droppedLines.raise(to: Double(LogSink.droppedLines))
            if let sample = read() {
                // The counter only goes up; the kernel's total never goes down.
                cpu.raise(to: sample.cpuSeconds)
                resident.set(sample.residentBytes)
                virtual.set(sample.virtualBytes)
                start.set(sample.startTimeSeconds)
            }
            if let count = openDescriptorCount() { openFDs.set(Double(count)) }
            var limit = rlimit()
            if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 { maxFDs.set(Double(limit.rlim_cur)) }
        }
    }

    /// Reads `/proc/self/stat` and the boot time from `/proc/stat`.
    public static func read() -> Sample? {
        guard let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8),
            let boot = bootTime()
        else { return nil }
        return parse(
            stat: stat, bootTime: boot, ticksPerSecond: Double(sysconf(Int32(_SC_CLK_TCK))),
            pageSize: Double(sysconf(Int32(_SC_PAGESIZE))))
    }

    /// Parses one `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and parentheses, so fields
    /// are counted from the last `)`.
    public static func parse(stat: String, bootTime: Double, ticksPerSecond: Double, pageSize: Double) -> Sample? {
        guard ticksPerSecond > 0, let close = stat.lastIndex(of: ")") else { return nil }
        // After ")": field 3 (state) is the first.
        let fields = stat[stat.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        func field(_ number: Int) -> Double? {
            let index = number - 3
            guard index >= 0, index < fields.count else { return nil }
            return Double(fields[index])
        }
        guard let utime = field(14), let stime = field(15), let startTicks = field(22), let vsize = field(23),
            let rss = field(24)
        else { return nil }
        return Sample(
            cpuSeconds: (utime + stime) / ticksPerSecond, residentBytes: rss * pageSize, virtualBytes: vsize,
            startTimeSeconds: bootTime + startTicks / ticksPerSecond)
    }

    private static func bootTime() -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces))
        }
        return nil
    }

    private static func openDescriptorCount() -> Int? {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return nil }
        return entries.count
    }
}
