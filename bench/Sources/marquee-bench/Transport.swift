import Crypto
import Foundation
import MarqueeCore
import MarqueeDelivery

/// `marquee-bench transport`: N live-activity pushes through `APNsProvider` (its pooled HTTP/2 connections, token
/// auth, response classification) to an APNs endpoint, K at a time. Prints one JSON line: pushes/s, p50/p99/max of
/// the per-push time from `send` called to decision returned, and how many were not `sent`.
///
///     marquee-bench transport --host 127.0.0.1 --port 2197 --ca ca.pem --key key.p8 --kid K --team T
///         --topic com.example.bench.push-type.liveactivity --payload payload.json
///         [--n 200000] [--connections 2] [--concurrency 200] [--tokens 10000] [--warmup 1000]
///
/// Push i goes to `benchToken(i % tokens)`, with an `apns-id` made from its index (the worker sends its delivery ID,
/// read from the database; Foundation's `UUID()` opens `/dev/urandom` on every call, which would be measured here). A warm-up of `--warmup` pushes (not counted) opens the connections and
/// signs the provider token before the clock starts.
func transport(_ arguments: [String]) async throws {
    let n = option("--n", arguments, default: 200_000)
    let connections = option("--connections", arguments, default: 2)
    let concurrency = option("--concurrency", arguments, default: connections * 100)
    let tokenCount = max(1, option("--tokens", arguments, default: 10_000))
    let warmup = option("--warmup", arguments, default: 1_000)
    let host = stringOption("--host", arguments) ?? "127.0.0.1"
    let port = option("--port", arguments, default: 2197)
    let key = try ES256PrivateKey(pem: try readText(try requiredOption("--key", arguments)))
    let topic = try requiredOption("--topic", arguments)
    let payload = Array(try readText(try requiredOption("--payload", arguments)).utf8)
    let expiration = Int64(Date().timeIntervalSince1970) + 3600

    let provider = APNsProvider(
        configuration: .init(
            caFile: stringOption("--ca", arguments), connectionsPerHost: connections,
            allowedHosts: ProviderHosts(entries: [.init(host: host, port: port)])))
    let target = APNsTarget(
        host: host, port: port,
        tokens: ProviderTokenCache(
            teamID: try requiredOption("--team", arguments), keyID: try requiredOption("--kid", arguments), key: key))
    let tokens = (0..<tokenCount).map(benchToken)

    /// Sends pushes 0..<total, `concurrency` senders at once (sender k sends k, k + concurrency, …); returns the
    /// latencies (s), how many were not sent, and the first such decision.
    func run(total: Int) async -> (latencies: [Double], failed: Int, firstFailure: String?) {
        let senders = min(concurrency, max(total, 1))
        return await withTaskGroup(of: ([Double], Int, String?).self) { group in
            for k in 0..<senders {
                group.addTask { [provider, target, tokens, topic, payload] in
                    let clock = ContinuousClock()
                    var latencies: [Double] = []
                    latencies.reserveCapacity(total / senders + 1)
                    var failed = 0
                    var firstFailure: String?
                    for i in stride(from: k, to: total, by: senders) {
                        let push = APNsPush(
                            token: tokens[i % tokens.count], topic: topic, priority: 10, expiration: expiration,
                            apnsID: pushID(round: total, i), payload: payload)
                        let started = clock.now
                        let decision = await provider.send(push, to: target).decision
                        latencies.append(seconds(clock.now - started))
                        if case .sent = decision { continue }
                        failed += 1
                        if firstFailure == nil { firstFailure = "\(decision)" }
                    }
                    return (latencies, failed, firstFailure)
                }
            }
            var all: [Double] = []
            all.reserveCapacity(total)
            var failed = 0
            var firstFailure: String?
            for await (latencies, f, first) in group {
                all += latencies
                failed += f
                firstFailure = firstFailure ?? first
            }
            return (all, failed, firstFailure)
        }
    }

    let warm = await run(total: warmup)
    if warm.failed > 0 {
        throw BenchError(
            description: "warm-up: \(warm.failed) of \(warmup) not sent; first: \(warm.firstFailure ?? "")")
    }
    let clock = ContinuousClock()
    let start = clock.now
    let measured = await run(total: n)
    let elapsed = seconds(clock.now - start)
    await provider.shutdown()
    let sorted = measured.latencies.sorted()
    print(
        #"{"bench":"transport","client":"APNsProvider","n":\#(n),"connections":\#(connections),"concurrency":\#(concurrency),"seconds":\#(format(elapsed, 3)),"pushes_per_second":\#(Int(Double(n) / elapsed)),"p50_ms":\#(format(percentile(sorted, 50) * 1000)),"p99_ms":\#(format(percentile(sorted, 99) * 1000)),"max_ms":\#(format((sorted.last ?? 0) * 1000)),"not_sent":\#(measured.failed)}"#
    )
    if let first = measured.firstFailure {
        FileHandle.standardError.write(Data("transport: first push not sent: \(first)\n".utf8))
    }
}

/// A distinct version-4-shaped UUID for push `i` of the round of `round` pushes (so warm-up and measured IDs differ).
private func pushID(round: Int, _ i: Int) -> UUID {
    let a = UInt64(truncatingIfNeeded: round)
    let b = UInt64(truncatingIfNeeded: i)
    func byte(_ value: UInt64, _ shift: UInt64) -> UInt8 { UInt8(truncatingIfNeeded: value >> shift) }
    return UUID(
        uuid: (
            byte(a, 24), byte(a, 16), byte(a, 8), byte(a, 0), 0, 0, 0x40, 0, 0x80, 0,
            byte(b, 40), byte(b, 32), byte(b, 24), byte(b, 16), byte(b, 8), byte(b, 0)
        ))
}
