import Synchronization

/// The request-body bytes the server holds at once, over all requests, against
/// `HTTPServer.Configuration.maxBufferedBodySize`.
///
/// A request reserves its share as its bytes arrive (ahead of them as its buffer grows, never past its announced
/// `Content-Length`) and gives it back when its body is dropped or the request is over, whichever comes first.
final class BodyBudget: Sendable {
    /// The most bytes that may be reserved at once; 0: no limit (reservations are still counted).
    let limit: Int
    private let reserved = Atomic<Int>(0)

    init(limit: Int) {
        self.limit = limit
    }

    /// Bytes reserved now.
    var inUse: Int { reserved.load(ordering: .relaxed) }

    /// Reserves `bytes` unless that would take the total over `limit`; returns whether it did.
    func reserve(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        var current = reserved.load(ordering: .relaxed)
        while true {
            if limit > 0, bytes > limit - current { return false }
            let (exchanged, original) = reserved.compareExchange(
                expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    /// Whether `bytes` more would fit now (nothing is reserved).
    func wouldFit(_ bytes: Int) -> Bool {
        limit == 0 || bytes <= limit - reserved.load(ordering: .relaxed)
    }

    /// Gives back `bytes` reserved earlier.
    func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        reserved.subtract(bytes, ordering: .relaxed)
    }
}
