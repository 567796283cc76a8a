/// The `marquee` profile's progress convention for Android 16 Live Updates (`Notification.ProgressStyle`), one to
/// one: a content-state member `progress` that is an object
///
/// ```json
/// {"current": 3, "max": 10,
///  "segments": [{"length": 5, "color": "#3366FF"}, {"length": 5}],
///  "points": [{"position": 5, "color": "#FF0000"}]}
/// ```
///
/// - `current` (`setProgress`) and `max` are integers, 0 ≤ current ≤ max, max ≥ 1;
/// - `segments` (`setProgressSegments`): each a `length` ≥ 1 and an optional `#RRGGBB` `color`; their lengths add
///   up to `max` (ProgressStyle derives the maximum from them);
/// - `points` (`setProgressPoints`): each a `position` in 0…max and an optional `color`.
///
/// On Android the data message carries it as `progress_current`, `progress_max`, and `progress_segments` /
/// `progress_points` (JSON text), beside the whole content state. A `progress` that is not an object (a plain
/// number, as the Capacitor plugin uses) is not this convention and is left alone.
public struct ProgressConvention: Sendable, Equatable {
    public struct Segment: Sendable, Equatable {
        public var length: Int64
        public var color: String?
    }

    public struct Point: Sendable, Equatable {
        public var position: Int64
        public var color: String?
    }

    public var current: Int64
    public var max: Int64
    public var segments: [Segment]
    public var points: [Point]

    static let limit = 100

    /// The convention in `state`, nil when `state` has no `progress` object; throws when the object breaks it.
    public static func parse(_ state: JSONValue, field: String = "content_state") throws(ValidationError)
        -> ProgressConvention?
    {
        guard let object = state["progress"]?.objectValue else { return nil }
        let base = field + "/progress"
        if let unknown = object.keys.sorted().first(where: { !["current", "max", "segments", "points"].contains($0) }) {
            throw ValidationError(field: base + "/" + unknown, reason: "is not part of the progress convention")
        }
        guard let max = object["max"]?.intValue, max >= 1 else {
            throw ValidationError(field: base + "/max", reason: "must be an integer of at least 1")
        }
        guard let current = object["current"]?.intValue, (0...max).contains(current) else {
            throw ValidationError(field: base + "/current", reason: "must be an integer from 0 to max")
        }
        var segments: [Segment] = []
        if let list = object["segments"] {
            guard let items = list.arrayValue, items.count <= limit else {
                throw ValidationError(field: base + "/segments", reason: "must be an array of at most \(limit)")
            }
            for (index, item) in items.enumerated() {
                let here = base + "/segments/\(index)"
                guard let length = item["length"]?.intValue, (1...max).contains(length) else {
                    throw ValidationError(field: here + "/length", reason: "must be an integer from 1 to max")
                }
                segments.append(Segment(length: length, color: try color(item, here)))
            }
            // Client numbers: a sum that overflows is no match (never a trap).
            let total = segments.reduce(Optional(Int64(0))) { total, segment in
                total.flatMap { total in
                    let (sum, overflow) = total.addingReportingOverflow(segment.length)
                    return overflow ? nil : sum
                }
            }
            guard segments.isEmpty || total == max else {
                throw ValidationError(field: base + "/segments", reason: "lengths must add up to max (\(max))")
            }
        }
        var points: [Point] = []
        if let list = object["points"] {
            guard let items = list.arrayValue, items.count <= limit else {
                throw ValidationError(field: base + "/points", reason: "must be an array of at most \(limit)")
            }
            for (index, item) in items.enumerated() {
                let here = base + "/points/\(index)"
                guard let position = item["position"]?.intValue, (0...max).contains(position) else {
                    throw ValidationError(field: here + "/position", reason: "must be an integer from 0 to max")
                }
                points.append(Point(position: position, color: try color(item, here)))
            }
        }
        return ProgressConvention(current: current, max: max, segments: segments, points: points)
    }

    private static func color(_ item: JSONValue, _ field: String) throws(ValidationError) -> String? {
        guard let value = item["color"], value != .null else { return nil }
        guard let text = value.stringValue, text.utf8.count == 7, text.hasPrefix("#"),
            text.utf8.dropFirst().allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x66) })
        else { throw ValidationError(field: field + "/color", reason: "must be a colour like #3366FF") }
        return text
    }

    /// The FCM data keys for this progress.
    public var dataFields: [String: String] {
        var data = ["progress_current": String(current), "progress_max": String(max)]
        if !segments.isEmpty {
            data["progress_segments"] =
                JSONValue.array(
                    segments.map { s in
                        var o: [String: JSONValue] = ["length": .int(s.length)]
                        if let color = s.color { o["color"] = .string(color) }
                        return .object(o)
                    }
                ).serialized()
        }
        if !points.isEmpty {
            data["progress_points"] =
                JSONValue.array(
                    points.map { p in
                        var o: [String: JSONValue] = ["position": .int(p.position)]
                        if let color = p.color { o["color"] = .string(color) }
                        return .object(o)
                    }
                ).serialized()
        }
        return data
    }
}
