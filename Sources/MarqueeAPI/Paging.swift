import HTTPServer
import MarqueeCore

/// Cursor-paged lists: the one home of their `limit` parameter and of how a page and its next cursor are cut from a
/// read of one row more than the limit.
enum Paging {
    /// The `limit` query parameter: 1 to 200, 50 when absent.
    static func limit(_ request: HTTPRequest) throws(ValidationError) -> Int {
        guard let text = request.query["limit"] else { return 50 }
        guard let n = Int(text), (1...200).contains(n) else {
            throw ValidationError(field: "limit", reason: "must be an integer in 1...200")
        }
        return n
    }

    /// The first `limit` of `rows` (read with a limit of `limit + 1`) and the cursor after the last of them (`cursor`
    /// of that row), or null when there is no next page.
    static func page<Row>(_ rows: [Row], limit: Int, cursor: (Row) -> JSONValue) -> (
        items: ArraySlice<Row>, next: JSONValue
    ) {
        let items = rows.prefix(limit)
        guard rows.count > limit, let last = items.last else { return (items, .null) }
        return (items, cursor(last))
    }
}
