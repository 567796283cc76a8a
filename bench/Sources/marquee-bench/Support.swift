import Foundation

struct BenchError: Error, CustomStringConvertible {
    var description: String
}

/// `--name <int>` from `arguments`, or `value`.
func option(_ name: String, _ arguments: [String], default value: Int) -> Int {
    guard let text = stringOption(name, arguments), let n = Int(text) else { return value }
    return n
}

/// `--name <double>` from `arguments`, or `value`.
func doubleOption(_ name: String, _ arguments: [String], default value: Double) -> Double {
    guard let text = stringOption(name, arguments), let n = Double(text) else { return value }
    return n
}

/// `--name <text>` from `arguments`, or nil.
func stringOption(_ name: String, _ arguments: [String]) -> String? {
    guard let i = arguments.firstIndex(of: name), i + 1 < arguments.count else { return nil }
    return arguments[i + 1]
}

/// `--name <text>`, required.
func requiredOption(_ name: String, _ arguments: [String]) throws -> String {
    guard let value = stringOption(name, arguments) else { throw BenchError(description: "missing \(name)") }
    return value
}

func readText(_ path: String) throws -> String {
    do {
        return try String(contentsOfFile: path, encoding: .utf8)
    } catch {
        throw BenchError(description: "cannot read \(path): \(error)")
    }
}

func writeText(_ text: String, to path: String) throws {
    do {
        try text.write(toFile: path, atomically: true, encoding: .utf8)
    } catch {
        throw BenchError(description: "cannot write \(path): \(error)")
    }
}

/// The `p`-th percentile (0…100) of sorted `values` (nearest rank), 0 when empty.
func percentile(_ sorted: [Double], _ p: Double) -> Double {
    guard !sorted.isEmpty else { return 0 }
    let rank = Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1
    return sorted[min(max(rank, 0), sorted.count - 1)]
}

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

func format(_ value: Double, _ digits: Int = 2) -> String { String(format: "%.\(digits)f", value) }

/// The i-th benchmark device token: 64 hex characters, distinct for distinct `i` below 2^32.
func benchToken(_ i: Int) -> String {
    String(repeating: String(format: "%08x", UInt32(truncatingIfNeeded: i)), count: 8)
}
