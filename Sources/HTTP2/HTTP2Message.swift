internal import CNghttp2

/// Header fields stored back to back in one byte buffer, so that a request costs one allocation for all of its
/// headers and hands nghttp2 pointers into that buffer without a copy per field.
public struct HTTP2HeaderBlock: Sendable {
    private var bytes: [UInt8] = []
    // Per field: name start, name length, value start, value length.
    private var offsets: [Int32] = []

    public init(capacity: Int = 512) {
        bytes.reserveCapacity(capacity)
        offsets.reserveCapacity(48)
    }

    /// A request's pseudo-header fields, which HTTP/2 requires first.
    public static func request(method: String, scheme: String = "https", authority: String, path: String) -> Self {
        var block = HTTP2HeaderBlock()
        block.add(":method", method)
        block.add(":scheme", scheme)
        block.add(":authority", authority)
        block.add(":path", path)
        return block
    }

    public mutating func add(_ name: String, _ value: String) {
        let nameStart = bytes.count
        bytes.append(contentsOf: name.utf8)
        let valueStart = bytes.count
        bytes.append(contentsOf: value.utf8)
        offsets.append(contentsOf: [Int32(nameStart), Int32(valueStart - nameStart), Int32(valueStart),
                                    Int32(bytes.count - valueStart)])
    }

    public var count: Int { offsets.count / 4 }

    func withNghttp2Fields<T>(_ body: (UnsafePointer<nghttp2_nv>, Int) -> T) -> T {
        let fieldCount = count
        return bytes.withUnsafeBufferPointer { raw in
            // nghttp2 copies the fields during submit; its C API merely lacks const on these pointers.
            let base = UnsafeMutablePointer(mutating: raw.baseAddress ?? UnsafePointer(bitPattern: 1)!)
            return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(fieldCount, 1)) { fields in
                for field in 0..<fieldCount {
                    let index = field * 4
                    fields[field] = nghttp2_nv(name: base + Int(offsets[index]), value: base + Int(offsets[index + 2]),
                                               namelen: Int(offsets[index + 1]), valuelen: Int(offsets[index + 3]),
                                               flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                }
                return body(UnsafePointer(fields.baseAddress!), fieldCount)
            }
        }
    }
}

public struct HTTP2Field: Sendable, Equatable, CustomStringConvertible {
    public var name: String
    public var value: String

    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }

    public var description: String { "\(name): \(value)" }
}

/// A request as the client sends it: its header block begins with the pseudo-header fields.
public struct HTTP2Request: Sendable {
    public var headers: HTTP2HeaderBlock
    public var body: [UInt8]

    public init(headers: HTTP2HeaderBlock, body: [UInt8]) {
        self.headers = headers
        self.body = body
    }
}

/// A response as the client receives it.
public struct HTTP2Response: Sendable {
    public var status: Int
    public var headers: [HTTP2Field]
    public var body: [UInt8]

    public init(status: Int, headers: [HTTP2Field] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    public func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
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

    public var description: String {
        switch self {
        case .refused: "stream refused"
        case .reset(let code): "stream reset (HTTP/2 error \(code))"
        case .connectionLost(let reason): "connection lost: \(reason)"
        case .notSent(let reason): "not sent: \(reason)"
        case .timedOut: "no response before the deadline"
        }
    }
}
