internal import CRabbitMQ
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Reading what the broker sends: frames, methods, message content, and the connection-level methods that end a
/// session; then the conversions between librabbitmq's types and Swift's.
extension AMQPConnection {
    /// The next frame, or nil if none came within `timeout` seconds (nil: wait as long as it takes).
    func waitFrame(timeout: Double?) throws(AMQPError) -> amqp_frame_t? {
        var frame = amqp_frame_t()
        var status: Int32
        if let timeout {
            var wait = timeval(tv_sec: Int(timeout), tv_usec: Int(timeout.truncatingRemainder(dividingBy: 1) * 1e6))
            status = amqp_simple_wait_frame_noblock(state, &frame, &wait)
        } else {
            status = amqp_simple_wait_frame(state, &frame)
        }
        if status == AMQP_STATUS_TIMEOUT.rawValue { return nil }
        guard status == AMQP_STATUS_OK.rawValue else {
            isOpen = false
            AMQPNodeHealth.shared.noteSilent(url)
            throw AMQPError(
                kind: .connectionLost, code: Int(status),
                "connection to \(url) lost: \(String(cString: amqp_error_string2(status)))")
        }
        return frame
    }

    func readEvent(timeout: Double?) throws(AMQPError) -> AMQPEvent? {
        while true {
            guard let frame = try waitFrame(timeout: timeout) else { return nil }
            guard frame.frame_type == UInt8(AMQP_FRAME_METHOD) else { continue }
            let method = frame.payload.method
            switch method.id {
            case Method.basicDeliver:
                let deliver = method.decoded.assumingMemoryBound(to: amqp_basic_deliver_t.self).pointee
                let routingKey = recentNames.string(deliver.routing_key)
                let consumerTag = recentNames.string(deliver.consumer_tag)
                let (body, properties) = try readContent(channel: frame.channel)
                return .delivery(
                    AMQPDelivery(
                        deliveryTag: deliver.delivery_tag, redelivered: deliver.redelivered != 0,
                        consumerTag: consumerTag, routingKey: routingKey, body: body,
                        properties: properties))
            case Method.basicAck:
                let ack = method.decoded.assumingMemoryBound(to: amqp_basic_ack_t.self).pointee
                amqp_maybe_release_buffers(state)
                recordConfirm(ack.delivery_tag, multiple: ack.multiple != 0, ack: true)
                return .confirm(sequence: ack.delivery_tag, multiple: ack.multiple != 0, ack: true)
            case Method.basicNack:
                let nack = method.decoded.assumingMemoryBound(to: amqp_basic_nack_t.self).pointee
                amqp_maybe_release_buffers(state)
                recordConfirm(nack.delivery_tag, multiple: nack.multiple != 0, ack: false)
                return .confirm(sequence: nack.delivery_tag, multiple: nack.multiple != 0, ack: false)
            case Method.basicReturn:
                let returned = method.decoded.assumingMemoryBound(to: amqp_basic_return_t.self).pointee
                let handedBack = AMQPReturn(
                    exchange: Self.string(returned.exchange),
                    routingKey: Self.string(returned.routing_key),
                    replyCode: Int(returned.reply_code), replyText: Self.string(returned.reply_text))
                _ = try readContent(channel: frame.channel)
                returns.append(handedBack)
                continue
            case Method.connectionBlocked, Method.connectionUnblocked, Method.connectionClose:
                return try connectionMethod(method)
            case Method.basicCancel, Method.channelClose:
                throw ended(by: method, channel: frame.channel)
            default:
                continue
            }
        }
    }

    /// The broker ended the consumer or closed the channel: what that means for the owner.
    func ended(by method: amqp_method_t, channel: amqp_channel_t) -> AMQPError {
        isOpen = false
        guard method.id == Method.channelClose else {
            // The broker ended a consumer (its queue was deleted, or its node left a cluster): nothing more will
            // arrive on it. Reported as a lost connection, so that the owner connects again, declares its queues
            // and consumes afresh, instead of waiting forever on a consumer that no longer exists.
            let cancel = method.decoded.assumingMemoryBound(to: amqp_basic_cancel_t.self).pointee
            return AMQPError(
                kind: .connectionLost,
                "the broker cancelled consumer \(Self.string(cancel.consumer_tag)) (queue deleted?)")
        }
        let close = method.decoded.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
        onChannelClose?(Int(close.reply_code))
        var ok = amqp_channel_close_ok_t(dummy: 0)
        amqp_send_method(state, channel, Method.channelCloseOk, &ok)
        return AMQPError(
            kind: .brokerRefused, code: Int(close.reply_code),
            "broker closed the channel: \(Self.string(close.reply_text))")
    }

    /// A delivery's header and body frames, read straight off the connection. (amqp_read_message would copy them
    /// into a fresh memory pool per message, a few thousand instructions for nothing on the per-job path.)
    func readContent(channel: amqp_channel_t) throws(AMQPError) -> ([UInt8], AMQPProperties) {
        var size = 0
        defer { releaseFrameMemory(after: size) }
        var frame = amqp_frame_t()
        try waitFrame(&frame, channel: channel)
        guard frame.frame_type == UInt8(AMQP_FRAME_HEADER), let decoded = frame.payload.properties.decoded else {
            throw AMQPError(
                kind: .library, "reading a message: expected a content header, got frame type \(frame.frame_type)")
        }
        let properties = Self.properties(
            decoded.assumingMemoryBound(to: amqp_basic_properties_t.self).pointee,
            contentTypes: &recentContentTypes)
        size = Int(frame.payload.properties.body_size)
        var body: [UInt8] = []
        while body.count < size {
            try waitFrame(&frame, channel: channel)
            guard frame.frame_type == UInt8(AMQP_FRAME_BODY) else {
                throw AMQPError(
                    kind: .library, "reading a message: expected a body frame, got frame type \(frame.frame_type)")
            }
            let fragment = frame.payload.body_fragment
            guard fragment.len > 0, let bytes = fragment.bytes, body.count + fragment.len <= size else {
                throw AMQPError(kind: .library, "reading a message: body frames do not add up to \(size) bytes")
            }
            let fragmentBytes = UnsafeRawBufferPointer(start: bytes, count: fragment.len)
            if body.isEmpty && fragment.len == size {
                // Most bodies come in one frame: the array is made from it at its size, about 150 instructions a job
                // fewer in scripts/profile than reserving the array and appending to it.
                body = Array(fragmentBytes)
            } else {
                if body.isEmpty { body.reserveCapacity(size) }
                body.append(contentsOf: fragmentBytes)
            }
        }
        return (body, properties)
    }

    /// Gives librabbitmq's frame memory back every 64 messages or 256 KiB of them, rather than after each one (which
    /// cost about a thousand instructions per message): what a message's frames hold is copied out as it is read, so
    /// only the bound on the memory depends on when.
    func releaseFrameMemory(after messageBytes: Int) {
        messagesSinceRelease += 1
        bytesSinceRelease += messageBytes
        guard messagesSinceRelease >= 64 || bytesSinceRelease >= 256 << 10 else { return }
        amqp_maybe_release_buffers(state)
        messagesSinceRelease = 0
        bytesSinceRelease = 0
    }

    /// The next frame of `channel`. Content frames of one message arrive together on their channel, but the broker
    /// may slip connection-level methods (channel 0) in between: a block notice is kept for `nextEvent`, a close ends
    /// the connection.
    func waitFrame(_ frame: inout amqp_frame_t, channel: amqp_channel_t) throws(AMQPError) {
        while true {
            let status = amqp_simple_wait_frame(state, &frame)
            guard status == AMQP_STATUS_OK.rawValue else { throw libraryError(status, "reading a message") }
            if frame.channel == channel { return }
            guard frame.frame_type == UInt8(AMQP_FRAME_METHOD) else { continue }
            if let event = try connectionMethod(frame.payload.method) { buffered.append(event) }
        }
    }

    /// What the broker says about the whole connection (channel 0): publishing blocked or unblocked by a resource
    /// alarm, or the connection closed (thrown). nil for any other method.
    func connectionMethod(_ method: amqp_method_t) throws(AMQPError) -> AMQPEvent? {
        switch method.id {
        case Method.connectionBlocked, Method.connectionUnblocked:
            isBlocked = method.id == Method.connectionBlocked
            return .blocked(isBlocked)
        case Method.connectionClose:
            let close = method.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
            isOpen = false
            throw AMQPError(
                kind: .connectionLost, code: Int(close.reply_code),
                "broker closed the connection: \(Self.string(close.reply_text))")
        default:
            return nil
        }
    }

    // MARK: conversions

    /// Method numbers (librabbitmq's macros cast, which Swift does not import).
    enum Method {
        static let connectionClose: amqp_method_number_t = 0x000A_0032
        static let connectionBlocked: amqp_method_number_t = 0x000A_003C
        static let connectionUnblocked: amqp_method_number_t = 0x000A_003D
        static let channelClose: amqp_method_number_t = 0x0014_0028
        static let channelCloseOk: amqp_method_number_t = 0x0014_0029
        static let queueDeclare: amqp_method_number_t = 0x0032_000A
        static let basicCancel: amqp_method_number_t = 0x003C_001E
        static let basicReturn: amqp_method_number_t = 0x003C_0032
        static let basicDeliver: amqp_method_number_t = 0x003C_003C
        static let basicAck: amqp_method_number_t = 0x003C_0050
        static let basicNack: amqp_method_number_t = 0x003C_0078
    }

    func check(_ reply: amqp_rpc_reply_t, _ what: String) throws(AMQPError) {
        switch reply.reply_type {
        case AMQP_RESPONSE_NORMAL:
            return
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            throw libraryError(reply.library_error, what)
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if reply.reply.id == Method.connectionClose {
                let close = reply.reply.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
                isOpen = false
                throw AMQPError(
                    kind: .connectionLost, code: Int(close.reply_code),
                    "\(what): broker closed the connection: \(Self.string(close.reply_text))")
            }
            if reply.reply.id == Method.channelClose {
                let close = reply.reply.decoded.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
                onChannelClose?(Int(close.reply_code))
                var ok = amqp_channel_close_ok_t(dummy: 0)
                amqp_send_method(state, channel, Method.channelCloseOk, &ok)
                throw AMQPError(
                    kind: .brokerRefused, code: Int(close.reply_code),
                    "\(what): \(Self.string(close.reply_text))")
            }
            throw AMQPError(kind: .brokerRefused, "\(what): unexpected broker method \(reply.reply.id)")
        default:
            throw AMQPError(kind: .library, "\(what): no reply")
        }
    }

    func libraryError(_ status: Int32, _ what: String) -> AMQPError {
        let text = String(cString: amqp_error_string2(status))
        // A reply that timed out leaves the connection closed by librabbitmq: lost, like a broken socket.
        let lost = [
            AMQP_STATUS_SOCKET_ERROR, AMQP_STATUS_CONNECTION_CLOSED, AMQP_STATUS_HEARTBEAT_TIMEOUT,
            AMQP_STATUS_SSL_ERROR, AMQP_STATUS_SOCKET_CLOSED, AMQP_STATUS_TCP_ERROR,
            AMQP_STATUS_TIMEOUT
        ].map(\.rawValue).contains(status)
        if lost {
            isOpen = false
            AMQPNodeHealth.shared.noteSilent(url)
        }
        return AMQPError(kind: lost ? .connectionLost : .library, code: Int(status), "\(what): \(text)")
    }

    /// librabbitmq takes strings as (length, pointer) pairs that must stay valid through the call. Swift's implicit
    /// String-to-pointer bridging (`amqp_cstring_bytes(name)`) lasts only for the call that receives it, so the
    /// pointer would dangle by the time librabbitmq reads it (two such arguments were seen to share one buffer).
    func withBytes<T>(_ text: String, _ body: (amqp_bytes_t) -> T) -> T {
        var copy = text
        return copy.withUTF8 { buffer in
            body(amqp_bytes_t(len: buffer.count, bytes: UnsafeMutableRawPointer(mutating: buffer.baseAddress)))
        }
    }

    func withBytes<T>(_ first: String, _ second: String, _ body: (amqp_bytes_t, amqp_bytes_t) -> T) -> T {
        withBytes(first) { firstBytes in withBytes(second) { body(firstBytes, $0) } }
    }

    static func string(_ bytes: amqp_bytes_t) -> String {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: bytes.len), as: UTF8.self)
    }

    /// A short string (at most 255 bytes on the wire) that is sent on again with the message (reply_to, ids, header
    /// names): as it is if it is UTF-8; otherwise its bytes above 0x7F, and `%`, written as `%XX`, and past 255 bytes
    /// cut with a hash of the whole, so that two such ids stay two. Decoded with replacement characters, each bad
    /// byte took three, and a field past 255 bytes could not be published again: the job's summary, its parked copy
    /// and its retries all failed, and with them the session.
    static func shortString(_ bytes: amqp_bytes_t) -> String {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        let wire = UnsafeRawBufferPointer(start: pointer, count: bytes.len)
        if let text = String(validating: wire, as: UTF8.self) { return text }
        var escaped = ""
        for byte in wire {
            escaped +=
                byte < 0x80 && byte != UInt8(ascii: "%")
                ? String(UnicodeScalar(byte)) : "%" + String(byte, radix: 16, uppercase: true)
        }
        guard escaped.utf8.count > 255 else { return escaped }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in wire { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return String(escaped.prefix(238)) + "~" + String(hash, radix: 16)
    }

    static func properties(_ raw: amqp_basic_properties_t, contentTypes: inout RecentNames) -> AMQPProperties {
        func field(_ flag: Int32, _ bytes: amqp_bytes_t) -> String? {
            raw._flags & amqp_flags_t(flag) != 0 ? shortString(bytes) : nil
        }
        var headers: [String: String] = [:]
        var otherHeaders: [AMQPEncodedHeader] = []
        var deliveryCount: Int?
        if raw._flags & amqp_flags_t(AMQP_BASIC_HEADERS_FLAG) != 0, let entries = raw.headers.entries {
            for index in 0..<Int(raw.headers.num_entries) {
                let entry = entries[index]
                let name = shortString(entry.key)
                if entry.value.kind == UInt8(ascii: "S"), let text = utf8(entry.value.value.bytes) {
                    headers[name] = text
                } else if name == "x-delivery-count" {
                    deliveryCount = integer(entry.value)
                } else if let encoded = AMQPEncodedHeader(entry, name: name) {
                    otherHeaders.append(encoded)
                }
            }
        }
        // Built whole, in one initializer: a value made and then changed was copied (each string counted again).
        let rarelySet = amqp_flags_t(
            AMQP_BASIC_CONTENT_ENCODING_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_PRIORITY_FLAG)
        let more =
            raw._flags & rarelySet == 0
            ? nil
            : AMQPMoreProperties(
                contentEncoding: field(AMQP_BASIC_CONTENT_ENCODING_FLAG, raw.content_encoding),
                type: field(AMQP_BASIC_TYPE_FLAG, raw.type), appID: field(AMQP_BASIC_APP_ID_FLAG, raw.app_id),
                priority: raw._flags & amqp_flags_t(AMQP_BASIC_PRIORITY_FLAG) != 0 ? raw.priority : nil)
        return AMQPProperties(
            contentType: raw._flags & amqp_flags_t(AMQP_BASIC_CONTENT_TYPE_FLAG) != 0
                ? contentTypes.string(raw.content_type) : nil,
            replyTo: field(AMQP_BASIC_REPLY_TO_FLAG, raw.reply_to),
            correlationID: field(AMQP_BASIC_CORRELATION_ID_FLAG, raw.correlation_id),
            messageID: field(AMQP_BASIC_MESSAGE_ID_FLAG, raw.message_id),
            persistent: raw._flags & amqp_flags_t(AMQP_BASIC_DELIVERY_MODE_FLAG) != 0 && raw.delivery_mode == 2,
            timestamp: raw._flags & amqp_flags_t(AMQP_BASIC_TIMESTAMP_FLAG) != 0
                ? Int64(clamping: raw.timestamp) : nil,
            headers: headers, otherHeaders: otherHeaders, deliveryCount: deliveryCount, more: more)
    }

    /// The text of a long string, if it is UTF-8: other bytes are kept as they came (`AMQPEncodedHeader`).
    static func utf8(_ bytes: amqp_bytes_t) -> String? {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        return String(validating: UnsafeRawBufferPointer(start: pointer, count: bytes.len), as: UTF8.self)
    }

    /// An integer field of a table, of whichever width the sender chose; nil for any other kind.
    static func integer(_ field: amqp_field_value_t) -> Int? {
        switch field.kind {
        case UInt8(ascii: "b"): Int(field.value.i8)
        case UInt8(ascii: "B"): Int(field.value.u8)
        case UInt8(ascii: "s"): Int(field.value.i16)
        case UInt8(ascii: "u"): Int(field.value.u16)
        case UInt8(ascii: "I"): Int(field.value.i32)
        case UInt8(ascii: "i"): Int(field.value.u32)
        case UInt8(ascii: "l"): Int(field.value.i64)
        case UInt8(ascii: "L"): Int(clamping: field.value.u64)
        default: nil
        }
    }

    /// Runs `body` with C properties whose strings point into one buffer that lives for the call.
    func withProperties<T>(
        _ properties: AMQPProperties,
        _ body: (UnsafePointer<amqp_basic_properties_t>) -> T
    ) -> T {
        var strings = CStringArena()
        var raw = amqp_basic_properties_t()
        raw._flags = amqp_flags_t(AMQP_BASIC_DELIVERY_MODE_FLAG)
        raw.delivery_mode = properties.persistent ? 2 : 1
        let texts: [(Int32, String?, WritableKeyPath<amqp_basic_properties_t, amqp_bytes_t>)] = [
            (AMQP_BASIC_CONTENT_TYPE_FLAG, properties.contentType, \.content_type),
            (AMQP_BASIC_REPLY_TO_FLAG, properties.replyTo, \.reply_to),
            (AMQP_BASIC_CORRELATION_ID_FLAG, properties.correlationID, \.correlation_id),
            (AMQP_BASIC_MESSAGE_ID_FLAG, properties.messageID, \.message_id),
            (AMQP_BASIC_CONTENT_ENCODING_FLAG, properties.more?.contentEncoding, \.content_encoding),
            (AMQP_BASIC_TYPE_FLAG, properties.more?.type, \.type),
            (AMQP_BASIC_APP_ID_FLAG, properties.more?.appID, \.app_id)
        ]
        for (flag, text, field) in texts {
            guard let text else { continue }
            raw._flags |= amqp_flags_t(flag)
            raw[keyPath: field] = strings.bytes(text)
        }
        if let value = properties.timestamp, value >= 0 {
            raw._flags |= amqp_flags_t(AMQP_BASIC_TIMESTAMP_FLAG)
            raw.timestamp = UInt64(value)
        }
        if let value = properties.more?.priority {
            raw._flags |= amqp_flags_t(AMQP_BASIC_PRIORITY_FLAG)
            raw.priority = value
        }
        // A header named both as text and among the others is published as text: the worker set it.
        let others = properties.otherHeaders.filter { properties.headers[$0.name] == nil }
        let entries = UnsafeMutablePointer<amqp_table_entry_t>.allocate(
            capacity: max(1, properties.headers.count + others.count))
        defer {
            entries.deallocate()
            strings.free()
        }
        var count = 0
        for key in properties.headers.keys.sorted() {
            var value = amqp_field_value_t()
            value.kind = UInt8(ascii: "S")
            value.value.bytes = strings.bytes(properties.headers[key]!)
            entries[count] = amqp_table_entry_t(key: strings.bytes(key), value: value)
            count += 1
        }
        return AMQPEncodedHeader.withEntries(others) { decoded in
            if let decoded, let decodedEntries = decoded.entries {
                for index in 0..<Int(decoded.num_entries) {
                    entries[count] = decodedEntries[index]
                    count += 1
                }
            }
            if count > 0 {
                raw._flags |= amqp_flags_t(AMQP_BASIC_HEADERS_FLAG)
                raw.headers = amqp_table_t(num_entries: Int32(count), entries: entries)
            }
            return body(&raw)
        }
    }

    func withTable<T>(_ arguments: [String: AMQPArgument], _ body: (amqp_table_t) -> T) -> T {
        guard !arguments.isEmpty else { return body(amqp_empty_table) }
        var strings = CStringArena()
        let entries = UnsafeMutablePointer<amqp_table_entry_t>.allocate(capacity: arguments.count)
        defer {
            entries.deallocate()
            strings.free()
        }
        for (index, key) in arguments.keys.sorted().enumerated() {
            var value = amqp_field_value_t()
            switch arguments[key]! {
            case .string(let text):
                value.kind = UInt8(ascii: "S")
                value.value.bytes = strings.bytes(text)
            case .integer(let number):
                value.kind = UInt8(ascii: "l")
                value.value.i64 = number
            }
            entries[index] = amqp_table_entry_t(key: strings.bytes(key), value: value)
        }
        return body(amqp_table_t(num_entries: Int32(arguments.count), entries: entries))
    }
}
