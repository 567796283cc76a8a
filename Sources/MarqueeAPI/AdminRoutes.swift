import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `/admin/v1/…`: tenants and keys, guarded by `MARQUEE_ADMIN_TOKEN`.
struct AdminRoutes: Sendable {
    let authenticator: Authenticator
    let tenants: TenantStore

    func register(in router: inout Router) {
        router.add(.POST, "/admin/v1/tenants", createTenant)
        router.add(.GET, "/admin/v1/tenants", listTenants)
        router.add(.GET, "/admin/v1/tenants/{tenant_id}", getTenant)
        router.add(.GET, "/admin/v1/tenants/{tenant_id}/keys", listKeys)
        router.add(.POST, "/admin/v1/tenants/{tenant_id}/keys", createKey)
        router.add(.POST, "/admin/v1/tenants/{tenant_id}/keys/{key_id}/rotate", rotateKey)
        router.add(.DELETE, "/admin/v1/tenants/{tenant_id}/keys/{key_id}", revokeKey)
    }

    func createTenant(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["name"])
        // The store trims and checks the length; only an absurd body is refused here.
        let name = try body.requiredString("name", maxLength: 1000)
        let created = try await tenants.create(name: name)
        return .json(Render.createdTenant(created), status: 201)
    }

    func listTenants(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let all = try await tenants.list()
        return .json(.object(["tenants": .array(all.map(Render.tenant))]))
    }

    func getTenant(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        return .json(Render.tenant(try await tenants.get(try tenantID(request))))
    }

    func listKeys(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let keys = try await tenants.keys(tenant: try tenantID(request))
        return .json(.object(["keys": .array(keys.map(Render.key))]))
    }

    func createKey(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let body = try JSONBody.parse(request)
        try body.rejectUnknown(["kind"])
        let kind = try body.requiredEnum("kind", APIKeyKind.self)
        let issued = try await tenants.createKey(tenant: try tenantID(request), kind: kind)
        return .json(Render.issuedKey(issued), status: 201)
    }

    func rotateKey(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let body = try JSONBody.parse(request, allowEmpty: true)
        try body.rejectUnknown(["grace_seconds"])
        let allowed = TenantStore.rotationGraceSeconds
        let grace = try body.integer("grace_seconds", range: Int64(allowed.lowerBound)...Int64(allowed.upperBound)) ?? 0
        let tenant = try tenantID(request)
        let issued = try await tenants.rotateKey(tenant: tenant, key: try keyID(request), grace: .seconds(grace))
        // This process's cache learns at once (others within MARQUEE_KEY_CACHE_SECONDS).
        authenticator.forgetKeys(of: tenant)
        return .json(Render.issuedKey(issued), status: 201)
    }

    func revokeKey(_ request: HTTPRequest) async throws -> HTTPResponse {
        try authenticator.requireAdmin(request)
        let tenant = try tenantID(request)
        let record = try await tenants.revokeKey(tenant: tenant, key: try keyID(request))
        // This process's cache learns at once (others within MARQUEE_KEY_CACHE_SECONDS).
        authenticator.forgetKeys(of: tenant)
        return .json(Render.key(record))
    }

    func tenantID(_ request: HTTPRequest) throws -> UUID {
        guard let id = request.pathParameters["tenant_id"].flatMap(UUID.init(uuidString:)) else {
            throw Problems.notFound("tenant")
        }
        return id
    }

    func keyID(_ request: HTTPRequest) throws -> UUID {
        guard let id = request.pathParameters["key_id"].flatMap(UUID.init(uuidString:)) else {
            throw Problems.notFound("api_key")
        }
        return id
    }
}
