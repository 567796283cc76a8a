import HTTP2
import Synchronization

/// One HTTP/2 client pool per provider host, opened on first use, shared by every tenant sending to that host.
final class ProviderConnections: Sendable {
    private let caFile: String?
    private let connectionsPerHost: Int
    private let requestTimeout: Duration
    private let clients = Mutex<[String: HTTP2Client]>([:])

    init(caFile: String?, connectionsPerHost: Int, requestTimeout: Duration) {
        self.caFile = caFile
        self.connectionsPerHost = connectionsPerHost
        self.requestTimeout = requestTimeout
    }

    func client(host: String, port: Int) throws -> HTTP2Client {
        let key = "\(host):\(port)"
        return try clients.withLock { clients in
            if let client = clients[key] { return client }
            let client = try HTTP2Client(
                .init(
                    host: host, port: port, tls: TLSClientConfiguration(caFile: caFile),
                    connections: connectionsPerHost,
                    requestTimeout: requestTimeout))
            clients[key] = client
            return client
        }
    }

    /// Open connections and streams in flight across hosts.
    var statistics: (connections: Int, streams: Int) {
        clients.withLock { clients in
            clients.values.reduce((0, 0)) { sum, client in
                let s = client.statistics
                return (sum.0 + s.openConnections, sum.1 + s.activeStreams)
            }
        }
    }

    /// Closes every pool after its in-flight requests finish.
    func shutdown() async {
        let all = clients.withLock { clients in
            defer { clients.removeAll() }
            return Array(clients.values)
        }
        for client in all { await client.shutdown() }
    }
}
