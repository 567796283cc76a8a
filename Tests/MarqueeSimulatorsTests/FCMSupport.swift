import Crypto
import Foundation
import HTTP2
import MarqueeCore
import Synchronization
import Testing

@testable import MarqueeSimulators

/// A clock tests can move.
final class TestClock: Sendable {
    private let current = Mutex(Date())

    var now: Date { current.withLock { $0 } }

    func advance(_ seconds: TimeInterval) { current.withLock { $0 += seconds } }
}

/// A running FCM simulator and a client that trusts its CA.
struct FCMHarness {
    static let email = "sender@sim-project.iam.gserviceaccount.com"
    static let project = "sim-project"
    static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    let simulator: FCMSimulator
    let client: HTTP2Client
    let clock: TestClock
    let directory: String

    var audience: String { "https://127.0.0.1:\(simulator.port)/token" }

    func assertion(
        issuer: String = FCMHarness.email, audience: String? = nil, scope: String = FCMHarness.scope,
        issuedAt: Date? = nil, lifetime: Int64 = 3600, signer: RS256PrivateKey = TestKeys.fcm
    ) -> String {
        let iat = Int64((issuedAt ?? clock.now).timeIntervalSince1970)
        return try! JWT.sign(
            claims: [
                "iss": .string(issuer), "aud": .string(audience ?? self.audience), "scope": .string(scope),
                "iat": .int(iat), "exp": .int(iat + lifetime),
            ], header: ["kid": "key-1"], signer: signer)
    }

    func exchange(
        _ assertion: String, grantType: String = "urn:ietf:params:oauth:grant-type:jwt-bearer",
        contentType: String = "application/x-www-form-urlencoded"
    ) async throws -> HTTP2Response {
        let grant = grantType.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let body = "grant_type=\(grant)&assertion=\(assertion)"
        return try await client.send(
            HTTP2Request(path: "/token", headers: [("content-type", contentType)], body: Array(body.utf8)))
    }

    func accessToken() async throws -> String {
        let response = try await exchange(assertion())
        guard response.status == 200, let token = try json(response)["access_token"]?.stringValue else {
            throw TestFailure("token exchange answered \(response.status)")
        }
        return token
    }

    static func message(
        token: String = "fcm-token-1", data: String = #"{"event":"update","score":"2-0"}"#,
        android: String = #"{"priority":"HIGH","ttl":"3600s","collapse_key":"match-1"}"#
    ) -> String {
        #"{"message":{"token":"\#(token)","data":\#(data),"android":\#(android)}}"#
    }

    func send(
        _ body: String = FCMHarness.message(), bearer: String?, project: String = FCMHarness.project
    ) async throws -> HTTP2Response {
        var headers = [("content-type", "application/json")]
        if let bearer { headers.append(("authorization", "Bearer " + bearer)) }
        return try await client.send(
            HTTP2Request(path: "/v1/projects/\(project)/messages:send", headers: headers, body: Array(body.utf8)))
    }

    func get(_ path: String) async throws -> JSONValue {
        let response = try await client.send(HTTP2Request(method: "GET", path: path))
        guard response.status == 200 else { throw TestFailure("\(path) answered \(response.status)") }
        return try json(response)
    }
}

/// The FCM error fields: HTTP status, `error.status`, `details[0].errorCode`.
func fcmError(_ response: HTTP2Response) throws -> (Int, String?, String?) {
    let error = try json(response)["error"]
    return (
        response.status, error?["status"]?.stringValue, error?["details"]?.arrayValue?.first?["errorCode"]?.stringValue
    )
}

/// Starts an FCM simulator on a free port, runs `body`, stops it.
func withFCM<R>(
    faults: [FaultRule] = [], tokenLifetime: TimeInterval = 3600, _ body: (FCMHarness) async throws -> R
) async throws -> R {
    let directory = try temporaryDirectory()
    let clock = TestClock()
    let simulator = try FCMSimulator(
        configuration: .init(
            port: 0, caOutputPath: directory + "/ca.pem", recordsPath: directory + "/fcm.jsonl",
            accounts: [
                .init(clientEmail: FCMHarness.email, projectID: FCMHarness.project, publicKey: TestKeys.fcm.publicKey)
            ], faults: faults, accessTokenLifetime: tokenLifetime, randomSeed: 3, now: { clock.now }))
    try simulator.start()
    let runner = Task { try await simulator.run() }
    let client = try HTTP2Client(
        .init(
            host: "127.0.0.1", port: simulator.port, tls: TLSClientConfiguration(caFile: directory + "/ca.pem"),
            connectTimeout: .seconds(5), requestTimeout: .seconds(20)))
    let harness = FCMHarness(simulator: simulator, client: client, clock: clock, directory: directory)
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
