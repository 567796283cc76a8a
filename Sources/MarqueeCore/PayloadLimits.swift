/// A payload too large for its push service. The API renders it as 413, saying on which platform and by how much.
public struct PayloadSizeError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Where the payload would have gone: `ios` (APNs) or `android` (FCM).
    public var platform: Platform
    /// The payload's size in bytes (APNs: the JSON body; FCM: keys and values of the data map).
    public var size: Int
    /// The service's limit in bytes.
    public var limit: Int

    /// How many bytes must go.
    public var overBy: Int { size - limit }

    public init(platform: Platform, size: Int, limit: Int) {
        self.platform = platform
        self.size = size
        self.limit = limit
    }

    /// Sizes only; never the payload.
    public var description: String {
        let service = platform == .ios ? "APNs payload" : "FCM data"
        return "\(service) is \(size) bytes, \(overBy) over the \(limit)-byte limit"
    }
}

/// Request-time size checks: the payload is composed with the largest possible attribution
/// (``DeliveryAttribution/worstCase``), so a request accepted here cannot fail for size at APNs or FCM later.
public enum PayloadLimits {
    /// Checks the APNs payload against ``APNsPayload/maximumSize``.
    public static func checkAPNs(_ content: ActivityContent, attribution: DeliveryAttribution = .worstCase)
        throws(PayloadSizeError)
    {
        let size = APNsPayload.size(content, attribution: attribution)
        if size > APNsPayload.maximumSize {
            throw PayloadSizeError(platform: .ios, size: size, limit: APNsPayload.maximumSize)
        }
    }

    /// Checks the FCM data map against ``FCMData/maximumSize``.
    public static func checkFCM(_ content: ActivityContent, attribution: DeliveryAttribution = .worstCase)
        throws(PayloadSizeError)
    {
        let size = FCMData.size(FCMData.compose(content, attribution: attribution))
        if size > FCMData.maximumSize {
            throw PayloadSizeError(platform: .android, size: size, limit: FCMData.maximumSize)
        }
    }

    /// Checks the payload for one platform.
    public static func check(
        _ content: ActivityContent, platform: Platform, attribution: DeliveryAttribution = .worstCase
    ) throws(PayloadSizeError) {
        switch platform {
        case .ios: try checkAPNs(content, attribution: attribution)
        case .android: try checkFCM(content, attribution: attribution)
        }
    }
}
