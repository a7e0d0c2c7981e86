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
        // to 1 MiB is enough for any that came in one; most fit the first, on the stack.
        var capacity = 256
        while capacity <= 1 << 20 {
            let encoded = withUnsafeTemporaryAllocation(byteCount: capacity, alignment: 8) { bytes -> [UInt8]? in
                var offset = 0
                let status = withUnsafeMutablePointer(to: &single) { entry in
                    var table = amqp_table_t(num_entries: 1, entries: entry)
                    return amqp_encode_table(amqp_bytes_t(len: bytes.count, bytes: bytes.baseAddress), &table, &offset)
                }
                return status == AMQP_STATUS_OK.rawValue ? Array(bytes[4..<offset]) : nil
            }
            if let encoded {
                self.name = name
                entry = encoded
                return
            }
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

extension AMQPProperties {
    /// The bytes of the content header frame that carries these properties as `withProperties` writes them (the
    /// frame's envelope, the header's fixed fields, the delivery mode, then what is set); nil when a short string
    /// among them is over 255 bytes, which no frame carries. Counted, not encoded: every publish asks.
    func headerFrameSize() -> Int? {
        var size = 8 + 14 + 1
        for text in [contentType, replyTo, correlationID, messageID, more?.contentEncoding, more?.type, more?.appID] {
            guard let count = text?.utf8.count else { continue }
            guard count <= 255 else { return nil }
            size += 1 + count
        }
        if let timestamp, timestamp >= 0 { size += 8 }
        if more?.priority != nil { size += 1 }
        var table = 0
        for (name, value) in headers {
            guard name.utf8.count <= 255 else { return nil }
            // Name as a short string, kind, length, text.
            table += 1 + name.utf8.count + 1 + 4 + value.utf8.count
        }
        for other in otherHeaders where headers[other.name] == nil { table += other.entry.count }
        return table > 0 ? size + 4 + table : size
    }
}
