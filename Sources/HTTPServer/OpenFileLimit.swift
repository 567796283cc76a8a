import Glibc

/// The process's open-files limit (`RLIMIT_NOFILE`) against what a listener may hold open. Each accepted connection
/// is a descriptor; past the soft limit `accept` fails with `EMFILE` and clients wait in the kernel's backlog whatever
/// the connection limit says. Many systems start services with a soft limit of 1,024 and a hard one far above it (the
/// soft limit is kept low for programs that use `select`, which libmicrohttpd here does not: it polls with epoll), so
/// a server raises its soft limit itself, as far as the hard one allows.
public enum OpenFileLimit {
    /// The soft and hard limits before and after `ensure`.
    public struct Outcome: Sendable, Equatable {
        public var before: UInt64
        public var after: UInt64
        public var hard: UInt64
        /// Whether the soft limit now covers what was asked.
        public var enough: Bool
    }

    /// The soft limit to set for `needed` descriptors: `needed`, at most `hard`; nil when `current` already covers it.
    public static func target(current: UInt64, hard: UInt64, needed: UInt64) -> UInt64? {
        guard current < needed else { return nil }
        let target = min(needed, hard)
        return target > current ? target : nil
    }

    /// Raises the soft limit to cover `needed` descriptors when it does not, as far as the hard limit allows. Nil when
    /// the limits cannot be read.
    @discardableResult
    public static func ensure(atLeast needed: Int) -> Outcome? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        let before = UInt64(limit.rlim_cur)
        let hard = UInt64(limit.rlim_max)
        var after = before
        if let target = target(current: before, hard: hard, needed: UInt64(max(0, needed))) {
            limit.rlim_cur = rlim_t(target)
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 { after = target }
        }
        return Outcome(before: before, after: after, hard: hard, enough: after >= UInt64(max(0, needed)))
    }
}
