#if canImport(Glibc)
import Glibc
#endif
internal import CRabbitMQ
import Foundation

/// An error from the broker or from librabbitmq, with the library's status code where there is one.
public struct AMQPError: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        case badURL
        /// The connection is gone (socket, heartbeat, broker closed it): reconnect.
        case connectionLost
        /// The broker closed the channel or refused a method (reply code in `code`).
        case brokerRefused
        /// Anything else librabbitmq reports.
        case library
    }

    public let kind: Kind
    /// librabbitmq's status (negative) or the broker's reply code (e.g. 406, 404, 320).
    public let code: Int
    public let message: String

    public var description: String { message }

    init(kind: Kind, code: Int = 0, _ message: String) {
        self.kind = kind
        self.code = code
        self.message = message
    }

    static func badURL(_ message: String) -> AMQPError { AMQPError(kind: .badURL, message) }

    /// Publishes the broker nacked: whoever published them must not acknowledge what caused them.
    public static func unconfirmed(_ what: String) -> AMQPError {
        AMQPError(kind: .brokerRefused, "\(what): the broker refused (nacked) a publish")
    }

    public var isConnectionLost: Bool { kind == .connectionLost }

    /// The broker refused this connection's own settings (ACCESS_REFUSED: user or password; NOT_ALLOWED: the vhost
    /// does not exist or the user may not use it), or the URL is wrong: waiting will not help, the URL must change.
    public var isPermanent: Bool { kind == .badURL || code == 403 || code == 530 }
}

/// Message properties the worker reads and writes.
public struct AMQPProperties: Sendable, Equatable {
    public var contentType: String?
    public var replyTo: String?
    public var correlationID: String?
    public var messageID: String?
    public var persistent: Bool
    /// When the message was published, UNIX seconds (the AMQP timestamp property).
    public var timestamp: Int64?
    /// String-valued headers (others are skipped when reading).
    public var headers: [String: String]
    /// How many times the broker delivered this message before (quorum queues say so in the integer header
    /// `x-delivery-count`); nil when the broker does not count. Read only: never published.
    public var deliveryCount: Int?

    public init(contentType: String? = "application/json", replyTo: String? = nil, correlationID: String? = nil,
                messageID: String? = nil, persistent: Bool = true, timestamp: Int64? = nil,
                headers: [String: String] = [:], deliveryCount: Int? = nil) {
        self.deliveryCount = deliveryCount
        self.contentType = contentType
        self.replyTo = replyTo
        self.correlationID = correlationID
        self.messageID = messageID
        self.persistent = persistent
        self.timestamp = timestamp
        self.headers = headers
    }
}

public struct AMQPDelivery: Sendable {
    public var deliveryTag: UInt64
    public var redelivered: Bool
    /// Which `consume` this came from, for a connection consuming several queues.
    public var consumerTag: String
    public var routingKey: String
    public var body: [UInt8]
    public var properties: AMQPProperties
}

/// What arrives on the connection.
public enum AMQPEvent: Sendable {
    case delivery(AMQPDelivery)
    /// Publisher confirm: the broker took (`ack`) or lost (`!ack`) publishes up to `sequence` (all of them if `multiple`).
    case confirm(sequence: UInt64, multiple: Bool, ack: Bool)
    /// The broker stopped (`true`) or resumed (`false`) accepting publishes (memory or disk alarm).
    case blocked(Bool)
}

/// A mandatory publish that no queue took (the queue was deleted, or nothing is bound to the exchange): the broker
/// hands it back before it confirms it, so it is known by the time `waitForConfirms` returns (`takeReturns`).
public struct AMQPReturn: Sendable, Equatable {
    public var exchange: String
    public var routingKey: String
    public var replyCode: Int
    public var replyText: String
}

/// One AMQP 0-9-1 connection with one channel, owning its librabbitmq state.
///
/// Not thread-safe, as librabbitmq is not: one thread owns it and makes every call. Calls block on the socket.
public final class AMQPConnection {
    public let url: AMQPURL
    private let state: amqp_connection_state_t
    private let channel: amqp_channel_t = 1
    private var nextPublishSequence: UInt64 = 1
    private var confirmsEnabled = false
    private var isOpen = false
    /// Events read while waiting for something else (confirms), handed out first by `nextEvent`.
    private var buffered: [AMQPEvent] = []
    /// The consumer tags and routing keys of deliveries: the same few again and again.
    private var recentNames = RecentNames()
    /// Content types of recent messages, apart from the names: every job carries one ("application/json" is one byte
    /// too long to be stored inline in a String, so each would cost an allocation).
    private var recentContentTypes = RecentNames()
    /// Messages and their bytes read since librabbitmq's frame memory was last given back (`releaseFrameMemory`).
    private var messagesSinceRelease = 0
    private var bytesSinceRelease = 0
    /// The broker said it blocks this connection's publishes (a memory or disk alarm) and has not lifted it yet.
    public private(set) var isBlocked = false
    /// Every publish up to here is confirmed (acked or nacked).
    private var confirmedThrough: UInt64 = 0
    private var confirmedSingles = Set<UInt64>()
    private var nacked = Set<UInt64>()
    /// Mandatory publishes handed back, since the last `takeReturns`.
    private var returns: [AMQPReturn] = []

    /// Seconds a call that waits for the broker's reply (a declare, a passive declare) waits at most, unless the
    /// connection is opened with another `replyTimeout`.
    public static let replyTimeout = 10.0

    /// Connects, logs in and opens channel 1. `heartbeat` in seconds (0: none). `connectTimeout` bounds the TCP (and
    /// TLS) connection and the login handshake each; `replyTimeout`, every later call that waits for a reply.
    public init(url: AMQPURL, heartbeat: Int = 30, connectTimeout: Double = 10, replyTimeout: Double = replyTimeout,
                caFile: String? = nil, verifyPeer: Bool = true) throws(AMQPError) {
        self.url = url
        guard let state = amqp_new_connection() else { throw AMQPError(kind: .library, "out of memory") }
        // From here `self` owns `state`: a throw runs deinit, which destroys it (never destroy it here as well).
        self.state = state
        let socket: OpaquePointer?
        if url.usesTLS {
            socket = amqp_ssl_socket_new(state)
            if let socket {
                amqp_ssl_socket_set_verify_peer(socket, verifyPeer ? 1 : 0)
                amqp_ssl_socket_set_verify_hostname(socket, verifyPeer ? 1 : 0)
                let bundle = caFile ?? "/etc/ssl/certs/ca-certificates.crt"
                if verifyPeer && amqp_ssl_socket_set_cacert(socket, bundle) != AMQP_STATUS_OK.rawValue {
                    throw AMQPError(kind: .library, "cannot load CA bundle \(bundle) for amqps")
                }
            }
        } else {
            socket = amqp_tcp_socket_new(state)
        }
        guard let socket else { throw AMQPError(kind: .library, "cannot create the AMQP socket") }
        var timeout = timeval(tv_sec: Int(connectTimeout), tv_usec: Int(connectTimeout.truncatingRemainder(dividingBy: 1) * 1e6))
        let opened = amqp_socket_open_noblock(socket, url.host, Int32(url.port), &timeout)
        guard opened == AMQP_STATUS_OK.rawValue else {
            AMQPNodeHealth.shared.noteSilent(url)
            throw AMQPError(kind: .connectionLost, code: Int(opened),
                            "cannot connect to \(url): \(String(cString: amqp_error_string2(opened)))")
        }
        // A node that accepts the connection and then answers nothing (frozen, cut off) is given up on as soon as a
        // node that does not answer at all.
        amqp_set_handshake_timeout(state, &timeout)
        let login = CRabbitMQ_login_plain_with_capabilities(state, url.virtualHost, 0, 131_072, Int32(heartbeat), url.user, url.password)
        try check(login, "login to \(url) (user \(url.user), vhost \(url.virtualHost))")
        // Every call that waits for the broker's reply gives up after this long: a broker that stops answering (a
        // frozen node) is found out by the next call, not after two missed heartbeats.
        var rpcTimeout = timeval(tv_sec: Int(replyTimeout),
                                 tv_usec: Int(replyTimeout.truncatingRemainder(dividingBy: 1) * 1e6))
        amqp_set_rpc_timeout(state, &rpcTimeout)
        amqp_channel_open(state, channel)
        try check(amqp_get_rpc_reply(state), "channel.open")
        isOpen = true
        AMQPNodeHealth.shared.noteAnswered(url)
    }

    deinit {
        if isOpen {
            _ = amqp_channel_close(state, channel, Int32(AMQP_REPLY_SUCCESS))
            _ = amqp_connection_close(state, Int32(AMQP_REPLY_SUCCESS))
        }
        amqp_destroy_connection(state)
    }

    /// Closes politely; the object is unusable afterwards.
    public func close() {
        guard isOpen else { return }
        isOpen = false
        _ = amqp_channel_close(state, channel, Int32(AMQP_REPLY_SUCCESS))
        _ = amqp_connection_close(state, Int32(AMQP_REPLY_SUCCESS))
    }

    /// The socket, for poll(2). Data may also sit in librabbitmq's buffer: check `hasBufferedInput` first.
    public var socketDescriptor: Int32 { amqp_get_sockfd(state) }

    /// This end's TCP port, which names the connection in the broker's own listings (rabbitmqctl list_connections).
    public var localPort: Int {
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let descriptor = amqp_get_sockfd(state)
        let result = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        guard result == 0 else { return 0 }
        return withUnsafeBytes(of: &address) { Int(UInt16(bigEndian: $0.load(fromByteOffset: 2, as: UInt16.self))) }
    }

    public var hasBufferedInput: Bool {
        !buffered.isEmpty || amqp_frames_enqueued(state) != 0 || amqp_data_in_buffer(state) != 0
    }

    // MARK: topology and consuming

    /// Declares a durable queue. One that exists with other arguments (a quorum queue, a TTL) is used as it is.
    /// Returns the queue's message count.
    @discardableResult
    public func declareQueue(_ name: String, arguments: [String: AMQPArgument] = [:]) throws(AMQPError) -> Int {
        let declared = withTable(arguments) { table in
            withBytes(name) { amqp_queue_declare(state, channel, $0, 0, 1, 0, 0, table) }
        }
        if let declared { return Int(declared.pointee.message_count) }
        do {
            try check(amqp_get_rpc_reply(state), "queue.declare \(name)")
        } catch where error.code == Int(AMQP_PRECONDITION_FAILED) {
            try reopenChannel()
            guard let status = try queueStatus(name) else {
                throw AMQPError(kind: .brokerRefused, code: Int(AMQP_NOT_FOUND), "queue \(name) vanished while declared")
            }
            return status.messages
        }
        return 0
    }

    /// A queue's depth and consumer count, or nil if there is no such queue (a passive declare, which creates
    /// nothing).
    public func queueStatus(_ name: String) throws(AMQPError) -> (messages: Int, consumers: Int)? {
        guard let passive = withBytes(name, { amqp_queue_declare(state, channel, $0, 1, 0, 0, 0, amqp_empty_table) }) else {
            do {
                try check(amqp_get_rpc_reply(state), "queue.declare (passive) \(name)")
            } catch where error.code == Int(AMQP_NOT_FOUND) {
                try reopenChannel()
                return nil
            }
            return nil
        }
        return (Int(passive.pointee.message_count), Int(passive.pointee.consumer_count))
    }

    /// A queue only this connection sees, named by the broker, gone when the connection closes (for watching an
    /// exchange without taking messages from anyone).
    public func declareTemporaryQueue() throws(AMQPError) -> String {
        guard let declared = amqp_queue_declare(state, channel, amqp_empty_bytes, 0, 0, 1, 1, amqp_empty_table) else {
            try check(amqp_get_rpc_reply(state), "queue.declare (temporary)")
            return ""
        }
        return Self.string(declared.pointee.queue)
    }

    /// Declares a durable exchange. One that exists already with another type is used as it is.
    public func declareExchange(_ name: String, type: String) throws(AMQPError) {
        _ = withBytes(name, type) { amqp_exchange_declare(state, channel, $0, $1, 0, 1, 0, 0, amqp_empty_table) }
        do {
            try check(amqp_get_rpc_reply(state), "exchange.declare \(name)")
        } catch where error.code == Int(AMQP_PRECONDITION_FAILED) {
            try reopenChannel()
            _ = withBytes(name, type) { amqp_exchange_declare(state, channel, $0, $1, 1, 0, 0, 0, amqp_empty_table) }
            try check(amqp_get_rpc_reply(state), "exchange.declare (passive) \(name)")
        }
    }

    /// Deletes a queue and what it holds (operators' and tests' tool; the worker never deletes).
    public func deleteQueue(_ name: String) throws(AMQPError) {
        _ = withBytes(name) { amqp_queue_delete(state, channel, $0, 0, 0) }
        try check(amqp_get_rpc_reply(state), "queue.delete \(name)")
    }

    public func bindQueue(_ queue: String, to exchange: String, routingKey: String = "") throws(AMQPError) {
        _ = withBytes(queue, exchange) { queueBytes, exchangeBytes in
            withBytes(routingKey) { amqp_queue_bind(state, channel, queueBytes, exchangeBytes, $0, amqp_empty_table) }
        }
        try check(amqp_get_rpc_reply(state), "queue.bind \(queue) to \(exchange)")
    }

    /// After a channel-level error the broker has closed the channel: open it again, with confirms if they were on.
    private func reopenChannel() throws(AMQPError) {
        amqp_channel_open(state, channel)
        try check(amqp_get_rpc_reply(state), "channel.open")
        if confirmsEnabled { confirmsEnabled = false; try enablePublisherConfirms() }
    }

    public func setPrefetch(_ count: Int) throws(AMQPError) {
        amqp_basic_qos(state, channel, 0, UInt16(min(count, 65535)), 0)
        try check(amqp_get_rpc_reply(state), "basic.qos")
    }

    /// Every publish is then confirmed by the broker (`AMQPEvent.confirm`), numbered from 1.
    public func enablePublisherConfirms() throws(AMQPError) {
        guard !confirmsEnabled else { return }
        amqp_confirm_select(state, channel)
        try check(amqp_get_rpc_reply(state), "confirm.select")
        confirmsEnabled = true
        nextPublishSequence = 1
        confirmedThrough = 0
        confirmedSingles.removeAll()
        nacked.removeAll()
    }

    /// Starts delivering from `queue`; returns the consumer tag. Without `acknowledging`, the broker counts a
    /// message as handled once sent (for watching, never for work).
    @discardableResult
    public func consume(_ queue: String, acknowledging: Bool = true) throws(AMQPError) -> String {
        guard let reply = withBytes(queue, { amqp_basic_consume(state, channel, $0, amqp_empty_bytes, 0,
                                                                acknowledging ? 0 : 1, 0, amqp_empty_table) }) else {
            try check(amqp_get_rpc_reply(state), "basic.consume \(queue)")
            return ""
        }
        return Self.string(reply.pointee.consumer_tag)
    }

    // MARK: messages

    /// Publishes to `exchange`, by default the default exchange (straight to the queue named `queue`).
    /// Returns the publish's confirm sequence number.
    @discardableResult
    public func publish(to queue: String, exchange: String = "", body: [UInt8], properties: AMQPProperties = .init(),
                        mandatory: Bool = false) throws(AMQPError) -> UInt64 {
        let status = withProperties(properties) { props in
            withBytes(exchange, queue) { exchangeBytes, queueBytes in
                body.withUnsafeBytes { raw in
                    amqp_basic_publish(state, channel, exchangeBytes, queueBytes, mandatory ? 1 : 0, 0, props,
                                       amqp_bytes_t(len: raw.count, bytes: UnsafeMutableRawPointer(mutating: raw.baseAddress)))
                }
            }
        }
        guard status == AMQP_STATUS_OK.rawValue else { throw libraryError(status, "basic.publish to \(queue)") }
        defer { nextPublishSequence += 1 }
        return nextPublishSequence
    }

    public func ack(_ deliveryTag: UInt64, multiple: Bool = false) throws(AMQPError) {
        let status = amqp_basic_ack(state, channel, deliveryTag, multiple ? 1 : 0)
        guard status == AMQP_STATUS_OK.rawValue else { throw libraryError(status, "basic.ack") }
    }

    /// Gives a delivery back: requeued for another try, or dropped (dead-lettered if the queue says so).
    public func reject(_ deliveryTag: UInt64, requeue: Bool) throws(AMQPError) {
        let status = amqp_basic_reject(state, channel, deliveryTag, requeue ? 1 : 0)
        guard status == AMQP_STATUS_OK.rawValue else { throw libraryError(status, "basic.reject") }
    }

    /// The next event, waiting up to `timeout` seconds (0: only what is already there; nil: forever).
    public func nextEvent(timeout: Double?) throws(AMQPError) -> AMQPEvent? {
        if !buffered.isEmpty { return buffered.removeFirst() }
        return try readEvent(timeout: timeout)
    }

    /// Blocks until every publish up to `sequence` is confirmed; returns those the broker nacked.
    /// Deliveries that arrive meanwhile are kept for `nextEvent`.
    public func waitForConfirms(through sequence: UInt64, timeout: Double = 30) throws(AMQPError) -> [UInt64] {
        var deadline = Date().addingTimeInterval(timeout)
        while confirmedThrough < sequence {
            // While the broker blocks publishers the wait is the alarm's, not a fault: reconnecting would not help
            // and would only make the broker redeliver work under way. Heartbeats still show the link alive.
            if isBlocked { deadline = Date().addingTimeInterval(timeout) }
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else {
                throw AMQPError(kind: .connectionLost, "no publisher confirm within \(Int(timeout)) s")
            }
            guard let event = try readEvent(timeout: remaining) else { continue }
            if case .confirm = event { continue }  // already folded in by readEvent
            buffered.append(event)
        }
        let lost = nacked.filter { $0 <= sequence }.sorted()
        nacked.subtract(lost)
        return lost
    }

    /// Confirms arrive as single acks or as "everything up to n"; this folds both into one watermark.
    private func recordConfirm(_ sequence: UInt64, multiple: Bool, ack: Bool) {
        if multiple {
            if !ack && sequence > confirmedThrough { nacked.formUnion((confirmedThrough + 1)...sequence) }
            confirmedThrough = max(confirmedThrough, sequence)
        } else {
            if !ack { nacked.insert(sequence) }
            confirmedSingles.insert(sequence)
        }
        while confirmedSingles.remove(confirmedThrough + 1) != nil { confirmedThrough += 1 }
        confirmedSingles = confirmedSingles.filter { $0 > confirmedThrough }
    }

    /// Sequence number the next publish will get.
    public var upcomingPublishSequence: UInt64 { nextPublishSequence }

    /// The mandatory publishes the broker handed back since the last call (a return precedes its publish's confirm,
    /// so after `waitForConfirms(through: n)` every return up to publish n is here).
    public func takeReturns() -> [AMQPReturn] {
        defer { returns.removeAll() }
        return returns
    }

    // MARK: reading frames

    /// The next frame, or nil if none came within `timeout` seconds (nil: wait as long as it takes).
    private func waitFrame(timeout: Double?) throws(AMQPError) -> amqp_frame_t? {
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
            throw AMQPError(kind: .connectionLost, code: Int(status),
                            "connection to \(url) lost: \(String(cString: amqp_error_string2(status)))")
        }
        return frame
    }

    private func readEvent(timeout: Double?) throws(AMQPError) -> AMQPEvent? {
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
                return .delivery(AMQPDelivery(deliveryTag: deliver.delivery_tag, redelivered: deliver.redelivered != 0,
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
                let handedBack = AMQPReturn(exchange: Self.string(returned.exchange),
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
    private func ended(by method: amqp_method_t, channel: amqp_channel_t) -> AMQPError {
        isOpen = false
        guard method.id == Method.channelClose else {
            // The broker ended a consumer (its queue was deleted, or its node left a cluster): nothing more will
            // arrive on it. Reported as a lost connection, so that the owner connects again, declares its queues
            // and consumes afresh, instead of waiting forever on a consumer that no longer exists.
            let cancel = method.decoded.assumingMemoryBound(to: amqp_basic_cancel_t.self).pointee
            return AMQPError(kind: .connectionLost,
                             "the broker cancelled consumer \(Self.string(cancel.consumer_tag)) (queue deleted?)")
        }
        let close = method.decoded.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
        var ok = amqp_channel_close_ok_t(dummy: 0)
        amqp_send_method(state, channel, Method.channelCloseOk, &ok)
        return AMQPError(kind: .brokerRefused, code: Int(close.reply_code),
                         "broker closed the channel: \(Self.string(close.reply_text))")
    }

    /// A delivery's header and body frames, read straight off the connection. (amqp_read_message would copy them
    /// into a fresh memory pool per message, a few thousand instructions for nothing on the per-job path.)
    private func readContent(channel: amqp_channel_t) throws(AMQPError) -> ([UInt8], AMQPProperties) {
        var size = 0
        defer { releaseFrameMemory(after: size) }
        var frame = amqp_frame_t()
        try waitFrame(&frame, channel: channel)
        guard frame.frame_type == UInt8(AMQP_FRAME_HEADER), let decoded = frame.payload.properties.decoded else {
            throw AMQPError(kind: .library, "reading a message: expected a content header, got frame type \(frame.frame_type)")
        }
        let properties = Self.properties(decoded.assumingMemoryBound(to: amqp_basic_properties_t.self).pointee,
                                         contentTypes: &recentContentTypes)
        size = Int(frame.payload.properties.body_size)
        var body: [UInt8] = []
        body.reserveCapacity(size)
        while body.count < size {
            try waitFrame(&frame, channel: channel)
            guard frame.frame_type == UInt8(AMQP_FRAME_BODY) else {
                throw AMQPError(kind: .library, "reading a message: expected a body frame, got frame type \(frame.frame_type)")
            }
            let fragment = frame.payload.body_fragment
            guard fragment.len > 0, let bytes = fragment.bytes, body.count + fragment.len <= size else {
                throw AMQPError(kind: .library, "reading a message: body frames do not add up to \(size) bytes")
            }
            body.append(contentsOf: UnsafeRawBufferPointer(start: bytes, count: fragment.len))
        }
        return (body, properties)
    }

    /// Gives librabbitmq's frame memory back every 64 messages or 256 KiB of them, rather than after each one (which
    /// cost about a thousand instructions per message): what a message's frames hold is copied out as it is read, so
    /// only the bound on the memory depends on when.
    private func releaseFrameMemory(after messageBytes: Int) {
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
    private func waitFrame(_ frame: inout amqp_frame_t, channel: amqp_channel_t) throws(AMQPError) {
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
    private func connectionMethod(_ method: amqp_method_t) throws(AMQPError) -> AMQPEvent? {
        switch method.id {
        case Method.connectionBlocked, Method.connectionUnblocked:
            isBlocked = method.id == Method.connectionBlocked
            return .blocked(isBlocked)
        case Method.connectionClose:
            let close = method.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
            isOpen = false
            throw AMQPError(kind: .connectionLost, code: Int(close.reply_code),
                            "broker closed the connection: \(Self.string(close.reply_text))")
        default:
            return nil
        }
    }

    // MARK: helpers

    private enum Method {
        static let connectionClose: amqp_method_number_t = 0x000A_0032
        static let connectionBlocked: amqp_method_number_t = 0x000A_003C
        static let connectionUnblocked: amqp_method_number_t = 0x000A_003D
        static let channelClose: amqp_method_number_t = 0x0014_0028
        static let channelCloseOk: amqp_method_number_t = 0x0014_0029
        static let basicCancel: amqp_method_number_t = 0x003C_001E
        static let basicReturn: amqp_method_number_t = 0x003C_0032
        static let basicDeliver: amqp_method_number_t = 0x003C_003C
        static let basicAck: amqp_method_number_t = 0x003C_0050
        static let basicNack: amqp_method_number_t = 0x003C_0078
    }

    private func check(_ reply: amqp_rpc_reply_t, _ what: String) throws(AMQPError) {
        switch reply.reply_type {
        case AMQP_RESPONSE_NORMAL:
            return
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            throw libraryError(reply.library_error, what)
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if reply.reply.id == Method.connectionClose {
                let close = reply.reply.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
                isOpen = false
                throw AMQPError(kind: .connectionLost, code: Int(close.reply_code),
                                "\(what): broker closed the connection: \(Self.string(close.reply_text))")
            }
            if reply.reply.id == Method.channelClose {
                let close = reply.reply.decoded.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
                var ok = amqp_channel_close_ok_t(dummy: 0)
                amqp_send_method(state, channel, Method.channelCloseOk, &ok)
                throw AMQPError(kind: .brokerRefused, code: Int(close.reply_code),
                                "\(what): \(Self.string(close.reply_text))")
            }
            throw AMQPError(kind: .brokerRefused, "\(what): unexpected broker method \(reply.reply.id)")
        default:
            throw AMQPError(kind: .library, "\(what): no reply")
        }
    }

    private func libraryError(_ status: Int32, _ what: String) -> AMQPError {
        let text = String(cString: amqp_error_string2(status))
        // A reply that timed out leaves the connection closed by librabbitmq: lost, like a broken socket.
        let lost = [AMQP_STATUS_SOCKET_ERROR, AMQP_STATUS_CONNECTION_CLOSED, AMQP_STATUS_HEARTBEAT_TIMEOUT,
                    AMQP_STATUS_SSL_ERROR, AMQP_STATUS_SOCKET_CLOSED, AMQP_STATUS_TCP_ERROR,
                    AMQP_STATUS_TIMEOUT].map(\.rawValue).contains(status)
        if lost {
            isOpen = false
            AMQPNodeHealth.shared.noteSilent(url)
        }
        return AMQPError(kind: lost ? .connectionLost : .library, code: Int(status), "\(what): \(text)")
    }

    /// librabbitmq takes strings as (length, pointer) pairs that must stay valid through the call. Swift's implicit
    /// String-to-pointer bridging (`amqp_cstring_bytes(name)`) lasts only for the call that receives it, so the
    /// pointer would dangle by the time librabbitmq reads it (two such arguments were seen to share one buffer).
    private func withBytes<T>(_ text: String, _ body: (amqp_bytes_t) -> T) -> T {
        var copy = text
        return copy.withUTF8 { buffer in
            body(amqp_bytes_t(len: buffer.count, bytes: UnsafeMutableRawPointer(mutating: buffer.baseAddress)))
        }
    }

    private func withBytes<T>(_ first: String, _ second: String, _ body: (amqp_bytes_t, amqp_bytes_t) -> T) -> T {
        withBytes(first) { firstBytes in withBytes(second) { body(firstBytes, $0) } }
    }

    static func string(_ bytes: amqp_bytes_t) -> String {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: bytes.len), as: UTF8.self)
    }

    private static func properties(_ raw: amqp_basic_properties_t, contentTypes: inout RecentNames) -> AMQPProperties {
        func field(_ flag: Int32, _ bytes: amqp_bytes_t) -> String? {
            raw._flags & amqp_flags_t(flag) != 0 ? string(bytes) : nil
        }
        var headers: [String: String] = [:]
        var deliveryCount: Int?
        if raw._flags & amqp_flags_t(AMQP_BASIC_HEADERS_FLAG) != 0, let entries = raw.headers.entries {
            for index in 0..<Int(raw.headers.num_entries) {
                let entry = entries[index]
                if entry.value.kind == UInt8(ascii: "S") || entry.value.kind == UInt8(ascii: "x") {
                    headers[string(entry.key)] = string(entry.value.value.bytes)
                } else if string(entry.key) == "x-delivery-count" {
                    deliveryCount = integer(entry.value)
                }
            }
        }
        return AMQPProperties(
            contentType: raw._flags & amqp_flags_t(AMQP_BASIC_CONTENT_TYPE_FLAG) != 0 ? contentTypes.string(raw.content_type) : nil,
            replyTo: field(AMQP_BASIC_REPLY_TO_FLAG, raw.reply_to),
            correlationID: field(AMQP_BASIC_CORRELATION_ID_FLAG, raw.correlation_id),
            messageID: field(AMQP_BASIC_MESSAGE_ID_FLAG, raw.message_id),
            persistent: raw._flags & amqp_flags_t(AMQP_BASIC_DELIVERY_MODE_FLAG) != 0 && raw.delivery_mode == 2,
            timestamp: raw._flags & amqp_flags_t(AMQP_BASIC_TIMESTAMP_FLAG) != 0
                ? Int64(clamping: raw.timestamp) : nil,
            headers: headers, deliveryCount: deliveryCount)
    }

    /// An integer field of a table, of whichever width the sender chose; nil for any other kind.
    private static func integer(_ field: amqp_field_value_t) -> Int? {
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
    private func withProperties<T>(_ properties: AMQPProperties,
                                   _ body: (UnsafePointer<amqp_basic_properties_t>) -> T) -> T {
        var strings = CStringArena()
        var raw = amqp_basic_properties_t()
        raw._flags = amqp_flags_t(AMQP_BASIC_DELIVERY_MODE_FLAG)
        raw.delivery_mode = properties.persistent ? 2 : 1
        if let value = properties.contentType {
            raw._flags |= amqp_flags_t(AMQP_BASIC_CONTENT_TYPE_FLAG)
            raw.content_type = strings.bytes(value)
        }
        if let value = properties.replyTo {
            raw._flags |= amqp_flags_t(AMQP_BASIC_REPLY_TO_FLAG)
            raw.reply_to = strings.bytes(value)
        }
        if let value = properties.correlationID {
            raw._flags |= amqp_flags_t(AMQP_BASIC_CORRELATION_ID_FLAG)
            raw.correlation_id = strings.bytes(value)
        }
        if let value = properties.messageID {
            raw._flags |= amqp_flags_t(AMQP_BASIC_MESSAGE_ID_FLAG)
            raw.message_id = strings.bytes(value)
        }
        if let value = properties.timestamp, value >= 0 {
            raw._flags |= amqp_flags_t(AMQP_BASIC_TIMESTAMP_FLAG)
            raw.timestamp = UInt64(value)
        }
        let entries = UnsafeMutablePointer<amqp_table_entry_t>.allocate(capacity: max(1, properties.headers.count))
        defer {
            entries.deallocate()
            strings.free()
        }
        if !properties.headers.isEmpty {
            raw._flags |= amqp_flags_t(AMQP_BASIC_HEADERS_FLAG)
            for (index, key) in properties.headers.keys.sorted().enumerated() {
                var value = amqp_field_value_t()
                value.kind = UInt8(ascii: "S")
                value.value.bytes = strings.bytes(properties.headers[key]!)
                entries[index] = amqp_table_entry_t(key: strings.bytes(key), value: value)
            }
            raw.headers = amqp_table_t(num_entries: Int32(properties.headers.count), entries: entries)
        }
        return body(&raw)
    }

    private func withTable<T>(_ arguments: [String: AMQPArgument], _ body: (amqp_table_t) -> T) -> T {
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

/// A queue argument value (x-message-ttl, x-dead-letter-routing-key, ...).
public enum AMQPArgument: Sendable, Equatable {
    case string(String)
    case integer(Int64)
}

/// C copies of strings for one librabbitmq call, freed together afterwards.
private struct CStringArena {
    private var allocations: [UnsafeMutableRawPointer] = []

    mutating func bytes(_ text: String) -> amqp_bytes_t {
        let utf8 = Array(text.utf8)
        let memory = UnsafeMutableRawPointer.allocate(byteCount: max(1, utf8.count), alignment: 1)
        utf8.withUnsafeBytes { memory.copyMemory(from: $0.baseAddress!, byteCount: utf8.count) }
        allocations.append(memory)
        return amqp_bytes_t(len: utf8.count, bytes: memory)
    }

    func free() { for memory in allocations { memory.deallocate() } }
}

/// The last few names read off the wire (a delivery's consumer tag and routing key), kept as Strings: the same few
/// come with every delivery, and a tag of 31 bytes would otherwise cost a String allocation per message.
private struct RecentNames {
    private var names: [String] = []
    private var next = 0

    mutating func string(_ bytes: amqp_bytes_t) -> String {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        let wire = UnsafeRawBufferPointer(start: pointer, count: bytes.len)
        // By index, in place: a loop variable would be a copy of each name (a reference count on and off).
        for index in names.indices where names[index].utf8.count == wire.count {
            let same = names[index].utf8.withContiguousStorageIfAvailable { memcmp($0.baseAddress!, pointer, wire.count) == 0 }
            if same == true { return names[index] }
        }
        let name = String(decoding: wire, as: UTF8.self)
        if names.count < 4 { names.append(name) } else { names[next] = name; next = (next + 1) % 4 }
        return name
    }
}
