/// A client mistake in one field: which field, why, and a stable code. Rendered by the API as a 422 problem.
public struct ValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable kinds; the API turns each into a problem `type`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(_ rawValue: String) { self.rawValue = rawValue }
        public static let invalidField = Code("invalid-field")
        public static let missingField = Code("missing-field")
        public static let invalidToken = Code("invalid-token")
        public static let invalidKey = Code("invalid-key")
        public static let schemaViolation = Code("schema-violation")
        /// A registration named an activity type the tenant does not have, and registrations have created as many
        /// as the tenant allows (`max_auto_created_activity_types`).
        public static let activityTypeLimit = Code("activity-type-limit")
        public var description: String { rawValue }
    }

    public var code: Code
    /// The field at fault: a name (`platform`), a dotted path (`push_payload.alert`) or a JSON pointer.
    public var field: String
    /// Readable reason, safe to show: it never quotes a token or a secret.
    public var reason: String

    public init(_ code: Code = .invalidField, field: String, reason: String) {
        self.code = code
        self.field = field
        self.reason = reason
    }

    public static func missing(_ field: String) -> ValidationError {
        ValidationError(.missingField, field: field, reason: "is required")
    }

    public var description: String { "\(field): \(reason)" }
}

/// Device platforms.
public enum Platform: String, Sendable, CaseIterable, Codable {
    case ios
    case android
}

/// Token and identifier rules shared by the API and the stores.
public enum Identifiers {
    /// APNs device, push-to-start and activity tokens: hex, 64–200 characters; stored lowercase.
    public static func apnsToken(_ text: String, field: String) throws(ValidationError) -> String {
        let utf8 = text.utf8
        guard (64...200).contains(utf8.count), utf8.allSatisfy(isHexDigit) else {
            throw ValidationError(
                .invalidToken, field: field, reason: "must be an APNs token: 64 to 200 hexadecimal characters")
        }
        return text.lowercased()
    }

    /// The longest FCM token accepted. Real tokens are about 160 characters; the bound keeps every index holding
    /// tokens (an Android activity token sits next to its device token in one key) under PostgreSQL's 2704-byte limit
    /// for a B-tree entry, which longer values would break with a server error.
    public static let maxFCMTokenLength = 1024

    /// The longest delivery-metric recipient accepted, in code points and in UTF-8 bytes (it is part of an index,
    /// like tokens, so its bytes must stay under PostgreSQL's 2704-byte limit for a B-tree entry).
    public static let maxRecipientLength = 1024

    /// A delivery-metric recipient as read from a body (already at most ``maxRecipientLength`` code points): at most
    /// ``maxRecipientLength`` UTF-8 bytes, since a few characters can carry any number of combining marks.
    public static func recipient(_ text: String?, field: String) throws(ValidationError) -> String? {
        guard let text else { return nil }
        guard text.utf8.count <= maxRecipientLength else {
            throw ValidationError(field: field, reason: "must be at most \(maxRecipientLength) bytes")
        }
        return text
    }

    /// FCM registration tokens: 1–1024 printable ASCII characters.
    public static func fcmToken(_ text: String, field: String) throws(ValidationError) -> String {
        let utf8 = text.utf8
        guard (1...maxFCMTokenLength).contains(utf8.count), utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
            throw ValidationError(
                .invalidToken, field: field,
                reason: "must be an FCM token: 1 to \(maxFCMTokenLength) printable ASCII characters")
        }
        return text
    }

    /// A device token by platform.
    public static func deviceToken(_ text: String, platform: Platform, field: String) throws(ValidationError) -> String
    {
        switch platform {
        case .ios: try apnsToken(text, field: field)
        case .android: try fcmToken(text, field: field)
        }
    }

    /// A device token whose platform is not known yet (path parameters): an APNs token is normalised to lowercase,
    /// anything else must be a valid FCM token.
    public static func anyDeviceToken(_ text: String, field: String) throws(ValidationError) -> String {
        if let apns = try? apnsToken(text, field: field) { return apns }
        return try fcmToken(text, field: field)
    }

    /// A person's ID as a set or dictionary in Swift must hold it: its UTF-8 bytes, which compare as PostgreSQL and
    /// every route compare IDs. Swift's `==` takes canonically equivalent strings (`é` and `e` + U+0301) for one; to
    /// the database they are two people. (Instance, campaign and segment IDs, device tokens and activity types are
    /// ASCII by their rules, where the two agree.)
    public static func personKey(_ id: String) -> [UInt8] { Array(id.utf8) }

    /// A person's ID as a write that may create a record carrying it takes it (a person, device, instance or campaign
    /// audience): ``personReference(_:field:)``, and none of the characters that make an ID look like another in the
    /// console and in logs (``isInvisibleOrReordering(_:)``).
    public static func personID(_ text: String, field: String = "id") throws(ValidationError) -> String {
        let id = try personReference(text, field: field)
        guard !id.unicodeScalars.contains(where: isInvisibleOrReordering) else {
            throw ValidationError(
                field: field,
                reason: "must not hold invisible, formatting, direction-changing, private-use or noncharacter "
                    + "code points (Unicode categories Cc, Cf, Zl, Zp, Co, default-ignorable code points, "
                    + "noncharacters)")
        }
        return id
    }

    /// A person's ID as a read or a delete names one (and a paging cursor): 1–256 characters, no control characters.
    /// Laxer than ``personID(_:field:)`` on purpose: people created before that rule keep IDs it refuses, and must
    /// still be found, erased and paged through by them.
    public static func personReference(_ text: String, field: String = "id") throws(ValidationError) -> String {
        guard (1...256).contains(text.unicodeScalars.count),
            !text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
        else {
            throw ValidationError(field: field, reason: "must be 1 to 256 characters without control characters")
        }
        return text
    }

    /// Code points that do not show, or show as something else, and so let two IDs that differ look the same (or
    /// one look like another when printed next to text): controls (Cc), format characters (Cf: zero-width spaces and
    /// joiners, the bidi embeddings, overrides, isolates and marks, soft hyphen, BOM, tags), line and paragraph
    /// separators (Zl, Zp), private use (Co), other default-ignorable code points (variation selectors, the Hangul
    /// fillers, combining grapheme joiner) and noncharacters (U+FDD0–U+FDEF, U+xFFFE, U+xFFFF). (Surrogates cannot
    /// occur: a Swift string holds Unicode scalars only, and JSON's unpaired `\\uD800` is refused when parsed.)
    /// The one home of that rule, for the identifiers clients choose freely (the others are ASCII by their own rules).
    public static func isInvisibleOrReordering(_ scalar: Unicode.Scalar) -> Bool {
        let properties = scalar.properties
        switch properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .privateUse: return true
        default: return properties.isDefaultIgnorableCodePoint || properties.isNoncharacterCodePoint
        }
    }

    /// A live activity instance ID: ``instanceReference(_:field:)``, and not `.` or `..` (dot segments, which HTTP
    /// clients and browsers remove from request paths: `/v1/live_notifications/..` would never reach it). Campaign
    /// and segment IDs follow the same rule.
    public static func instanceID(_ text: String, field: String = "instance_id") throws(ValidationError) -> String {
        _ = try instanceReference(text, field: field)
        guard text != ".", text != ".." else {
            throw ValidationError(field: field, reason: "must not be . or .. (clients drop them from request paths)")
        }
        return text
    }

    /// An instance, campaign or segment ID as a list's filter or paging cursor names one: 1–128 characters of
    /// `[A-Za-z0-9._:-]`. Laxer than ``instanceID(_:field:)`` on purpose: IDs made before the rule against `.` and
    /// `..` keep them, and lists must still filter by them and page past them.
    public static func instanceReference(_ text: String, field: String = "instance_id") throws(ValidationError)
        -> String
    {
        guard (1...128).contains(text.utf8.count),
            text.utf8.allSatisfy({ isAlphanumeric($0) || $0 == 0x2E || $0 == 0x5F || $0 == 0x3A || $0 == 0x2D })
        else {
            throw ValidationError(field: field, reason: "must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")
        }
        return text
    }

    /// An activity type identifier in reverse-DNS form, e.g. `com.example.delivery`: at least two dot-separated
    /// labels of `[A-Za-z0-9_-]`, at most 255 characters.
    public static func activityType(_ text: String, field: String = "identifier") throws(ValidationError) -> String {
        let labels = text.split(separator: ".", omittingEmptySubsequences: false)
        guard text.utf8.count <= 255, labels.count >= 2,
            labels.allSatisfy({ label in
                !label.isEmpty && label.utf8.allSatisfy { isAlphanumeric($0) || $0 == 0x5F || $0 == 0x2D }
            })
        else {
            throw ValidationError(field: field, reason: "must be a reverse-DNS identifier such as com.example.delivery")
        }
        return text
    }

    /// A Swift type name as ActivityKit sends it in `attributes-type`: an identifier, possibly dotted.
    public static func attributesType(_ text: String, field: String = "attributes_type") throws(ValidationError)
        -> String
    {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...200).contains(text.utf8.count),
            parts.allSatisfy({ part in
                guard let first = part.utf8.first, !isDigit(first) else { return false }
                return part.utf8.allSatisfy { isAlphanumeric($0) || $0 == 0x5F }
            })
        else {
            throw ValidationError(field: field, reason: "must be a Swift type name such as DeliveryAttributes")
        }
        return text
    }

    static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
    static func isHexDigit(_ c: UInt8) -> Bool { isDigit(c) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66) }
    static func isAlphanumeric(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
    }
}

/// How a date field of the content state is encoded for the app's decoder.
public enum DateEncoding: String, Sendable, CaseIterable, Codable {
    /// Seconds since 1970 (a number).
    case epochSeconds = "epoch_seconds"
    /// Seconds since 2001-01-01 00:00:00 UTC: what ActivityKit's default `Date` decoding expects.
    case appleReference = "apple_reference"
    /// An ISO 8601 string in UTC.
    case iso8601
}

/// Which client library the pushed payload is shaped for.
public enum PayloadProfile: String, Sendable, CaseIterable, Codable {
    case marquee
    case customerio
    case capacitor
}

/// Lifecycle events a device reports for an activity instance.
public enum LifecycleEvent: String, Sendable, CaseIterable, Codable {
    case started
    case updated
    case ended
    case dismissed
    case stale

    /// After these, the device gets no more sends for the instance.
    public var stopsSends: Bool { self == .ended || self == .dismissed }
}

/// Delivery metrics reported by the SDK.
public enum DeliveryMetric: String, Sendable, CaseIterable, Codable {
    case delivered
    case opened
}
