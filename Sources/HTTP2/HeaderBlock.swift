import CNGHTTP2

/// A header list laid out in one byte buffer, ready to be handed to nghttp2 as `nghttp2_nv` entries.
///
/// Built once per request (by the sender, off the loop thread) or response, with one allocation: each field is its
/// name's and value's lengths (4 bytes each, native order) followed by the name and value bytes. Regular header names
/// are lower-cased byte by byte, which for ASCII names (the usual case) gives the bytes of `String.lowercased()`
/// without a string per name; a list with any other name goes through `lowercased()` itself.
struct HeaderBlock: Sendable {
    private let storage: [UInt8]
    /// Number of fields.
    let count: Int

    private static let lengthSize = MemoryLayout<UInt32>.size

    /// A block of `fields` as they are (no case change).
    init(_ fields: [(String, String)]) {
        (storage, count) = Self.layout(
            fixedSize: fields.reduce(0) { $0 + Self.fieldSize($1.0, $1.1) }, headers: [], contentLength: nil
        ) { writer in
            for (name, value) in fields { writer.field(name, value, lowercasing: false) }
        }
    }

    /// The header list of a client request: the four pseudo-headers, the request's headers with lower-case names, and
    /// `content-length` when there is a body and the request does not set one.
    init(request: HTTP2Request, authority: String) {
        let fixedSize =
            Self.fieldSize(":method", request.method) + Self.fieldSize(":scheme", "https")
            + Self.fieldSize(":authority", authority) + Self.fieldSize(":path", request.path)
        (storage, count) = Self.layout(
            fixedSize: fixedSize, headers: request.headers,
            contentLength: request.body.isEmpty ? nil : String(request.body.count)
        ) { writer in
            writer.field(":method", request.method, lowercasing: false)
            writer.field(":scheme", "https", lowercasing: false)
            writer.field(":authority", authority, lowercasing: false)
            writer.field(":path", request.path, lowercasing: false)
        }
    }

    /// The header list of a server response: `:status`, the headers with lower-case names, and `content-length`
    /// unless the headers set one.
    init(status: Int, headers: [(String, String)], bodyCount: Int) {
        let status = String(status)
        (storage, count) = Self.layout(
            fixedSize: Self.fieldSize(":status", status), headers: headers, contentLength: String(bodyCount)
        ) { writer in
            writer.field(":status", status, lowercasing: false)
        }
    }

    /// The fields in order (for tests and diagnostics).
    var fields: [(String, String)] {
        var fields: [(String, String)] = []
        forEachField { name, value in
            fields.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
        return fields
    }

    /// Runs `body` with the fields as an `nghttp2_nv` array (nghttp2 copies names and values while submitting).
    func withNameValues<R>(_ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(count, 1)) { entries in
            var index = 0
            let flags = UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)
            forEachField { name, value in
                entries.initializeElement(
                    at: index,
                    to: nghttp2_nv(
                        name: UnsafeMutablePointer(mutating: name.baseAddress!),
                        value: UnsafeMutablePointer(mutating: value.baseAddress!), namelen: name.count,
                        valuelen: value.count, flags: flags))
                index += 1
            }
            return body(UnsafePointer(entries.baseAddress!), index)
        }
    }

    /// Calls `body` with each field's name and value bytes, in order. The buffers live only during the call of
    /// `forEachField` (they point into `storage`).
    private func forEachField(_ body: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>) -> Void) {
        storage.withUnsafeBytes { raw in
            var at = 0
            while at < raw.count {
                let nameLength = Int(raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))
                let valueLength = Int(raw.loadUnaligned(fromByteOffset: at + Self.lengthSize, as: UInt32.self))
                let name = raw.baseAddress! + at + 2 * Self.lengthSize
                body(
                    UnsafeBufferPointer(start: name.assumingMemoryBound(to: UInt8.self), count: nameLength),
                    UnsafeBufferPointer(
                        start: (name + nameLength).assumingMemoryBound(to: UInt8.self), count: valueLength))
                at += 2 * Self.lengthSize + nameLength + valueLength
            }
        }
    }

    /// The bytes a field takes in `storage`.
    private static func fieldSize(_ name: String, _ value: String) -> Int {
        2 * lengthSize + name.utf8.count + value.utf8.count
    }

    /// Lays out the fields `writeFixed` writes (`fixedSize` bytes, as they are), then `headers` with lower-case names,
    /// then `content-length: contentLength` when `contentLength` is set and no name in `headers` is `content-length`.
    /// `namesLowercased`: the names already went through `lowercased()`.
    private static func layout(
        fixedSize: Int, headers: [(String, String)], contentLength: String?, namesLowercased: Bool = false,
        writeFixed: (inout Writer) -> Void
    ) -> ([UInt8], Int) {
        var size = fixedSize + fieldSize("content-length", contentLength ?? "")
        for (name, value) in headers { size += fieldSize(name, value) }
        var ascii = true
        var count = 0
        let storage = [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            var writer = Writer(base: buffer.baseAddress!)
            writeFixed(&writer)
            var hasContentLength = false
            for (name, value) in headers {
                guard let isContentLength = writer.field(name, value, lowercasing: !namesLowercased) else {
                    ascii = false
                    break
                }
                hasContentLength = hasContentLength || isContentLength
            }
            if ascii, let contentLength, !hasContentLength {
                writer.field("content-length", contentLength, lowercasing: false)
            }
            initialized = writer.at
            count = writer.fields
        }
        if ascii { return (storage, count) }
        // A name with other characters than ASCII (which HTTP/2 does not allow anyway): lower-case every name the
        // long way.
        return layout(
            fixedSize: fixedSize, headers: headers.map { ($0.0.lowercased(), $0.1) }, contentLength: contentLength,
            namesLowercased: true, writeFixed: writeFixed)
    }

    /// Writes fields into a buffer known to be large enough.
    private struct Writer {
        let base: UnsafeMutablePointer<UInt8>
        var at = 0
        var fields = 0

        /// Writes one field and returns whether its name is `content-length`. With `lowercasing`, lower-cases the
        /// name's ASCII letters, or returns `nil` (leaving the field half written) when the name is not ASCII.
        @discardableResult
        mutating func field(_ name: String, _ value: String, lowercasing: Bool) -> Bool? {
            let start = at
            at += 2 * HeaderBlock.lengthSize
            let nameStart = at
            copy(name)
            if lowercasing {
                for index in nameStart..<at {
                    let byte = base[index]
                    if byte >= 0x80 { return nil }
                    if byte &- UInt8(ascii: "A") < 26 { base[index] = byte | 0x20 }
                }
            }
            let isContentLength =
                at - nameStart == HeaderBlock.contentLengthName.count
                && UnsafeBufferPointer(start: base + nameStart, count: at - nameStart).elementsEqual(
                    HeaderBlock.contentLengthName)
            let nameLength = at - nameStart
            copy(value)
            let valueLength = at - nameStart - nameLength
            UnsafeMutableRawPointer(base + start).storeBytes(of: UInt32(nameLength), as: UInt32.self)
            UnsafeMutableRawPointer(base + start + HeaderBlock.lengthSize).storeBytes(
                of: UInt32(valueLength), as: UInt32.self)
            fields += 1
            return isContentLength
        }

        private mutating func copy(_ text: String) {
            let copied: Void? = text.utf8.withContiguousStorageIfAvailable { bytes in
                if let source = bytes.baseAddress { (base + at).update(from: source, count: bytes.count) }
                at += bytes.count
            }
            if copied == nil {
                for byte in text.utf8 {
                    base[at] = byte
                    at += 1
                }
            }
        }
    }

    private static let contentLengthName = Array("content-length".utf8)
}

/// `name.lowercased()`, returning `name` itself (no new string) when it is ASCII without upper-case letters.
func lowercasedHeaderName(_ name: String) -> String {
    name.utf8.contains { $0 &- UInt8(ascii: "A") < 26 || $0 >= 0x80 } ? name.lowercased() : name
}
