internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// Per-stream state, owned by its connection: a server's streams are these, a client's `HTTP2RequestStream`s.
class HTTP2Stream {
    /// Set when nghttp2 numbers it (a client's at submission, a server's when its request begins).
    var id: Int32 = 0
    /// The connection's open streams, oldest first: a list through the streams themselves, so that opening and
    /// closing one hashes nothing. nghttp2 finds a stream for a callback through its stream user data.
    var next: HTTP2Stream?
    unowned(unsafe) var previous: HTTP2Stream?
    /// In the connection's list (removing a stream twice would unlink its neighbours).
    var listed = false
    /// The answer broke HTTP (a second final status, a status that is no status, a body past the limit): the stream
    /// is reset, and its request answered as reset, whatever came before.
    var malformed = false
    /// The fields kept of those received, allocated at the first one kept (`expectedHeaderBytes` of room): an answer
    /// that keeps none allocates nothing.
    var incomingHeaders = HTTP2HeaderBlock(capacity: 0)
    let expectedHeaderBytes: Int
    var incomingBody: [UInt8] = []
    var status = 0
    /// A server's answer; a client's request is read where its batch holds it (`outgoingBytes`).
    var outgoingBody: [UInt8]
    var outgoingOffset = 0
    /// The request's HEADERS left this process: from here on the server may have acted on it.
    var headersSent = false
    /// When it opened (`HTTP2Connection.append`).
    var startedAt: UInt64 = 0

    /// `expectedHeaderBytes`: room for the incoming fields at once (they arrive one by one).
    init(expectedHeaderBytes: Int, outgoingBody: [UInt8] = []) {
        self.expectedHeaderBytes = expectedHeaderBytes
        self.outgoingBody = outgoingBody
    }

    /// The body to send: `outgoingBody`, or what a request stream names instead.
    var outgoingBytes: ArraySlice<UInt8> { outgoingBody[...] }
}

/// One HTTP/2 connection over TLS on a non-blocking socket, client or server, driven by one `EventLoop`.
/// The TLS layer owns the socket; nghttp2 only turns bytes into frames and back (mem_recv / mem_send), so the
/// bytes of many frames leave in one SSL_write.
final class HTTP2Connection: PollHandler {
    enum Role {
        case client
        case server(HTTP2RequestHandler)
    }

    enum State: Equatable { case connecting, handshaking, open, closed }

    /// Largest response or request body accepted; anything bigger resets the stream (hostile or broken peer).
    static let maximumBodySize = 1 << 20
    static let writeBatchSize = 64 * 1024
    static let readBufferSize = 64 * 1024

    let id: Int
    let loop: EventLoop
    let fileDescriptor: Int32
    let role: Role
    var state: State
    let tls: TLSStream
    /// Read once, after the handshake (server connections only ask).
    lazy var peerCertificateCommonName: String? = tls.peerCertificateCommonName
    var session: OpaquePointer?
    /// nghttp2's allocations for this session; outlives it (deinit deletes the session first).
    let memoryPool = Nghttp2MemoryPool()
    /// The open streams, oldest first (see `HTTP2Stream.next`); each is also nghttp2's user data of its stream,
    /// unretained: the list owns it, and a stream leaves nghttp2's user data when it leaves the list.
    var firstStream: HTTP2Stream?
    unowned(unsafe) var lastStream: HTTP2Stream?
    var openStreamCount = 0
    /// The stream the last callback was about: a response's fields arrive one callback each for one stream, so it is
    /// checked first. Unretained: `remove` clears it before the list lets the stream go.
    var recentStream: Unmanaged<HTTP2Stream>?
    var outbound: [UInt8] = []
    var outboundSent = 0
    var wantsWrite = false
    var handshakeWantsWrite = false
    let readBuffer: UnsafeMutableRawBufferPointer
    var closeRequested: String?
    /// True while input is being handed to nghttp2: answers made meanwhile leave in the one flush that follows.
    var processingInput = false
    let serverSettings: [(id: Int32, value: UInt32)]
    /// A server that leaves PINGs unanswered plays a dead peer (fault simulation).
    let acknowledgesPings: Bool
    /// Names of the incoming header fields kept (nil: all), and of those kept of a client's successful (2xx) answer.
    let keptHeaders: [[UInt8]]?
    let keptSuccessHeaders: [[UInt8]]?
    /// The fields of client streams that left before nghttp2 sent their HEADERS frame (lent to it, not copied:
    /// `submitRequest`): kept until it has sent the frame or given up on it. The reset a timed-out stream gets cancels
    /// its queued frame, but the fields' lifetime does not depend on that.
    var lentHeaders: [Int32: HTTP2HeaderBlock] = [:]
    /// The fields of the block lent last, read once for the requests that share it.
    var lentFields = Nghttp2FieldsCache()
    /// The earliest send-by time of a client stream whose HEADERS may still wait in nghttp2's queue (`.max`: none):
    /// until then, sending checks none of them (`dropUnsentRequests`).
    var earliestQueuedSendBy = UInt64.max
    /// Bit n set: a name of n bytes (bit 63: of 63 or more) may be kept or read (":status" included). A server's
    /// answer carries fields the client drops (date, server): most are told apart by their length alone, before any
    /// lookup.
    let keptNameLengths: UInt64

    /// A continuation of reading is queued on the loop (what is left may sit in TLS's buffer, which poll cannot see).
    var readingContinues = false

    // The client's liveness (HTTP2ClientConnection.swift).
    /// Last time a frame arrived (monotonic ns): what idleness and PING timeouts are measured from.
    var lastFrameReceivedAt = EventLoop.now()
    /// When the unanswered PING was sent, if one is out.
    var pingSentAt: UInt64?
    var pingsAcknowledged = 0
    /// Complete responses received: a connection that never got one did not prove the endpoint healthy.
    var responsesReceived = 0

    /// GOAWAY from the peer: streams above `lastStreamID` were not processed.
    var goAwayReceived: (lastStreamID: Int32, errorCode: UInt32, debugData: String)?
    var goAwaySent = false

    // Each handler is given its connection, so that none needs to capture it (weakly, to avoid a cycle: see
    // HTTP2ResponseWriter.connection for what a weak reference costs).
    var onOpen: ((HTTP2Connection) -> Void)?
    var onClose: ((HTTP2Connection, String) -> Void)?
    var onRemoteSettings: ((HTTP2Connection, Int) -> Void)?
    var onGoAway: ((HTTP2Connection, Int32, UInt32, String) -> Void)?
    var onPingAcknowledged: ((HTTP2Connection) -> Void)?
    /// A client stream ended: its request and the answer, or why there is none.
    var onResponse: ((HTTP2RequestStream, Result<HTTP2Response, HTTP2StreamError>) -> Void)?

    init(
        id: Int, loop: EventLoop, fileDescriptor: Int32, tls: TLSStream, role: Role, connecting: Bool,
        serverSettings: [(id: Int32, value: UInt32)] = [], acknowledgesPings: Bool = true,
        keptHeaders: [[UInt8]]? = nil, keptSuccessHeaders: [[UInt8]]? = nil
    ) {
        self.keptHeaders = keptHeaders
        self.keptSuccessHeaders = keptSuccessHeaders ?? keptHeaders
        keptNameLengths =
            keptHeaders.map { names in
                names.reduce(UInt64(1) << 7) { mask, name in mask | UInt64(1) << min(name.count, 63) }
            } ?? .max
        self.id = id
        self.loop = loop
        self.fileDescriptor = fileDescriptor
        self.tls = tls
        self.role = role
        self.state = connecting ? .connecting : .handshaking
        self.serverSettings = serverSettings
        self.acknowledgesPings = acknowledgesPings
        readBuffer = .allocate(byteCount: Self.readBufferSize, alignment: 16)
    }

    deinit {
        // A connection nobody closed (its owner dropped it) still gives its socket back.
        if state != .closed {
            tls.shutdown()
            Glibc.close(fileDescriptor)
        }
        if let session { nghttp2_session_del(session) }
        readBuffer.deallocate()
    }

    var isClient: Bool { if case .client = role { true } else { false } }

    /// A connection that may take a new request now.
    var acceptsRequests: Bool { state == .open && goAwayReceived == nil && !goAwaySent && closeRequested == nil }

    /// Open or on its way to open, and not going away: counts toward the pool's size.
    var isUsable: Bool { state != .closed && goAwayReceived == nil && !goAwaySent }

    /// Whether the peer's SETTINGS arrived: until then `remoteMaxConcurrentStreams` is nghttp2's unlimited default.
    var remoteSettingsReceived = false

    var remoteMaxConcurrentStreams: Int {
        guard let session else { return 1 }
        return Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
    }

    // MARK: PollHandler

    var pollEvents: Int16 {
        switch state {
        case .connecting: Int16(POLLOUT)
        case .handshaking: Int16(handshakeWantsWrite ? POLLOUT : POLLIN)
        case .open: Int16(POLLIN) | (wantsWrite ? Int16(POLLOUT) : 0)
        case .closed: 0
        }
    }

    func handlePollEvents(_ events: Int16) {
        switch state {
        case .connecting:
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fileDescriptor, SOL_SOCKET, SO_ERROR, &error, &length)
            if error != 0 || events & Int16(POLLERR | POLLHUP) != 0 && events & Int16(POLLOUT) == 0 {
                close(reason: "connect failed: \(String(cString: strerror(error == 0 ? ECONNREFUSED : error)))")
                return
            }
            state = .handshaking
            continueHandshake()
        case .handshaking:
            if events & Int16(POLLIN | POLLERR | POLLHUP) != 0 { tls.socketReadable() }
            continueHandshake()
        case .open:
            if events & Int16(POLLIN | POLLERR | POLLHUP) != 0 {
                tls.socketReadable()
                readAvailable()
            }
            if state == .open && events & Int16(POLLOUT) != 0 { flush() }
        case .closed:
            break
        }
    }

    // MARK: handshake

    func continueHandshake() {
        switch tls.handshake() {
        case .done:
            guard tls.negotiatedProtocol == "h2" else {
                close(reason: "the peer did not negotiate HTTP/2 (ALPN h2)")
                return
            }
            startSession()
        case .wantRead: handshakeWantsWrite = false
        case .wantWrite: handshakeWantsWrite = true
        case .closed: close(reason: "the peer closed the connection during the TLS handshake")
        case .failed(let message): close(reason: message)
        }
    }

    func startSession() {
        let callbacks = sessionCallbacks(client: isClient)
        defer { nghttp2_session_callbacks_del(callbacks) }
        let userData = Unmanaged.passUnretained(self).toOpaque()
        var settings: [nghttp2_settings_entry]
        // A large receive window: responses and requests are small, but many streams share the connection.
        let window: UInt32 = 1 << 24
        var options: OpaquePointer?
        nghttp2_option_new(&options)
        defer { nghttp2_option_del(options) }
        // No RFC 7540 priority tree (RFC 9113 deprecates it): nghttp2 then keeps no closed streams around for it and
        // spends nothing per stream on dependency bookkeeping that neither APNs nor this client uses.
        nghttp2_option_set_no_closed_streams(options, 1)
        let noPriorities = nghttp2_settings_entry(
            settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1)
        var allocator = memoryPool.nghttp2Allocator
        if isClient {
            // The client checks what it reads of an answer itself (`header`: the status, the kept fields) and bounds
            // the body; nghttp2's HTTP checks of every field cost about a thousand instructions per request against a
            // server that sends six. Frame-level checks (HPACK, flow control, stream states) remain.
            nghttp2_option_set_no_http_messaging(options, 1)
            // One stream until the peer's SETTINGS say how many (nghttp2 assumes 100): APNs allows one until a valid
            // provider token was posted, and a server refuses streams past a limit it announced, or closes for them.
            nghttp2_option_set_peer_max_concurrent_streams(options, 1)
            nghttp2_session_client_new3(&session, callbacks, userData, options, &allocator)
            settings = [
                nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
                nghttp2_settings_entry(
                    settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                    value: window), noPriorities
            ]
        } else {
            if !acknowledgesPings { nghttp2_option_set_no_auto_ping_ack(options, 1) }
            nghttp2_session_server_new3(&session, callbacks, userData, options, &allocator)
            settings = [
                nghttp2_settings_entry(
                    settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                    value: window), noPriorities
            ]
            for setting in serverSettings {
                settings.removeAll { $0.settings_id == setting.id }
                settings.append(nghttp2_settings_entry(settings_id: setting.id, value: setting.value))
            }
        }
        guard let session else {
            close(reason: "nghttp2 session creation failed")
            return
        }
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), settings, settings.count)
        nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, Int32(window))
        state = .open
        onOpen?(self)
        flush()
    }

    // MARK: nghttp2 events (called from the callbacks below, inside mem_recv / mem_send)

    func header(streamID: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        guard keptNameLengths & (1 << min(name.count, 63)) != 0 else { return }
        withOpenStream(streamID) { stream in keep(name, value, of: stream) }
    }

    private func keep(_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>, of stream: HTTP2Stream) {
        if isClient {
            // Compared whole: ":scheme" has seven bytes and the same start too.
            if name.count == 7 && memcmp(name.baseAddress!, ":status", 7) == 0 { readStatus(value, of: stream) }
            // The fields of an interim (1xx) answer, or of one without a status, are not the answer's.
            guard stream.status >= 200 && !stream.malformed else { return }
        }
        guard stream.incomingHeaders.count < 128 else { return }
        // The status comes first (HTTP/2 sends pseudo-header fields before the others): known here.
        let keptNames = isClient && stream.status < 300 ? keptSuccessHeaders : keptHeaders
        if let keptNames,
            !keptNames.contains(where: { kept in
                kept.count == name.count
                    && kept.withUnsafeBytes { memcmp($0.baseAddress!, name.baseAddress!, name.count) == 0 }
            })
        {
            return
        }
        // A client checks what it keeps (a server's nghttp2 session still checks every field): a name as HTTP/2
        // writes them when it keeps every field, and no control character in a value (a line break: a header
        // injected into a log).
        if isClient
            && ((keptNames == nil && !Self.isFieldName(name)) || Self.hasControlCharacter(value))
        {
            return
        }
        if stream.incomingHeaders.count == 0 { stream.incomingHeaders.reserveCapacity(stream.expectedHeaderBytes) }
        stream.incomingHeaders.add(raw: name, value)
    }

    /// An answer's `:status`, checked here (nghttp2's HTTP checks are off for clients): three digits from 100 to 599,
    /// any number of interim (1xx) ones before one final status, and no 101 (HTTP/2 has no protocol switch).
    /// Anything else makes the answer malformed.
    func readStatus(_ value: UnsafeBufferPointer<UInt8>, of stream: HTTP2Stream) {
        let digits = value.count == 3 && value.allSatisfy { $0 &- 48 < 10 }
        let status = digits ? value.reduce(0) { $0 * 10 + Int($1 &- 48) } : 0
        guard stream.status < 200, (100...599).contains(status), status != 101 else { return malformed(stream) }
        stream.status = status
    }

    /// Resets a stream whose answer broke HTTP; its request is answered as reset when the stream closes.
    func malformed(_ stream: HTTP2Stream) {
        guard !stream.malformed else { return }
        stream.malformed = true
        if let session {
            nghttp2_submit_rst_stream(
                session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream.id, NGHTTP2_PROTOCOL_ERROR.rawValue)
        }
    }

    /// Whether `value` holds a byte below 0x20 or 0x7F (DEL), eight bytes at a time: every kept field of every answer
    /// is checked. In each word, a byte below 0x20 sets its top bit in `(w - 0x20..) & ~w`, and DEL, turned into zero
    /// by the XOR, in `(x - 0x01..) & ~x`; bytes of 0x80 and above are masked out by `~w` and `~x`. A borrow only
    /// reaches bytes above one that matched, so the answer is exact.
    static func hasControlCharacter(_ value: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let base = value.baseAddress else { return false }
        let raw = UnsafeRawPointer(base)
        let ones: UInt64 = 0x0101_0101_0101_0101
        let high = ones &* 0x80
        var index = 0
        while index + 8 <= value.count {
            let word = raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            let deleted = word ^ (ones &* 0x7F)
            if ((word &- ones &* 0x20) & ~word | (deleted &- ones) & ~deleted) & high != 0 { return true }
            index += 8
        }
        while index < value.count {
            if value[index] < 0x20 || value[index] == 0x7F { return true }
            index += 1
        }
        return false
    }

    /// A field name as HTTP/2 allows it: lower-case token characters (RFC 9110 5.6.2), a colon before a pseudo-field.
    static func isFieldName(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !name.isEmpty else { return false }
        for (index, byte) in name.enumerated() {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "!"), UInt8(ascii: "#")...UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^")...UInt8(ascii: "`"), UInt8(ascii: "|"),
                UInt8(ascii: "~"):
                continue
            case UInt8(ascii: ":") where index == 0: continue
            default: return false
            }
        }
        return true
    }

    /// The open stream a callback is about, through nghttp2's stream user data (its own stream map, which it
    /// searches anyway): nil for a stream that is not open here.
    func stream(_ streamID: Int32) -> HTTP2Stream? {
        openStream(streamID)?.takeUnretainedValue()
    }

    /// `body` on the open stream `streamID` names, if any, lent without the counted reference `stream(_:)` takes
    /// and gives back: for the callbacks of every field and frame, none of which removes the stream.
    @inline(__always)
    func withOpenStream(_ streamID: Int32, _ body: (HTTP2Stream) -> Void) {
        openStream(streamID)?._withUnsafeGuaranteedRef(body)
    }

    @inline(__always)
    private func openStream(_ streamID: Int32) -> Unmanaged<HTTP2Stream>? {
        if let recentStream, recentStream._withUnsafeGuaranteedRef({ $0.id == streamID }) { return recentStream }
        guard let session, let userData = nghttp2_session_get_stream_user_data(session, streamID) else { return nil }
        // Unretained: the list owns the stream while nghttp2 has it as user data.
        let stream = Unmanaged<HTTP2Stream>.fromOpaque(userData)
        recentStream = stream
        return stream
    }

    /// The open streams, oldest first.
    var openStreams: [HTTP2Stream] {
        var streams: [HTTP2Stream] = []
        streams.reserveCapacity(openStreamCount)
        var current = firstStream
        while let stream = current {
            streams.append(stream)
            current = stream.next
        }
        return streams
    }

    /// A stream nghttp2 just numbered joins the open streams (its user data was given to nghttp2 already).
    func append(_ stream: HTTP2Stream, id: Int32) {
        stream.id = id
        stream.listed = true
        stream.startedAt = EventLoop.now()
        stream.previous = lastStream
        if let lastStream { lastStream.next = stream } else { firstStream = stream }
        lastStream = stream
        openStreamCount += 1
    }

    /// A stream leaves the open streams, and nghttp2's user data: no callback finds it after this.
    func remove(_ stream: HTTP2Stream) {
        guard stream.listed else { return }
        stream.listed = false
        // nghttp2 may still send its HEADERS frame (queued behind the peer's stream limit), reading the lent fields.
        if !stream.headersSent, isClient { lentHeaders[stream.id] = Self.requestStream(stream).requestHeaders }
        withExtendedLifetime(stream) {
            if let session { nghttp2_session_set_stream_user_data(session, stream.id, nil) }
            if recentStream?.toOpaque() == Unmanaged.passUnretained(stream).toOpaque() { recentStream = nil }
            let previous = stream.previous
            let next = stream.next
            if let previous { previous.next = next } else { firstStream = next }
            if let next { next.previous = previous } else { lastStream = previous }
            stream.next = nil
            stream.previous = nil
            openStreamCount -= 1
        }
    }

    /// A body chunk; one past `maximumBodySize` makes the stream malformed (reset) rather than growing memory.
    func dataChunk(streamID: Int32, _ data: UnsafeBufferPointer<UInt8>) {
        guard let stream = stream(streamID), !stream.malformed else { return }
        guard stream.incomingBody.count + data.count <= Self.maximumBodySize else { return malformed(stream) }
        stream.incomingBody.append(contentsOf: data)
    }

    func frameReceived(type: UInt8, flags: UInt8, streamID: Int32, frame: UnsafePointer<nghttp2_frame>) {
        lastFrameReceivedAt = EventLoop.now()
        switch UInt32(type) {
        case NGHTTP2_PING.rawValue where flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
            pingSentAt = nil
            pingsAcknowledged += 1
            onPingAcknowledged?(self)
        case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
            if !isClient && flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 { dispatchRequest(streamID: streamID) }
        case NGHTTP2_SETTINGS.rawValue:
            if flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 {
                remoteSettingsReceived = true
                onRemoteSettings?(self, remoteMaxConcurrentStreams)
            }
        case NGHTTP2_GOAWAY.rawValue:
            let goaway = frame.pointee.goaway
            let debug =
                goaway.opaque_data_len > 0 && goaway.opaque_data != nil
                ? String(
                    decoding: UnsafeBufferPointer(start: goaway.opaque_data, count: goaway.opaque_data_len),
                    as: UTF8.self)
                : ""
            goAwayReceived = (goaway.last_stream_id, goaway.error_code, debug)
            onGoAway?(self, goaway.last_stream_id, goaway.error_code, debug)
        default:
            break
        }
    }

    func beginHeaders(streamID: Int32, category: UInt32) {
        // A request's fields, a provider token among them, take about half a kilobyte.
        guard !isClient && category == NGHTTP2_HCAT_REQUEST.rawValue, let session else { return }
        let stream = HTTP2Stream(expectedHeaderBytes: 768)
        nghttp2_session_set_stream_user_data(session, streamID, Unmanaged.passUnretained(stream).toOpaque())
        append(stream, id: streamID)
    }

    func streamClosed(streamID: Int32, errorCode: UInt32) {
        guard let stream = stream(streamID) else { return }
        remove(stream)
        guard isClient else { return }
        if stream.malformed {
            answer(stream, .failure(.reset(code: NGHTTP2_PROTOCOL_ERROR.rawValue)))
        } else if errorCode == NGHTTP2_NO_ERROR.rawValue && stream.status >= 200 {
            responsesReceived += 1
            answer(
                stream,
                .success(
                    HTTP2Response(
                        status: stream.status, headerBlock: stream.incomingHeaders,
                        body: stream.incomingBody)))
        } else if errorCode == NGHTTP2_REFUSED_STREAM.rawValue {
            answer(stream, .failure(.refused))
        } else if errorCode == NGHTTP2_NO_ERROR.rawValue {
            answer(stream, .failure(.connectionLost("stream closed without a response")))
        } else {
            answer(stream, .failure(.reset(code: errorCode)))
        }
    }

    /// A client connection's stream: every stream a client opens is one (`submitRequest`).
    static func requestStream(_ stream: HTTP2Stream) -> HTTP2RequestStream {
        unsafeDowncast(stream, to: HTTP2RequestStream.self)
    }

    func answer(_ stream: HTTP2Stream, _ result: Result<HTTP2Response, HTTP2StreamError>) {
        if isClient { onResponse?(Self.requestStream(stream), result) }
    }

    func frameSent(streamID: Int32, type: UInt8) {
        guard UInt32(type) == NGHTTP2_HEADERS.rawValue else { return }
        withOpenStream(streamID) { $0.headersSent = true }
        if !lentHeaders.isEmpty { lentHeaders[streamID] = nil }
    }

    func frameNotSent(streamID: Int32, type: UInt8, libraryError: Int32) {
        guard UInt32(type) == NGHTTP2_HEADERS.rawValue else { return }
        defer { if !lentHeaders.isEmpty { lentHeaders[streamID] = nil } }
        guard let stream = stream(streamID) else { return }
        remove(stream)
        answer(stream, .failure(.notSent(String(cString: nghttp2_strerror(libraryError)))))
    }

    /// A request's or response's body, from the stream its data source names (the stream itself, no lookup).
    static func readOutgoing(
        _ stream: HTTP2Stream, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
        flags: UnsafeMutablePointer<UInt32>
    ) -> Int {
        let bytes = stream.outgoingBytes
        let count = min(length, bytes.count - stream.outgoingOffset)
        bytes.withUnsafeBufferPointer { body in
            buffer.update(from: body.baseAddress! + stream.outgoingOffset, count: count)
        }
        stream.outgoingOffset += count
        if stream.outgoingOffset == bytes.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return count
    }
}
