import Testing

@testable import HTTPServer

@Suite("Request head limits (no sockets)")
struct RequestHeadTests {
    static func head(
        target: Int = 10, text: Int = 100, fields: Int = 2, query: Int = 0, cookies: Int = 0, cookieHeader: Int = 0
    ) -> RequestHead {
        RequestHead(
            targetLength: target, textLength: text, fieldCount: fields, queryParameterCount: query,
            cookieCount: cookies, cookieHeaderLength: cookieHeader)
    }

    @Test("a head takes its text, a 64-byte record per field, query parameter and cookie, and the Cookie copy")
    func size() {
        #expect(Self.head(text: 100, fields: 2).size == 100 + 128)
        #expect(Self.head(text: 100, fields: 2, query: 3).size == 100 + 5 * 64)
        // The Cookie copy: its value and a NUL, 16-byte aligned.
        #expect(Self.head(text: 100, fields: 3, cookies: 2, cookieHeader: 15).size == 100 + 16 + 5 * 64)
        #expect(Self.head(text: 100, fields: 3, cookies: 2, cookieHeader: 16).size == 100 + 32 + 5 * 64)
        #expect(RequestHead.connectionMemory(maxSize: 16_384) == 32_768)
    }

    @Test("over the limits: 414 naming path or query, then 431 naming the field that takes over half, if one does")
    func problems() {
        let small: HTTPHeaders = ["Host": "x"]
        #expect(Self.head().problem(maxTargetLength: 8192, maxSize: 16_384, rawPath: "/a", headers: small) == nil)
        let longQuery = Self.head(target: 9000, text: 9100).problem(
            maxTargetLength: 8192, maxSize: 16_384, rawPath: "/a", headers: small)
        #expect(longQuery?.status == 414 && longQuery?.field == "query")
        let longPath = Self.head(target: 9000, text: 9100).problem(
            maxTargetLength: 8192, maxSize: 16_384, rawPath: "/" + String(repeating: "p", count: 8999), headers: small)
        #expect(longPath?.field == "path")

        let large: HTTPHeaders = ["Host": "x", "Authorization": String(repeating: "k", count: 17_000)]
        let oneField = Self.head(text: 17_050).problem(
            maxTargetLength: 8192, maxSize: 16_384, rawPath: "/a", headers: large)
        #expect(oneField?.status == 431 && oneField?.field == "Authorization")
        #expect(oneField?.extensions["limit_bytes"] == "16384")
        let many = HTTPHeaders((0..<300).map { ("X-\($0)", "v") })
        let manyFields = Self.head(text: 3000, fields: 300).problem(
            maxTargetLength: 8192, maxSize: 16_384, rawPath: "/a", headers: many)
        #expect(manyFields?.status == 431 && manyFields?.field == nil)
        let cookie = "a=1; " + String(repeating: "b", count: 100)
        let cookies = Self.head(text: 3000, fields: 2, cookies: 250, cookieHeader: 2000).problem(
            maxTargetLength: 8192, maxSize: 16_384, rawPath: "/a", headers: ["Host": "x", "Cookie": cookie])
        #expect(cookies?.status == 431 && cookies?.field == "Cookie")
    }
}
