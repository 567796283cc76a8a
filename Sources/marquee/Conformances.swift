import HTTPServer
import PostgresClient
import ServiceLifecycle

// The wire modules know nothing of ServiceLifecycle; their `run()` already has the Service contract.
extension PostgresPool: Service {}
extension HTTPServer: Service {}
