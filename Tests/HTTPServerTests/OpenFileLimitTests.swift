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
        var limit = rlimit()
        try #require(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0)
        let saved = limit
        defer {
            var restore = saved
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &restore)
        }
        let hard = UInt64(limit.rlim_max)
        // Lower the soft limit (always allowed), then ask for a little more than that.
        let low = min(UInt64(limit.rlim_cur), hard, 512)
        limit.rlim_cur = rlim_t(low)
        try #require(setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0)
        let wanted = min(low + 100, hard)
        let outcome = try #require(OpenFileLimit.ensure(atLeast: Int(wanted)))
        #expect(outcome.before == low)
        #expect(outcome.after == wanted)
        #expect(outcome.enough)
        var now = rlimit()
        try #require(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &now) == 0)
        #expect(UInt64(now.rlim_cur) == wanted)
        // More than the hard limit allows: raised to it, and not enough.
        if hard < UInt64(Int.max) {
            let beyond = try #require(OpenFileLimit.ensure(atLeast: Int(hard) + 1))
            #expect(beyond.after == hard)
            #expect(!beyond.enough)
        }
    }
}
