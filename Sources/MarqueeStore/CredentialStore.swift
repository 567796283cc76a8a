import Crypto
import Foundation
import MarqueeCore
import PostgresClient

/// What a tenant uploads for APNs token auth. The private key is sealed before it is stored.
public struct APNsCredentialInput: Sendable {
    public var teamID: String
    public var keyID: String
    public var privateKeyPEM: String
    public var bundleID: String
    public var environment: String
    public var endpoint: String?
    /// Overrides the broadcast channel management host (`https://host:port`).
    public var managementEndpoint: String?

    public init(
        teamID: String, keyID: String, privateKeyPEM: String, bundleID: String, environment: String, endpoint: String?,
        managementEndpoint: String? = nil
    ) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKeyPEM = privateKeyPEM
        self.bundleID = bundleID
        self.environment = environment
        self.endpoint = endpoint
        self.managementEndpoint = managementEndpoint
    }
}

/// APNs credentials as shown back: metadata only.
public struct APNsCredentialInfo: Sendable, Equatable {
    public var teamID: String
    public var keyID: String
    public var bundleID: String
    public var environment: String
    public var endpoint: String?
    public var managementEndpoint: String?
    public var status: String
    public var statusReason: String?
    public var createdAt: Date
    public var updatedAt: Date
}

/// What a tenant uploads for FCM: the whole service-account JSON (sealed) and the fields Marquee reads from it.
public struct FCMCredentialInput: Sendable {
    public var serviceAccountJSON: [UInt8]
    public var projectID: String
    public var clientEmail: String
    public var privateKeyID: String?
    public var tokenURI: String
    public var endpoint: String?

    public init(
        serviceAccountJSON: [UInt8], projectID: String, clientEmail: String, privateKeyID: String?, tokenURI: String,
        endpoint: String?
    ) {
        self.serviceAccountJSON = serviceAccountJSON
        self.projectID = projectID
        self.clientEmail = clientEmail
        self.privateKeyID = privateKeyID
        self.tokenURI = tokenURI
        self.endpoint = endpoint
    }
}

/// FCM credentials as shown back: metadata only.
public struct FCMCredentialInfo: Sendable, Equatable {
    public var projectID: String
    public var clientEmail: String
    public var privateKeyID: String?
    public var tokenURI: String
    public var endpoint: String?
    public var status: String
    public var statusReason: String?
    public var createdAt: Date
    public var updatedAt: Date
}

/// APNs and FCM credentials, sealed at rest under the master key.
public struct CredentialStore: Sendable {
    let database: TenantDatabase
    let keyRing: SealingKeyRing

    public init(database: TenantDatabase, keyRing: SealingKeyRing) {
        self.database = database
        self.keyRing = keyRing
    }

    /// Associated data that binds a sealed credential to its tenant and provider (`apns` or `fcm`).
    public static func context(_ tenant: UUID, _ provider: String) -> [UInt8] {
        Array("tenant:\(tenant.uuidString.lowercased()):\(provider)".utf8)
    }

    /// Stores (or replaces) the tenant's APNs credentials; a replaced credential starts out `ok` again.
    public func putAPNs(tenant: UUID, _ input: APNsCredentialInput) async throws -> APNsCredentialInfo {
        let sealed = try keyRing.seal(Array(input.privateKeyPEM.utf8), associatedData: Self.context(tenant, "apns"))
        return try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                INSERT INTO apns_credentials (tenant_id, team_id, key_id, bundle_id, environment, endpoint,
                                              management_endpoint, sealed_private_key)
                VALUES (\(tenant), \(input.teamID), \(input.keyID), \(input.bundleID), \(input.environment),
                        \(input.endpoint), \(input.managementEndpoint), \(sealed))
                ON CONFLICT (tenant_id) DO UPDATE SET
                    team_id = EXCLUDED.team_id, key_id = EXCLUDED.key_id, bundle_id = EXCLUDED.bundle_id,
                    environment = EXCLUDED.environment, endpoint = EXCLUDED.endpoint,
                    management_endpoint = EXCLUDED.management_endpoint,
                    sealed_private_key = EXCLUDED.sealed_private_key, status = 'ok', status_reason = NULL
                RETURNING \(unsafeRaw: Self.apnsColumns)
                """)
            return try Self.apnsInfo(rows[0])
        }
    }

    public func getAPNs(tenant: UUID) async throws -> APNsCredentialInfo {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                "SELECT \(unsafeRaw: Self.apnsColumns) FROM apns_credentials WHERE tenant_id = \(tenant)")
            guard let row = rows.first else { throw NotFound("apns_credentials") }
            return try Self.apnsInfo(row)
        }
    }

    public func deleteAPNs(tenant: UUID) async throws {
        let deleted = try await database.tenantTransaction(tenant) { connection in
            try connection.execute("DELETE FROM apns_credentials WHERE tenant_id = \(tenant)")
        }
        if deleted == 0 { throw NotFound("apns_credentials") }
    }

    /// The tenant's APNs private key PEM, unsealed: for the delivery worker only.
    public func apnsPrivateKey(tenant: UUID) async throws -> String {
        let sealed = try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                "SELECT sealed_private_key FROM apns_credentials WHERE tenant_id = \(tenant)")
            guard let row = rows.first else { throw NotFound("apns_credentials") }
            return try row.decode([UInt8].self, "sealed_private_key")
        }
        return String(decoding: try keyRing.open(sealed, associatedData: Self.context(tenant, "apns")), as: UTF8.self)
    }

    /// The tenant's APNs credential with its sealed key, or nil without one: for channel management in the API.
    public func apnsCredential(tenant: UUID) async throws -> (APNsCredentialInfo, sealed: [UInt8])? {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                SELECT \(unsafeRaw: Self.apnsColumns), sealed_private_key FROM apns_credentials
                WHERE tenant_id = \(tenant)
                """)
            guard let row = rows.first else { return nil }
            return (try Self.apnsInfo(row), try row.decode([UInt8].self, "sealed_private_key"))
        }
    }

    /// Stores (or replaces) the tenant's FCM service account.
    public func putFCM(tenant: UUID, _ input: FCMCredentialInput) async throws -> FCMCredentialInfo {
        let sealed = try keyRing.seal(input.serviceAccountJSON, associatedData: Self.context(tenant, "fcm"))
        return try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                """
                INSERT INTO fcm_credentials (tenant_id, project_id, client_email, private_key_id, token_uri, endpoint,
                                             sealed_service_account)
                VALUES (\(tenant), \(input.projectID), \(input.clientEmail), \(input.privateKeyID), \(input.tokenURI),
                        \(input.endpoint), \(sealed))
                ON CONFLICT (tenant_id) DO UPDATE SET
                    project_id = EXCLUDED.project_id, client_email = EXCLUDED.client_email,
                    private_key_id = EXCLUDED.private_key_id, token_uri = EXCLUDED.token_uri,
                    endpoint = EXCLUDED.endpoint, sealed_service_account = EXCLUDED.sealed_service_account,
                    status = 'ok', status_reason = NULL
                RETURNING \(unsafeRaw: Self.fcmColumns)
                """)
            return try Self.fcmInfo(rows[0])
        }
    }

    public func getFCM(tenant: UUID) async throws -> FCMCredentialInfo {
        try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                "SELECT \(unsafeRaw: Self.fcmColumns) FROM fcm_credentials WHERE tenant_id = \(tenant)")
            guard let row = rows.first else { throw NotFound("fcm_credentials") }
            return try Self.fcmInfo(row)
        }
    }

    public func deleteFCM(tenant: UUID) async throws {
        let deleted = try await database.tenantTransaction(tenant) { connection in
            try connection.execute("DELETE FROM fcm_credentials WHERE tenant_id = \(tenant)")
        }
        if deleted == 0 { throw NotFound("fcm_credentials") }
    }

    /// The tenant's service-account JSON, unsealed: for the delivery worker only.
    public func fcmServiceAccount(tenant: UUID) async throws -> [UInt8] {
        let sealed = try await database.tenantTransaction(tenant) { connection in
            let rows = try connection.query(
                "SELECT sealed_service_account FROM fcm_credentials WHERE tenant_id = \(tenant)")
            guard let row = rows.first else { throw NotFound("fcm_credentials") }
            return try row.decode([UInt8].self, "sealed_service_account")
        }
        return try keyRing.open(sealed, associatedData: Self.context(tenant, "fcm"))
    }

    static let apnsColumns =
        "team_id, key_id, bundle_id, environment, endpoint, management_endpoint, status, status_reason, created_at, updated_at"
    static let fcmColumns =
        "project_id, client_email, private_key_id, token_uri, endpoint, status, status_reason, created_at, updated_at"

    static func apnsInfo(_ row: PostgresRow) throws -> APNsCredentialInfo {
        APNsCredentialInfo(
            teamID: try row.decode(String.self, "team_id"), keyID: try row.decode(String.self, "key_id"),
            bundleID: try row.decode(String.self, "bundle_id"), environment: try row.decode(String.self, "environment"),
            endpoint: try row.decode(String?.self, "endpoint"),
            managementEndpoint: try row.decode(String?.self, "management_endpoint"),
            status: try row.decode(String.self, "status"), statusReason: try row.decode(String?.self, "status_reason"),
            createdAt: try row.decode(Date.self, "created_at"), updatedAt: try row.decode(Date.self, "updated_at"))
    }

    static func fcmInfo(_ row: PostgresRow) throws -> FCMCredentialInfo {
        FCMCredentialInfo(
            projectID: try row.decode(String.self, "project_id"),
            clientEmail: try row.decode(String.self, "client_email"),
            privateKeyID: try row.decode(String?.self, "private_key_id"),
            tokenURI: try row.decode(String.self, "token_uri"), endpoint: try row.decode(String?.self, "endpoint"),
            status: try row.decode(String.self, "status"), statusReason: try row.decode(String?.self, "status_reason"),
            createdAt: try row.decode(Date.self, "created_at"), updatedAt: try row.decode(Date.self, "updated_at"))
    }
}
