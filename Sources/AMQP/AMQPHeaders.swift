internal import CRabbitMQ

/// A header the worker does not read as text: a number, a flag, a time, a decimal, bytes, a table, an array, or text
/// that is not UTF-8. It is kept as the broker sent it, so that a message published again from it (a job's retry,
/// its parked copy) carries it with its type and value unchanged; its name is readable, its value is not.
public struct AMQPEncodedHeader: Sendable, Equatable {
    /// As `AMQPProperties.headers` names headers (a name that is not UTF-8 reads with `%XX` escapes).
    public let name: String
    /// The entry as an AMQP 0-9-1 field table encodes it: its name as a short string, then its kind and value.
    public let entry: [UInt8]

    /// A header read before (`entry` as this type gave it), to be published again.
    public init(name: String, entry: [UInt8]) {
        self.name = name
        self.entry = entry
    }
}

extension AMQPEncodedHeader {
    /// The table entry `raw`, encoded; nil if librabbitmq cannot encode it (a kind it does not know).
    init?(_ raw: amqp_table_entry_t, name: String) {
        var single = raw
        // A table of this one entry: a 4-byte length, then the entry. Headers fit one frame, so a buffer that grows
        // to 1 MiB is enough for any that came in one.
        var capacity = 256
        while capacity <= 1 << 20 {
            var buffer = [UInt8](repeating: 0, count: capacity)
            var offset = 0
            let status = buffer.withUnsafeMutableBytes { bytes in
                withUnsafeMutablePointer(to: &single) { entry in
                    var table = amqp_table_t(num_entries: 1, entries: entry)
                    return amqp_encode_table(
                        amqp_bytes_t(len: bytes.count, bytes: bytes.baseAddress), &table, &offset)
                }
            }
            if status == AMQP_STATUS_OK.rawValue {
                self.name = name
                entry = Array(buffer[4..<offset])
                return
            }
            guard status == AMQP_STATUS_TABLE_TOO_BIG.rawValue else { return nil }
            capacity *= 4
        }
        return nil
    }

    /// Runs `body` with the table entries of `headers`, decoded into memory that lives for the call (the entries
    /// point into it); nil for an empty list, or entries that do not decode (none made by `init`).
    static func withEntries<T>(
        _ headers: some Collection<AMQPEncodedHeader>, _ body: (amqp_table_t?) -> T
    ) -> T {
        guard !headers.isEmpty else { return body(nil) }
        // One table of every entry: its length (big-endian), then the entries one after another.
        let length = headers.reduce(0) { $0 + $1.entry.count }
        var table: [UInt8] = withUnsafeBytes(of: UInt32(length).bigEndian) { Array($0) }
        table.reserveCapacity(4 + length)
        for header in headers { table += header.entry }
        var pool = amqp_pool_t()
        init_amqp_pool(&pool, 4096)
        defer { empty_amqp_pool(&pool) }
        return table.withUnsafeMutableBytes { bytes in
            var decoded = amqp_table_t()
            var offset = 0
            let status = amqp_decode_table(
                amqp_bytes_t(len: bytes.count, bytes: bytes.baseAddress), &pool, &decoded, &offset)
            return body(status == AMQP_STATUS_OK.rawValue ? decoded : nil)
        }
    }
}

extension AMQPConnection {
    /// The bytes of the content header frame that carries `raw` (the properties `withProperties` sets), if it fits a
    /// frame of `frame` bytes (librabbitmq encodes each frame into a buffer of that size).
    static func headerFrameSize(_ raw: amqp_basic_properties_t, within frame: Int) -> Int? {
        func present(_ flag: Int32) -> Bool { raw._flags & amqp_flags_t(flag) != 0 }
        // Frame type, channel, size and end; class, weight, body size and flags.
        var size = 8 + 14
        for (flag, text) in [
            (AMQP_BASIC_CONTENT_TYPE_FLAG, raw.content_type), (AMQP_BASIC_REPLY_TO_FLAG, raw.reply_to),
            (AMQP_BASIC_CORRELATION_ID_FLAG, raw.correlation_id), (AMQP_BASIC_MESSAGE_ID_FLAG, raw.message_id)
        ] where present(flag) {
            size += 1 + text.len
        }
        if present(AMQP_BASIC_DELIVERY_MODE_FLAG) { size += 1 }
        if present(AMQP_BASIC_TIMESTAMP_FLAG) { size += 8 }
        if present(AMQP_BASIC_HEADERS_FLAG) {
            guard size < frame else { return nil }
            var table = raw.headers
            // Uninitialised: encoding writes what it measures, and a frame is 128 KiB by default.
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: frame - size, alignment: 8)
            defer { buffer.deallocate() }
            var offset = 0
            let status = amqp_encode_table(
                amqp_bytes_t(len: buffer.count, bytes: buffer.baseAddress), &table, &offset)
            guard status == AMQP_STATUS_OK.rawValue else { return nil }
            size += offset
        }
        return size <= frame ? size : nil
    }
}
