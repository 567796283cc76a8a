import HTTPServer
import MarqueeCore
import Testing

@testable import MarqueeAPI

@Suite("Paging")
struct PagingTests {
    @Test("a read of one row past the limit: the limit's rows and the last one's cursor; no cursor on the last page")
    func page() {
        let cursor: (Int) -> JSONValue = { .string("after-\($0)") }
        let more = Paging.page([1, 2, 3], limit: 2, cursor: cursor)
        #expect(Array(more.items) == [1, 2] && more.next == .string("after-2"))
        let last = Paging.page([1, 2], limit: 2, cursor: cursor)
        #expect(Array(last.items) == [1, 2] && last.next == .null)
        let empty = Paging.page([Int](), limit: 2, cursor: cursor)
        #expect(empty.items.isEmpty && empty.next == .null)
    }

    @Test("limit: 50 when absent, 1 to 200, anything else a 422 naming the parameter")
    func limit() throws {
        func limit(_ query: String) throws(ValidationError) -> Int {
            try Paging.limit(HTTPRequest(method: .GET, target: "/v1/campaigns" + query))
        }
        #expect(try limit("") == 50)
        #expect(try limit("?limit=1") == 1)
        #expect(try limit("?limit=200") == 200)
        for bad in ["?limit=0", "?limit=201", "?limit=-1", "?limit=ten", "?limit=", "?limit=1.5"] {
            #expect(throws: ValidationError.self, "\(bad)") { try limit(bad) }
            do { _ = try limit(bad) } catch { #expect(error.field == "limit") }
        }
    }
}
