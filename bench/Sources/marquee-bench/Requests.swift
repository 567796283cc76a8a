import Foundation
import Synchronization

/// `marquee-bench requests`: sends the HTTP requests listed in `--input`, one a line, over `--connections` keep-alive
/// HTTP/1.1 connections (one thread each), and writes one result line per request to `--output`. Used by
/// bench/chaos, which needs to know exactly which requests were accepted while processes and PostgreSQL fail.
///
///     marquee-bench requests --port 18601 --input requests.txt --output results.tsv
///         [--host 127.0.0.1] [--connections 16] [--rate 0] [--timeout 10]
///
/// An input line is `METHOD PATH KEYVAR [BODY]`: KEYVAR names the environment variable holding the bearer key
/// (`APP_KEY`, `SDK_KEY`), BODY is the JSON body (the rest of the line). With `--rate` > 0 request i is sent at
/// start + i/rate (open loop); with 0, as fast as the connections allow.
///
/// An output line is `index TAB status TAB sent TAB done TAB content-type TAB body` (times: seconds since the epoch;
/// body: its first 400 bytes, tabs and newlines made spaces). Status 0 means the connection failed or closed
/// without an answer, -1 that no answer came within `--timeout` seconds (a hang). A failed connection is replaced
/// for the next request; a request is never repeated. Prints one JSON line: counts by status and the rate.
func requests(_ arguments: [String]) throws {
    let host = stringOption("--host", arguments) ?? "127.0.0.1"
    let port = option("--port", arguments, default: 8080)
    let connections = option("--connections", arguments, default: 16)
    let rate = doubleOption("--rate", arguments, default: 0)
    let timeout = doubleOption("--timeout", arguments, default: 10)
    let output = try requiredOption("--output", arguments)
    let environment = ProcessInfo.processInfo.environment
    struct Planned: Sendable {
        var method: String
        var path: String
        var authorization: String
        var body: [UInt8]
    }
    var plan: [Planned] = []
    for line in try readText(try requiredOption("--input", arguments)).split(separator: "\n") {
        let parts = line.split(separator: " ", maxSplits: 3)
        guard parts.count >= 3 else { throw BenchError(description: "bad request line: \(line)") }
        guard let key = environment[String(parts[2])] else { throw BenchError(description: "\(parts[2]) is not set") }
        plan.append(
            Planned(
                method: String(parts[0]), path: String(parts[1]), authorization: "Bearer " + key,
                body: parts.count > 3 ? Array(parts[3].utf8) : []))
    }
    let requestsToSend = plan

    struct Result: Sendable {
        var index: Int
        var status: Int
        var sent: Double
        var done: Double
        var contentType: String
        var body: String
    }
    let next = SharedCounter()
    let results = Mutex<[Result]>([])
    let start = wallClock() + 0.05
    let group = DispatchGroup()
    for _ in 0..<max(1, connections) {
        group.enter()
        let thread = Thread {
            defer { group.leave() }
            var connection: HTTP1Connection?
            var mine: [Result] = []
            while true {
                let i = next.value.wrappingAdd(1, ordering: .relaxed).oldValue
                if i >= requestsToSend.count { break }
                if rate > 0 { sleep(until: start + Double(i) / rate) }
                let r = requestsToSend[i]
                let sent = wallClock()
                var result = Result(index: i, status: 0, sent: sent, done: sent, contentType: "", body: "")
                do {
                    if connection == nil { connection = try HTTP1Connection(host: host, port: port, timeout: timeout) }
                    let response = try connection!.request(
                        method: r.method, path: r.path, authorization: r.authorization, body: r.body)
                    result.status = response.status
                    result.contentType = response.contentType
                    result.body = String(
                        String(decoding: response.body.prefix(400), as: UTF8.self).map {
                            $0 == "\t" || $0 == "\n" || $0 == "\r" ? " " : $0
                        })
                } catch is HTTP1Timeout {
                    result.status = -1
                    connection = nil
                } catch {
                    result.body = "\(error)"
                    connection = nil
                    Thread.sleep(forTimeInterval: 0.05)
                }
                result.done = wallClock()
                mine.append(result)
            }
            results.withLock { $0 += mine }
        }
        thread.start()
    }
    group.wait()
    let all = results.withLock { $0 }.sorted { $0.index < $1.index }
    var text = ""
    for r in all {
        text += "\(r.index)\t\(r.status)\t\(format(r.sent, 3))\t\(format(r.done, 3))\t\(r.contentType)\t\(r.body)\n"
    }
    try writeText(text, to: output)
    var byStatus: [Int: Int] = [:]
    for r in all { byStatus[r.status, default: 0] += 1 }
    let elapsed = (all.map(\.done).max() ?? start) - (all.map(\.sent).min() ?? start)
    let counts = byStatus.keys.sorted().map { #""\#($0)":\#(byStatus[$0]!)"# }.joined(separator: ",")
    print(
        #"{"bench":"requests","requests":\#(all.count),"by_status":{\#(counts)},"seconds":\#(format(elapsed)),"per_second":\#(format(Double(all.count) / max(elapsed, 1e-9), 1))}"#
    )
}
