import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/v1/credentials/apns` and `/v1/credentials/fcm` (app key). Secrets go in, only metadata comes out.
struct CredentialRoutes: Sendable {
    let authenticator: Authenticator
    let credentials: CredentialStore
    /// The operator's allowlist for `endpoint` and `token_uri`.
    let providerHosts: ProviderHosts

    func register(in router: inout Router) {
        router.add(.PUT, "/v1/credentials/apns", authenticator.app(putAPNs))
        router.add(.GET, "/v1/credentials/apns", authenticator.app(getAPNs))
        router.add(.DELETE, "/v1/credentials/apns", authenticator.app(deleteAPNs))
        router.add(.PUT, "/v1/credentials/fcm", authenticator.app(putFCM))
        router.add(.GET, "/v1/credentials/fcm", authenticator.app(getFCM))
        router.add(.DELETE, "/v1/credentials/fcm", authenticator.app(deleteFCM))
    }

    func putAPNs(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let body = try JSONBody.parse(request)
        try body.rejectUnknown([
            "team_id", "key_id", "private_key", "bundle_id", "environment", "endpoint", "management_endpoint",
        ])
        let teamID = try Self.appleID(body.requiredString("team_id"), field: "team_id")
        let keyID = try Self.appleID(body.requiredString("key_id"), field: "key_id")
        let pem = try body.requiredString("private_key", maxLength: 16 * 1024)
        do {
            _ = try ES256PrivateKey(pem: pem)
        } catch let error as CryptoError {
            throw ValidationError(.invalidKey, field: "private_key", reason: "is not usable: \(error.description)")
        }
        let bundleID = try body.requiredString("bundle_id", maxLength: 155)
        guard Self.isBundleID(bundleID) else {
            throw ValidationError(field: "bundle_id", reason: "must be a bundle identifier such as com.example.app")
        }
        let environment = try body.requiredString("environment")
        guard environment == "sandbox" || environment == "production" else {
            throw ValidationError(field: "environment", reason: "must be sandbox or production")
        }
        let endpoint = try allowed(Self.httpsURL(body.string("endpoint"), field: "endpoint"), field: "endpoint")
        let managementEndpoint = try allowed(
            Self.httpsURL(body.string("management_endpoint"), field: "management_endpoint"),
            field: "management_endpoint")
        let info = try await credentials.putAPNs(
            tenant: principal.tenantID,
            APNsCredentialInput(
                teamID: teamID, keyID: keyID, privateKeyPEM: pem, bundleID: bundleID, environment: environment,
                endpoint: endpoint, managementEndpoint: managementEndpoint))
        return .json(Render.apns(info))
    }

    func getAPNs(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        return .json(Render.apns(try await credentials.getAPNs(tenant: principal.tenantID)))
    }

    func deleteAPNs(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await credentials.deleteAPNs(tenant: principal.tenantID)
        return .noContent()
    }

    func putFCM(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["service_account", "endpoint", "token_uri"])
        guard let account = try body.nested("service_account") else { throw ValidationError.missing("service_account") }
        if let type = try account.string("type"), type != "service_account" {
            throw ValidationError(field: "service_account.type", reason: "must be service_account")
        }
        let projectID = try account.requiredString("project_id", maxLength: 100)
        let clientEmail = try account.requiredString("client_email", maxLength: 320)
        guard clientEmail.contains("@") else {
            throw ValidationError(field: "service_account.client_email", reason: "must be an email address")
        }
        try Self.checkServiceAccountKey(account.requiredString("private_key", maxLength: 16 * 1024))
        let privateKeyID = try account.string("private_key_id", maxLength: 200)
        let tokenURI =
            try allowed(Self.httpsURL(body.string("token_uri"), field: "token_uri"), field: "token_uri")
            ?? allowed(
                Self.httpsURL(account.string("token_uri"), field: "service_account.token_uri"),
                field: "service_account.token_uri")
            ?? "https://oauth2.googleapis.com/token"
        let endpoint = try allowed(Self.httpsURL(body.string("endpoint"), field: "endpoint"), field: "endpoint")
        let info = try await credentials.putFCM(
            tenant: principal.tenantID,
            FCMCredentialInput(
                serviceAccountJSON: JSONValue.object(account.object).bytes, projectID: projectID,
                clientEmail: clientEmail, privateKeyID: privateKeyID, tokenURI: tokenURI, endpoint: endpoint))
        return .json(Render.fcm(info))
    }

    func getFCM(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        return .json(Render.fcm(try await credentials.getFCM(tenant: principal.tenantID)))
    }

    func deleteFCM(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        try await credentials.deleteFCM(tenant: principal.tenantID)
        return .noContent()
    }

    /// The service account's `private_key`, checked as the worker loads it: an RSA key of 2048 to 4096 bits, or a 422
    /// naming the field and the reason. The worker refuses a larger key (each access token would cost up to half a
    /// second of its thread pool to sign), so it is refused here, where the tenant learns why.
    static func checkServiceAccountKey(_ pem: String) throws(ValidationError) {
        do {
            _ = try RS256PrivateKey(pem: pem)
        } catch let error as CryptoError {
            throw ValidationError(
                .invalidKey, field: "service_account.private_key", reason: "is not usable: \(error.description)")
        } catch {
            throw ValidationError(.invalidKey, field: "service_account.private_key", reason: "is not usable")
        }
    }

    /// Apple team and key IDs: 10 characters of A-Z and 0-9.
    static func appleID(_ text: String, field: String) throws(ValidationError) -> String {
        guard text.utf8.count == 10, text.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) })
        else { throw ValidationError(field: field, reason: "must be 10 characters of A-Z and 0-9") }
        return text
    }

    static func isBundleID(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count >= 2
            && parts.allSatisfy { part in
                !part.isEmpty
                    && part.utf8.allSatisfy {
                        ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A)
                            || $0 == 0x2D
                    }
            }
    }

    /// `url` itself when its host (and port) is in `MARQUEE_PROVIDER_HOSTS`; a 422 naming `field` otherwise.
    func allowed(_ url: String?, field: String) throws(ValidationError) -> String? {
        guard let url else { return nil }
        if providerHosts.check(url: url) != nil {
            throw ValidationError(
                .endpointNotAllowed, field: field,
                reason: "must point at a host the operator allows (MARQUEE_PROVIDER_HOSTS)")
        }
        return url
    }

    /// An `https://host[:port][/path]` URL: plain HTTP is never accepted, TLS verification is always on.
    static func httpsURL(_ text: String?, field: String) throws(ValidationError) -> String? {
        guard let text else { return nil }
        guard let components = URLComponents(string: text), components.scheme == "https",
            let host = components.host, !host.isEmpty, components.user == nil, components.password == nil,
            components.query == nil, components.fragment == nil
        else {
            throw ValidationError(field: field, reason: "must be an https:// URL without credentials or query")
        }
        return text.hasSuffix("/") ? String(text.dropLast()) : text
    }
}
