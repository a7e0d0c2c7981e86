#if canImport(Glibc)
    import Glibc
#endif

/// Redis's replies (RESP 2) read from the bytes a connection received, in the connection's own buffer: a reply is
/// parsed only once all of it has arrived, and a hash's fields can be handed out in place (`nextHash`), with no object
/// per field, which is what resolving a user's tokens reads most.
///
/// Nothing a server says is trusted before it arrives: an array's count (fifteen bytes, `*2147483647\r\n`, announce
/// 2^31 - 1 elements) is only a promise; a bulk string's length is checked against `maximumBulkLength` (Redis's own
/// largest); arrays nest at most `maximumDepth` deep. Bytes that are not RESP make the reader fail with a protocol
/// error naming what it found (the reader is unusable after that, as is the connection).
///
/// A reply with an array of more than `maximumElements` elements (a user's hash of millions of tokens) costs that
/// reply, not the connection: its bytes are dropped as they arrive, never held whole, and it reads as an error reply
/// naming the bound, which the caller treats as the data error it is. (Refusing it broke the connection, and every
/// command that shared its batch failed again with each new one.)
///
/// One owner thread, like the connection that feeds it.
package final class RedisReplyReader {
    package static let maximumElements = 1 << 22
    package static let maximumBulkLength = 512 << 20
    package static let maximumDepth = 8

    /// What a `nextHash` found.
    package enum HashReply: Equatable {
        /// A hash, its field and value pairs handed out; how many pairs.
        case fields(Int)
        /// Anything else (an error reply, a reply of another shape), whole.
        case other(RedisReply)
    }

    private var buffer: UnsafeMutableRawPointer
    private var capacity: Int
    /// The first byte not read yet, and the end of what was received.
    private var start = 0
    private var end = 0
    /// Of the next reply, while it has not arrived whole: how far it was scanned, and for each array still open the
    /// elements still to come.
    private var measuring = false
    private var scanned = 0
    private var open: [Int] = []
    /// The largest array count past `elementLimit` in the reply being measured: its bytes are dropped as scanned.
    private var oversized: Int64?
    private let elementLimit: Int

    package init(capacity: Int = 16 << 10, maximumElements: Int = RedisReplyReader.maximumElements) {
        self.capacity = capacity
        elementLimit = maximumElements
        buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 8)
    }

    /// The bytes the buffer holds room for (it grows to hold a whole reply, never an oversized one).
    package var bufferCapacity: Int { capacity }

    deinit { buffer.deallocate() }

    /// Appends received bytes.
    package func feed(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        makeRoom(bytes.count)
        memcpy(buffer + end, base, bytes.count)
        end += bytes.count
    }

    /// Lets `receive` write into the free room after what was received (at least `minimum` bytes of it); `receive`
    /// returns how many bytes it wrote, or a negative number (nothing written) which is passed back.
    package func receive(minimum: Int = 4 << 10, _ receive: (UnsafeMutableRawBufferPointer) -> Int) -> Int {
        makeRoom(minimum)
        let count = receive(UnsafeMutableRawBufferPointer(start: buffer + end, count: capacity - end))
        if count > 0 { end += count }
        return count
    }

    /// The next whole reply, or nil until more bytes arrive.
    package func next() throws(RedisError) -> RedisReply? {
        guard let after = try measureNext() else { return nil }
        if let refused = takeOversized(upTo: after) { return refused }
        var cursor = start
        let reply = build(at: &cursor)
        consume(upTo: after)
        return reply
    }

    /// The next whole reply read as a hash (HGETALL's array of field, value, field, value...): each pair is handed to
    /// `visit` in place (the bytes live only during the call); or nil until more bytes arrive.
    package func nextHash(_ visit: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void) throws(RedisError)
        -> HashReply?
    {
        guard let after = try measureNext() else { return nil }
        if let refused = takeOversized(upTo: after) { return .other(refused) }
        guard let pairs = hashPairs(at: start) else {
            var cursor = start
            let reply = build(at: &cursor)
            consume(upTo: after)
            return .other(reply)
        }
        var cursor = start
        _ = line(at: &cursor)
        for _ in 0..<pairs {
            let field = bulk(at: &cursor)
            let value = bulk(at: &cursor)
            visit(field, value)
        }
        consume(upTo: after)
        return .fields(pairs)
    }

    /// An oversized reply measured to its end (`after`): consumed, as the error reply it reads as.
    private func takeOversized(upTo after: Int) -> RedisReply? {
        guard let count = oversized else { return nil }
        oversized = nil
        consume(upTo: after)
        return .error(
            "ERR reply dropped unread: an array of \(count) elements, more than the \(elementLimit) this client reads")
    }

    // MARK: reading a complete reply

    /// The number of pairs if the complete reply at `offset` is an array of an even number of bulk strings, none null.
    private func hashPairs(at offset: Int) -> Int? {
        guard load(offset) == UInt8(ascii: "*") else { return nil }
        var cursor = offset
        let count = Int(integer(line(at: &cursor)))
        guard count >= 0, count % 2 == 0 else { return nil }
        for _ in 0..<count {
            guard load(cursor) == UInt8(ascii: "$") else { return nil }
            let length = Int(integer(line(at: &cursor)))
            guard length >= 0 else { return nil }
            cursor += length + 2
        }
        return count / 2
    }

    /// The reply at `cursor`, already measured whole; `cursor` moves past it.
    private func build(at cursor: inout Int) -> RedisReply {
        let type = load(cursor)
        let text = line(at: &cursor)
        switch type {
        case UInt8(ascii: "+"): return .status(String(decoding: text, as: UTF8.self))
        case UInt8(ascii: "-"): return .error(String(decoding: text, as: UTF8.self))
        case UInt8(ascii: ":"): return .integer(integer(text))
        case UInt8(ascii: "$"):
            let length = Int(integer(text))
            guard length >= 0 else { return .null }
            let bytes = [UInt8](UnsafeRawBufferPointer(start: buffer + cursor, count: length))
            cursor += length + 2
            return .string(bytes)
        default:
            let count = Int(integer(text))
            guard count >= 0 else { return .null }
            var elements: [RedisReply] = []
            elements.reserveCapacity(count)
            for _ in 0..<count { elements.append(build(at: &cursor)) }
            return .array(elements)
        }
    }

    /// A bulk string at `cursor`, already measured; `cursor` moves past it.
    private func bulk(at cursor: inout Int) -> UnsafeRawBufferPointer {
        let length = Int(integer(line(at: &cursor)))
        let bytes = UnsafeRawBufferPointer(start: buffer + cursor, count: length)
        cursor += length + 2
        return bytes
    }

    /// The text of the line at `cursor` after its type byte, without its line end; `cursor` moves past the line end.
    private func line(at cursor: inout Int) -> UnsafeRawBufferPointer {
        let textStart = cursor + 1
        var at = textStart
        while load(at) != 13 { at += 1 }
        cursor = at + 2
        return UnsafeRawBufferPointer(start: buffer + textStart, count: at - textStart)
    }

    /// A number already checked by `measureNext`.
    private func integer(_ text: UnsafeRawBufferPointer) -> Int64 {
        guard !text.isEmpty else { return 0 }
        var value: Int64 = 0
        let negative = text[0] == UInt8(ascii: "-")
        for index in (negative ? 1 : 0)..<text.count { value = value &* 10 &+ Int64(text[index] &- 48) }
        return negative ? -value : value
    }

    // MARK: checking that a reply arrived whole

    /// The offset after the next reply if all of it arrived, nil if not yet; throws on bytes that are not RESP. What a
    /// reply not yet whole has shown so far is kept (`scanned`, `open`): a long reply arriving in many reads is
    /// scanned once, not once per read.
    private func measureNext() throws(RedisError) -> Int? {
        if !measuring {
            scanned = start
            open.removeAll(keepingCapacity: true)
            oversized = nil
            measuring = true
        }
        while true {
            if oversized != nil { dropScanned() }
            guard scanned < end else { return nil }
            let type = load(scanned)
            var after: Int
            switch type {
            case UInt8(ascii: "+"), UInt8(ascii: "-"):
                guard let lineEnd = try lineEnd(from: scanned + 1) else { return nil }
                after = lineEnd + 2
            case UInt8(ascii: ":"):
                guard let (_, next) = try numberLine(at: scanned, what: "integer") else { return nil }
                after = next
            case UInt8(ascii: "$"):
                guard let (length, next) = try numberLine(at: scanned, what: "bulk length") else { return nil }
                guard length >= -1, length <= Self.maximumBulkLength else {
                    throw Self.protocolError("a bulk string of \(length) bytes")
                }
                after = next
                if length >= 0 {
                    let stringEnd = after + Int(length)
                    guard stringEnd + 2 <= end else { return nil }
                    guard load(stringEnd) == 13, load(stringEnd + 1) == 10 else {
                        throw Self.protocolError("a bulk string longer than its length")
                    }
                    after = stringEnd + 2
                }
            case UInt8(ascii: "*"):
                guard let (count, next) = try numberLine(at: scanned, what: "array count") else { return nil }
                guard count >= -1 else { throw Self.protocolError("an array of \(count) elements") }
                if count > elementLimit { oversized = max(oversized ?? 0, count) }
                guard open.count < Self.maximumDepth else {
                    throw Self.protocolError("arrays nested more than \(Self.maximumDepth) deep")
                }
                after = next
                if count > 0 {
                    open.append(Int(count))
                    scanned = after
                    continue
                }
            default:
                throw Self.protocolError("got \(Self.describe(type)) as reply type byte")
            }
            scanned = after
            if open.isEmpty || elementEnded() {
                measuring = false
                return after
            }
        }
    }

    /// The number on the line at `offset` (after its type byte: at most 18 digits, optionally negative) and where the
    /// next line starts, read in one pass; nil if the line has not arrived whole.
    private func numberLine(at offset: Int, what: String) throws(RedisError) -> (Int64, Int)? {
        var at = offset + 1
        let negative = at < end && load(at) == UInt8(ascii: "-")
        if negative { at += 1 }
        let digitsStart = at
        var value: Int64 = 0
        var allDigits = true
        while at < end {
            let byte = load(at)
            if byte == 13 { break }
            let digit = byte &- 48
            if digit >= 10 { allDigits = false }
            value = value &* 10 &+ Int64(digit)
            at += 1
        }
        guard at + 1 < end else { return nil }
        let digits = at - digitsStart
        guard load(at + 1) == 10, allDigits, digits > 0, digits <= 18 else {
            let text = UnsafeRawBufferPointer(start: buffer + offset + 1, count: min(at - offset - 1, 20))
            throw Self.protocolError("a bad \(what) \"\(String(decoding: text, as: UTF8.self))\"")
        }
        return (negative ? -value : value, at + 2)
    }

    /// Counts an element off the arrays it ends; true when it ends the whole reply.
    private func elementEnded() -> Bool {
        while let remaining = open.last {
            if remaining > 1 {
                open[open.count - 1] = remaining - 1
                return false
            }
            open.removeLast()
        }
        return true
    }

    /// Where the line starting at `offset` ends (its `\r`), nil if its end has not arrived.
    private func lineEnd(from offset: Int) throws(RedisError) -> Int? {
        guard offset < end, let found = memchr(buffer + offset, 13, end - offset) else { return nil }
        let at = buffer.distance(to: found)
        guard at + 1 < end else { return nil }
        guard load(at + 1) == 10 else { throw Self.protocolError("a line ending in \\r without \\n") }
        return at
    }

    // MARK: the buffer

    private func load(_ offset: Int) -> UInt8 { buffer.load(fromByteOffset: offset, as: UInt8.self) }

    /// What an oversized reply has shown so far, dropped: nothing is built from it.
    private func dropScanned() {
        if scanned == end {
            start = 0
            end = 0
            scanned = 0
        } else {
            start = scanned
        }
    }

    private func consume(upTo offset: Int) {
        start = offset
        if start == end {
            start = 0
            end = 0
        }
    }

    /// At least `count` free bytes after `end`: the unread bytes moved to the front, or the buffer grown.
    private func makeRoom(_ count: Int) {
        guard capacity - end < count else { return }
        let unread = end - start
        if start > 0 {
            memmove(buffer, buffer + start, unread)
            scanned -= start
            start = 0
            end = unread
            guard capacity - end < count else { return }
        }
        var grown = capacity * 2
        while grown - end < count { grown *= 2 }
        let larger = UnsafeMutableRawPointer.allocate(byteCount: grown, alignment: 8)
        larger.copyMemory(from: buffer, byteCount: end)
        buffer.deallocate()
        buffer = larger
        capacity = grown
    }

    private static func protocolError(_ what: String) -> RedisError {
        RedisError(kind: .connectionLost, "unreadable reply (Protocol error: \(what))")
    }

    private static func describe(_ byte: UInt8) -> String {
        (32..<127).contains(byte) ? "\"\(Character(Unicode.Scalar(byte)))\"" : "byte \(byte)"
    }
}
