import Foundation

/// The FCM data map for one event: every value a string, as FCM requires.
///
/// Android has no system-rendered live activity: FCM wakes the app, and its code (or the SDK) posts the Live Update.
/// So unlike APNs, every push carries what a renderer needs to draw from scratch (attributes included), and the
/// keys are the ones each profile's Android side reads:
///
/// - `marquee`: `instance_id`, `event`, `notification_type` (the activity type's identifier), `timestamp` (epoch
///   seconds), `content_state` and `attributes` (JSON texts), `delivery_id`, `delivery_token`; when present
///   `deep_link`, `stale_date` and `dismissal_date` (end only; epoch seconds), `alert_title` and `alert_body` (an
///   alert re-notifies on Android instead of updating silently).
/// - `customerio`: what Customer.io's Android SDK routes to its live-notification handler (its live-notifications
///   branches: `CustomerIOPushNotificationHandler.kt`, `LiveNotificationHandler.kt`, `LiveNotificationStore.kt`,
///   `DeliveryTrackingTemplate.kt`). `activity_id` (the instance ID; without it the push is shown as an ordinary
///   notification), `event`, `notification_type`, `timestamp` in epoch **milliseconds** (the SDK compares it with
///   the last value seen for the activity, and writes `System.currentTimeMillis()` there for local starts and
///   updates; seconds would be dropped as stale — strictly increasing per instance because Marquee's event seconds
///   are), `payload` — one JSON object holding the attributes and the content state together (state wins on a shared
///   key), with the activity type's date fields in epoch milliseconds as the built-in templates read them —,
///   `CIO-Delivery-ID` and `CIO-Delivery-Token` (both required, or the SDK ignores the push), `link` for the deep
///   link, `title` and `body` (the alert's, else the content state's `title`/`body` strings) for the app's
///   notification callback, and on `end` with a dismissal date `dismissal_date` in epoch milliseconds (without it
///   the SDK removes the notification at once).
/// - `capacitor` (seed 000): `liveActivityId` plus the content state's fields flattened to strings, as the plugin's
///   documented data message shows (`"progress": "0.95"`), including its flat attribution fields. Marquee adds
///   `event` and `timestamp` (epoch seconds): the app's `onMessageReceived` needs to tell an end from an update, and
///   FCM does not keep order. Envelope keys win over state fields of the same name. The plugin has no push receiver
///   on Android: the app maps `liveActivityId` to the plugin's own activity ID.
public enum FCMData {
    /// Largest data map FCM accepts, counting the UTF-8 bytes of keys and values.
    public static let maximumSize = 4096

    /// The data map.
    public static func compose(_ content: ActivityContent, attribution: DeliveryAttribution) -> [String: String] {
        var data: [String: String] = [:]
        switch content.profile {
        case .marquee:
            data["instance_id"] = content.instanceID
            data["notification_type"] = content.activityType
            data["content_state"] = content.contentState.serialized()
            data["attributes"] = content.attributes.serialized()
            data["delivery_id"] = attribution.deliveryID
            data["delivery_token"] = attribution.deliveryToken
            if let deepLink = content.deepLink { data["deep_link"] = deepLink }
            if let stale = content.staleDate { data["stale_date"] = String(epochSeconds(stale)) }
            // Android 16 ProgressStyle, one to one (checked at the API; a broken one is simply not mapped).
            if let progress = try? ProgressConvention.parse(content.contentState) {
                data.merge(progress.dataFields) { _, new in new }
            }
            if content.event == .end, let dismissal = content.dismissalDate {
                data["dismissal_date"] = String(epochSeconds(dismissal))
            }
            if let alert = content.alert {
                data["alert_title"] = alert.title
                data["alert_body"] = alert.body
            }
        case .customerio:
            var merged = content.attributes.objectValue ?? [:]
            for (key, value) in content.contentState.objectValue ?? [:] { merged[key] = value }
            data["activity_id"] = content.instanceID
            data["notification_type"] = content.activityType
            data["payload"] = inMilliseconds(.object(merged), dateFields: content.dateFields).serialized()
            data["CIO-Delivery-ID"] = attribution.deliveryID
            data["CIO-Delivery-Token"] = attribution.deliveryToken
            if let deepLink = content.deepLink { data["link"] = deepLink }
            let state = content.contentState
            if let title = content.alert?.title ?? state["title"]?.stringValue { data["title"] = title }
            if let body = content.alert?.body ?? state["body"]?.stringValue { data["body"] = body }
            if content.event == .end, let dismissal = content.dismissalDate {
                data["dismissal_date"] = String(epochMilliseconds(dismissal))
            }
        case .capacitor:
            let state = content.profile.capacitorFlatState(
                content.contentState, deepLink: content.deepLink, attribution: attribution)
            for (key, value) in state {
                if let text = flatString(value) { data[key] = text }
            }
            data["liveActivityId"] = content.instanceID
        }
        data["event"] = content.event.rawValue
        // Customer.io's Android SDK compares timestamps in milliseconds; ×1000 keeps Marquee's per-instance order.
        data["timestamp"] = String(content.profile == .customerio ? content.timestamp * 1000 : content.timestamp)
        return data
    }

    /// `object` with every date field present re-encoded as whole epoch milliseconds (a JSON integer). A value that
    /// is not a date in range (an attribute of the same name, never validated as a date) is left as it is.
    static func inMilliseconds(_ object: JSONValue, dateFields: [String: DateEncoding]) -> JSONValue {
        var result = object
        for (text, encoding) in dateFields {
            guard let pointer = JSONPointer(text), let value = result[pointer: pointer],
                let seconds = DateFields.decode(value, as: encoding), DateFields.acceptedRange.contains(seconds)
            else { continue }
            result.replace(at: pointer, with: .int(DateFields.epochMilliseconds(seconds)))
        }
        return result
    }

    /// A JSON value as one FCM data string: strings verbatim, numbers in shortest form, `true`/`false`, objects and
    /// arrays as compact JSON. nil for `null`, which a data map cannot carry (the field is left out, which a
    /// replace-the-whole-state renderer treats the same).
    public static func flatString(_ value: JSONValue) -> String? {
        switch value {
        case .null: nil
        case .string(let s): s
        default: value.serialized()
        }
    }

    /// Size as FCM counts it: UTF-8 bytes of every key and value.
    public static func size(_ data: [String: String]) -> Int {
        data.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count }
    }

    /// The map serialized with sorted keys (for logs, fixtures and comparison).
    public static func serialized(_ data: [String: String]) -> String {
        JSONValue.object(data.mapValues { .string($0) }).serialized()
    }

    /// Keys FCM refuses in a data map: `from`, `message_type`, `collapse_key`, the empty key, and anything starting
    /// with `google` or `gcm` (any case). The one home of that list: the content-state check of the `capacitor`
    /// profile (``PayloadProfile/checkContentState(_:field:)``, the only profile that puts the team's field names at
    /// the top level) and the FCM simulator both ask it.
    public static func isReservedKey(_ key: String) -> Bool {
        let lower = key.lowercased()
        return key.isEmpty || ["from", "message_type", "collapse_key"].contains(lower) || lower.hasPrefix("google")
            || lower.hasPrefix("gcm")
    }
}

/// The FCM HTTP v1 `messages:send` request body around a data map.
public enum FCMMessage {
    /// FCM's longest `ttl`: 28 days.
    public static let maximumTTLSeconds = 2_419_200

    /// How long FCM keeps a message for an offline device: until the instance's stale date or its expiry, whichever
    /// comes first (a Live Update shown after either is wrong), never negative, at most 28 days. An end is kept until
    /// the expiry even past the stale date: the notification must still go away.
    public static func ttlSeconds(event: LiveActivityEvent, staleDate: Date?, expiresAt: Date, now: Date) -> Int {
        var horizon = expiresAt
        if event != .end, let staleDate, staleDate < horizon { horizon = staleDate }
        let seconds = horizon.timeIntervalSince(now)
        guard seconds.isFinite, seconds > 0 else { return 0 }
        return Int(min(seconds.rounded(.down), Double(maximumTTLSeconds)))
    }

    /// The collapse key of an instance's messages: one per instance, so that a device that was offline gets only
    /// the latest state, not every update in between.
    public static func collapseKey(instanceID: String) -> String { instanceID }

    /// `{"message": {"token", "data", "android": {"priority": "high", "ttl": "<n>s", "collapse_key"?}}}`.
    ///
    /// High priority because a data message is what wakes the app to redraw the Live Update; normal-priority data
    /// messages may be held back in Doze. `ttlSeconds` is clamped at 0.
    public static func body(token: String, data: [String: String], ttlSeconds: Int, collapseKey: String? = nil)
        -> JSONValue
    {
        var android: [String: JSONValue] = [
            "priority": .string("high"),
            "ttl": .string("\(max(0, ttlSeconds))s"),
        ]
        if let collapseKey { android["collapse_key"] = .string(collapseKey) }
        return .object([
            "message": .object([
                "token": .string(token),
                "data": .object(data.mapValues { .string($0) }),
                "android": .object(android),
            ])
        ])
    }
}
