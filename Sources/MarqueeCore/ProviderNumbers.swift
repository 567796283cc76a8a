import Foundation

/// The one home for numbers and texts a provider sends back (`Retry-After`, a 410's `timestamp`, a token's
/// `expires_in`, reasons, the identifiers of sent pushes).
///
/// A tenant chooses (within the operator's allowlist) which endpoint answers, so every such number is hostile
/// input: these functions never trap, and return only values the rest of the worker can do arithmetic and date
/// formatting on. Out-of-range values are clamped when a bound is meaningful, and ignored otherwise.
public enum ProviderNumbers {
    /// The longest `Retry-After` honoured: one hour.
    public static let maximumRetryAfter: Duration = .seconds(3600)
    /// The earliest timestamp believed (2001-01-01T00:00:00Z); before it a provider's timestamp is ignored.
    public static let earliestTimestamp = Date(timeIntervalSince1970: 978_307_200)
    /// The latest timestamp believed, relative to now: one day ahead (clock skew); beyond it is ignored.
    public static let timestampLeeway: TimeInterval = 86_400
    /// Bounds for an OAuth2 `expires_in`, in seconds: at least 10 minutes (the cache refreshes 5 minutes early), at
    /// most a day. Missing or unreadable values mean an hour.
    public static let tokenLifetimeRange: ClosedRange<Double> = 600...86_400

    /// A `Retry-After` header (delta-seconds, possibly fractional, or an HTTP-date) as a delay in 0...1 h.
    /// Unreadable, negative or non-finite values give nil (no floor from the provider); huge ones give one hour.
    public static func retryAfter(_ header: String?, now: Date = Date()) -> Duration? {
        guard let text = header?.trimmingCharacters(in: .whitespaces), !text.isEmpty, text.utf8.count <= 64 else {
            return nil
        }
        let seconds: Double
        if let number = Double(text) {
            seconds = number
        } else if let date = httpDate(text) {
            seconds = date.timeIntervalSince(now)
        } else {
            return nil
        }
        guard seconds.isFinite else { return nil }
        let limit = Double(maximumRetryAfter.components.seconds)
        let clamped = min(max(seconds, 0), limit)
        return .milliseconds(Int64((clamped * 1000).rounded()))
    }

    /// A provider's millisecond timestamp (APNs 410 `timestamp`) as a date, if it is a finite number within
    /// `earliestTimestamp ... now + timestampLeeway`; otherwise nil (ignored). Strings and other types are ignored.
    public static func timestamp(milliseconds value: JSONValue?, now: Date = Date()) -> Date? {
        guard let ms = value?.doubleValue, ms.isFinite else { return nil }
        let seconds = ms / 1000
        guard seconds >= earliestTimestamp.timeIntervalSince1970,
            seconds <= now.timeIntervalSince1970 + timestampLeeway
        else { return nil }
        return Date(timeIntervalSince1970: seconds)
    }

    /// An OAuth2 `expires_in` (seconds) clamped to `tokenLifetimeRange`; missing or non-numeric gives an hour.
    public static func tokenLifetime(_ value: JSONValue?) -> TimeInterval {
        guard let seconds = value?.doubleValue, seconds.isFinite else { return 3600 }
        return min(max(seconds, tokenLifetimeRange.lowerBound), tokenLifetimeRange.upperBound)
    }

    /// A reason text from a provider's body, made safe to store and label metrics with: at most 64 characters of
    /// `A-Z a-z 0-9 _ - .`, and not one of the worker's own reasons (`DeliveryReason.workerReasons`, `oauth_…`);
    /// anything else gives nil. A provider cannot pass its answer off as the worker's: a 503 "shutdown" would
    /// otherwise be retried as an attempt the worker ended itself (`RetryPolicy.uncounted`), for ever.
    public static func reasonText(_ text: String?) -> String? {
        guard let text, (1...64).contains(text.utf8.count),
            text.utf8.allSatisfy({
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F
                    || $0 == 0x2D || $0 == 0x2E
            }),
            !DeliveryReason.workerReasons.contains(text), !text.hasPrefix("oauth_")
        else { return nil }
        return text
    }

    /// The longest provider-chosen identifier stored (an FCM message `name` is about 80 bytes, an APNs ID 36).
    public static let maximumIdentifierLength = 256

    /// An identifier a provider names a sent push by (FCM's message `name`, APNs' `apns-id` or `apns-unique-id`),
    /// made safe to store: 1 to `maximumIdentifierLength` bytes of visible ASCII (`!` … `~`, no spaces, no control
    /// characters: a NUL would cut the text parameter it is bound in); anything else gives nil (not recorded).
    public static func identifier(_ text: String?) -> String? {
        guard let text, (1...maximumIdentifierLength).contains(text.utf8.count),
            text.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E })
        else { return nil }
        return text
    }

    /// How far a provider's clock may be from this host's before a time-based rejection is blamed on the clocks
    /// rather than on the credential: a minute.
    public static let clockTolerance: TimeInterval = 60

    /// How far the provider's clock is from this host's (provider minus host, in seconds), read from the `Date` header
    /// of its answer, when they disagree by more than `clockTolerance`; nil when they agree, or the header is missing
    /// or unreadable. A time-based rejection (APNs `ExpiredProviderToken`, an OAuth2 `invalid_grant` about `iat` or
    /// `exp`) while the clocks disagree is this host's clock's doing, the operator's: it never breaks the tenant's
    /// credential (`DeliveryReason.clockSkew`).
    public static func clockSkew(date header: String?, now: Date = Date()) -> TimeInterval? {
        guard let text = header?.trimmingCharacters(in: .whitespaces), text.utf8.count <= 64,
            let date = httpDate(text)
        else { return nil }
        let skew = date.timeIntervalSince(now)
        return abs(skew) > clockTolerance ? skew : nil
    }

    /// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110 requires senders to use.
    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.date(from: text)
    }
}
