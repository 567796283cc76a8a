import Foundation
import Testing

@testable import HTTP2

@Suite("HTTP2 event loop")
struct EventLoopTests {
    @Test("a write on a loop thread to a socket whose peer closed fails with EPIPE; no SIGPIPE ends the process")
    func writeAfterPeerClosed() async throws {
        let loop = try EventLoop(name: "sigpipe-test")
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<(Int, Int32), Never>) in
            loop.execute { _ in
                var fds: [Int32] = [0, 0]
                guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else {
                    continuation.resume(returning: (-2, errno))
                    return
                }
                close(fds[1])
                let byte: [UInt8] = [0x41]
                // write(2), as OpenSSL's socket BIO writes: without SIGPIPE blocked here, this ends the test process.
                let written = byte.withUnsafeBytes { write(fds[0], $0.baseAddress, 1) }
                let error = errno
                close(fds[0])
                continuation.resume(returning: (written, error))
            }
        }
        #expect(result.0 == -1)
        #expect(result.1 == EPIPE)
        loop.shutdown()
        await loop.join()
    }
}
