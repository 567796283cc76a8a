import Crypto
import Foundation

/// `marquee-bench keygen es256|rs256 <private.pem> <public.pem>`: a fresh key pair (PKCS#8 and SPKI PEM).
func keygen(_ arguments: [String]) throws {
    guard arguments.count == 3 else { throw BenchError(description: "keygen es256|rs256 <private> <public>") }
    switch arguments[0] {
    case "es256":
        let key = ES256PrivateKey.generate()
        try writeText(key.pkcs8PEM, to: arguments[1])
        try writeText(key.publicKey.pem, to: arguments[2])
    case "rs256":
        let key = try RS256PrivateKey.generate()
        try writeText(key.pkcs8PEM, to: arguments[1])
        try writeText(key.publicKey.pem, to: arguments[2])
    default:
        throw BenchError(description: "keygen: es256 or rs256")
    }
}

/// `marquee-bench jwt --key <p8> --kid <key ID> --team <team ID>`: prints an APNs provider token signed now.
func jwt(_ arguments: [String]) throws {
    let key = try ES256PrivateKey(pem: try readText(try requiredOption("--key", arguments)))
    let token = try JWT.sign(
        claims: [
            "iss": .string(try requiredOption("--team", arguments)), "iat": .int(Int64(Date().timeIntervalSince1970)),
        ],
        header: ["kid": try requiredOption("--kid", arguments)], signer: key)
    print(token)
}
