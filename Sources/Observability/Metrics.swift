import Foundation
import Synchronization

/// Label values of one series, in the order of the family's label names.
public typealias LabelValues = [String]

/// A set of metric families, rendered together in the Prometheus text exposition format (0.0.4).
///
/// Families are created once (at start-up) and then updated from any thread. Registering the same name twice
/// returns the existing family when its type and labels match, and traps otherwise: that is a programming error.
public final class MetricsRegistry: Sendable {
    private let families = Mutex<[String: any MetricFamily]>([:])
    private let collectors = Mutex<[@Sendable () -> Void]>([])

    public init() {}

    /// A monotonically increasing counter. Prometheus convention: the name ends in `_total`.
    public func counter(_ name: String, help: String, labels: [String] = []) -> Counter {
        register(name) { Counter(name: name, help: help, labelNames: labels) }
    }

    /// A value that goes up and down.
    public func gauge(_ name: String, help: String, labels: [String] = []) -> Gauge {
        register(name) { Gauge(name: name, help: help, labelNames: labels) }
    }

    /// A histogram with cumulative buckets (upper bounds, ascending; `+Inf` is implicit).
    public func histogram(
        _ name: String, help: String, labels: [String] = [], buckets: [Double] = Histogram.defaultLatencyBuckets
    ) -> Histogram {
        register(name) { Histogram(name: name, help: help, labelNames: labels, buckets: buckets) }
    }

    /// Adds a callback run before every exposition, to refresh gauges that are sampled (queue depth, pool size).
    public func onCollect(_ collector: @escaping @Sendable () -> Void) {
        collectors.withLock { $0.append(collector) }
    }

    /// The whole registry in the Prometheus text format, families sorted by name.
    public func exposition() -> String {
        for collector in collectors.withLock({ $0 }) { collector() }
        let snapshot = families.withLock { $0 }
        var out = ""
        for name in snapshot.keys.sorted() {
            snapshot[name]!.render(into: &out)
        }
        return out
    }

    private func register<F: MetricFamily>(_ name: String, make: () -> F) -> F {
        precondition(Self.isValidName(name), "invalid metric name \(name)")
        return families.withLock { families in
            if let existing = families[name] {
                guard let same = existing as? F else { preconditionFailure("metric \(name) registered twice") }
                return same
            }
            let family = make()
            for label in family.labelNames {
                precondition(
                    Self.isValidName(label) && !label.hasPrefix("__") && label != "le", "invalid label \(label)")
            }
            families[name] = family
            return family
        }
    }

    static func isValidName(_ name: String) -> Bool {
        var isFirst = true
        for c in name.unicodeScalars {
            let ok =
                (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || c == "_" || c == ":"
                || (!isFirst && c >= "0" && c <= "9")
            if !ok { return false }
            isFirst = false
        }
        return !name.isEmpty
    }
}

/// Common behaviour of counters, gauges and histograms.
protocol MetricFamily: Sendable {
    var name: String { get }
    var labelNames: [String] { get }
    func render(into out: inout String)
}

/// A counter family. `inc` with no labels when the family has none.
public final class Counter: MetricFamily {
    let name: String
    let help: String
    let labelNames: [String]
    private let series = Mutex<[LabelValues: Double]>([:])

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
    }

    /// Adds `amount` (which must not be negative) to the series with these label values.
    public func inc(_ amount: Double = 1, _ labels: LabelValues = []) {
        precondition(amount >= 0, "counters only go up")
        precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        series.withLock { $0[labels, default: 0] += amount }
    }

    /// Raises the series to `total` if it is below (a total sampled from elsewhere, such as the kernel's CPU time):
    /// one step under the lock, so two collections at once cannot both add the same difference.
    public func raise(to total: Double, _ labels: LabelValues = []) {
        precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        series.withLock { $0[labels] = max($0[labels] ?? 0, total) }
    }

    /// Convenience for labelled counters: `requests.inc(labels: "GET", "200")`.
    public func inc(labels: String..., by amount: Double = 1) { inc(amount, labels) }

    /// The current value of one series (0 if it was never incremented).
    public func value(_ labels: LabelValues = []) -> Double { series.withLock { $0[labels] ?? 0 } }

    func render(into out: inout String) {
        Exposition.header(name: name, help: help, type: "counter", into: &out)
        let snapshot = series.withLock { $0 }
        if snapshot.isEmpty && labelNames.isEmpty {
            out += "\(name) 0\n"
        }
        for key in snapshot.keys.sorted(by: Exposition.labelOrder) {
            Exposition.sample(name: name, labelNames: labelNames, labelValues: key, value: snapshot[key]!, into: &out)
        }
    }
}

/// A gauge family.
public final class Gauge: MetricFamily {
    let name: String
    let help: String
    let labelNames: [String]
    private let series = Mutex<[LabelValues: Double]>([:])

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
    }

    /// Sets the series with these label values.
    public func set(_ value: Double, _ labels: LabelValues = []) {
        precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        series.withLock { $0[labels] = value }
    }

    /// Adds `delta` (may be negative).
    public func add(_ delta: Double, _ labels: LabelValues = []) {
        precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        series.withLock { $0[labels, default: 0] += delta }
    }

    /// Removes every series (for gauges recomputed from scratch on each collection).
    public func reset() { series.withLock { $0.removeAll() } }

    /// Replaces every series at once, so that a scrape never sees the family half rebuilt.
    public func replaceAll(_ values: [LabelValues: Double]) {
        for labels in values.keys {
            precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        }
        series.withLock { $0 = values }
    }

    /// The current value of one series (0 if never set).
    public func value(_ labels: LabelValues = []) -> Double { series.withLock { $0[labels] ?? 0 } }

    func render(into out: inout String) {
        Exposition.header(name: name, help: help, type: "gauge", into: &out)
        let snapshot = series.withLock { $0 }
        if snapshot.isEmpty && labelNames.isEmpty {
            out += "\(name) 0\n"
        }
        for key in snapshot.keys.sorted(by: Exposition.labelOrder) {
            Exposition.sample(name: name, labelNames: labelNames, labelValues: key, value: snapshot[key]!, into: &out)
        }
    }
}

/// A histogram family with fixed buckets.
public final class Histogram: MetricFamily {
    /// Seconds, from 0.5 ms to 10 s: suits HTTP handlers, database calls and push sends.
    public static let defaultLatencyBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    struct Series {
        var counts: [UInt64]
        var sum: Double = 0
        var count: UInt64 = 0

        mutating func record(_ value: Double, in bucket: Int) {
            counts[bucket] += 1
            sum += value
            count += 1
        }
    }

    let name: String
    let help: String
    let labelNames: [String]
    let buckets: [Double]
    private let series = Mutex<[LabelValues: Series]>([:])

    init(name: String, help: String, labelNames: [String], buckets: [Double]) {
        precondition(
            !buckets.isEmpty && zip(buckets, buckets.dropFirst()).allSatisfy { $0 < $1 }, "buckets must ascend")
        self.name = name
        self.help = help
        self.labelNames = labelNames
        self.buckets = buckets.last == .infinity ? Array(buckets.dropLast()) : buckets
    }

    /// Records one observation.
    public func observe(_ value: Double, _ labels: LabelValues = []) {
        precondition(labels.count == labelNames.count, "\(name): expected labels \(labelNames)")
        // First bucket whose upper bound holds the value; counts are made cumulative when rendered.
        var index = buckets.count
        for (i, bound) in buckets.enumerated() where value <= bound {
            index = i
            break
        }
        let slots = buckets.count + 1
        series.withLock { all in
            // Updated in place: a copy taken out of the dictionary would copy its bucket array on every observation.
            all[labels, default: Series(counts: Array(repeating: 0, count: slots))].record(value, in: index)
        }
    }

    /// Records a duration in seconds.
    public func observe(_ duration: Duration, _ labels: LabelValues = []) {
        let (seconds, attoseconds) = duration.components
        observe(Double(seconds) + Double(attoseconds) / 1e18, labels)
    }

    /// Number of observations of one series.
    public func count(_ labels: LabelValues = []) -> UInt64 { series.withLock { $0[labels]?.count ?? 0 } }

    func render(into out: inout String) {
        Exposition.header(name: name, help: help, type: "histogram", into: &out)
        let snapshot = series.withLock { $0 }
        for key in snapshot.keys.sorted(by: Exposition.labelOrder) {
            let s = snapshot[key]!
            var cumulative: UInt64 = 0
            for (i, bound) in buckets.enumerated() {
                cumulative += s.counts[i]
                Exposition.sample(
                    name: name + "_bucket", labelNames: labelNames + ["le"],
                    labelValues: key + [Exposition.number(bound)], value: Double(cumulative), into: &out)
            }
            cumulative += s.counts[buckets.count]
            Exposition.sample(
                name: name + "_bucket", labelNames: labelNames + ["le"], labelValues: key + ["+Inf"],
                value: Double(cumulative), into: &out)
            Exposition.sample(name: name + "_sum", labelNames: labelNames, labelValues: key, value: s.sum, into: &out)
            Exposition.sample(
                name: name + "_count", labelNames: labelNames, labelValues: key, value: Double(s.count), into: &out)
        }
    }
}

/// Prometheus text format 0.0.4 helpers.
public enum Exposition {
    /// The Content-Type of `/metrics`.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    static func header(name: String, help: String, type: String, into out: inout String) {
        out += "# HELP \(name) "
        for c in help {
            switch c {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default: out.append(c)
            }
        }
        out += "\n# TYPE \(name) \(type)\n"
    }

    static func sample(name: String, labelNames: [String], labelValues: [String], value: Double, into out: inout String)
    {
        out += name
        if !labelNames.isEmpty {
            out += "{"
            for (i, label) in labelNames.enumerated() {
                if i > 0 { out += "," }
                out += label
                out += "=\""
                for c in labelValues[i] {
                    switch c {
                    case "\\": out += "\\\\"
                    case "\"": out += "\\\""
                    case "\n": out += "\\n"
                    default: out.append(c)
                    }
                }
                out += "\""
            }
            out += "}"
        }
        out += " "
        out += number(value)
        out += "\n"
    }

    /// Formats a sample value: integers without a fraction, `+Inf`, `-Inf`, `NaN`.
    static func number(_ v: Double) -> String {
        if v.isNaN { return "NaN" }
        if v == .infinity { return "+Inf" }
        if v == -.infinity { return "-Inf" }
        if v == v.rounded() && abs(v) < 1e15 { return String(Int64(v)) }
        return String(v)
    }

    static func labelOrder(_ a: LabelValues, _ b: LabelValues) -> Bool {
        a.lexicographicallyPrecedes(b)
    }
}
