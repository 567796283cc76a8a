import Foundation

/// The result of running a local command-line tool.
struct CommandResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs `executable` with `arguments`, capturing output through files so large output can never deadlock a pipe.
///
/// posix_spawn and `waitpid` rather than Foundation's `Process`: `waitUntilExit` was seen to hang on Linux while many
/// tests run, and these synchronous tests run on the cooperative pool, so two hung waits stalled the whole suite.
func runCommand(_ executable: String, _ arguments: [String]) throws -> CommandResult {
    let directory = try TemporaryDirectory()
    let outPath = directory.url.appendingPathComponent("stdout").path
    let errPath = directory.url.appendingPathComponent("stderr").path
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    _ = spawnActionsAddCloseFrom(&actions, 3)
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard rc == 0 else {
        throw CocoaError(.executableLoad, userInfo: [NSFilePathErrorKey: executable, "errno": rc])
    }
    var raw: Int32 = 0
    while waitpid(pid, &raw, 0) == -1 && errno == EINTR {}
    let exited = raw & 0x7f == 0
    return CommandResult(
        status: exited ? (raw >> 8) & 0xff : 128 + (raw & 0x7f),
        stdout: (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "",
        stderr: (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not export.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func spawnActionsAddCloseFrom(
    _ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32
) -> Int32

/// Runs the `openssl` command-line tool.
func openssl(_ arguments: String...) throws -> CommandResult {
    try runCommand("/usr/bin/openssl", arguments)
}

/// A fresh directory under the system temp directory, removed on deinit.
final class TemporaryDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("crypto-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit {
        try? FileManager.default.removeItem(at: url)
    }

    /// Writes `bytes` to `name` inside the directory and returns its path.
    @discardableResult
    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let path = url.appendingPathComponent(name).path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// Writes `text` as UTF-8 to `name` inside the directory and returns its path.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        try write(name, Array(text.utf8))
    }

    /// The path of `name` inside the directory.
    func path(_ name: String) -> String {
        url.appendingPathComponent(name).path
    }

    /// Reads `name` inside the directory as UTF-8.
    func read(_ name: String) throws -> String {
        try String(contentsOf: url.appendingPathComponent(name), encoding: .utf8)
    }
}

/// A small DER codec for ECDSA signatures, written independently of the module under test so the tests do not
/// check the module's conversion against itself.
enum TestDER {
    /// Encodes raw `R || S` (32 + 32 bytes) as a DER `SEQUENCE { INTEGER r, INTEGER s }`.
    static func ecdsaSignature(raw: [UInt8]) -> [UInt8] {
        precondition(raw.count == 64)
        func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            var value = Array(bytes.drop { $0 == 0 })
            if value.isEmpty { value = [0] }
            if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
            return [0x02, UInt8(value.count)] + value
        }
        let body = integer(raw[0..<32]) + integer(raw[32..<64])
        return [0x30, UInt8(body.count)] + body
    }

    /// Decodes a DER ECDSA signature (short-form lengths, as every P-256 signature has) into raw `R || S`.
    static func rawSignature(der: [UInt8]) -> [UInt8]? {
        guard der.count >= 8, der[0] == 0x30, Int(der[1]) == der.count - 2 else { return nil }
        var index = 2
        var out: [UInt8] = []
        for _ in 0..<2 {
            guard index + 2 <= der.count, der[index] == 0x02 else { return nil }
            let length = Int(der[index + 1])
            guard index + 2 + length <= der.count else { return nil }
            var value = Array(der[(index + 2)..<(index + 2 + length)].drop { $0 == 0 })
            guard value.count <= 32 else { return nil }
            value = [UInt8](repeating: 0, count: 32 - value.count) + value
            out += value
            index += 2 + length
        }
        return index == der.count ? out : nil
    }
}

/// Decodes one base64url JWT segment into a JSON object with Foundation alone, independently of the module.
func decodeSegment(_ segment: Substring) -> [String: Any]? {
    var base64 = segment.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while base64.count % 4 != 0 { base64 += "=" }
    guard let data = Data(base64Encoded: base64) else { return nil }
    return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
}

/// Whether `python3` can import `module` (checked once per module name, without installing anything).
func pythonCanImport(_ module: String) -> Bool {
    (try? runCommand("/usr/bin/env", ["python3", "-c", "import \(module)"]).status) == 0
}

let pythonHasPyJWT = pythonCanImport("jwt")
let pythonHasCryptography = pythonCanImport("cryptography")
