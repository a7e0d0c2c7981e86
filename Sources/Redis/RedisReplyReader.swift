internal import CHiredis

/// hiredis's reply reader (RESP), with a bound on arrays: hiredis allocates an array's element pointers as soon as it
/// reads the count, so fifteen bytes (`*2147483647\r\n`) from a broken or hostile server would ask for 16 GB. An
/// array of more than `maximumElements` makes the reader fail with a protocol error instead; the largest the worker
/// asks for (a user's tokens, a SCAN page, CLUSTER SLOTS) is far below it.
///
/// A `RedisReplyReader` owns its reader (the TLS transport feeds it what it decrypts); `bound` fits the same bound to
/// the reader inside a hiredis connection.
package final class RedisReplyReader {
    package static let maximumElements = 1 << 22

    private let reader: UnsafeMutablePointer<redisReader>

    package init?() {
        guard let reader = redisReaderCreate() else { return nil }
        Self.bound(reader)
        self.reader = reader
    }

    deinit { redisReaderFree(reader) }

    package func feed(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        _ = redisReaderFeed(reader, base.assumingMemoryBound(to: CChar.self), bytes.count)
    }

    /// The next whole reply, or nil until more bytes are fed; throws the reader's reason on bytes that are not RESP
    /// (the reader is unusable after that, as is the connection).
    package func next() throws(RedisError) -> RedisReply? {
        var raw: UnsafeMutableRawPointer?
        guard redisReaderGetReply(reader, &raw) == REDIS_OK else {
            throw RedisError(kind: .connectionLost, "unreadable reply (\(Self.reason(reader)))")
        }
        return raw.map(Self.take)
    }

    /// Makes `reader` refuse arrays of more than `maximumElements`.
    static func bound(_ reader: UnsafeMutablePointer<redisReader>) {
        reader.pointee.fn = boundedFunctions
    }

    /// Why `reader` failed, in words.
    static func reason(_ reader: UnsafeMutablePointer<redisReader>) -> String {
        if reader.pointee.err == REDIS_ERR_OOM {
            return "an array of more than \(maximumElements) elements, or out of memory"
        }
        let text = withUnsafeBytes(of: reader.pointee.errstr) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        return text.isEmpty ? "protocol error" : text
    }

    /// The reply object `raw` points at, converted; the object is freed.
    static func take(_ raw: UnsafeMutableRawPointer) -> RedisReply {
        defer { freeReplyObject(raw) }
        return convert(raw.assumingMemoryBound(to: redisReply.self))
    }

    private static func convert(_ reply: UnsafeMutablePointer<redisReply>) -> RedisReply {
        let value = reply.pointee
        func bytes() -> [UInt8] {
            guard let pointer = value.str, value.len > 0 else { return [] }
            return Array(UnsafeRawBufferPointer(start: pointer, count: Int(value.len)))
        }
        switch value.type {
        case REDIS_REPLY_STRING: return .string(bytes())
        case REDIS_REPLY_INTEGER: return .integer(value.integer)
        case REDIS_REPLY_NIL: return .null
        case REDIS_REPLY_STATUS: return .status(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ERROR: return .error(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ARRAY:
            guard let elements = value.element else { return .array([]) }
            return .array((0..<Int(value.elements)).compactMap { index in elements[index].map(convert) })
        default:
            return .null
        }
    }

    /// hiredis's own reply functions: what a new reader starts with.
    private static let hiredisFunctions: redisReplyObjectFunctions = {
        let probe = redisReaderCreate()!
        defer { redisReaderFree(probe) }
        return probe.pointee.fn.pointee
    }()

    /// The same with arrays bounded; allocated once, read by every reader, never changed.
    private nonisolated(unsafe) static let boundedFunctions: UnsafeMutablePointer<redisReplyObjectFunctions> = {
        let functions = UnsafeMutablePointer<redisReplyObjectFunctions>.allocate(capacity: 1)
        functions.initialize(to: hiredisFunctions)
        functions.pointee.createArray = { task, elements in
            guard elements <= RedisReplyReader.maximumElements else { return nil }
            return RedisReplyReader.hiredisFunctions.createArray?(task, elements)
        }
        return functions
    }()
}
