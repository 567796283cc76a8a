import Foundation

/// The per-change options of an instance as stored with it (`instances.options`), from which the worker composes
/// each push at send time: the latest change's alert, and the sticky options (deep link, stale date, relevance,
/// priority), plus the end's dismissal date.
public struct StoredOptions: Sendable, Equatable {
    public var alert: LiveActivityAlert?
    public var deepLink: String?
    public var staleDate: Date?
    public var relevanceScore: Double?
    /// APNs priority, 5 or 10; nil means the default (10 with an alert, else 5).
    public var priority: Int?
    public var dismissalDate: Date?

    public init(
        alert: LiveActivityAlert? = nil, deepLink: String? = nil, staleDate: Date? = nil, relevanceScore: Double? = nil,
        priority: Int? = nil, dismissalDate: Date? = nil
    ) {
        self.alert = alert
        self.deepLink = deepLink
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.priority = priority
        self.dismissalDate = dismissalDate
    }

    /// The options that compare for no-op suppression (the alert and dismissal are per push, not state).
    public var activityOptions: ActivityOptions {
        ActivityOptions(
            staleDate: staleDate, relevanceScore: relevanceScore,
            priority: priority.map { $0 == 10 ? .high : .normal }, deepLink: deepLink)
    }

    /// The APNs priority to send with: explicit, else 10 when there is an alert, else 5 — except that a push without
    /// an alert goes at 5 unless the activity type declares `frequent_updates` (the app sets
    /// `NSSupportsLiveActivitiesFrequentUpdates`). Apple silently drops frequent high-priority updates beyond a
    /// per-user budget; without that key the budget is small, and "updates stopped arriving" is the symptom.
    public func apnsPriority(frequentUpdates: Bool) -> Int {
        let requested = priority ?? (alert == nil ? 5 : 10)
        return alert == nil && !frequentUpdates ? 5 : requested
    }

    public var json: JSONValue {
        var o: [String: JSONValue] = [:]
        if let alert {
            var a: [String: JSONValue] = ["title": .string(alert.title), "body": .string(alert.body)]
            if let sound = alert.sound { a["sound"] = .string(sound) }
            o["alert"] = .object(a)
        }
        if let deepLink { o["deep_link"] = .string(deepLink) }
        if let staleDate { o["stale_date"] = .int(Int64(staleDate.timeIntervalSince1970.rounded(.down))) }
        if let relevanceScore { o["relevance_score"] = .double(relevanceScore) }
        if let priority { o["priority"] = .int(Int64(priority)) }
        if let dismissalDate { o["dismissal_date"] = .int(Int64(dismissalDate.timeIntervalSince1970.rounded(.down))) }
        return .object(o)
    }

    public init(json: JSONValue) {
        if let a = json["alert"], let title = a["title"]?.stringValue, let body = a["body"]?.stringValue {
            alert = LiveActivityAlert(title: title, body: body, sound: a["sound"]?.stringValue)
        }
        deepLink = json["deep_link"]?.stringValue
        staleDate = json["stale_date"]?.doubleValue.map { Date(timeIntervalSince1970: $0) }
        relevanceScore = json["relevance_score"]?.doubleValue
        priority = json["priority"]?.intValue.map(Int.init)
        dismissalDate = json["dismissal_date"]?.doubleValue.map { Date(timeIntervalSince1970: $0) }
    }
}
