internal import CRabbitMQ
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One AMQP 0-9-1 connection with one channel, owning its librabbitmq state.
///
/// Not thread-safe, as librabbitmq is not: one thread owns it and makes every call. Calls block on the socket.
public final class AMQPConnection {
    public let url: AMQPURL
    let state: amqp_connection_state_t
    let channel: amqp_channel_t = 1
    var nextPublishSequence: UInt64 = 1
    var confirmsEnabled = false
    var isOpen = false
    /// Events read while waiting for something else (confirms), handed out first by `nextEvent`.
    var buffered: [AMQPEvent] = []
    /// The consumer tags and routing keys of deliveries: the same few again and again.
    var recentNames = RecentNames()
    /// Content types of recent messages, apart from the names: every job carries one ("application/json" is one byte
    /// too long to be stored inline in a String, so each would cost an allocation).
    var recentContentTypes = RecentNames(names: [AMQPProperties.jsonContentType])
    /// Messages and their bytes read since librabbitmq's frame memory was last given back (`releaseFrameMemory`).
    var messagesSinceRelease = 0
    var bytesSinceRelease = 0
    /// The broker said it blocks this connection's publishes (a memory or disk alarm) and has not lifted it yet.
    public internal(set) var isBlocked = false
    /// Told the reply code when the broker closes the channel (404 NOT_FOUND: a queue or exchange missing), on the
    /// thread that met it, before the error is thrown.
    public var onChannelClose: ((Int) -> Void)?
    /// Every publish up to here is confirmed (acked or nacked).
    var confirmedThrough: UInt64 = 0
    var confirmedSingles = Set<UInt64>()
    var nacked = Set<UInt64>()
    /// Mandatory publishes handed back, since the last `takeReturns`.
    var returns: [AMQPReturn] = []

    /// Seconds a call that waits for the broker's reply (a declare, a passive declare) waits at most, unless the
    /// connection is opened with another `replyTimeout`.
    public static let replyTimeout = 10.0

    /// Connects, logs in and opens channel 1. `heartbeat` in seconds (0: none). `connectTimeout` bounds the TCP (and
    /// TLS) connection and the login handshake each; `replyTimeout`, every later call that waits for a reply.
    public init(
        url: AMQPURL, heartbeat: Int = 30, connectTimeout: Double = 10, replyTimeout: Double = replyTimeout,
        caFile: String? = nil, verifyPeer: Bool = true
    ) throws(AMQPError) {
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
        var timeout = timeval(
            tv_sec: Int(connectTimeout), tv_usec: Int(connectTimeout.truncatingRemainder(dividingBy: 1) * 1e6))
        let opened = amqp_socket_open_noblock(socket, url.host, Int32(url.port), &timeout)
        guard opened == AMQP_STATUS_OK.rawValue else {
            AMQPNodeHealth.shared.noteSilent(url)
            throw AMQPError(
                kind: .connectionLost, code: Int(opened),
                "cannot connect to \(url): \(String(cString: amqp_error_string2(opened)))")
        }
        // A node that accepts the connection and then answers nothing (frozen, cut off) is given up on as soon as a
        // node that does not answer at all.
        amqp_set_handshake_timeout(state, &timeout)
        let login = CRabbitMQ_login_plain_with_capabilities(
            state, url.virtualHost, 0, 131_072, Int32(heartbeat), url.user, url.password)
        try check(login, "login to \(url) (user \(url.user), vhost \(url.virtualHost))")
        // Every call that waits for the broker's reply gives up after this long: a broker that stops answering (a
        // frozen node) is found out by the next call, not after two missed heartbeats.
        var rpcTimeout = timeval(
            tv_sec: Int(replyTimeout),
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
        } catch  where error.code == Int(AMQP_PRECONDITION_FAILED) {
            try reopenChannel()
            guard let status = try queueStatus(name) else {
                throw AMQPError(
                    kind: .brokerRefused, code: Int(AMQP_NOT_FOUND), "queue \(name) vanished while declared")
            }
            return status.messages
        }
        return 0
    }

    /// Declares durable queues as `declareQueue` does each, in a few round trips rather than one each: the
    /// declarations go without waiting for their replies (no-wait), ten at a time, and a passive declare of the last
    /// of each ten answers for them, since the broker handles a channel's methods in order and a declaration it
    /// refuses closes the channel (the close then comes instead of that answer). Ten at a time, so that what the
    /// broker does for one answer stays well within a reply's timeout. If the broker refuses one (a queue that
    /// exists with other arguments), those ten are declared again one at a time, which uses such a queue as it is.
    public func declareQueues(_ queues: [(name: String, arguments: [String: AMQPArgument])]) throws(AMQPError) {
        for start in stride(from: 0, to: queues.count, by: Self.declarationsPerRoundTrip) {
            let some = queues[start..<min(start + Self.declarationsPerRoundTrip, queues.count)]
            for queue in some {
                let status = withTable(queue.arguments) { table in
                    withBytes(queue.name) { name in
                        var method = amqp_queue_declare_t(
                            ticket: 0, queue: name, passive: 0, durable: 1, exclusive: 0, auto_delete: 0, nowait: 1,
                            arguments: table)
                        return amqp_send_method(state, channel, Method.queueDeclare, &method)
                    }
                }
                guard status == AMQP_STATUS_OK.rawValue else {
                    throw libraryError(status, "queue.declare \(queue.name)")
                }
            }
            // Nil, or a refusal (whose channel is then reopened): one of the ten was not declared.
            let declared: Bool
            do throws(AMQPError) {
                declared = try queueStatus(some.last!.name) != nil
            } catch  where error.kind == .brokerRefused {
                try reopenChannel()
                declared = false
            }
            if !declared { for queue in some { try declareQueue(queue.name, arguments: queue.arguments) } }
        }
    }

    /// How many queues `declareQueues` declares a round trip.
    public static let declarationsPerRoundTrip = 10

    /// A queue's depth and consumer count, or nil if there is no such queue (a passive declare, which creates
    /// nothing).
    public func queueStatus(_ name: String) throws(AMQPError) -> (messages: Int, consumers: Int)? {
        guard let passive = withBytes(name, { amqp_queue_declare(state, channel, $0, 1, 0, 0, 0, amqp_empty_table) })
        else {
            do {
                try check(amqp_get_rpc_reply(state), "queue.declare (passive) \(name)")
            } catch  where error.code == Int(AMQP_NOT_FOUND) {
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
        } catch  where error.code == Int(AMQP_PRECONDITION_FAILED) {
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

    /// Deletes an exchange (operators' and tests' tool; the worker never deletes).
    public func deleteExchange(_ name: String) throws(AMQPError) {
        _ = withBytes(name) { amqp_exchange_delete(state, channel, $0, 0) }
        try check(amqp_get_rpc_reply(state), "exchange.delete \(name)")
    }

    public func bindQueue(_ queue: String, to exchange: String, routingKey: String = "") throws(AMQPError) {
        _ = withBytes(queue, exchange) { queueBytes, exchangeBytes in
            withBytes(routingKey) { amqp_queue_bind(state, channel, queueBytes, exchangeBytes, $0, amqp_empty_table) }
        }
        try check(amqp_get_rpc_reply(state), "queue.bind \(queue) to \(exchange)")
    }

    /// After a channel-level error the broker has closed the channel: open it again, with confirms if they were on.
    func reopenChannel() throws(AMQPError) {
        amqp_channel_open(state, channel)
        try check(amqp_get_rpc_reply(state), "channel.open")
        if confirmsEnabled {
            confirmsEnabled = false
            try enablePublisherConfirms()
        }
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
        guard
            let reply = withBytes(
                queue,
                {
                    amqp_basic_consume(
                        state, channel, $0, amqp_empty_bytes, 0,
                        acknowledging ? 0 : 1, 0, amqp_empty_table)
                })
        else {
            try check(amqp_get_rpc_reply(state), "basic.consume \(queue)")
            return ""
        }
        // The tag its deliveries will carry is the very string returned here: a caller telling consumers apart by
        // tag then compares one string with itself, which costs nothing, on every delivery.
        return recentNames.string(reply.pointee.consumer_tag)
    }

    /// Stops the consumer `consumerTag`: the broker hands it nothing more. What it handed over stays unacknowledged
    /// on the channel, to be acknowledged or handed back as usual; deliveries on their way when the broker answers
    /// are read as usual too.
    public func cancel(_ consumerTag: String) throws(AMQPError) {
        _ = withBytes(consumerTag) { amqp_basic_cancel(state, channel, $0) }
        try check(amqp_get_rpc_reply(state), "basic.cancel")
    }

    // MARK: messages

    /// Publishes to `exchange`, by default the default exchange (straight to the queue named `queue`).
    /// Returns the publish's confirm sequence number.
    @discardableResult
    public func publish(
        to queue: String, exchange: String = "", body: [UInt8], properties: AMQPProperties = .init(),
        mandatory: Bool = false
    ) throws(AMQPError) -> UInt64 {
        // Checked before anything is sent: librabbitmq would fail half-way, after the publish method went out.
        let frame = Int(amqp_get_frame_max(state))
        guard let size = properties.headerFrameSize(), size <= frame else {
            throw AMQPError(
                kind: .propertiesTooLarge, code: Int(AMQP_STATUS_TABLE_TOO_BIG.rawValue),
                "basic.publish to \(queue): the properties (\(properties.headers.count + properties.otherHeaders.count) "
                    + "headers) do not fit one frame of \(frame) bytes, or hold a short string over 255 bytes")
        }
        let status = withProperties(properties) { props -> Int32 in
            withBytes(exchange, queue) { exchangeBytes, queueBytes in
                body.withUnsafeBytes { raw in
                    amqp_basic_publish(
                        state, channel, exchangeBytes, queueBytes, mandatory ? 1 : 0, 0, props,
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
    func recordConfirm(_ sequence: UInt64, multiple: Bool, ack: Bool) {
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
}

/// A queue argument value (x-message-ttl, x-dead-letter-routing-key, ...).
public enum AMQPArgument: Sendable, Equatable {
    case string(String)
    case integer(Int64)
}

/// C copies of strings for one librabbitmq call, freed together afterwards.
struct CStringArena {
    var allocations: [UnsafeMutableRawPointer] = []

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
struct RecentNames {
    var names: [String] = []
    var next = 0

    mutating func string(_ bytes: amqp_bytes_t) -> String {
        guard bytes.len > 0, let pointer = bytes.bytes else { return "" }
        let wire = UnsafeRawBufferPointer(start: pointer, count: bytes.len)
        // By index, in place: a loop variable would be a copy of each name (a reference count on and off).
        for index in names.indices where names[index].utf8.count == wire.count {
            let same = names[index].utf8.withContiguousStorageIfAvailable {
                memcmp($0.baseAddress!, pointer, wire.count) == 0
            }
            if same == true { return names[index] }
        }
        let name = String(decoding: wire, as: UTF8.self)
        if names.count < 4 {
            names.append(name)
        } else {
            names[next] = name
            next = (next + 1) % 4
        }
        return name
    }
}
