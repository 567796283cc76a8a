import Foundation
import MarqueeCore
import MarqueeStore

/// JSON shapes of API responses, in one place so that every endpoint shows a resource the same way.
public enum Render {
    public static func tenant(_ t: Tenant) -> JSONValue {
        .object([
            "id": .string(t.id.uuidString.lowercased()), "name": .string(t.name), "created_at": .from(t.createdAt),
        ])
    }

    /// A new tenant with its keys, as `POST /admin/v1/tenants` and `marquee tenant create --json` print it.
    public static func createdTenant(_ c: CreatedTenant) -> JSONValue {
        .object([
            "id": .string(c.tenant.id.uuidString.lowercased()), "name": .string(c.tenant.name),
            "created_at": .from(c.tenant.createdAt),
            "keys": .object(["app": .string(c.appKey.text), "sdk": .string(c.sdkKey.text)]),
        ])
    }

    public static func key(_ k: APIKeyRecord) -> JSONValue {
        .object([
            "id": .string(k.id.uuidString.lowercased()), "kind": .string(k.kind.rawValue), "hint": .string(k.hint),
            "created_at": .from(k.createdAt), "revoked_at": .from(k.revokedAt), "last_used_at": .from(k.lastUsedAt),
        ])
    }

    /// A key just issued: the only time its text is shown.
    public static func issuedKey(_ k: IssuedKey) -> JSONValue {
        guard case .object(var o) = key(k.record) else { return .null }
        o["key"] = .string(k.text)
        return .object(o)
    }

    static func apns(_ c: APNsCredentialInfo) -> JSONValue {
        .object([
            "team_id": .string(c.teamID), "key_id": .string(c.keyID), "bundle_id": .string(c.bundleID),
            "environment": .string(c.environment), "endpoint": .from(c.endpoint),
            "management_endpoint": .from(c.managementEndpoint), "status": .string(c.status),
            "status_reason": .from(c.statusReason), "created_at": .from(c.createdAt), "updated_at": .from(c.updatedAt),
        ])
    }

    static func fcm(_ c: FCMCredentialInfo) -> JSONValue {
        .object([
            "project_id": .string(c.projectID), "client_email": .string(c.clientEmail),
            "private_key_id": .from(c.privateKeyID), "token_uri": .string(c.tokenURI), "endpoint": .from(c.endpoint),
            "status": .string(c.status), "status_reason": .from(c.statusReason), "created_at": .from(c.createdAt),
            "updated_at": .from(c.updatedAt),
        ])
    }

    static func activityType(_ t: ActivityType) -> JSONValue {
        .object([
            "identifier": .string(t.identifier), "attributes_type": .string(t.attributesType),
            "content_state_schema": t.contentStateSchema ?? .null,
            "date_fields": .object(t.dateFields.mapValues { .string($0.rawValue) }),
            "payload_profile": .string(t.payloadProfile.rawValue), "frequent_updates": .bool(t.frequentUpdates),
            "min_update_interval_ms": .int(Int64(t.minUpdateIntervalMilliseconds)),
            "auto_created": .bool(t.autoCreated),
            "created_at": .from(t.createdAt), "updated_at": .from(t.updatedAt),
        ])
    }

    static func person(_ p: Person) -> JSONValue {
        .object([
            "id": .string(p.id), "email": .from(p.email), "attributes": p.attributes, "created_at": .from(p.createdAt),
            "updated_at": .from(p.updatedAt),
        ])
    }

    /// A device; its token is masked, as push tokens are never shown whole. With `tokens`, `tokensTotal` says how many
    /// the device has in all.
    static func device(_ d: Device, tokens: [TokenInfo]? = nil, tokensTotal: Int = 0) -> JSONValue {
        var o: [String: JSONValue] = [
            "token": .string(maskToken(d.token)), "platform": .string(d.platform.rawValue), "app_id": .from(d.appID),
            "os_version": .from(d.osVersion), "app_version": .from(d.appVersion), "attributes": d.attributes,
            "created_at": .from(d.createdAt), "updated_at": .from(d.updatedAt),
        ]
        if let tokens {
            o["tokens_total"] = .int(Int64(tokensTotal))
            o["tokens"] = .array(
                tokens.map { t in
                    var token: [String: JSONValue] = [
                        "kind": .string(t.kind.rawValue), "token": .string(t.masked), "status": .string(t.status),
                        "updated_at": .from(t.updatedAt),
                    ]
                    token[t.kind == .pushToStart ? "activity_type" : "instance_id"] = .string(t.scope)
                    return .object(token)
                })
        }
        return .object(o)
    }

    /// What an sdk key is told of a device it registered: what it sent (the token masked), nothing stored.
    static func deviceWritten(_ d: Device) -> JSONValue {
        .object(["token": .string(maskToken(d.token)), "platform": .string(d.platform.rawValue)])
    }

    static func personDetail(_ p: PersonDetail) -> JSONValue {
        guard case .object(var o) = person(p.person) else { return .null }
        o["devices"] = .array(p.devices.map { device($0.device, tokens: $0.tokens, tokensTotal: $0.tokensTotal) })
        return .object(o)
    }
}
