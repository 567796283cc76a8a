import Foundation
import Testing

@Suite("marquee tenant and key commands")
struct TenantCommandTests {
    static func keys(_ output: String) throws -> [[String: Any]] {
        try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [[String: Any]])
    }

    @Test("an option a subcommand does not take, or one given twice, is refused before anything is done")
    func optionsPerSubcommand() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let environment = [
            "DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
            "MARQUEE_MASTER_KEY": MarqueeProcess.masterKey,
        ]
        func marquee(_ arguments: [String]) async throws -> CommandResult {
            try await runCommand(TestEnvironment.marqueeBinary, arguments, environment: environment)
        }
        #expect(try await marquee(["migrate"]).status == 0)
        let created = try await marquee(["tenant", "create", "--name", "flags", "--json"])
        try #require(created.status == 0, "\(created.output)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(created.output.utf8)) as? [String: Any])
        let tenant = try #require(json["id"] as? String)
        let listed = try await marquee(["key", "list", "--tenant", tenant])
        try #require(listed.status == 0, "\(listed.output)")
        let key = try #require(try Self.keys(listed.output).first?["id"] as? String)

        // A grace period asked of revoke (which has none) must not become an instant revocation.
        let revoke = try await marquee(["key", "revoke", "--tenant", tenant, "--key", key, "--grace-seconds", "3600"])
        #expect(revoke.status == 2)
        #expect(revoke.output.contains("key revoke: unknown option '--grace-seconds'"))
        // Given twice, an option is not silently the last one.
        let twice = try await marquee(["key", "revoke", "--tenant", tenant, "--key", key, "--key", key])
        #expect(twice.status == 2)
        #expect(twice.output.contains("--key is given twice"))
        #expect(try await marquee(["tenant", "list", "--name", "x"]).status == 2)
        let after = try await marquee(["key", "list", "--tenant", tenant])
        #expect(try Self.keys(after.output).allSatisfy { $0["revoked_at"] is NSNull })
        // What a subcommand takes still works.
        #expect(try await marquee(["key", "revoke", "--tenant", tenant, "--key", key, "--json"]).status == 0)
        let revoked = try await marquee(["key", "list", "--tenant", tenant])
        #expect(try Self.keys(revoked.output).contains { $0["id"] as? String == key && $0["revoked_at"] is String })
    }
}
