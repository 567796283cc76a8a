import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Testing

@testable import MarqueeSimulators

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A fresh temporary directory per call.
func temporaryDirectory() throws -> String {
    let path = NSTemporaryDirectory() + "marquee-sims-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// Parses a response body as JSON.
func json(_ response: HTTP2Response) throws -> JSONValue {
    try JSONValue.parse(response.body)
}

/// Keys shared by the tests (generating RSA keys is slow).
enum TestKeys {
    static let apns = ES256PrivateKey.generate()
    static let otherAPNs = ES256PrivateKey.generate()
    static let fcm = try! RS256PrivateKey.generate()
    static let otherFCM = try! RS256PrivateKey.generate()
}

/// A running APNs simulator and a client that trusts its CA.
struct APNsHarness {
    static let keyID = "KEY1234567"
    static let teamID = "TEAM123456"
    static let bundleID = "com.example.scores"
    static let topic = bundleID + ".push-type.liveactivity"

    let simulator: APNsSimulator
    let client: HTTP2Client
    let directory: String

    var recordsPath: String { directory + "/apns.jsonl" }

    static func provider(
        keyID: String = keyID, teamID: String = teamID, issuedAt: Date = Date(),
        signer: ES256PrivateKey = TestKeys.apns
    ) -> String {
        try! JWT.sign(
            claims: ["iss": .string(teamID), "iat": .int(Int64(issuedAt.timeIntervalSince1970))],
            header: ["kid": keyID], signer: signer)
    }

    static let startPayload = """
        {"aps":{"event":"start","timestamp":1700000000,"content-state":{"home":1,"away":0},\
        "attributes-type":"MatchAttributes","attributes":{"match":"A-B"},\
        "alert":{"title":"Kick-off","body":"A v B"}}}
        """

    static let updatePayload = """
        {"aps":{"event":"update","timestamp":1700000100,"content-state":{"home":2,"away":0}}}
        """

    static func token(_ prefix: String = "", fill: Character = "a") -> String {
        prefix + String(repeating: fill, count: 64 - prefix.count)
    }

    /// Headers of a valid request; `overrides` replace (or with `nil` remove) single headers.
    static func headers(_ overrides: [String: String?] = [:]) -> [(String, String)] {
        var headers: [String: String] = [
            "authorization": "bearer " + provider(), "apns-push-type": "liveactivity", "apns-topic": topic,
            "apns-priority": "10",
        ]
        for (name, value) in overrides { headers[name] = value ?? nil }
        return headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    func push(
        token: String = APNsHarness.token(), payload: String = APNsHarness.updatePayload,
        headers: [(String, String)] = APNsHarness.headers(), method: String = "POST", path: String? = nil
    ) async throws -> HTTP2Response {
        try await client.send(
            HTTP2Request(
                method: method, path: path ?? "/3/device/\(token)", headers: headers, body: Array(payload.utf8)))
    }

    func get(_ path: String) async throws -> JSONValue {
        let response = try await client.send(HTTP2Request(method: "GET", path: path))
        guard response.status == 200 else { throw TestFailure("\(path) answered \(response.status)") }
        return try json(response)
    }
}

/// Starts an APNs simulator on a free port, runs `body`, stops it.
func withAPNs<R>(
    faults: [FaultRule] = [], bundleIDs: [String] = [APNsHarness.bundleID], seed: UInt64? = 7,
    _ body: (APNsHarness) async throws -> R
) async throws -> R {
    let directory = try temporaryDirectory()
    let simulator = try APNsSimulator(
        configuration: .init(
            port: 0, caOutputPath: directory + "/ca.pem", recordsPath: directory + "/apns.jsonl",
            keys: [
                .init(
                    keyID: APNsHarness.keyID, teamID: APNsHarness.teamID, publicKey: TestKeys.apns.publicKey,
                    bundleIDs: bundleIDs)
            ], faults: faults, randomSeed: seed))
    try simulator.start()
    let runner = Task { try await simulator.run() }
    let client = try HTTP2Client(
        .init(
            host: "127.0.0.1", port: simulator.port, tls: TLSClientConfiguration(caFile: directory + "/ca.pem"),
            connectTimeout: .seconds(20), requestTimeout: .seconds(20), backoff: .init(initial: .milliseconds(10))))
    let harness = APNsHarness(simulator: simulator, client: client, directory: directory)
    do {
        let result = try await body(harness)
        await client.shutdown()
        await simulator.stop()
        try await runner.value
        return result
    } catch {
        await client.shutdown()
        await simulator.stop()
        _ = try? await runner.value
        throw error
    }
}
