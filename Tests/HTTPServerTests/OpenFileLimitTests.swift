import Glibc
import Testing

@testable import HTTPServer

@Suite("Open-files limit")
struct OpenFileLimitTests {
    @Test("the soft limit is raised to what is needed, at most the hard limit, and only when it is below")
    func target() {
        #expect(OpenFileLimit.target(current: 1024, hard: 524_288, needed: 4_500) == 4_500)
        #expect(OpenFileLimit.target(current: 1024, hard: 4_096, needed: 4_500) == 4_096)
        #expect(OpenFileLimit.target(current: 8_192, hard: 524_288, needed: 4_500) == nil)
        #expect(OpenFileLimit.target(current: 4_500, hard: 524_288, needed: 4_500) == nil)
        // Nothing to raise to: the hard limit is the soft one.
        #expect(OpenFileLimit.target(current: 1024, hard: 1024, needed: 4_500) == nil)
        // No hard limit.
        #expect(OpenFileLimit.target(current: 1024, hard: .max, needed: 4_500) == 4_500)
    }

    @Test("ensure raises this process's soft limit within the hard one, and says whether it covers what was asked")
    func ensure() throws {
        // Only ever raised here (other tests of this process open descriptors meanwhile), then put back.
        var limit = rlimit()
        try #require(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0)
        let saved = limit
        defer {
            var restore = saved
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &restore)
        }
        let soft = UInt64(limit.rlim_cur)
        let hard = UInt64(limit.rlim_max)
        let covered = try #require(OpenFileLimit.ensure(atLeast: Int(clamping: soft)))
        #expect(covered == .init(before: soft, after: soft, hard: hard, enough: true), "nothing to raise")
        guard hard < UInt64(Int.max) else { return }  // no hard limit: nothing is ever short
        if soft < hard {
            let more = try #require(OpenFileLimit.ensure(atLeast: Int(soft) + 1))
            #expect(more == .init(before: soft, after: soft + 1, hard: hard, enough: true))
            var now = rlimit()
            try #require(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &now) == 0)
            #expect(UInt64(now.rlim_cur) == soft + 1)
        }
        // More than the hard limit allows: raised to it, and not enough.
        let beyond = try #require(OpenFileLimit.ensure(atLeast: Int(hard) + 1))
        #expect(beyond.after == hard)
        #expect(!beyond.enough)
    }
}
