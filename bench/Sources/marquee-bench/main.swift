// marquee-bench: client-side drivers for the benchmarks in bench/. Each prints one JSON line of results.
//
//   marquee-bench pg-bulk --rows 100000 --batch 10000 --connections 1
//       writes delivery-like rows through PostgresClient's COPY path into bench_deliveries
//   marquee-bench transport --n 200000 --connections 2 --concurrency 200 … (see Transport.swift)
//       live-activity pushes through APNsProvider to an APNs endpoint (the simulator)
//   marquee-bench latency --rate 1000 --duration 10 … (see Latency.swift)
//       paced API updates, then receipt times from the simulator's records
//   marquee-bench requests --port 18601 --input requests.txt --output results.tsv … (see Requests.swift)
//       a list of API requests, one result line each (bench/chaos)
//   marquee-bench keygen es256|rs256 <private.pem> <public.pem>
//   marquee-bench jwt --key <p8> --kid <key ID> --team <team ID>
//       an APNs provider token signed now (for h2load)
//   marquee-bench json --n 200000
//       JSONValue parse and write, nanoseconds a document (see JSONBench.swift)
import Foundation
import PostgresClient

func pgBulk(_ arguments: [String]) async throws {
    guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"] else {
        throw BenchError(description: "DATABASE_URL")
    }
    let rows = option("--rows", arguments, default: 100_000)
    let batch = option("--batch", arguments, default: 10_000)
    let connections = option("--connections", arguments, default: 1)
    let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: connections))
    defer { pool.close() }
    try await pool.execute(PostgresQuery(unsafeSQL: "TRUNCATE bench_deliveries"))

    // Rows are built before the clock starts: the benchmark measures the write path, not the generator.
    let tenant = UUID()
    let columns = ["id", "tenant_id", "instance_id", "device_token", "provider", "status", "attempts", "payload"]
    var batches: [[[PostgresBind]]] = []
    var current: [[PostgresBind]] = []
    for i in 0..<rows {
        let token = String(repeating: String(format: "%08x", UInt32(truncatingIfNeeded: i &* 2_654_435_761)), count: 8)
        current.append([
            UUID().encodePostgres(), tenant.encodePostgres(), "inst-\(i)".encodePostgres(), token.encodePostgres(),
            (i % 3 == 0 ? "fcm" : "apns").encodePostgres(), "queued".encodePostgres(), 0.encodePostgres(),
            PostgresJSON(#"{"event":"update","version":\#(i % 100),"note":"bench"}"#)
                .encodePostgres(),
        ])
        if current.count == batch {
            batches.append(current)
            current = []
        }
    }
    if !current.isEmpty { batches.append(current) }

    let clock = ContinuousClock()
    let start = clock.now
    try await withThrowingTaskGroup(of: Int.self) { group in
        let perWorker = (batches.count + connections - 1) / connections
        for worker in 0..<connections {
            let mine = Array(batches.dropFirst(worker * perWorker).prefix(perWorker))
            group.addTask {
                var written = 0
                for rows in mine {
                    written += try await pool.withConnection { connection in
                        try connection.copyFrom(table: "bench_deliveries", columns: columns, rows: rows)
                    }
                }
                return written
            }
        }
        var total = 0
        for try await n in group { total += n }
        guard total == rows else { throw BenchError(description: "wrote \(total) of \(rows)") }
    }
    let elapsed = clock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    let count = try await pool.query("SELECT count(*)::int AS n FROM bench_deliveries")
    let stored = try count[0].decode(Int.self, "n")
    print(
        #"{"bench":"pg-bulk","rows":\#(rows),"stored":\#(stored),"batch":\#(batch),"connections":\#(connections),"seconds":\#(String(format: "%.3f", seconds)),"rows_per_second":\#(Int(Double(rows) / seconds))}"#
    )
}

let arguments = Array(CommandLine.arguments.dropFirst())
do {
    switch arguments.first {
    case "pg-bulk": try await pgBulk(Array(arguments.dropFirst()))
    case "transport": try await transport(Array(arguments.dropFirst()))
    case "latency": try latency(Array(arguments.dropFirst()))
    case "requests": try requests(Array(arguments.dropFirst()))
    case "keygen": try keygen(Array(arguments.dropFirst()))
    case "jwt": try jwt(Array(arguments.dropFirst()))
    case "json": try jsonBench(Array(arguments.dropFirst()))
    default:
        FileHandle.standardError.write(
            Data(
                "usage: marquee-bench pg-bulk|transport|latency|requests|keygen|jwt … (see bench/Sources/marquee-bench)\n"
                    .utf8))
        exit(2)
    }
} catch {
    FileHandle.standardError.write(Data("marquee-bench: \(error)\n".utf8))
    exit(1)
}
