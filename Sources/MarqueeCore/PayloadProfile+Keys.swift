/// The key names each device library reads, in one place.
///
/// - `marquee` (Marquee's own SDK): content state carries `marqueeMetadata {deliveryId, deliveryToken, deepLink?}`;
///   attributes carry `marqueeInstanceId`.
/// - `customerio` (Customer.io's Live Activities SDK, seed 004): content state carries
///   `cioMetadata {deliveryId, deliveryToken, deepLink?}` — the SDK's `CIOLiveActivityMetadata`, whose three
///   members are all optional strings, so `deepLink` is omitted when there is none; attributes carry
///   `cioInstanceId` (the `CIOActivityAttribute` property Customer.io fills in for push-to-start).
/// - `capacitor` (the Capacitor plugin, seed 000): its `LiveActivityState` is flat and passes unknown fields through
///   in an extras dictionary, so attribution travels as flat string fields `marqueeDeliveryId`,
///   `marqueeDeliveryToken` and `marqueeDeepLink`; its `LiveActivityAttributes` has a single field, `activityType`,
///   documented as the identifier you assign to correlate updates, which is where the instance ID goes.
extension PayloadProfile {
    /// Content-state keys Marquee writes for this profile; a team's own field of the same name is overwritten.
    public var reservedContentStateKeys: Set<String> {
        switch self {
        case .marquee: ["marqueeMetadata"]
        case .customerio: ["cioMetadata"]
        case .capacitor: ["marqueeDeliveryId", "marqueeDeliveryToken", "marqueeDeepLink"]
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

    /// The content state as sent to the device: the team's fields plus this profile's attribution fields.
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
        case .capacitor:
            fields["marqueeDeliveryId"] = .string(attribution.deliveryID)
            fields["marqueeDeliveryToken"] = .string(attribution.deliveryToken)
            if let deepLink { fields["marqueeDeepLink"] = .string(deepLink) } else { fields["marqueeDeepLink"] = nil }
        }
        return .object(fields)
    }

    /// The attributes as sent to the device: the team's fields plus the instance ID under this profile's key.
    func deviceAttributes(_ attributes: JSONValue, instanceID: String) -> JSONValue {
        var fields = attributes.objectValue ?? [:]
        fields[instanceIDAttributeKey] = .string(instanceID)
        return .object(fields)
    }
}
