/// The key names and shapes each device library decodes, in one place.
///
/// - `marquee` (Marquee's own SDK): content state carries `marqueeMetadata {deliveryId, deliveryToken, deepLink?}`;
///   attributes carry `marqueeInstanceId`.
/// - `customerio` (Customer.io's Live Activities SDK, seed 004). iOS: content state carries
///   `cioMetadata {deliveryId, deliveryToken, deepLink?}` — the SDK's `CIOLiveActivityMetadata`, whose three
///   members are all optional strings, so `deepLink` is omitted when there is none; attributes carry
///   `cioInstanceId` (the `CIOActivityAttribute` property Customer.io fills in for push-to-start). Its dates are
///   `EpochSecondsDate` (an `Int64`), which is why `epoch_seconds` date fields are always whole numbers. Android: see
///   ``FCMData``.
/// - `capacitor` (the Capacitor plugin, seed 000): its `LiveActivityAttributes` and `ContentState` use the
///   compiler-generated `Codable`, so every non-optional property must be present. Attributes are
///   `{activityType, staticData: {…}}`: the instance ID goes in `activityType` (documented as the identifier you
///   assign to correlate updates), every field of the team's attributes (its own `activityType` too) under `staticData`. Content state is
///   `{title, subtitle?, progress?, icon?, timerStart?, timerEnd?, timerCountsDown?, <colours>?, progressBarHeight?,
///   progressBarRadius?, extras: {…}}`: the plugin's own
///   fields stay at the top level (``capacitorStateKeys``), everything else — Marquee's `marqueeDeliveryId`,
///   `marqueeDeliveryToken` and `marqueeDeepLink` included — goes under `extras`.
extension PayloadProfile {
    /// Content-state keys Marquee writes for this profile; a team's own field of the same name is overwritten.
    public var reservedContentStateKeys: Set<String> {
        switch self {
        case .marquee: ["marqueeMetadata"]
        case .customerio: ["cioMetadata"]
        case .capacitor: ["extras", "marqueeDeliveryId", "marqueeDeliveryToken", "marqueeDeepLink"]
        }
    }

    /// The attributes key that carries the instance ID for this profile.
    public var instanceIDAttributeKey: String {
        switch self {
        case .marquee: "marqueeInstanceId"
        case .customerio: "cioInstanceId"
        case .capacitor: "activityType"
        }
    }

    /// The Capacitor plugin's own `ContentState` properties and the JSON type each decodes from: `title` (required),
    /// `progress`, `progressBarHeight` and `progressBarRadius` Doubles, `timerStart`/`timerEnd` a `Date` (Apple
    /// reference-date seconds with the default decoder, so declare them as `apple_reference` date fields),
    /// `timerCountsDown` a Bool, the rest optional strings. Any other field goes in `extras`.
    public static let capacitorStateKeys: [String: CapacitorFieldType] = [
        "title": .string, "subtitle": .string, "progress": .number, "icon": .string,
        "timerStart": .number, "timerEnd": .number, "timerCountsDown": .bool,
        "backgroundColor": .string, "progressColor": .string, "textColor": .string, "iconColor": .string,
        "keylineTint": .string, "progressBarHeight": .number, "progressBarRadius": .number,
    ]

    /// What a top-level Capacitor content-state property decodes from.
    public enum CapacitorFieldType: Sendable {
        case string
        case number
        case bool

        /// How an error names the type.
        var name: String {
            switch self {
            case .string: "a string"
            case .number: "a number"
            case .bool: "true or false"
            }
        }
    }

    /// Whether an alert without an explicit sound gets `"sound": "default"` on APNs.
    ///
    /// `marquee` and `customerio`: yes. Both leave alerts to the system, and an ActivityKit alert raised on the device
    /// plays the default sound unless told otherwise, so a pushed alert behaves like a local one. `capacitor`: no. Its
    /// API has no sound option (only `alertTitle`/`alertBody`) and its documented APNs alert is `{title, body}`, so a
    /// team moving from its own server to Marquee gets the same silent-unless-asked alerts.
    public var alertSoundDefaultsOn: Bool {
        switch self {
        case .marquee, .customerio: true
        case .capacitor: false
        }
    }

    /// Refuses a content state the profile's device code could not decode. Only `capacitor` has typed top-level
    /// fields: `title` must be a string, and each plugin field present must have the type its `ContentState` declares
    /// (a wrong type makes the whole state undecodable, so the push would arrive and do nothing). It is also the only
    /// profile whose FCM data map carries the team's field names as keys, so a field FCM reserves
    /// (``FCMData/isReservedKey(_:)``) is refused: FCM would refuse every push of the instance, its end too.
    ///
    /// - Parameter field: prefix for error fields (`content_state` → `content_state/title`).
    public func checkContentState(_ state: JSONValue, field: String = "content_state") throws(ValidationError) {
        if self == .marquee {
            _ = try ProgressConvention.parse(state, field: field)
            return
        }
        guard self == .capacitor else { return }
        let fields = state.objectValue ?? [:]
        guard fields["title"]?.stringValue != nil else {
            throw ValidationError(
                .missingField, field: field + "/title",
                reason: "must be a string: the Capacitor plugin's ContentState requires a title")
        }
        // A null field is left out of the data map (``FCMData/flatString(_:)``), so only the others count.
        if let key = fields.keys.sorted().first(where: { FCMData.isReservedKey($0) && fields[$0] != .null }) {
            throw ValidationError(
                field: field + JSONPointer(tokens: [key]).description,
                reason:
                    "is a name FCM reserves (from, message_type, collapse_key, google…, gcm…, or empty): the Capacitor profile sends each field as a data key, which FCM would refuse"
            )
        }
        for key in Self.capacitorStateKeys.keys.sorted() {
            guard let value = fields[key], value != .null else { continue }
            let type = Self.capacitorStateKeys[key]!
            let ok =
                switch type {
                case .string: value.stringValue != nil
                case .number: value.doubleValue != nil
                case .bool: value.boolValue != nil
                }
            if !ok {
                throw ValidationError(
                    field: field + JSONPointer(tokens: [key]).description,
                    reason: "must be \(type.name): the Capacitor plugin's ContentState declares it so")
            }
        }
    }

    /// The content state as sent to the device in an APNs payload: the team's fields plus this profile's
    /// attribution fields, shaped as the profile's `ContentState` decodes.
    func deviceContentState(_ state: JSONValue, deepLink: String?, attribution: DeliveryAttribution) -> JSONValue {
        var fields = state.objectValue ?? [:]
        switch self {
        case .marquee, .customerio:
            var metadata: [String: JSONValue] = [
                "deliveryId": .string(attribution.deliveryID),
                "deliveryToken": .string(attribution.deliveryToken),
            ]
            if let deepLink { metadata["deepLink"] = .string(deepLink) }
            fields[self == .marquee ? "marqueeMetadata" : "cioMetadata"] = .object(metadata)
            return .object(fields)
        case .capacitor:
            fields = capacitorFlatState(state, deepLink: deepLink, attribution: attribution)
            var top: [String: JSONValue] = [:]
            var extras: [String: JSONValue] = [:]
            for (key, value) in fields {
                if Self.capacitorStateKeys[key] != nil {
                    // An optional property sent as null decodes as absent; leave it out.
                    if value != .null { top[key] = value }
                } else {
                    extras[key] = value
                }
            }
            top["extras"] = .object(extras)
            return .object(top)
        }
    }

    /// The Capacitor content state before nesting: the team's fields with the flat attribution fields, as its
    /// Android side (FCM data) carries them.
    func capacitorFlatState(_ state: JSONValue, deepLink: String?, attribution: DeliveryAttribution) -> [String:
        JSONValue]
    {
        var fields = state.objectValue ?? [:]
        fields["extras"] = nil
        fields["marqueeDeliveryId"] = .string(attribution.deliveryID)
        fields["marqueeDeliveryToken"] = .string(attribution.deliveryToken)
        fields["marqueeDeepLink"] = deepLink.map(JSONValue.string)
        return fields
    }

    /// The attributes as sent to the device in an APNs start: the team's fields plus the instance ID under this
    /// profile's key (`capacitor`: the team's fields under `staticData`).
    func deviceAttributes(_ attributes: JSONValue, instanceID: String) -> JSONValue {
        let fields = attributes.objectValue ?? [:]
        if self == .capacitor {
            return .object([instanceIDAttributeKey: .string(instanceID), "staticData": .object(fields)])
        }
        var result = fields
        result[instanceIDAttributeKey] = .string(instanceID)
        return .object(result)
    }
}
