internal import CNghttp2

#if canImport(Glibc)
    import Glibc
#endif

/// Header fields packed back to back in one byte buffer: `[flags][name length: UInt16][value length: UInt16][name]
/// [value]` per field. A response's headers cost one allocation in all, requests of one kind share one block built
/// once (each with its own path apart, `HTTP2Path`), and nghttp2 gets pointers into the buffer without a copy per
/// field. Names go out as given (a request's are lent to nghttp2, which then does not lower-case them): HTTP/2
/// wants them in lower case, which every caller writes.
public struct HTTP2HeaderBlock: Sendable, Equatable {
    fileprivate var bytes: [UInt8] = []
    public private(set) var count = 0
    private static let recordHeader = 5
    private static let neverIndexed: UInt8 = 1

    public init(capacity: Int = 512) {
        reserveCapacity(capacity)
    }

    /// Room for `byteCount` bytes of records (each is 5 bytes, then its name and value).
    public mutating func reserveCapacity(_ byteCount: Int) {
        bytes.reserveCapacity(byteCount)
    }

    /// A request's pseudo-header fields, which HTTP/2 requires first.
    public static func request(method: String, scheme: String = "https", authority: String, path: String) -> Self {
        var block = HTTP2HeaderBlock()
        block.add(":method", method)
        block.add(":scheme", scheme)
        block.add(":authority", authority)
        block.add(":path", path, indexed: false)
        return block
    }

    /// `indexed: false` for values that are new with every message (a device token's path, an apns-id): HPACK then
    /// sends them as never-indexed literals instead of filling the connection's header table with entries no later
    /// message will use, which would push out the ones every message does use (the provider token, the topic).
    /// Names and values longer than 65,535 bytes are cut there (no HTTP/2 peer accepts such a field anyway).
    public mutating func add(_ name: String, _ value: String, indexed: Bool = true) {
        var name = name
        var value = value
        name.withUTF8 { nameBytes in value.withUTF8 { valueBytes in add(raw: nameBytes, valueBytes, indexed: indexed) }
        }
    }

    /// The same from bytes (the receiving side, straight from nghttp2's buffers).
    public mutating func add(
        raw name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>, indexed: Bool = true
    ) {
        let nameLength = min(name.count, 65_535)
        let valueLength = min(value.count, 65_535)
        let recordLength = Self.recordHeader + nameLength + valueLength
        count += 1
        // The record is put together first and appended in one copy: each append checks the buffer's uniqueness and
        // room, about a hundred instructions apiece, and every kept field of every answer comes this way. Records of
        // usual sizes are put together on the stack (the standard library moves large ones to the heap).
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: recordLength) { record in
            let header = Self.recordHeaderBytes(nameLength, valueLength, indexed: indexed)
            (record[0], record[1], record[2], record[3], record[4]) = header
            let base = record.baseAddress! + Self.recordHeader
            if nameLength > 0 { base.initialize(from: name.baseAddress!, count: nameLength) }
            if valueLength > 0 { (base + nameLength).initialize(from: value.baseAddress!, count: valueLength) }
            bytes.append(contentsOf: UnsafeBufferPointer(record))
        }
    }

    /// A record's five header bytes: flags, then the name's and the value's lengths (little-endian UInt16).
    private static func recordHeaderBytes(_ nameLength: Int, _ valueLength: Int, indexed: Bool)
        -> (UInt8, UInt8, UInt8, UInt8, UInt8)
    {
        (
            indexed ? 0 : neverIndexed, UInt8(truncatingIfNeeded: nameLength),
            UInt8(truncatingIfNeeded: nameLength >> 8),
            UInt8(truncatingIfNeeded: valueLength), UInt8(truncatingIfNeeded: valueLength >> 8)
        )
    }

    /// Appends every field of `other`, in one copy.
    public mutating func append(contentsOf other: HTTP2HeaderBlock) {
        bytes.append(contentsOf: other.bytes)
        count += other.count
    }

    public var byteCount: Int { bytes.count }

    /// Calls `body` with each field's name, value and whether it may be indexed, in order, until it returns false.
    func forEachRecord(_ body: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>, Bool) -> Bool) {
        bytes.withUnsafeBufferPointer { raw in
            var offset = 0
            while offset + Self.recordHeader <= raw.count {
                let indexed = raw[offset] & Self.neverIndexed == 0
                let nameLength = Int(raw[offset + 1]) | Int(raw[offset + 2]) << 8
                let valueLength = Int(raw[offset + 3]) | Int(raw[offset + 4]) << 8
                let nameStart = offset + Self.recordHeader
                let valueStart = nameStart + nameLength
                offset = valueStart + valueLength
                guard
                    body(
                        UnsafeBufferPointer(rebasing: raw[nameStart..<valueStart]),
                        UnsafeBufferPointer(rebasing: raw[valueStart..<offset]), indexed)
                else { return }
            }
        }
    }

    /// Calls `body` with each field's name and value, in order, until it returns false.
    public func forEachField(_ body: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>) -> Bool) {
        forEachRecord { name, value, _ in body(name, value) }
    }

    /// The first field named `name` (names compared as bytes; HTTP/2 names are lowercase).
    public func value(_ name: String) -> String? {
        var found: String?
        var name = name
        name.withUTF8 { wanted in
            forEachField { fieldName, fieldValue in
                guard fieldName.count == wanted.count,
                    memcmp(fieldName.baseAddress!, wanted.baseAddress!, wanted.count) == 0
                else { return true }
                found = String(decoding: fieldValue, as: UTF8.self)
                return false
            }
        }
        return found
    }

    public var fields: [HTTP2Field] {
        var result: [HTTP2Field] = []
        result.reserveCapacity(count)
        forEachRecord { name, value, indexed in
            result.append(
                HTTP2Field(
                    name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self),
                    indexed: indexed))
            return true
        }
        return result
    }

    /// `lent`: nghttp2 reads the names and values where they are, when it sends the HEADERS frame, instead of copying
    /// them at submission (and lower-casing the names, which HTTP/2 writes in lower case anyway): only for a block
    /// whose storage stays as it is until nghttp2 has sent the frame or given up on it. `path`, if any, goes first,
    /// joined on the stack: nghttp2 copies it at submission, into the session's pooled memory.
    /// `path` (unless `isAbsent`) is borrowed where its request holds it, never copied (its two strings counted
    /// again, as the payload of an optional was).
    func withNghttp2Fields<T>(
        lent: Bool = false, path: borrowing HTTP2Path = .absent, _ body: (UnsafePointer<nghttp2_nv>, Int) -> T
    ) -> T {
        let hasPath = !path.isAbsent
        let lending = lent ? Self.lendingFlags : 0
        return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(count + (hasPath ? 1 : 0), 1)) {
            fields in
            let first = hasPath ? 1 : 0
            let count = fill(UnsafeMutableBufferPointer(rebasing: fields[first...]), lending: lending)
            return Self.withPath(path, before: fields, count: first + count, body)
        }
    }

    /// `withNghttp2Fields(lent: true, path:)`, the block's own fields taken from `cache` when it holds this very
    /// block, and read into it otherwise: requests of one kind share one block (an APNs job's, `RequestTemplate`).
    func withLentNghttp2Fields<T>(
        path: borrowing HTTP2Path, cache: inout Nghttp2FieldsCache, _ body: (UnsafePointer<nghttp2_nv>, Int) -> T
    ) -> T {
        if !cache.holds(self) { cache.read(self) }
        let first = path.isAbsent ? 0 : 1
        return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(cache.fields.count + first, 1)) {
            fields in
            cache.fields.withUnsafeBufferPointer { cached in
                guard let start = cached.baseAddress else { return }
                (fields.baseAddress! + first).initialize(from: start, count: cached.count)
            }
            return Self.withPath(path, before: fields, count: first + cache.fields.count, body)
        }
    }

    fileprivate static let lendingFlags = UInt8(
        NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue | NGHTTP2_NV_FLAG_NO_COPY_VALUE.rawValue)

    /// `body` with `fields`, whose first is set to `path` here unless it is absent (then they start with the block's).
    private static func withPath<T>(
        _ path: borrowing HTTP2Path, before fields: UnsafeMutableBufferPointer<nghttp2_nv>, count: Int,
        _ body: (UnsafePointer<nghttp2_nv>, Int) -> T
    ) -> T {
        guard !path.isAbsent else { return body(UnsafePointer(fields.baseAddress!), count) }
        return path.withJoinedBytes { value in
            fields[0] = nghttp2_nv(
                name: UnsafeMutablePointer(mutating: HTTP2Path.name.utf8Start),
                value: UnsafeMutablePointer(mutating: value.baseAddress ?? UnsafePointer(bitPattern: 1)!),
                namelen: HTTP2Path.name.utf8CodeUnitCount, valuelen: value.count,
                flags: UInt8(NGHTTP2_NV_FLAG_NO_INDEX.rawValue | NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue))
            return body(UnsafePointer(fields.baseAddress!), count)
        }
    }

    /// Writes the block's fields into `fields` (room for `count` of them), pointing into its bytes; returns how many.
    fileprivate func fill(_ fields: UnsafeMutableBufferPointer<nghttp2_nv>, lending: UInt8) -> Int {
        var index = 0
        forEachRecord { name, value, indexed in
            // nghttp2 only reads the fields; its C API merely lacks const on these pointers.
            fields[index] = nghttp2_nv(
                name: UnsafeMutablePointer(mutating: name.baseAddress ?? UnsafePointer(bitPattern: 1)!),
                value: UnsafeMutablePointer(mutating: value.baseAddress ?? UnsafePointer(bitPattern: 1)!),
                namelen: name.count, valuelen: value.count,
                flags: UInt8((indexed ? NGHTTP2_NV_FLAG_NONE : NGHTTP2_NV_FLAG_NO_INDEX).rawValue) | lending)
            index += 1
            return true
        }
        return index
    }
}

/// The nghttp2 fields of the header block a connection lent last (`HTTP2HeaderBlock.withLentNghttp2Fields`), read
/// once for the requests that share the block rather than record by record for each. The copy of the block kept
/// here holds the block's buffer, which the fields point into: a block whose bytes are in that buffer is that block,
/// unchanged (an array is copied before it changes), and the buffer cannot be freed and reused while kept.
struct Nghttp2FieldsCache {
    fileprivate private(set) var fields: [nghttp2_nv] = []
    private var bytes: [UInt8] = []

    fileprivate func holds(_ block: HTTP2HeaderBlock) -> Bool {
        guard !bytes.isEmpty, block.bytes.count == bytes.count else { return false }
        return block.bytes.withUnsafeBufferPointer { theirs in
            bytes.withUnsafeBufferPointer { ours in theirs.baseAddress == ours.baseAddress }
        }
    }

    fileprivate mutating func read(_ block: HTTP2HeaderBlock) {
        bytes = block.bytes
        fields = Array(unsafeUninitializedCapacity: block.count) { buffer, initialized in
            initialized = block.fill(buffer, lending: HTTP2HeaderBlock.lendingFlags)
        }
    }
}

public struct HTTP2Field: Sendable, Equatable, CustomStringConvertible {
    public var name: String
    public var value: String
    /// False for a value new with every message: sent as a never-indexed HPACK literal (see `HTTP2HeaderBlock`).
    public var indexed: Bool

    public init(name: String, value: String, indexed: Bool = true) {
        self.name = name
        self.value = value
        self.indexed = indexed
    }

    public var description: String { "\(name): \(value)" }
}

/// A request as the client sends it: its header block begins with the pseudo-header fields.
public struct HTTP2Request: Sendable {
    /// Every field, or with `path` every field but :path: then a block that many requests can share as it is.
    public var headers: HTTP2HeaderBlock
    /// :path when `headers` lacks it, sent first (pseudo-header fields may come in any order before the others).
    public var path: HTTP2Path? {
        get { ownPath.isAbsent ? nil : ownPath }
        set { ownPath = newValue ?? .absent }
    }
    /// `path` unwrapped, read in place at submission: the payload of an optional was copied there, counting its
    /// two strings again, for every request. `absent` for none.
    @usableFromInline private(set) var ownPath: HTTP2Path
    /// A slice: an APNs notification's payload is read where its job's body holds it, not copied out of it.
    public var body: ArraySlice<UInt8>
    /// UNIX seconds after which the request is not worth sending; `.infinity` (the default) for none. One whose
    /// HEADERS are not encoded yet by then (it waits for a connection, or behind the server's stream limit) is
    /// dropped and answered `sendByPassed`: never sent, so never processed.
    public var sendBy: Double

    public init(headers: HTTP2HeaderBlock, body: [UInt8]) {
        self.headers = headers
        ownPath = .absent
        self.body = body[...]
        sendBy = .infinity
    }

    /// A request whose fields other than :path are `headers`, a block that can be shared with other requests:
    /// nothing is allocated for the request's own fields (a block of its own would be an allocation per APNs
    /// notification beyond the sizes glibc keeps in its fast bins).
    /// Inlinable: made for every APNs notification in another module, where a call copied the whole request once
    /// more on its way back.
    @inlinable
    public init(headers: HTTP2HeaderBlock, path: HTTP2Path, body: ArraySlice<UInt8>, sendBy: Double = .infinity) {
        self.headers = headers
        ownPath = path
        self.body = body
        self.sendBy = sendBy
    }

    public init(headers: HTTP2HeaderBlock, path: HTTP2Path, body: [UInt8], sendBy: Double = .infinity) {
        self.init(headers: headers, path: path, body: body[...], sendBy: sendBy)
    }
}

/// A request's path as a prefix that many requests share and a part of its own (an APNs device path: "/3/device/"
/// and the token), joined only when the request is submitted, on the stack.
public struct HTTP2Path: Sendable, Equatable {
    public var prefix: String
    public var rest: String
    static let name: StaticString = ":path"
    /// No path (a request whose fields hold theirs): HTTP/2 has no empty :path.
    static let absent = HTTP2Path(prefix: "", rest: "")
    var isAbsent: Bool { prefix.isEmpty && rest.isEmpty }

    public init(prefix: String, rest: String) {
        self.prefix = prefix
        self.rest = rest
    }

    /// The joined path's bytes, valid during `body` only. Read where the strings keep them, with no copy of either.
    func withJoinedBytes<T>(_ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        let prefixCount = prefix.utf8.count
        let total = prefixCount + rest.utf8.count
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(total, 1)) { buffer in
            _ = UnsafeMutableBufferPointer(rebasing: buffer[..<prefixCount]).initialize(from: prefix.utf8)
            _ = UnsafeMutableBufferPointer(rebasing: buffer[prefixCount..<total]).initialize(from: rest.utf8)
            return body(UnsafeBufferPointer(start: buffer.baseAddress, count: total))
        }
    }
}

/// A response as the client receives it.
public struct HTTP2Response: Sendable {
    public var status: Int
    /// The fields as received, packed; `header(_:)` finds one without building the others.
    public var headerBlock: HTTP2HeaderBlock
    public var body: [UInt8]

    public init(status: Int, headers: [HTTP2Field] = [], body: [UInt8] = []) {
        var block = HTTP2HeaderBlock(capacity: 64)
        for field in headers { block.add(field.name, field.value) }
        self.init(status: status, headerBlock: block, body: body)
    }

    public init(status: Int, headerBlock: HTTP2HeaderBlock, body: [UInt8]) {
        self.status = status
        self.headerBlock = headerBlock
        self.body = body
    }

    public var headers: [HTTP2Field] { headerBlock.fields }
    public func header(_ name: String) -> String? { headerBlock.value(name) }
}

/// Why a request got no response. Every case but `reset` means the server did not act on it, or may not have:
/// the request can be sent again on another connection.
public enum HTTP2StreamError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The server refused the stream (REFUSED_STREAM, or above a GOAWAY's last-stream-id): not processed.
    case refused
    /// The server reset the stream with this HTTP/2 error code.
    case reset(code: UInt32)
    /// The connection ended before the response was complete: processed or not, nobody knows.
    case connectionLost(String)
    /// The request never left this process (no connection could be opened, or the client shut down).
    case notSent(String)
    /// No response within the request deadline.
    case timedOut
    /// Dropped before its HEADERS were encoded: its `sendBy` time came while it waited for a connection or a stream.
    /// Never sent.
    case sendByPassed

    public var description: String {
        switch self {
        case .refused: "stream refused"
        case .reset(let code): "stream reset (HTTP/2 error \(code))"
        case .connectionLost(let reason): "connection lost: \(reason)"
        case .notSent(let reason): "not sent: \(reason)"
        case .timedOut: "no response before the deadline"
        case .sendByPassed: "not sent: its send-by time passed while it waited for a connection or a stream"
        }
    }
}
