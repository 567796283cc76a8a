import HTTPServer
import PostgresClient
import ProcessLifecycle

// The wire modules know nothing of ProcessLifecycle: their `run()` returns when cancelled (or, for the HTTP server,
// on `requestStop()`). These adapt them to graceful shutdown.

extension HTTPServer {
    /// Serves until graceful shutdown begins, then drains in-flight requests (`run()` returns once drained).
    var service: ClosureService {
        ClosureService {
            try await withGracefulShutdownHandler {
                try await self.run()
            } onGracefulShutdown: {
                self.requestStop()
            }
        }
    }
}

extension PostgresPool {
    /// The pool's maintenance loop, stopped by graceful shutdown; the pool itself stays usable until it is closed.
    var service: CancellingService { CancellingService { try await self.run() } }
}
