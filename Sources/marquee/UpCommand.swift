import Dispatch
import Foundation
import MarqueeCore
import Observability
import Synchronization

/// `marquee up`: the local all-in-one. Runs and supervises the APNs and FCM simulators (unless
/// `MARQUEE_SIMULATORS=off`), the API and `MARQUEE_WORKERS` worker processes. A child that dies is restarted with
/// backoff; SIGINT or SIGTERM stops them all (SIGTERM, then SIGKILL after the drain timeout).
struct UpCommand {
    init(arguments: [String]) throws {
        if let first = arguments.first { throw UsageError("up: unknown option '\(first)'") }
    }

    struct Child {
        var name: String
        var arguments: [String]
        var environment: [String: String]
        var pid: pid_t = 0
        var restarts = 0
        var startedAt = Date()
    }

    func run() async throws {
        let configuration = try Startup.configuration()
        let logger = Startup.logger("marquee.up", configuration)
        _ = try configuration.requireDatabaseURL()
        let environment = ProcessInfo.processInfo.environment
        let dataDir = environment["MARQUEE_DATA_DIR"] ?? ".data"
        try FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        let simulators = (environment["MARQUEE_SIMULATORS"] ?? "on") != "off"
        let binary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().path

        var children: [Child] = []
        var workerEnvironment: [String: String] = [:]
        var serveEnvironment: [String: String] = [:]
        if simulators {
            // Credentials may point at the simulators: their host:port join the operator's (or the default) list.
            let simulatorHosts = [
                environment["MARQUEE_SIM_APNS_LISTEN"] ?? "127.0.0.1:2197",
                environment["MARQUEE_SIM_FCM_LISTEN"] ?? "127.0.0.1:2198",
            ].map { $0.hasPrefix(":") ? "127.0.0.1" + $0 : $0 }  // `:port` listens on every interface, loopback too
            // A malformed operator value is passed on as is: serve and worker then refuse it, naming the variable.
            let hosts =
                (environment["MARQUEE_PROVIDER_HOSTS"] ?? ProviderHosts.standard.description) + ","
                + simulatorHosts.joined(separator: ",")
            serveEnvironment["MARQUEE_PROVIDER_HOSTS"] = hosts
            workerEnvironment["MARQUEE_PROVIDER_HOSTS"] = hosts
            let ca = dataDir + "/sim-ca.pem"
            children.append(
                Child(
                    name: "simulate-apns", arguments: ["simulate", "apns"],
                    environment: [
                        "MARQUEE_SIM_LISTEN": environment["MARQUEE_SIM_APNS_LISTEN"] ?? "127.0.0.1:2197",
                        "MARQUEE_SIM_CA_OUT": ca, "MARQUEE_SIM_RECORDS": dataDir + "/apns-pushes.jsonl",
                        "MARQUEE_SIM_KEYS": dataDir + "/apns-keys.json",
                    ]))
            children.append(
                Child(
                    name: "simulate-fcm", arguments: ["simulate", "fcm"],
                    environment: [
                        "MARQUEE_SIM_LISTEN": environment["MARQUEE_SIM_FCM_LISTEN"] ?? "127.0.0.1:2198",
                        "MARQUEE_SIM_CA_OUT": dataDir + "/sim-ca-fcm.pem",
                        "MARQUEE_SIM_RECORDS": dataDir + "/fcm-messages.jsonl",
                        "MARQUEE_SIM_KEYS": dataDir + "/fcm-keys.json",
                    ]))
            // Workers trust both simulators' CAs: one bundle, written once both exist (see Supervisor.run).
            workerEnvironment["MARQUEE_CA_FILE"] = dataDir + "/sim-ca-bundle.pem"
            // serve too: it creates and deletes broadcast channels at the APNs simulator.
            serveEnvironment["MARQUEE_CA_FILE"] = dataDir + "/sim-ca-bundle.pem"
        }
        children.append(Child(name: "serve", arguments: ["serve"], environment: serveEnvironment))
        for i in 0..<configuration.workers {
            var env = workerEnvironment
            env["MARQUEE_METRICS_LISTEN"] =
                "\(configuration.metricsListen.host):\(configuration.metricsListen.port + i)"
            children.append(Child(name: "worker-\(i + 1)", arguments: ["worker"], environment: env))
        }

        let bundle: (output: String, parts: [String])? =
            simulators
            ? (dataDir + "/sim-ca-bundle.pem", [dataDir + "/sim-ca.pem", dataDir + "/sim-ca-fcm.pem"]) : nil
        let supervisor = Supervisor(binary: binary, children: children, caBundle: bundle, logger: logger)
        try await supervisor.run(drainTimeout: .seconds(configuration.drainTimeoutSeconds + 5))
    }
}

/// Spawns children, restarts the ones that die (backoff 1 s doubling to 30 s, reset after a minute up), and stops
/// them all on SIGINT/SIGTERM.
final class Supervisor: Sendable {
    private let binary: String
    private let logger: Logger
    private let state: Mutex<[UpCommand.Child]>
    private let stopping = Atomic<Bool>(false)
    private let caBundle: (output: String, parts: [String])?

    init(binary: String, children: [UpCommand.Child], caBundle: (output: String, parts: [String])?, logger: Logger) {
        self.binary = binary
        self.logger = logger
        self.state = Mutex(children)
        self.caBundle = caBundle
    }

    func run(drainTimeout: Duration) async throws {
        for sig in [SIGINT, SIGTERM] { signal(sig, SIG_IGN) }
        let names = state.withLock { $0.map(\.name) }
        // Simulators first; the others once the simulators' CA certificates exist (workers must trust them).
        let fm = FileManager.default
        if let caBundle {
            // Stale files from an earlier run must not pass for this run's certificates.
            try? fm.removeItem(atPath: caBundle.output)
            for part in caBundle.parts { try? fm.removeItem(atPath: part) }
        }
        for (index, name) in names.enumerated() where name.hasPrefix("simulate-") { try spawn(index) }
        if let caBundle {
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, !caBundle.parts.allSatisfy({ fm.fileExists(atPath: $0) }) {
                try await Task.sleep(for: .milliseconds(50))
            }
            let pems = caBundle.parts.compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }
            try pems.joined(separator: "\n").write(toFile: caBundle.output, atomically: true, encoding: .utf8)
        }
        for (index, name) in names.enumerated() where !name.hasPrefix("simulate-") { try spawn(index) }
        let (signals, continuation) = AsyncStream<Int32>.makeStream()
        let sources = [SIGINT, SIGTERM].map { sig -> any DispatchSourceSignal in
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            return source
        }
        defer { for source in sources { source.cancel() } }

        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.reap() }
            for await sig in signals {
                logger.notice("stopping everything", metadata: ["signal": .int(Int(sig))])
                stopping.store(true, ordering: .sequentiallyConsistent)
                break
            }
            let pids = state.withLock { $0.map(\.pid).filter { $0 > 0 } }
            for pid in pids { kill(pid, SIGTERM) }
            let deadline = ContinuousClock.now + drainTimeout
            while ContinuousClock.now < deadline, state.withLock({ $0.contains { $0.pid > 0 } }) {
                try? await Task.sleep(for: .milliseconds(100))
            }
            for pid in state.withLock({ $0.map(\.pid).filter { $0 > 0 } }) { kill(pid, SIGKILL) }
            while state.withLock({ $0.contains { $0.pid > 0 } }) { try? await Task.sleep(for: .milliseconds(50)) }
            group.cancelAll()
        }
        logger.info("all processes stopped")
    }

    private func spawn(_ index: Int) throws {
        let child = state.withLock { $0[index] }
        var env = ProcessInfo.processInfo.environment
        env.merge(child.environment) { _, new in new }
        let argv = ([binary] + child.arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        // Children start with default signal handling and nothing blocked: restarts are spawned from Dispatch
        // threads, whose blocked signals a child would otherwise inherit (and then ignore SIGTERM).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in [SIGTERM, SIGINT, SIGPIPE] { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        // Each child in its own process group: a Ctrl-C in the terminal reaches only `up`, which then asks every
        // child once (SIGTERM). A second signal would make a child skip its drain.
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
        // Only stdin, stdout and stderr are inherited: no socket or pipe `up` happens to hold stays open in a child.
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        _ = spawnActionsAddCloseFrom(&actions, 3)
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, binary, &actions, &attributes, argv, envp)
        guard rc == 0 else { throw UsageError("could not start \(child.name): error \(rc)") }
        state.withLock {
            $0[index].pid = pid
            $0[index].startedAt = Date()
        }
        logger.info("started", metadata: ["process": .string(child.name), "pid": .int(Int(pid))])
    }

    /// Waits for children to exit (on a Dispatch thread) and restarts them unless stopping. The blocking `waitpid` runs
    /// on a serial queue of its own (an overcommitting thread), not `DispatchQueue.global()`, whose threads (one per
    /// core) on Linux also run every Swift task: it would hold one of them for as long as the children run.
    private func reap() async {
        let waiter = DispatchQueue(label: "marquee.up.waitpid")
        while true {
            let (pid, status) = await withCheckedContinuation { continuation in
                waiter.async {
                    var raw: Int32 = 0
                    var pid: pid_t
                    repeat { pid = waitpid(-1, &raw, 0) } while pid == -1 && errno == EINTR
                    continuation.resume(returning: (pid, raw))
                }
            }
            if pid <= 0 {
                // No child right now (all between restarts, or all stopped).
                if stopping.load(ordering: .sequentiallyConsistent) { return }
                try? await Task.sleep(for: .milliseconds(200))
                continue
            }
            guard let index = state.withLock({ $0.firstIndex { $0.pid == pid } }) else { continue }
            let child = state.withLock { children in
                children[index].pid = 0
                return children[index]
            }
            let code = status & 0x7F == 0 ? Int((status >> 8) & 0xFF) : 128 + Int(status & 0x7F)
            if stopping.load(ordering: .sequentiallyConsistent) {
                logger.info("stopped", metadata: ["process": .string(child.name), "exit": .int(code)])
                if state.withLock({ $0.allSatisfy { $0.pid == 0 } }) { return }
                continue
            }
            let upFor = Date().timeIntervalSince(child.startedAt)
            let restarts = upFor > 60 ? 0 : child.restarts + 1
            let delay = min(30.0, pow(2, Double(max(restarts - 1, 0))))
            logger.error(
                "process exited; restarting",
                metadata: [
                    "process": .string(child.name), "exit": .int(code), "restart.in_s": .double(delay),
                    "restarts": .int(restarts),
                ])
            state.withLock { $0[index].restarts = restarts }
            let supervisor = self
            DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
                guard !supervisor.stopping.load(ordering: .sequentiallyConsistent) else { return }
                try? supervisor.spawn(index)
            }
        }
    }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not export.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func spawnActionsAddCloseFrom(
    _ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32
) -> Int32
