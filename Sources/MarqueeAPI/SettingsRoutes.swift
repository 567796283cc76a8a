import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/v1/settings` (app key): the tenant's identity verification mode and identity secret, its send rate limit, its
/// cap on devices per person, its API request rate limits and its cap on activity types registrations create.
struct SettingsRoutes: Sendable {
    let authenticator: Authenticator
    let settings: TenantSettingsStore
    let identity: IdentityGuard
    /// The operator's request rate defaults, shown where the tenant set none.
    let limits: RequestLimits

    /// The values `max_devices_per_person` may take (the column's check, migration 0081).
    static let devicesPerPerson: ClosedRange<Int64> = 1...1000

    func register(in router: inout Router) {
        router.add(.GET, "/v1/settings", authenticator.app(getSettings))
        router.add(.PATCH, "/v1/settings", authenticator.app(patchSettings))
        router.add(.POST, "/v1/settings/identity_secret", authenticator.app(postIdentitySecret))
    }

    func getSettings(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        return .json(Self.render(try await settings.settings(tenant: principal.tenantID), limits: limits))
    }

    func patchSettings(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let body = try JSONBody.parse(request)
        try body.rejectUnknown([
            "identity_verification", "send_rate_per_second", "max_devices_per_person", "app_requests_per_second",
            "sdk_requests_per_second", "max_auto_created_activity_types",
        ])
        var change = TenantSettingsStore.Change()
        if body.object["identity_verification"] != nil {
            change.identityVerification = try body.requiredEnum("identity_verification", IdentityVerification.self)
        }
        if body.object["send_rate_per_second"] != nil {
            // null removes the limit.
            change.sendRatePerSecond = .some(
                try body.integer("send_rate_per_second", range: 1...1_000_000).map { Int($0) })
        }
        if body.object["max_devices_per_person"] != nil {
            // null restores the default.
            change.maxDevicesPerPerson = .some(
                try body.integer("max_devices_per_person", range: Self.devicesPerPerson).map { Int($0) })
        }
        if body.object["max_auto_created_activity_types"] != nil {
            // null restores the default; 0 lets registrations create none (every type made with the app key).
            change.maxAutoCreatedActivityTypes = .some(
                try body.integer("max_auto_created_activity_types", range: 0...10_000).map { Int($0) })
        }
        // Up to the operator's limit (a tenant may lower its rate, not raise it); null restores the operator's.
        for (field, kind) in [("app_requests_per_second", APIKeyKind.app), ("sdk_requests_per_second", .sdk)]
        where body.object[field] != nil {
            let rate = try body.integer(field, range: 1...Int64(limits.ceiling(kind) ?? 1_000_000)).map { Int($0) }
            if kind == .app {
                change.appRequestsPerSecond = .some(rate)
            } else {
                change.sdkRequestsPerSecond = .some(rate)
            }
        }
        guard
            change.identityVerification != nil || change.sendRatePerSecond != nil
                || change.maxDevicesPerPerson != nil || change.appRequestsPerSecond != nil
                || change.sdkRequestsPerSecond != nil || change.maxAutoCreatedActivityTypes != nil
        else {
            throw ValidationError(
                field: "body",
                reason: "must set at least one of identity_verification, send_rate_per_second, "
                    + "max_devices_per_person, app_requests_per_second, sdk_requests_per_second, "
                    + "max_auto_created_activity_types")
        }
        let updated = try await settings.update(tenant: principal.tenantID, change)
        identity.invalidate(principal.tenantID)
        // The request rate limits are cached with the keys: this process applies a change from its next request.
        authenticator.forgetKeys(of: principal.tenantID)
        return .json(Self.render(updated, limits: limits))
    }

    /// Creates or rotates the identity secret; the only place it is ever shown. While the previous secret is in its
    /// grace, a rotation is refused (409 `identity-secret-in-grace`) unless `?force=true`.
    func postIdentitySecret(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        var force = false
        if let text = request.query["force"] {
            guard text == "true" || text == "false" else {
                throw ValidationError(field: "force", reason: "must be true or false")
            }
            force = text == "true"
        }
        let (secret, rotated) = try await settings.rotateIdentitySecret(tenant: principal.tenantID, force: force)
        identity.invalidate(principal.tenantID)
        return .json(.object(["secret": .string(Base64URL.encode(secret))]), status: rotated ? 200 : 201)
    }

    /// The settings; the request rates are those in force on this process (the tenant's, else the default; null:
    /// none).
    static func render(_ s: TenantSettings, limits: RequestLimits) -> JSONValue {
        func rate(_ kind: APIKeyKind, _ setting: Int?) -> JSONValue {
            limits.perSecond(kind, setting: setting).map { .int(Int64($0)) } ?? .null
        }
        return .object([
            "identity_verification": .string(s.identityVerification.rawValue),
            "identity_secret_set": .bool(s.identitySecretSet),
            "previous_secret_valid_until": .from(s.previousSecretValidUntil),
            "send_rate_per_second": s.sendRatePerSecond.map { .int(Int64($0)) } ?? .null,
            "max_devices_per_person": .int(Int64(s.maxDevicesPerPerson)),
            "app_requests_per_second": rate(.app, s.appRequestsPerSecond),
            "sdk_requests_per_second": rate(.sdk, s.sdkRequestsPerSecond),
            "max_auto_created_activity_types": .int(Int64(s.maxAutoCreatedActivityTypes)),
        ])
    }
}
