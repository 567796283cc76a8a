import Foundation

// Plain Swift mirrors of the device libraries' `Codable` types, written from their field lists (no ActivityKit), so
// tests can decode what Marquee sends exactly as the app would. Each type names the client file it mirrors.

/// Decodes `bytes` the way ActivityKit decodes a pushed `attributes` / `content-state`: a default `JSONDecoder`
/// (dates as seconds since 2001-01-01, `deferredToDate`).
public func decodeLikeActivityKit<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
    try JSONDecoder().decode(type, from: Data(bytes))
}

/// Any JSON value, tried in the order the Capacitor plugin's `AnyCodable` tries (Bool, Int, Double, String, object,
/// array, else null), so it never fails.
public enum AnyJSON: Decodable, Equatable, Sendable {
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    case object([String: AnyJSON])
    case array([AnyJSON])
    case null

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if let v = try? c.decode(Bool.self) {
            self = .bool(v)
        } else if let v = try? c.decode(Int.self) {
            self = .int(v)
        } else if let v = try? c.decode(Double.self) {
            self = .double(v)
        } else if let v = try? c.decode(String.self) {
            self = .string(v)
        } else if let v = try? c.decode([String: AnyJSON].self) {
            self = .object(v)
        } else if let v = try? c.decode([AnyJSON].self) {
            self = .array(v)
        } else {
            self = .null
        }
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
}

/// `ciabosoftwaresolutions/capacitor-live-activities`, `ios/Plugin/LiveActivityManager.swift` (shared with the
/// widget extension): `LiveActivityAttributes` and its `ContentState`, compiler-generated `Codable`.
public enum Capacitor {
    public struct LiveActivityAttributes: Decodable, Sendable {
        public var activityType: String
        public var staticData: [String: AnyJSON]

        public struct ContentState: Decodable, Sendable {
            public var title: String
            public var subtitle: String?
            public var progress: Double?
            public var icon: String?
            public var timerEnd: Date?
            public var timerStart: Date?
            public var backgroundColor: String?
            public var progressColor: String?
            public var textColor: String?
            public var iconColor: String?
            public var keylineTint: String?
            public var timerCountsDown: Bool?
            public var progressBarHeight: Double?
            public var progressBarRadius: Double?
            public var extras: [String: AnyJSON]
        }
    }
}

/// `customerio/customerio-ios`, `Sources/LiveActivities_Attributes/`.
public enum CustomerIO {
    /// `EpochSecondsDate.swift`: a date decoded from an `Int64` of seconds since 1970 (a fraction fails).
    public struct EpochSecondsDate: Decodable, Sendable, Equatable {
        public var date: Date

        public init(from decoder: any Decoder) throws {
            let seconds = try decoder.singleValueContainer().decode(Int64.self)
            date = Date(timeIntervalSince1970: TimeInterval(seconds))
        }
    }

    /// `CIOLiveActivityMetadata.swift`: three optional strings in the content state under `cioMetadata`
    /// (`CIOMetadataCarrying`).
    public struct CIOLiveActivityMetadata: Decodable, Sendable, Equatable {
        public var deliveryId: String?
        public var deliveryToken: String?
        public var deepLink: String?
    }
}
