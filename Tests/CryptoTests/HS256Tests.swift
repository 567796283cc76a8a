import Crypto
import Foundation
import Testing

@Suite("HS256 user tokens")
struct HS256Tests {
    let secret = Array("a-tenant-identity-secret-of-32-bytes!".utf8)
    let now: Int64 = 1_800_000_000

    func forge(header: String, payload: String, key: [UInt8]?) -> String {
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(payload.utf8))
        let signature = key.map { HMACSHA256.authenticationCode(key: $0, message: Array(input.utf8)) } ?? []
        return input + "." + Base64URL.encode(signature)
    }

    @Test("a token signed with the secret verifies, also with a previous secret in the list")
    func verifies() throws {
        let token = HS256.sign(subject: "person-1", expiresAt: now + 600, secret: secret)
        let claims = try HS256.verify(token, secrets: [secret], now: now)
        #expect(claims == HS256.Claims(subject: "person-1", expiresAt: now + 600))
        #expect(try HS256.verify(token, secrets: [Array("new".utf8), secret], now: now).subject == "person-1")
    }

    @Test("refused: another secret, alg none, RS256/ES256 headers, crit, altered claims")
    func refusesForgeries() {
        let good = HS256.sign(subject: "p", expiresAt: now + 60, secret: secret)
        #expect(throws: HS256.Failure.signature) {
            try HS256.verify(good, secrets: [Array("other".utf8)], now: now)
        }
        #expect(throws: HS256.Failure.signature) { try HS256.verify(good, secrets: [], now: now) }
        let payload = #"{"sub":"victim","exp":\#(now + 60)}"#
        for alg in ["none", "RS256", "ES256", "hs256", "HS512"] {
            #expect(throws: HS256.Failure.algorithm) {
                try HS256.verify(
                    forge(header: #"{"alg":"\#(alg)"}"#, payload: payload, key: alg == "none" ? nil : secret),
                    secrets: [secret], now: now)
            }
        }
        #expect(throws: HS256.Failure.algorithm) {
            try HS256.verify(
                forge(header: #"{"alg":"HS256","crit":["x"]}"#, payload: payload, key: secret), secrets: [secret],
                now: now)
        }
        // Swapping in another payload under the same signature.
        let parts = good.split(separator: ".")
        let swapped = parts[0] + "." + Base64URL.encode(Array(payload.utf8)) + "." + parts[2]
        #expect(throws: HS256.Failure.signature) { try HS256.verify(String(swapped), secrets: [secret], now: now) }
        for junk in ["", "a.b", "a.b.c", "x.y.z.w", String(repeating: "a", count: 5000)] {
            #expect(throws: HS256.Failure.malformed) { try HS256.verify(junk, secrets: [secret], now: now) }
        }
    }

    @Test("a header or claims that name a key twice are malformed: parsers disagree on which one counts")
    func refusesDuplicateKeys() {
        let exp = now + 60
        let header = #"{"alg":"HS256","typ":"JWT"}"#
        let cases: [(String, String)] = [
            (header, #"{"sub":"alice","exp":\#(exp),"sub":"bob"}"#),
            (header, #"{"sub":"alice","exp":\#(exp),"s\u0075b":"bob"}"#),
            (header, #"{"sub":"alice","exp":\#(exp),"exp":\#(exp + 999_999)}"#),
            (header, #"{"sub":"alice","exp":\#(exp),"email":"a@example.com","email":"b@example.com"}"#),
            (header, #"{"sub":"alice","exp":\#(exp),"x":{"k":1,"k":2}}"#),
            (#"{"alg":"HS256","alg":"none"}"#, #"{"sub":"alice","exp":\#(exp)}"#),
            (#"{"alg":"none","alg":"HS256"}"#, #"{"sub":"alice","exp":\#(exp)}"#),
        ]
        for (header, payload) in cases {
            #expect(throws: HS256.Failure.malformed, "\(header) \(payload)") {
                try HS256.verify(forge(header: header, payload: payload, key: secret), secrets: [secret], now: now)
            }
        }
        // The same claims, each key once, verify.
        let once = forge(header: header, payload: #"{"sub":"alice","exp":\#(exp)}"#, key: secret)
        #expect((try? HS256.verify(once, secrets: [secret], now: now))?.subject == "alice")
    }

    @Test("exp is required, not past, and at most a day ahead; sub is required")
    func claims() {
        #expect(throws: HS256.Failure.expired) {
            try HS256.verify(
                HS256.sign(subject: "p", expiresAt: now - 120, secret: secret), secrets: [secret], now: now)
        }
        #expect(throws: HS256.Failure.lifetimeTooLong) {
            try HS256.verify(
                HS256.sign(subject: "p", expiresAt: now + 2 * 86_400, secret: secret), secrets: [secret], now: now)
        }
        #expect(throws: HS256.Failure.missingSubject) {
            try HS256.verify(
                HS256.sign(subject: "", expiresAt: now + 60, secret: secret), secrets: [secret], now: now)
        }
        #expect(throws: HS256.Failure.missingExpiry) {
            try HS256.verify(
                forge(header: #"{"alg":"HS256"}"#, payload: #"{"sub":"p"}"#, key: secret), secrets: [secret], now: now)
        }
        #expect(throws: HS256.Failure.missingExpiry) {
            try HS256.verify(
                forge(header: #"{"alg":"HS256"}"#, payload: #"{"sub":"p","exp":"soon"}"#, key: secret),
                secrets: [secret], now: now)
        }
    }
}
