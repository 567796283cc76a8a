import Foundation

/// A campaign's attributes with `{"$person": "/pointer"}` nodes, each filled in from one person's attributes at start.
///
/// A node may give `"default"`, used when the person has no value there (or `null`); without one such a person gets no
/// instance (the campaign records them as skipped, `missing_attribute`). The filling itself runs in SQL for the whole
/// audience at once (`marquee_fill_person`, migrations 0049, 0062, 0089) from ``fillsJSON``; this type validates the template and
/// says what to fill where.
public struct PersonTemplate: Sendable, Equatable {
    public struct Fill: Sendable, Equatable {
        /// Where in the attributes the value goes (object keys, or array indices as text).
        public var at: [String]
        /// Where in the person's attributes it comes from.
        public var pointer: JSONPointer
        public var defaultValue: JSONValue?
    }

    /// The attributes as the client wrote them.
    public var attributes: JSONValue
    public var fills: [Fill]

    public static let maximumFills = 32

    /// Validates `attributes` (a JSON object); `field` names it in errors.
    public init(_ attributes: JSONValue, field: String = "attributes") throws(ValidationError) {
        self.attributes = attributes
        var fills: [Fill] = []
        try Self.collect(attributes, at: [], field: field, into: &fills)
        self.fills = fills
    }

    /// The fills as `marquee_fill_person` reads them: `[{"at": [...], "path": [...], "default": v?}]`. `path` is the
    /// pointer's tokens, each that names an array element (``JSONPointer/arrayIndex(_:)``) as a number (an element,
    /// or the member of that name) and any other as a string (a member only), so that SQL walks it as RFC 6901 does.
    public var fillsJSON: JSONValue {
        .array(
            fills.map { fill in
                var o: [String: JSONValue] = [
                    "at": .array(fill.at.map(JSONValue.string)),
                    "path": .array(
                        fill.pointer.tokens.map { token in
                            JSONPointer.arrayIndex(token).map { .int(Int64($0)) } ?? .string(token)
                        }),
                ]
                if let d = fill.defaultValue { o["default"] = d }
                return .object(o)
            })
    }

    /// The attributes with every node replaced by its default, or by an empty string: what the size check measures.
    /// A person's filled attributes may be larger by the headroom that check leaves, no more.
    public var sample: JSONValue {
        var result = attributes
        for fill in fills { result = Self.replacing(result, at: fill.at[...], with: fill.defaultValue ?? .string("")) }
        return result
    }

    private static func collect(_ value: JSONValue, at path: [String], field: String, into fills: inout [Fill])
        throws(ValidationError)
    {
        let location = field + JSONPointer(tokens: path).description
        switch value {
        case .object(let object):
            if let reference = object["$person"] {
                guard !path.isEmpty else {
                    throw ValidationError(
                        field: location, reason: "must be an object of attributes, not a $person node")
                }
                guard object.keys.allSatisfy({ $0 == "$person" || $0 == "default" }) else {
                    throw ValidationError(field: location, reason: "a $person node holds only $person and default")
                }
                guard let text = reference.stringValue, let pointer = JSONPointer(text), !pointer.tokens.isEmpty else {
                    throw ValidationError(
                        field: location + "/$person",
                        reason: "must be a JSON pointer into the person's attributes, such as /team/name")
                }
                fills.append(Fill(at: path, pointer: pointer, defaultValue: object["default"]))
                guard fills.count <= maximumFills else {
                    throw ValidationError(field: field, reason: "may hold at most \(maximumFills) $person nodes")
                }
                return
            }
            for key in object.keys.sorted() {
                try collect(object[key]!, at: path + [key], field: field, into: &fills)
            }
        case .array(let items):
            for (index, item) in items.enumerated() {
                try collect(item, at: path + [String(index)], field: field, into: &fills)
            }
        default:
            return
        }
    }

    private static func replacing(_ value: JSONValue, at path: ArraySlice<String>, with replacement: JSONValue)
        -> JSONValue
    {
        guard let key = path.first else { return replacement }
        switch value {
        case .object(var object):
            if let inner = object[key] { object[key] = replacing(inner, at: path.dropFirst(), with: replacement) }
            return .object(object)
        case .array(var items):
            if let index = JSONPointer.arrayIndex(key), items.indices.contains(index) {
                items[index] = replacing(items[index], at: path.dropFirst(), with: replacement)
            }
            return .array(items)
        default:
            return value
        }
    }
}

/// The state of a campaign as clients see it: stored states, and `ending` / `ended` derived from its instances.
public enum CampaignState: String, Sendable, CaseIterable {
    /// Its start is due later.
    case scheduled
    /// Its start is due, or running now.
    case starting
    /// Started, with instances still open.
    case active
    /// No instance is open any more, but ends are still being delivered.
    case ending
    /// Every instance ended or expired, and nothing is left to deliver.
    case ended
    /// Cancelled before it started.
    case cancelled
    /// Its start could not run (e.g. its segment was deleted).
    case failed
}

/// A campaign-wide change of the content state: a whole new state, or a merge patch applied to each instance's own.
public enum ContentChange: Sendable, Equatable {
    case replace(JSONValue)
    case patch(JSONValue)
    /// An end that keeps the state.
    case none

    /// The new content state of an instance whose state is `current` (device encoding), checked.
    public func apply(
        to current: JSONValue, schema: JSONValue?, dateFields: [String: DateEncoding], profile: PayloadProfile
    ) throws(ValidationError) -> JSONValue {
        switch self {
        case .none:
            return current
        case .replace(let state):
            return try ContentStateRules.checked(state, schema: schema, dateFields: dateFields, profile: profile)
        case .patch(let patch):
            let encoded = try DateFields.normalize(patch, fields: dateFields, field: "content_state_patch")
            return try ContentStateRules.validated(
                MergePatch.apply(encoded, to: current), schema: schema, profile: profile)
        }
    }
}

/// What a content state must satisfy: its activity type's date encodings, its schema, and its payload profile. The
/// one home of the check, for single changes (the API) and campaign-wide ones (the worker's scheduler).
public enum ContentStateRules {
    /// Date fields encoded as the activity type declares, then ``validated(_:schema:profile:)``.
    public static func checked(
        _ state: JSONValue, schema: JSONValue?, dateFields: [String: DateEncoding], profile: PayloadProfile
    ) throws(ValidationError) -> JSONValue {
        try validated(
            DateFields.normalize(state, fields: dateFields, field: "content_state"), schema: schema, profile: profile)
    }

    /// The schema check (it describes the state as devices receive it) and the payload profile's rules.
    public static func validated(_ state: JSONValue, schema: JSONValue?, profile: PayloadProfile)
        throws(ValidationError) -> JSONValue
    {
        if let schema, let compiled = try? ContentSchema(schema), let violation = compiled.firstViolation(in: state) {
            throw ValidationError(
                .schemaViolation, field: "content_state" + violation.pointer.description, reason: violation.reason)
        }
        try profile.checkContentState(state)
        return state
    }
}

extension PayloadLimits {
    /// How many bytes the payload could still grow on every platform in `platforms` and stay within the limits.
    public static func headroom(_ content: ActivityContent, platforms: [Platform]) -> Int {
        var room = Int.max
        for platform in platforms {
            switch platform {
            case .ios:
                room = min(room, APNsPayload.maximumSize - APNsPayload.size(content, attribution: .worstCase))
            case .android:
                room = min(
                    room, FCMData.maximumSize - FCMData.size(FCMData.compose(content, attribution: .worstCase)))
            }
        }
        return room
    }
}

/// How a campaign's pushes are measured against the size limits: composed with its template's ``PersonTemplate/sample``
/// grown by the headroom its creation left (what a person's filled attributes may add, no more), under the longest
/// instance ID the campaign can make, for the platforms it targets. The one home of that measure, for the campaign's
/// start (the API), a campaign-wide change the API sees whole, and each new state a change computes at run time (the
/// worker's scheduler): a change accepted by it cannot fail for size at APNs or FCM on any of the campaign's instances.
public struct CampaignSizing: Sendable, Equatable {
    public var campaignID: String
    /// The template's sample, with the headroom added as one padding member.
    public var attributes: JSONValue
    public var platforms: [Platform]

    /// `template` is the campaign's attributes with their `$person` nodes; `headroom` as creation stored it.
    public init(campaignID: String, template: JSONValue, headroom: Int, platform: Platform?) {
        self.campaignID = campaignID
        var sample = (try? PersonTemplate(template))?.sample.objectValue ?? template.objectValue ?? [:]
        if headroom > 0 {
            // Only where the attributes travel (APNs starts, FCM data of the marquee and customerio profiles) does
            // the padding count, as a person's larger values would.
            var key = "~"
            while sample[key] != nil { key += "~" }
            sample[key] = .string(String(repeating: "~", count: headroom))
        }
        attributes = .object(sample)
        platforms = LifecyclePlanner.startPlatforms(platform)
    }

    /// The longest instance ID of a campaign: `<campaign_id>.<person_id>` is at most 128 bytes.
    public static func longestInstanceID(_ campaignID: String) -> String {
        campaignID + "." + String(repeating: "x", count: max(0, 127 - campaignID.utf8.count))
    }

    /// The options an instance of the campaign has after a change: the campaign's sticky ones (`base`, stored form)
    /// without the per-push alert and dismissal, then the change's (a null clears one), as the change's write sets
    /// them.
    public static func options(_ base: JSONValue, changed: [String: JSONValue]) -> StoredOptions {
        var o = base.objectValue ?? [:]
        o["alert"] = nil
        o["dismissal_date"] = nil
        o.merge(changed) { _, new in new }
        return StoredOptions(json: .object(o))
    }

    /// Throws when the push of `operation` with `contentState` and `options` would not fit.
    public func check(
        _ contentState: JSONValue, options: StoredOptions, operation: LifecyclePlanner.Operation, type: ActivityType,
        now: Date
    ) throws(PayloadSizeError) {
        let content = DeliverySnapshot(
            attributes: attributes, contentState: contentState, options: options,
            timestamp: Int64(now.timeIntervalSince1970)
        ).content(
            event: operation == .end ? .end : .update, instanceID: Self.longestInstanceID(campaignID),
            activityType: type.identifier, attributesType: type.attributesType, profile: type.payloadProfile,
            dateFields: type.dateFields, now: now)
        try LifecyclePlanner.checkSize(content, platforms: platforms)
    }
}
