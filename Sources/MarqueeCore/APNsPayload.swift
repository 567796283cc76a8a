/// The APNs `liveactivity` payload for one event.
///
/// ```json
/// {"aps": {"timestamp": 1740000000, "event": "update", "content-state": {...},
///          "alert": {"title": "...", "body": "...", "sound": "default"},
///          "stale-date": 1740003600, "relevance-score": 0.5}}
/// ```
/// - `start` adds `attributes-type`, `attributes` (with the instance ID, see ``PayloadProfile``) and
///   `"input-push-token": 1`, so the new activity reports its update token, or, on a broadcast channel,
///   `"input-push-channel": "<channel ID>"`, so it subscribes to the channel.
/// - `end` adds `dismissal-date` when one is given.
/// - Dates are whole epoch seconds. Attribution rides inside `content-state`, because iOS never hands the raw push
///   to the app: the widget and SDK only ever see the decoded state.
public enum APNsPayload {
    /// Largest payload APNs accepts for a live activity push, in bytes.
    public static let maximumSize = 4096

    /// The payload as a JSON value.
    public static func compose(_ content: ActivityContent, attribution: DeliveryAttribution) -> JSONValue {
        var aps: [String: JSONValue] = [
            "timestamp": .int(content.timestamp),
            "event": .string(content.event.rawValue),
            "content-state": content.profile.deviceContentState(
                content.contentState, deepLink: content.deepLink, attribution: attribution),
        ]
        if content.event == .start {
            aps["attributes-type"] = .string(content.attributesType)
            aps["attributes"] = content.profile.deviceAttributes(content.attributes, instanceID: content.instanceID)
            if let channel = content.inputPushChannel {
                aps["input-push-channel"] = .string(channel)
            } else {
                aps["input-push-token"] = .int(1)
            }
        }
        if let alert = content.alert {
            var fields: [String: JSONValue] = ["title": .string(alert.title), "body": .string(alert.body)]
            if let sound = alert.sound {
                fields["sound"] = .string(sound)
            } else if content.profile.alertSoundDefaultsOn {
                fields["sound"] = .string("default")
            }
            aps["alert"] = .object(fields)
        }
        if let stale = content.staleDate { aps["stale-date"] = .int(epochSeconds(stale)) }
        if content.event == .end, let dismissal = content.dismissalDate {
            aps["dismissal-date"] = .int(epochSeconds(dismissal))
        }
        if let score = content.relevanceScore { aps["relevance-score"] = DateFields.number(score) }
        return .object(["aps": .object(aps)])
    }

    /// The payload bytes as sent (compact JSON, sorted keys).
    public static func bytes(_ content: ActivityContent, attribution: DeliveryAttribution) -> [UInt8] {
        compose(content, attribution: attribution).bytes
    }

    /// The payload size in bytes.
    public static func size(_ content: ActivityContent, attribution: DeliveryAttribution) -> Int {
        compose(content, attribution: attribution).serialized().utf8.count
    }
}
