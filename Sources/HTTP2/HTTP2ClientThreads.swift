import Synchronization

/// I/O threads and TLS contexts shared by many `HTTP2Client`s.
///
/// A client made with them opens its connections on these threads (round robin) instead of starting its own, and
/// reuses one TLS context per `TLSClientConfiguration` (the trust store is loaded once). Its `shutdown()` closes only
/// its own connections. This is what a process keeping many small pools needs — one per APNs key, say, where each
/// pool would otherwise cost a thread and a trust store.
///
/// `shutdown()` stops the threads; call it after the clients using them shut down (a client still using them fails
/// its requests with `shutdown`).
public final class HTTP2ClientThreads: Sendable {
    let loops: [EventLoop]
    private let next = Atomic<Int>(0)
    private let contexts = Mutex<[TLSClientConfiguration: TLSContext]>([:])

    /// Starts `count` I/O threads, named `<name>-<n>`.
    public init(count: Int = 1, name: String = "http2-client") throws {
        guard count > 0 else { throw HTTP2Error(.invalidConfiguration, "the thread count must be positive") }
        loops = try (0..<count).map { try EventLoop(name: "\(name)-\($0)") }
    }

    deinit {
        for loop in loops { loop.shutdown() }
    }

    /// The number of threads.
    public var count: Int { loops.count }

    /// `n` loops for a new client, starting where the last client's left off.
    func assign(_ n: Int) -> [EventLoop] {
        let start = next.wrappingAdd(n, ordering: .relaxed).oldValue
        return (0..<min(n, loops.count)).map { loops[(start + $0) % loops.count] }
    }

    /// The shared TLS context for `configuration`, created on first use.
    func tlsContext(_ configuration: TLSClientConfiguration) throws -> TLSContext {
        try contexts.withLock { contexts in
            if let context = contexts[configuration] { return context }
            let context = try TLSContext.client(configuration)
            contexts[configuration] = context
            return context
        }
    }

    /// Stops the threads (their remaining connections are closed) and waits for them to exit.
    public func shutdown() async {
        for loop in loops { loop.shutdown() }
        for loop in loops { await loop.join() }
    }
}
