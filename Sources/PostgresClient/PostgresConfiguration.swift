import CLibPQ
import Foundation

/// How to reach a PostgreSQL server: a parsed connection string plus a few settings this library manages.
///
/// Every connection made from a configuration uses `client_encoding=UTF8`, `TimeZone=UTC` and `DateStyle=ISO`,
/// which the value decoders rely on.
public struct PostgresConfiguration: Sendable, CustomStringConvertible {
    struct Parameter: Sendable, Equatable {
        var key: String
        var value: String
    }

    /// Connection parameters as libpq keywords (without `connect_timeout` and `application_name`).
    var parameters: [Parameter]

    /// How long establishing a connection may take. Default 3 s, or the string's `connect_timeout`.
    /// libpq works in whole seconds and treats values below 2 s as 2 s.
    public var connectTimeout: Duration

    /// Reported to the server as `application_name` (visible in `pg_stat_activity`).
    public var applicationName: String?

    /// Server settings applied when each connection starts, as `-c name=value` options (e.g. `role`: the session's
    /// role, which transaction-local `SET ROLE`s return to). Names and values must not contain spaces.
    public var startupSettings: [String: String] = [:]

    /// Receives server notices (e.g. `NOTICE: relation already exists`). Default: notices are dropped.
    public var noticeHandler: (@Sendable (String) -> Void)?

    /// Parses a URI (`postgresql://user@host:5432/db?sslmode=disable`) or a `key=value` conninfo string.
    ///
    /// - Throws: `PostgresError` with code `.invalidConfiguration` if libpq cannot parse it.
    public init(url: String) throws {
        let trimmed = url.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty else {
            throw PostgresError(code: .invalidConfiguration, context: "empty connection string")
        }
        var errorMessage: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(trimmed, &errorMessage) else {
            var message = "unparsable connection string"
            if let errorMessage {
                message = String(cString: errorMessage)
                PQfreemem(errorMessage)
            }
            throw PostgresError(
                code: .invalidConfiguration, context: "connection string rejected by libpq",
                underlying: message.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        defer { PQconninfoFree(options) }

        var parameters: [Parameter] = []
        var timeout = Duration.seconds(3)
        var application: String?
        var index = 0
        while let keyword = options[index].keyword {
            defer { index += 1 }
            guard let rawValue = options[index].val else { continue }
            let key = String(cString: keyword)
            let value = String(cString: rawValue)
            switch key {
            case "connect_timeout":
                guard let seconds = Int(value.trimmingCharacters(in: .whitespaces)) else {
                    throw PostgresError(code: .invalidConfiguration, context: "connect_timeout is not an integer")
                }
                timeout = .seconds(seconds)
            case "application_name":
                application = value
            case "port":
                let ports = value.split(separator: ",", omittingEmptySubsequences: false)
                guard ports.allSatisfy({ port in port.isEmpty || UInt16(port) != nil }) else {
                    throw PostgresError(code: .invalidConfiguration, context: "port is not a number")
                }
                parameters.append(Parameter(key: key, value: value))
            default:
                parameters.append(Parameter(key: key, value: value))
            }
        }
        self.parameters = parameters
        self.connectTimeout = timeout
        self.applicationName = application
    }

    /// The `host` parameter, if given.
    public var host: String? { value(for: "host") ?? value(for: "hostaddr") }
    /// The `port` parameter, if given.
    public var port: String? { value(for: "port") }
    /// The `dbname` parameter, if given.
    public var database: String? { value(for: "dbname") }
    /// The `user` parameter, if given.
    public var user: String? { value(for: "user") }

    func value(for key: String) -> String? {
        parameters.first { $0.key == key }?.value
    }

    /// Host, port, database and user only; never the password.
    public var description: String {
        "PostgresConfiguration(host: \(host ?? "default"), port: \(port ?? "default"), "
            + "database: \(database ?? "default"), user: \(user ?? "default"))"
    }

    /// libpq's TCP settings that find a dead peer (ignored on Unix-domain sockets): a probe after 10 s idle, every
    /// 5 s, 3 unanswered end the connection; data unacknowledged for 30 s ends it.
    static let deadPeerDefaults: [(String, String)] = [
        ("keepalives", "1"), ("keepalives_idle", "10"), ("keepalives_interval", "5"), ("keepalives_count", "3"),
        ("tcp_user_timeout", "30000"),
    ]

    /// The keyword/value pairs handed to `PQconnectdbParams`.
    func connectionParameters() -> [Parameter] {
        var result = parameters.filter { $0.key != "client_encoding" && $0.key != "options" }
        let (seconds, attoseconds) = connectTimeout.components
        let wholeSeconds = max(1, seconds + (attoseconds > 0 ? 1 : 0))
        result.append(Parameter(key: "connect_timeout", value: String(wholeSeconds)))
        if let applicationName {
            result.append(Parameter(key: "application_name", value: applicationName))
        }
        // A peer gone without a word (a failover, a lost VM, a partition) leaves a half-open socket: every call here
        // blocks in libpq, and a statement sent into it hangs for the kernel's retransmission limit (~15 min) or, if
        // already acknowledged, until the system's keepalive (~2 h), which statement_timeout (server side) cannot
        // end. Keepalives and TCP_USER_TIMEOUT bound both to about 30 s, unless the URL sets them.
        for (key, value) in Self.deadPeerDefaults where self.value(for: key) == nil {
            result.append(Parameter(key: key, value: value))
        }
        result.append(Parameter(key: "client_encoding", value: "UTF8"))
        var options = value(for: "options") ?? ""
        if !options.isEmpty {
            options += " "
        }
        options += "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=iso_8601"
        for (name, value) in startupSettings.sorted(by: { $0.key < $1.key }) {
            options += " -c \(name)=\(value)"
        }
        result.append(Parameter(key: "options", value: options))
        return result
    }
}
