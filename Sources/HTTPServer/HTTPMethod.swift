/// An HTTP request method such as `GET` or `POST`.
///
/// Methods are compared by their exact (case-sensitive) token, as RFC 9110 requires.
public struct HTTPMethod: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The method token as it appears on the request line, e.g. `"GET"`.
    public var rawValue: String

    /// Creates a method from its token.
    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    /// `GET`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let GET = HTTPMethod(rawValue: "GET")
    /// `POST`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let POST = HTTPMethod(rawValue: "POST")
    /// `PUT`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let PUT = HTTPMethod(rawValue: "PUT")
    /// `PATCH`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let PATCH = HTTPMethod(rawValue: "PATCH")
    /// `DELETE`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let DELETE = HTTPMethod(rawValue: "DELETE")
    /// `HEAD`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let HEAD = HTTPMethod(rawValue: "HEAD")
    /// `OPTIONS`
    // swift-format-ignore: AlwaysUseLowerCamelCase
    public static let OPTIONS = HTTPMethod(rawValue: "OPTIONS")

    /// The method token.
    public var description: String { rawValue }

    /// The methods of RFC 9110 and PATCH (RFC 5789). The server passes any token through, so this is what
    /// bounded uses (metric labels) compare against.
    public static let standard: Set<String> = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ]

    /// The method's token when it is a ``standard`` one, else `OTHER`: a label of bounded cardinality, whatever
    /// tokens clients invent.
    public var boundedLabel: String { Self.standard.contains(rawValue) ? rawValue : "OTHER" }

    /// Position in `Allow` headers: well-known methods first, in a fixed order.
    var sortKey: Int {
        switch rawValue {
        case "GET": 0
        case "HEAD": 1
        case "POST": 2
        case "PUT": 3
        case "PATCH": 4
        case "DELETE": 5
        case "OPTIONS": 6
        default: 7
        }
    }
}
