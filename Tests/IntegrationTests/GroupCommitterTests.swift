import Foundation
import MarqueeStore
import PostgresClient
import Synchronization
import Testing

@Suite("Group commit")
struct GroupCommitterTests {
    @Test("every committed batch is reported with its size; the sizes add up to the statements")
    func batchSizesAreReported() async throws {
        let fixture = try await RegistryFixture.get()
        let sizes = Mutex<[Int]>([])
        let committer = GroupCommitter(
            pool: fixture.pool, configuration: .init(writers: 1, maxBatch: 16, notifyChannel: nil)
        ) { size in sizes.withLock { $0.append(size) } }
        let tenant = UUID()
        try await withThrowingTaskGroup(of: Int.self) { group in
            for i in 0..<100 {
                group.addTask {
                    try await committer.submit(tenant: tenant, Echo(n: i)).decode(Int.self, "n")
                }
            }
            let total = try await group.reduce(0, +)
            #expect(total == (0..<100).reduce(0, +))
        }
        let reported = sizes.withLock { $0 }
        #expect(reported.reduce(0, +) == 100)
        #expect(reported.allSatisfy { (1...16).contains($0) })
        #expect(committer.statistics.batches == reported.count)
        #expect(committer.statistics.statements == 100)
    }

    @Test("a database that cannot be reached fails a whole batch at once, not each write again alone")
    func unreachableFailsAtOnce() async throws {
        // Nothing listens on the port: every connection attempt is refused.
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        let port = UInt16(bigEndian: address.sin_port)
        close(listener)
        let pool = PostgresPool(
            try PostgresConfiguration(url: "postgresql://postgres@127.0.0.1:\(port)/none?connect_timeout=2"),
            options: .init(maxConnections: 2))
        defer { pool.close() }
        let committer = GroupCommitter(pool: pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil))
        let tenant = UUID()
        let failures = try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<40 {
                group.addTask {
                    do {
                        _ = try await committer.submit(tenant: tenant, Echo(n: i))
                        return false
                    } catch let error as PostgresError {
                        return error.code == .connectionFailed
                    }
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(failures == 40, "every caller hears the database is unreachable")
        #expect(committer.statistics.fallbacks == 0, "no write was tried again alone")
    }

    @Test("a batch of several tenants' statements runs each inside its own tenant, answered in its caller's order")
    func tenantsInterleaved() async throws {
        let fixture = try await RegistryFixture.get()
        let sizes = Mutex<[Int]>([])
        let committer = GroupCommitter(
            pool: fixture.pool, configuration: .init(writers: 1, maxBatch: 64, notifyChannel: nil)
        ) { size in sizes.withLock { $0.append(size) } }
        let tenants = (0..<3).map { _ in UUID() }
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<60 {
                let tenant = tenants[i % 3]
                group.addTask {
                    let row = try await committer.submit(tenant: tenant, Echo(n: i))
                    return try row.decode(String.self, "tenant") == tenant.uuidString.lowercased()
                        && row.decode(Int.self, "n") == i
                }
            }
            for try await ok in group { #expect(ok) }
        }
        // Statements did share transactions (otherwise nothing here was grouped).
        #expect(sizes.withLock { $0 }.contains { $0 > 1 })
    }
}

/// A write that writes nothing: each row answers its number and the tenant its statement ran in.
struct Echo: SetWrite {
    var n: Int
    var exclusiveKeys: [String] { [] }

    static func statement(tenant: UUID, _ writes: [Echo]) -> PostgresQuery {
        """
        SELECT current_setting('marquee.tenant_id') AS tenant, e.n::int AS n
        FROM unnest(\(writes.map(\.n))::int[]) WITH ORDINALITY AS e(n, i) ORDER BY e.i
        """
    }
}
