import Foundation
import Testing

@testable import MarqueeCore

@Suite("Configuration from the environment")
struct ConfigurationTests {
    @Test("defaults")
    func defaults() throws {
        let c = try MarqueeConfiguration(environment: [:])
        #expect(c.listen == .init(host: "127.0.0.1", port: 8080))
        #expect(c.logLevel == "info")
        #expect(c.databaseURL == nil)
        #expect(c.masterKey == nil)
        #expect(c.maxBodyBytes == 1 << 20)
        #expect(c.maxBufferedBodyBytes == 64 << 20)
        #expect(
            try MarqueeConfiguration(environment: ["MARQUEE_MAX_BUFFERED_BODY_BYTES": "0"]).maxBufferedBodyBytes == 0)
        let budget = #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: [
                "MARQUEE_MAX_BODY_BYTES": "2097152", "MARQUEE_MAX_BUFFERED_BODY_BYTES": "1048576",
            ])
        }
        #expect(budget?.problems.map(\.variable) == ["MARQUEE_MAX_BUFFERED_BODY_BYTES"])
        #expect(c.databasePoolSize == 16 && c.databaseAcquireTimeoutSeconds == 5)
        #expect(c.databaseWriteBatches == 2 && c.databaseReadBatches == 2)
        let batches = try MarqueeConfiguration(environment: [
            "MARQUEE_DB_WRITE_BATCHES": "4", "MARQUEE_DB_READ_BATCHES": "1",
        ])
        #expect(batches.databaseWriteBatches == 4 && batches.databaseReadBatches == 1)
        #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_DB_WRITE_BATCHES": "0"])
        }
        #expect(throws: ConfigurationError.self) { try c.requireDatabaseURL() }
        #expect(
            try MarqueeConfiguration(environment: ["MARQUEE_DB_ACQUIRE_TIMEOUT": "30"]).databaseAcquireTimeoutSeconds
                == 30)
        #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_DB_ACQUIRE_TIMEOUT": "0"])
        }
    }

    @Test("request rate limits: 1000 a second for each kind of key, bursts of 10 s, 0 for none, bad values named")
    func requestRateLimits() throws {
        let c = try MarqueeConfiguration(environment: [:])
        #expect(c.rateLimitApp == 1000 && c.rateLimitSDK == 1000 && c.rateLimitBurstSeconds == 10)
        let set = try MarqueeConfiguration(environment: [
            "MARQUEE_RATE_LIMIT_APP": "0", "MARQUEE_RATE_LIMIT_SDK": "250", "MARQUEE_RATE_LIMIT_BURST": "2",
        ])
        #expect(c.keyLookupsPerAddress == 20)
        #expect(set.rateLimitApp == 0 && set.rateLimitSDK == 250 && set.rateLimitBurstSeconds == 2)
        #expect(
            try MarqueeConfiguration(environment: ["MARQUEE_KEY_LOOKUPS_PER_ADDRESS": "0"]).keyLookupsPerAddress == 0)
        #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_KEY_LOOKUPS_PER_ADDRESS": "-1"])
        }
        let bad = #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: [
                "MARQUEE_RATE_LIMIT_APP": "-1", "MARQUEE_RATE_LIMIT_SDK": "many", "MARQUEE_RATE_LIMIT_BURST": "0",
            ])
        }
        #expect(
            bad?.problems.map(\.variable)
                == ["MARQUEE_RATE_LIMIT_APP", "MARQUEE_RATE_LIMIT_SDK", "MARQUEE_RATE_LIMIT_BURST"])
    }

    @Test("the worker's liveness bound: three holds plus the poll interval, and always past one hold and one poll")
    func workerLiveness() throws {
        #expect(try MarqueeConfiguration(environment: [:]).workerLivenessSeconds == 181)
        let short = try MarqueeConfiguration(environment: [
            "MARQUEE_WORKER_HOLD_SECONDS": "10", "MARQUEE_WORKER_POLL_MS": "2500",
        ])
        #expect(short.workerLivenessSeconds == 33)
        #expect(
            try MarqueeConfiguration(environment: ["MARQUEE_WORKER_LIVENESS_SECONDS": "62"]).workerLivenessSeconds == 62
        )
        let error = #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_WORKER_LIVENESS_SECONDS": "61"])
        }
        #expect(error?.problems.map(\.variable) == ["MARQUEE_WORKER_LIVENESS_SECONDS"])
    }

    @Test("the HTTP listener's connection settings: idle timeout (0 for none) and connection limit")
    func httpConnections() throws {
        let defaults = try MarqueeConfiguration(environment: [:])
        #expect(defaults.httpIdleTimeoutSeconds == 60 && defaults.httpConnections == 4096)
        #expect(defaults.httpReadTimeoutSeconds == 30 && defaults.httpConnectionsPerAddress == 256)
        let set = try MarqueeConfiguration(environment: [
            "MARQUEE_HTTP_IDLE_TIMEOUT": "0", "MARQUEE_HTTP_CONNECTIONS": "20000",
        ])
        #expect(set.httpIdleTimeoutSeconds == 0 && set.httpConnections == 20000)
        let refused = #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_HTTP_IDLE_TIMEOUT": "-1", "MARQUEE_HTTP_CONNECTIONS": "0"])
        }
        #expect(
            refused?.problems.map(\.variable).sorted() == ["MARQUEE_HTTP_CONNECTIONS", "MARQUEE_HTTP_IDLE_TIMEOUT"])
    }

    @Test("values are read and validated")
    func values() throws {
        let key = String(repeating: "A", count: 43) + "="  // 32 zero bytes in base64
        let c = try MarqueeConfiguration(environment: [
            "DATABASE_URL": "postgresql://u@h/db", "MARQUEE_LISTEN": "0.0.0.0:9000", "MARQUEE_LOG_LEVEL": "DEBUG",
            "MARQUEE_MASTER_KEY": key, "MARQUEE_ADMIN_TOKEN": "0123456789abcdef",
        ])
        #expect(c.listen == .init(host: "0.0.0.0", port: 9000))
        #expect(c.logLevel == "debug")
        #expect(c.masterKey == Array(repeating: 0, count: 32))
        #expect(try c.requireDatabaseURL() == "postgresql://u@h/db")
    }

    @Test("a value from a file keeps no line break: an admin token with a trailing newline is the token")
    func lineBreaksAround() throws {
        let c = try MarqueeConfiguration(environment: [
            "MARQUEE_ADMIN_TOKEN": "0123456789abcdef\n", "DATABASE_URL": "postgresql://u@h/db\r\n",
            "MARQUEE_LOG_LEVEL": " debug\n",
        ])
        #expect(c.adminToken == "0123456789abcdef")
        #expect(c.databaseURL == "postgresql://u@h/db")
        #expect(c.logLevel == "debug")
        // One no header can carry is refused, naming the variable.
        let inside = #expect(throws: ConfigurationError.self) {
            try MarqueeConfiguration(environment: ["MARQUEE_ADMIN_TOKEN": "01234567\n89abcdef"])
        }
        #expect(inside?.problems.map(\.variable) == ["MARQUEE_ADMIN_TOKEN"])
    }

    @Test("every problem is reported, naming the variable and never echoing a secret")
    func problems() {
        let secret = "c2hvcnQ="  // "short"
        do {
            _ = try MarqueeConfiguration(environment: [
                "MARQUEE_LISTEN": "nonsense", "MARQUEE_LOG_LEVEL": "loud", "MARQUEE_MASTER_KEY": secret,
                "MARQUEE_ADMIN_TOKEN": "short", "MARQUEE_DB_POOL_SIZE": "0",
            ])
            Issue.record("expected a configuration error")
        } catch {
            let variables = error.problems.map(\.variable)
            #expect(
                variables == [
                    "MARQUEE_LISTEN", "MARQUEE_LOG_LEVEL", "MARQUEE_MASTER_KEY", "MARQUEE_ADMIN_TOKEN",
                    "MARQUEE_DB_POOL_SIZE",
                ])
            #expect(!error.description.contains(secret))
        }
    }

    @Test(
        "listen addresses",
        arguments: [
            ("127.0.0.1:8080", "127.0.0.1", 8080), (":8081", "0.0.0.0", 8081), ("[::1]:443", "::1", 443),
        ])
    func listen(text: String, host: String, port: Int) throws {
        let address = try #require(MarqueeConfiguration.ListenAddress(text))
        #expect(address.host == host && address.port == port)
    }

    @Test("bad listen addresses", arguments: ["8080", "host:", "host:70000", "::1:80", "[::1]80"])
    func badListen(text: String) {
        #expect(MarqueeConfiguration.ListenAddress(text) == nil)
    }
}

@Suite("Master key rotation settings")
struct MasterKeyConfigurationTests {
    let a = String(repeating: "A", count: 43) + "="
    let b = String(repeating: "B", count: 43) + "="

    @Test("current key ID and previous keys parse")
    func parse() throws {
        let c = try MarqueeConfiguration(environment: [
            "MARQUEE_MASTER_KEY": a, "MARQUEE_MASTER_KEY_ID": "k2", "MARQUEE_MASTER_KEYS_PREVIOUS": "k1:\(b)",
        ])
        #expect(c.masterKeyID == "k2")
        #expect(c.previousMasterKeys.map(\.id) == ["k1"])
        #expect(c.previousMasterKeys[0].key.count == 32)
        #expect(try MarqueeConfiguration(environment: [:]).masterKeyID == "k1")
    }

    @Test(
        "master keys read as the key ring reads them: around whitespace (a key from a file ends in a newline), base64url"
    )
    func sameParserAsTheKeyRing() throws {
        // Bytes whose base64 holds `+` and `/`, which base64url writes `-` and `_`.
        let bytes = Array([UInt8]([0xFB, 0xFF, 0xBF]).repeated(11).prefix(32))
        let standard = Data(bytes).base64EncodedString()
        try #require(standard.contains("+") && standard.contains("/") && standard.hasSuffix("="))
        let url = String(
            standard.map { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 }.filter { $0 != "=" })
        for text in [standard + "\n", " " + standard + "\r\n", url, url + "\n"] {
            let c = try MarqueeConfiguration(environment: [
                "MARQUEE_MASTER_KEY": text, "MARQUEE_MASTER_KEY_ID": "k2", "MARQUEE_MASTER_KEYS_PREVIOUS": "k1:" + text,
            ])
            #expect(c.masterKey == bytes, "\(text.debugDescription)")
            #expect(c.previousMasterKeys.map(\.key) == [bytes], "\(text.debugDescription)")
        }
        // Only a newline is no key at all, as any variable holding only whitespace is unset.
        #expect(try MarqueeConfiguration(environment: ["MARQUEE_MASTER_KEY": "\n"]).masterKey == nil)
        for wrong in [standard + "AAAA", String(standard.dropLast(4)), standard + "*"] {
            let error = #expect(throws: ConfigurationError.self, "\(wrong.debugDescription)") {
                try MarqueeConfiguration(environment: ["MARQUEE_MASTER_KEY": wrong])
            }
            #expect(error.map { !$0.description.contains(standard) } ?? true)
        }
    }

    @Test("malformed previous keys, a reused ID, or a bad ID are refused without echoing the key")
    func refused() {
        for previous in ["k1", "k1:short", "k2:\(b)", "bad id:\(b)", ":", "k1:\(b),:"] {
            do {
                _ = try MarqueeConfiguration(environment: [
                    "MARQUEE_MASTER_KEY": a, "MARQUEE_MASTER_KEY_ID": "k2", "MARQUEE_MASTER_KEYS_PREVIOUS": previous,
                ])
                Issue.record("accepted \(previous)")
            } catch {
                #expect(error.problems.map(\.variable) == ["MARQUEE_MASTER_KEYS_PREVIOUS"])
                #expect(!error.description.contains(b))
            }
        }
    }
}

extension Array {
    fileprivate func repeated(_ times: Int) -> [Element] { (0..<times).flatMap { _ in self } }
}
