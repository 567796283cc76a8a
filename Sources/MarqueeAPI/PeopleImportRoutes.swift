import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore

/// `POST /v1/people/import` (app key): up to 100,000 people in one NDJSON body, one person per line:
/// `{"id", "email"?, "attributes"?, "devices"?: [{"token", "platform", "push_to_start"?: {"<type>": "<token>"}}]}`.
///
/// Each line is checked on its own; a bad line is reported in `rejected` with its number, field and reason, and the
/// others are imported. Everything accepted is written in one transaction (COPY into staging tables, then one
/// merge per table), so a failure imports nothing.
struct PeopleImportRoutes: Sendable {
    let authenticator: Authenticator
    let store: PeopleImportStore

    static let maxLines = 100_000
    static let maxLineBytes = 64 * 1024
    /// A sanity bound on one line: the most devices a tenant's `max_devices_per_person` may keep. The tenant's own cap
    /// is applied as a registration applies it, by its one home (`marquee_keep_recent_devices`, migration 0081).
    static let maxDevicesPerLine = Int(SettingsRoutes.devicesPerPerson.upperBound)
    /// 100,000 lines of about 600 bytes.
    static let maxBodyBytes = 64 << 20

    func register(in router: inout Router) {
        router.add(
            .POST, "/v1/people/import",
            body: .ndjson(maxSize: Self.maxBodyBytes, admission: authenticator.appAdmission()),
            authenticator.app(importPeople))
    }

    func importPeople(_ request: HTTPRequest, _ principal: Principal) async throws -> HTTPResponse {
        let idempotencyKey = try LifecycleRoutes.idempotencyKey(request)
        let requestHash = LifecycleRoutes.requestHash(request)
        // Seconds of CPU for 100,000 lines: off the few cooperative threads that every
        // other request of this process needs to make progress (held here, they starve, and requests holding
        // database connections stall with them until other requests' pool waits time out). Not on
        // `DispatchQueue.global()` either: on Linux Swift's tasks run on that same pool of one thread per core, so two
        // imports parsing at once stopped a whole test server for 4–8 s. A serial queue of its own runs on Dispatch's
        // overcommitting threads, which are added as needed.
        let body = request.body
        let (people, refused) = try await withCheckedThrowingContinuation {
            (continuation: CheckedContinuation<([ImportPerson], [ImportRejection]), any Error>) in
            DispatchQueue(label: "marquee.people-import.parse").async {
                continuation.resume(with: Result { try Self.parse(body) })
            }
        }
        let result = try await store.importPeople(
            tenant: principal.tenantID, people, idempotencyKey: idempotencyKey, requestHash: requestHash
        ) { outcome in
            let rejected = (refused + outcome.rejected).sorted { $0.line < $1.line }
            return .object([
                "imported": .int(Int64(outcome.imported)), "updated": .int(Int64(outcome.updated)),
                "rejected": .array(
                    rejected.map {
                        .object([
                            "line": .int(Int64($0.line)), "field": .string($0.field), "reason": .string($0.reason),
                        ])
                    }),
            ])
        }
        switch result {
        case .replay(let stored): return try LifecycleRoutes.replay(stored, hash: requestHash)
        case .done(_, let response): return .json(response)
        }
    }

    /// The people of an NDJSON body, and the lines refused. Lines are found in place, one after the other (a body of
    /// newlines alone is no array of millions of empty lines), and each counts against `maxLines`, blank or not: the
    /// body is refused at the first line past it. Blank lines are skipped; an ID or device token that repeats an
    /// earlier line's is refused (the earlier line wins). IDs repeat when their bytes do
    /// (``Identifiers/personKey(_:)``). Emails are compared by the database, as its unique index compares them
    /// (``PeopleImportStore``): Swift's comparison of strings is another one.
    static func parse(_ body: [UInt8]) throws(ValidationError) -> ([ImportPerson], [ImportRejection]) {
        var people: [ImportPerson] = []
        var rejected: [ImportRejection] = []
        var ids: [[UInt8]: Int] = [:]
        var tokens: [String: Int] = [:]
        var number = 0
        var next = body.startIndex
        // A final newline ends the last line; it starts none.
        while next < body.endIndex {
            let end = body[next...].firstIndex(of: 0x0A) ?? body.endIndex
            var line = body[next..<end]
            next = end + 1
            number += 1
            guard number <= maxLines else {
                throw ValidationError(
                    field: "body",
                    reason: "has more than \(maxLines) lines (blank ones count): split the import into several requests"
                )
            }
            while let last = line.last, last == 0x0D || last == 0x20 || last == 0x09 { line = line.dropLast() }
            if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
            do throws(ValidationError) {
                let person = try Self.person(line, line: number)
                let id = Identifiers.personKey(person.id)
                if let first = ids[id] {
                    throw ValidationError(field: "id", reason: "repeats line \(first)")
                }
                var own: [String: Int] = [:]
                for (index, device) in person.devices.enumerated() {
                    if let first = tokens[device.token] {
                        throw ValidationError(field: "devices[\(index)].token", reason: "repeats line \(first)")
                    }
                    // Within the line too (tokens are compared as stored: an APNs token in another case is the same).
                    if let earlier = own.updateValue(index, forKey: device.token) {
                        throw ValidationError(field: "devices[\(index)].token", reason: "repeats devices[\(earlier)]")
                    }
                }
                ids[id] = number
                for device in person.devices { tokens[device.token] = number }
                people.append(person)
            } catch {
                rejected.append(ImportRejection(line: number, field: error.field, reason: error.reason))
            }
        }
        return (people, rejected)
    }

    static func person(_ bytes: ArraySlice<UInt8>, line: Int) throws(ValidationError) -> ImportPerson {
        guard bytes.count <= maxLineBytes else {
            throw ValidationError(field: "line", reason: "is longer than \(maxLineBytes) bytes")
        }
        let value: JSONValue
        do {
            value = try JSONValue.parse(bytes)
        } catch {
            throw ValidationError(field: "line", reason: "is not valid JSON: \(error.reason) at byte \(error.offset)")
        }
        guard let object = value.objectValue else {
            throw ValidationError(field: "line", reason: "must be a JSON object, not \(value.typeName)")
        }
        if let field = JSONBody.nulField(in: value) {
            throw ValidationError(field: field, reason: JSONBody.nulReason)
        }
        if let unknown = object.keys.sorted().first(where: { !["id", "email", "attributes", "devices"].contains($0) }) {
            throw ValidationError(field: unknown, reason: "is not a field of an imported person")
        }
        guard let id = object["id"]?.stringValue else {
            throw object["id"] == nil
                ? ValidationError.missing("id") : ValidationError(field: "id", reason: "must be a string")
        }
        let personID = try Identifiers.personID(id, field: "id")
        var email: String?
        switch object["email"] {
        case nil, .null?: break
        case .string(let text)?:
            email = try RegistryRoutes.email(text)
        default: throw ValidationError(field: "email", reason: "must be a string")
        }
        var attributes: [UInt8]?
        switch object["attributes"] {
        case nil, .null?: break
        case .object?: attributes = try RegistryRoutes.serializedAttributes(object["attributes"], field: "attributes")
        default: throw ValidationError(field: "attributes", reason: "must be an object")
        }
        var devices: [ImportPerson.Device] = []
        switch object["devices"] {
        case nil, .null?: break
        case .array(let items)?:
            guard items.count <= maxDevicesPerLine else {
                throw ValidationError(field: "devices", reason: "must hold at most \(maxDevicesPerLine) devices")
            }
            for (index, item) in items.enumerated() {
                devices.append(try device(item, field: "devices[\(index)]"))
            }
        default: throw ValidationError(field: "devices", reason: "must be an array")
        }
        return ImportPerson(line: line, id: personID, email: email, attributes: attributes, devices: devices)
    }

    static func device(_ value: JSONValue, field: String) throws(ValidationError) -> ImportPerson.Device {
        guard let object = value.objectValue else { throw ValidationError(field: field, reason: "must be an object") }
        if let unknown = object.keys.sorted().first(where: { !["token", "platform", "push_to_start"].contains($0) }) {
            throw ValidationError(field: field + "." + unknown, reason: "is not a field of an imported device")
        }
        guard let platform = object["platform"]?.stringValue.flatMap(Platform.init(rawValue:)) else {
            throw ValidationError(field: field + ".platform", reason: "must be ios or android")
        }
        guard let token = object["token"]?.stringValue else { throw ValidationError.missing(field + ".token") }
        let deviceToken = try Identifiers.deviceToken(token, platform: platform, field: field + ".token")
        var pushToStart: [String: String] = [:]
        if let tokens = object["push_to_start"], tokens != .null {
            guard platform == .ios else {
                throw ValidationError(
                    field: field + ".push_to_start", reason: "push-to-start tokens exist only for iOS devices")
            }
            guard let map = tokens.objectValue, map.count <= 20 else {
                throw ValidationError(
                    field: field + ".push_to_start", reason: "must be an object of at most 20 activity type: token")
            }
            for (type, value) in map {
                let path = field + ".push_to_start." + type
                let activityType = try Identifiers.activityType(type, field: path)
                guard let text = value.stringValue else {
                    throw ValidationError(field: path, reason: "must be a token")
                }
                pushToStart[activityType] = try Identifiers.apnsToken(text, field: path)
            }
        }
        return ImportPerson.Device(token: deviceToken, platform: platform, pushToStart: pushToStart)
    }
}
