/// JSON Merge Patch (RFC 7396): how an update's partial content state is folded into the current one.
///
/// A `null` member deletes, an object merges member by member (recursively), and anything else — a string, a number,
/// an array, or a patch that is not an object at all — replaces the target outright.
public enum MergePatch {
    /// Applies `patch` to `target` exactly as RFC 7396 §2 describes.
    ///
    /// When the patch is an object and the target is not, the target is treated as an empty object first. Members of
    /// the patch whose value is `null` are removed from the result (and never appear in it, even when they were absent
    /// from the target).
    ///
    /// Members are matched as Swift matches `String` keys, by canonical equivalence: a patch member whose key is the
    /// same text as a target's member in another Unicode form (U+212B and U+00C5) replaces that member's value, where
    /// PostgreSQL, comparing bytes, would see two members. (`JSONValue.parse` refuses such twins within one document.)
    public static func apply(_ patch: JSONValue, to target: JSONValue) -> JSONValue {
        guard case .object(let patchMembers) = patch else { return patch }
        var result = target.objectValue ?? [:]
        for (key, value) in patchMembers {
            if value == .null {
                result.removeValue(forKey: key)
            } else {
                result[key] = apply(value, to: result[key] ?? .null)
            }
        }
        return .object(result)
    }
}
