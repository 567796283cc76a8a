/// An async request handler.
public typealias HTTPHandler = @Sendable (HTTPRequest) async throws -> HTTPResponse

/// What a route accepts as a request body; checked centrally before the handler runs.
public struct BodyPolicy: Sendable {
    /// Decides from a request's method, target and headers alone (its body empty) whether it may send a body over
    /// the server's `maxBodySize`; throws (an ``HTTPProblemConvertible`` renders itself) to refuse it.
    public typealias Admission = @Sendable (HTTPRequest) async throws -> Void

    private enum Kind: Hashable { case json, ndjson, any }
    private let kind: Kind
    /// The route's largest body in bytes, when it differs from the server's `maxBodySize` (never more than the
    /// server's `maxBufferedBodySize`, which caps it).
    public let maxSize: Int?
    /// With `maxSize` over the server's limit: run before any of a body that may exceed the server's limit is read
    /// (`Content-Length` over it, or a chunked body), so that only admitted callers (e.g. authenticated ones) can
    /// make the server buffer that much. A refused request's body is never read.
    public let admission: Admission?

    private init(kind: Kind, maxSize: Int? = nil, admission: Admission? = nil) {
        self.kind = kind
        self.maxSize = maxSize
        self.admission = admission
    }

    /// A non-empty body must have a JSON `Content-Type` (`application/json` or `application/…+json`),
    /// otherwise the server answers 415 without calling the handler. The default.
    public static let json = BodyPolicy(kind: .json)
    /// Any body is passed to the handler as is.
    public static let any = BodyPolicy(kind: .any)

    /// Newline-delimited JSON (`application/x-ndjson`, `application/ndjson` or `application/jsonl`), up to
    /// `maxSize` bytes (which may exceed the server's `maxBodySize`: bulk routes take large bodies), from callers
    /// that `admission` lets through before their body is read (see ``admission``).
    public static func ndjson(maxSize: Int, admission: @escaping Admission) -> BodyPolicy {
        BodyPolicy(kind: .ndjson, maxSize: maxSize, admission: admission)
    }

    /// The same policy with its admission run through `middleware` like a handler (so its errors render as the
    /// handlers' do).
    func wrappingAdmission(_ middleware: (@escaping HTTPHandler) -> HTTPHandler) -> BodyPolicy {
        guard let admission else { return self }
        let wrapped = middleware { request in
            try await admission(request)
            return HTTPResponse(status: 204)
        }
        return BodyPolicy(kind: kind, maxSize: maxSize) { request in _ = try await wrapped(request) }
    }

    /// The media types `.ndjson` accepts.
    public static let ndjsonMediaTypes: Set<String> = [
        "application/x-ndjson", "application/ndjson", "application/jsonl",
    ]

    /// The problem to answer with before the handler runs, if any.
    func violation(for request: HTTPRequest) -> HTTPProblem? {
        switch kind {
        case .any:
            return nil
        case .json:
            guard !request.body.isEmpty, !request.hasJSONContentType else { return nil }
            return .unsupportedMediaType(contentType: request.headers["Content-Type"])
        case .ndjson:
            guard !request.body.isEmpty, !(request.mediaType.map(Self.ndjsonMediaTypes.contains) ?? false) else {
                return nil
            }
            return .unsupportedMediaType(contentType: request.headers["Content-Type"])
        }
    }
}

/// A successful route lookup.
public struct RouteMatch: Sendable {
    /// The handler to run.
    public var handler: HTTPHandler
    /// The route pattern, e.g. `/v1/people/{id}`.
    public var pattern: String
    /// The `{name}` segment values, percent-decoded.
    public var parameters: [String: String]
    /// The route's body policy.
    public var bodyPolicy: BodyPolicy
}

/// The outcome of routing a request.
public enum RouteResult: Sendable {
    /// A route matched.
    case matched(RouteMatch)
    /// Nothing matched: a 404 problem, or a 405 problem carrying the `Allow` header.
    case problem(HTTPProblem)
}

/// Maps method + path to handlers. Patterns are `/`-separated segments, each either literal or `{name}`
/// (one whole segment). Literal segments win over parameters, so `/v1/people/me` beats `/v1/people/{id}`.
/// Empty segments are ignored (`/a//b/` is `/a/b`). `HEAD` falls back to the `GET` route and `OPTIONS`
/// is answered with 204 and `Allow` unless a route handles it.
public struct Router: Sendable {
    enum Segment: Hashable {
        case literal(String)
        case parameter(String)
    }

    struct Route: Sendable {
        var method: HTTPMethod
        var pattern: String
        var segments: [Segment]
        var handler: HTTPHandler
        var bodyPolicy: BodyPolicy

        /// Literal segments rank above parameters, left to right.
        var shape: [Bool] { segments.map { if case .literal = $0 { true } else { false } } }
    }

    private var routes: [Route] = []

    /// Creates an empty router.
    public init() {}

    /// Registers `handler` for `method` and `pattern` (e.g. `/v1/people/{id}/devices/{device_token}`).
    /// Registering the same method and pattern again replaces the handler.
    public mutating func add(
        _ method: HTTPMethod, _ pattern: String, body: BodyPolicy = .json, _ handler: @escaping HTTPHandler
    ) {
        let segments = Self.parse(pattern)
        let shape = Self.shapeKey(segments)
        routes.removeAll { $0.method == method && Self.shapeKey($0.segments) == shape }
        routes.append(
            Route(method: method, pattern: pattern, segments: segments, handler: handler, bodyPolicy: body))
    }

    /// Every registered route as `(method, pattern)`, in registration order: for listings, docs and tests.
    public var registered: [(method: HTTPMethod, pattern: String)] {
        routes.map { ($0.method, $0.pattern) }
    }

    /// Wraps every handler (and body admission) registered so far in `middleware` (e.g. error rendering that no
    /// route may forget).
    public mutating func wrapHandlers(_ middleware: (@escaping HTTPHandler) -> HTTPHandler) {
        for index in routes.indices {
            routes[index].handler = middleware(routes[index].handler)
            routes[index].bodyPolicy = routes[index].bodyPolicy.wrappingAdmission(middleware)
        }
    }

    /// Registers a `GET` route.
    public mutating func get(_ pattern: String, _ handler: @escaping HTTPHandler) {
        add(.GET, pattern, handler)
    }

    /// Registers a `POST` route.
    public mutating func post(_ pattern: String, body: BodyPolicy = .json, _ handler: @escaping HTTPHandler) {
        add(.POST, pattern, body: body, handler)
    }

    /// Registers a `PUT` route.
    public mutating func put(_ pattern: String, body: BodyPolicy = .json, _ handler: @escaping HTTPHandler) {
        add(.PUT, pattern, body: body, handler)
    }

    /// Registers a `PATCH` route.
    public mutating func patch(_ pattern: String, body: BodyPolicy = .json, _ handler: @escaping HTTPHandler) {
        add(.PATCH, pattern, body: body, handler)
    }

    /// Registers a `DELETE` route.
    public mutating func delete(_ pattern: String, _ handler: @escaping HTTPHandler) {
        add(.DELETE, pattern, handler)
    }

    /// Finds the handler for a request: 404 problem for unknown paths; 405 problem (with `Allow`) when
    /// the path exists but the method doesn't.
    public func route(_ request: HTTPRequest) -> RouteResult {
        if let problem = request.targetProblem { return .problem(problem) }
        return route(method: request.method, rawPath: request.rawPath, path: request.path)
    }

    func route(method: HTTPMethod, rawPath: String, path: String) -> RouteResult {
        let segments = RequestTarget.segments(rawPath)
        var candidates: [(route: Route, parameters: [String: String])] = []
        for route in routes {
            if let parameters = Self.match(route.segments, segments) {
                candidates.append((route, parameters))
            }
        }
        guard !candidates.isEmpty else { return .problem(.notFound(path: path)) }

        func best(_ method: HTTPMethod) -> (route: Route, parameters: [String: String])? {
            candidates.filter { $0.route.method == method }
                .max { Self.ranks($0.route.shape, below: $1.route.shape) }
        }
        if let found = best(method) ?? (method == .HEAD ? best(.GET) : nil) {
            return .matched(
                RouteMatch(
                    handler: found.route.handler, pattern: found.route.pattern,
                    parameters: found.parameters, bodyPolicy: found.route.bodyPolicy))
        }
        var allowed = Set(candidates.map(\.route.method))
        if allowed.contains(.GET) { allowed.insert(.HEAD) }
        allowed.insert(.OPTIONS)
        let allowedList = Array(allowed)
        if method == .OPTIONS {
            let pattern = candidates.max { Self.ranks($0.route.shape, below: $1.route.shape) }!.route.pattern
            let problem = HTTPProblem.methodNotAllowed(allowed: allowedList)
            let allow = problem.headers["Allow"] ?? ""
            return .matched(
                RouteMatch(
                    handler: { _ in HTTPResponse(status: 204, headers: ["Allow": allow]) },
                    pattern: pattern, parameters: [:], bodyPolicy: .any))
        }
        return .problem(.methodNotAllowed(allowed: allowedList))
    }

    static func parse(_ pattern: String) -> [Segment] {
        pattern.split(separator: "/", omittingEmptySubsequences: true).map { part in
            if part.hasPrefix("{") && part.hasSuffix("}") && part.count > 2 {
                return .parameter(String(part.dropFirst().dropLast()))
            }
            precondition(!part.contains("{") && !part.contains("}"), "Router: bad segment '\(part)' in '\(pattern)'")
            return .literal(String(part))
        }
    }

    /// Patterns that differ only in parameter names match the same paths.
    static func shapeKey(_ segments: [Segment]) -> [String?] {
        segments.map { segment in
            if case .literal(let literal) = segment { literal } else { nil }
        }
    }

    static func match(_ pattern: [Segment], _ segments: [String]) -> [String: String]? {
        guard pattern.count == segments.count else { return nil }
        var parameters: [String: String] = [:]
        for (expected, actual) in zip(pattern, segments) {
            switch expected {
            case .literal(let literal):
                guard literal == actual else { return nil }
            case .parameter(let name):
                parameters[name] = actual
            }
        }
        return parameters
    }

    /// Lexicographic: a literal at the first differing position ranks higher.
    static func ranks(_ a: [Bool], below b: [Bool]) -> Bool {
        for (x, y) in zip(a, b) where x != y {
            return !x && y
        }
        return false
    }
}
