import Foundation
import MarqueeCore
import Synchronization

/// `marquee-bench latency`: paces `POST /v1/live_notifications/update` at `--rate` per second for `--duration`
/// seconds (open loop: request i is due at start + i/rate, whatever happened to earlier ones), over `--connections`
/// keep-alive HTTP/1.1 connections, one thread each. Update i patches `{"seq": i}` into instance
/// `<prefix><i mod instances>`. Then it reads the simulator's JSONL records (`--records`) until every accepted
/// update has arrived (or `--wait` seconds pass) and prints one JSON line with p50/p99/max of
///
/// - `receipt - accept`: the simulator's record time minus the time the API's 200 arrived,
/// - `receipt - send`: … minus the time the request was written,
/// - `accept - send`: the API's own latency, and `send - due`: how late the pacer was.
///
///     marquee-bench latency --url-host 127.0.0.1 --port 18090 --records apns.jsonl
///         [--rate 1000] [--duration 10] [--instances 10000] [--prefix bench-] [--connections 64] [--wait 30]
///
/// The app key comes from `APP_KEY`. Times are wall-clock (CLOCK_REALTIME), the clock the simulator stamps with.
func latency(_ arguments: [String]) throws {
    guard let key = ProcessInfo.processInfo.environment["APP_KEY"] else { throw BenchError(description: "APP_KEY") }
    let host = stringOption("--host", arguments) ?? "127.0.0.1"
    let port = option("--port", arguments, default: 8080)
    let rate = doubleOption("--rate", arguments, default: 1000)
    let duration = doubleOption("--duration", arguments, default: 10)
    let instances = option("--instances", arguments, default: 10_000)
    let prefix = stringOption("--prefix", arguments) ?? "bench-"
    let connections = option("--connections", arguments, default: 64)
    let wait = doubleOption("--wait", arguments, default: 30)
    let records = try requiredOption("--records", arguments)
    let total = Int(rate * duration)

    let next = SharedCounter()
    let samples = Mutex<[PacedSample]>([])
    let failures = Mutex<[String]>([])
    let start = wallClock() + 0.2
    let group = DispatchGroup()
    for _ in 0..<connections {
        group.enter()
        let thread = Thread {
            defer { group.leave() }
            do {
                let connection = try HTTP1Connection(host: host, port: port)
                var mine: [PacedSample] = []
                while true {
                    let i = next.value.wrappingAdd(1, ordering: .relaxed).oldValue
                    if i >= total { break }
                    let due = start + Double(i) / rate
                    sleep(until: due)
                    let body = #"{"instance_id":"\#(prefix)\#(i % instances)","content_state_patch":{"seq":\#(i)}}"#
                    let sent = wallClock()
                    let status = try connection.post(
                        path: "/v1/live_notifications/update", authorization: "Bearer " + key, body: Array(body.utf8))
                    mine.append(PacedSample(seq: i, due: due, sent: sent, accepted: wallClock(), status: status))
                }
                samples.withLock { $0 += mine }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        thread.start()
    }
    group.wait()
    if let first = failures.withLock({ $0.first }) { throw BenchError(description: "driver: \(first)") }
    let all = samples.withLock { $0 }.sorted { $0.seq < $1.seq }
    let accepted = all.filter { $0.status == 200 }
    let lastSent = all.map(\.sent).max() ?? start
    let firstSent = all.map(\.sent).min() ?? start

    // Receipts: the simulator appends one JSON line per accepted push; `payload.aps.content-state.seq` names the update.
    var receipts: [Int: Double] = [:]
    let wanted = Set(accepted.map(\.seq))
    var offset = 0
    let parser = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
    let deadline = wallClock() + wait
    while true {
        if let data = FileManager.default.contents(atPath: records), data.count > offset {
            let bytes = [UInt8](data)
            var lineStart = offset
            for index in offset..<bytes.count where bytes[index] == 0x0A {
                let line = bytes[lineStart..<index]
                lineStart = index + 1
                guard let record = try? JSONValue.parse(line),
                    let seq = record["payload"]?["aps"]?["content-state"]?["seq"]?.intValue,
                    let time = record["time"]?.stringValue, let date = try? parser.parse(time)
                else { continue }
                let s = Int(seq)
                if wanted.contains(s), receipts[s] == nil { receipts[s] = date.timeIntervalSince1970 }
            }
            offset = lineStart
        }
        if receipts.count >= wanted.count || wallClock() > deadline { break }
        Thread.sleep(forTimeInterval: 0.2)
    }

    let achieved = all.count > 1 ? Double(all.count - 1) / max(lastSent - firstSent, 1e-9) : 0
    if achieved < rate * 0.95 {
        FileHandle.standardError.write(
            Data(
                "latency: WARNING: achieved \(format(achieved, 1))/s of \(format(rate, 0))/s: the API (or the driver) did not keep up; add --connections or read send_minus_due\n"
                    .utf8))
    }
    func summary(_ name: String, _ values: [Double]) -> String {
        let sorted = values.sorted()
        return
            #""\#(name)":{"p50_ms":\#(format(percentile(sorted, 50) * 1000)),"p99_ms":\#(format(percentile(sorted, 99) * 1000)),"max_ms":\#(format((sorted.last ?? 0) * 1000))}"#
    }
    let received = accepted.compactMap { s in receipts[s.seq].map { (s, $0) } }
    print(
        #"{"bench":"latency","rate":\#(format(rate, 0)),"achieved_rate":\#(format(achieved, 1)),"requests":\#(all.count),"accepted":\#(accepted.count),"received":\#(received.count),"missing":\#(accepted.count - received.count),"#
            + summary("receipt_minus_accept", received.map { $1 - $0.accepted }) + ","
            + summary("receipt_minus_send", received.map { $1 - $0.sent }) + ","
            + summary("accept_minus_send", accepted.map { $0.accepted - $0.sent }) + ","
            + summary("send_minus_due", all.map { $0.sent - $0.due }) + "}")
}

/// The next request index, shared by the driver threads.
final class SharedCounter: Sendable {
    let value = Atomic<Int>(0)
}

struct PacedSample: Sendable {
    var seq: Int
    var due: Double
    var sent: Double
    var accepted: Double
    var status: Int
}

/// Seconds since the epoch from CLOCK_REALTIME.
func wallClock() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

func sleep(until time: Double) {
    let delta = time - wallClock()
    guard delta > 0 else { return }
    var request = timespec(tv_sec: Int(delta), tv_nsec: Int((delta - Double(Int(delta))) * 1e9))
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
}

/// A blocking keep-alive HTTP/1.1 client connection, used by one thread.
final class HTTP1Connection {
    private let fd: Int32
    private let hostHeader: String
    private var buffer: [UInt8] = []

    /// `timeout` (seconds, 0 = none) bounds every send and receive: a request that hangs throws `HTTP1Timeout`.
    init(host: String, port: Int, timeout: Double = 0) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BenchError(description: "socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            close(fd)
            throw BenchError(description: "bad IPv4 address \(host)")
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw BenchError(description: "connect \(host):\(port): \(reason)")
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if timeout > 0 {
            var limit = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1e6))
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        }
        self.fd = fd
        hostHeader = "\(host):\(port)"
    }

    deinit { close(fd) }

    /// Sends a JSON POST and returns the response status after reading the whole response.
    func post(path: String, authorization: String, body: [UInt8]) throws -> Int {
        try request(method: "POST", path: path, authorization: authorization, body: body).status
    }

    /// Sends a request (a JSON body when `body` is not empty) and returns the whole response.
    func request(method: String, path: String, authorization: String, body: [UInt8]) throws -> HTTP1Response {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(hostHeader)\r\nAuthorization: \(authorization)\r\n"
        if !body.isEmpty || method == "POST" || method == "PUT" {
            head += "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n"
        }
        try writeAll(Array((head + "\r\n").utf8) + body)
        return try readResponse()
    }

    private func writeAll(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes {
                send(fd, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { throw HTTP1Timeout() }
            guard n > 0 else { throw BenchError(description: "send: \(String(cString: strerror(errno)))") }
            offset += n
        }
    }

    private func fill() throws {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { throw HTTP1Timeout() }
            guard n > 0 else { throw BenchError(description: "the server closed the connection") }
            buffer += chunk[0..<n]
            return
        }
    }

    private func readResponse() throws -> HTTP1Response {
        let separator: [UInt8] = [13, 10, 13, 10]
        var headerEnd: Int?
        while headerEnd == nil {
            if buffer.count >= 4 {
                headerEnd = (0...(buffer.count - 4)).first { buffer[$0..<$0 + 4].elementsEqual(separator) }
            }
            if headerEnd == nil { try fill() }
        }
        let head = String(decoding: buffer[0..<headerEnd!], as: UTF8.self)
        let lines = head.split(separator: "\r\n")
        guard let statusLine = lines.first, statusLine.split(separator: " ").count >= 2,
            let status = Int(statusLine.split(separator: " ")[1])
        else { throw BenchError(description: "bad status line") }
        var length = 0
        var chunked = false
        var contentType = ""
        for line in lines.dropFirst() {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { continue }
            let name = parts[0].lowercased()
            let value = parts[1].trimmingCharacters(in: .whitespaces)
            if name == "content-length" { length = Int(value) ?? 0 }
            if name == "content-type" { contentType = value }
            if name == "transfer-encoding" && value.lowercased().contains("chunked") { chunked = true }
        }
        buffer.removeFirst(headerEnd! + 4)
        var body: [UInt8] = []
        if chunked {
            let end: [UInt8] = Array("0\r\n\r\n".utf8)
            while true {
                if buffer.count >= end.count,
                    let at = (0...(buffer.count - end.count)).first(where: {
                        buffer[$0..<$0 + end.count].elementsEqual(end)
                    })
                {
                    body = Array(buffer[0..<at])  // still chunk-framed: good enough for a driver's record
                    buffer.removeFirst(at + end.count)
                    break
                }
                try fill()
            }
        } else {
            while buffer.count < length { try fill() }
            body = Array(buffer[0..<length])
            buffer.removeFirst(length)
        }
        return HTTP1Response(status: status, contentType: contentType, body: body)
    }
}

/// A response read by `HTTP1Connection`.
struct HTTP1Response {
    var status: Int
    var contentType: String
    var body: [UInt8]
}

/// No answer within the connection's timeout.
struct HTTP1Timeout: Error {}
