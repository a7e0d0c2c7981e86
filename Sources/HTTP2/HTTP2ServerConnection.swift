internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// What a server does with a complete request: answer it through the writer, now or later, on the loop thread.
public typealias HTTP2RequestHandler = (HTTP2ServerRequest, HTTP2ResponseWriter) -> Void

/// A request as a server receives it.
public struct HTTP2ServerRequest: Sendable {
    public var connectionID: Int
    public var streamID: Int32
    public var headerBlock: HTTP2HeaderBlock
    public var body: [UInt8]

    public var headers: [HTTP2Field] { headerBlock.fields }
    public func header(_ name: String) -> String? { headerBlock.value(name) }
    public var method: String { header(":method") ?? "" }
    public var path: String { header(":path") ?? "" }
}

/// A connection carried through the loop's task queue back to its own loop thread, which alone uses it.
struct LoopThreadReference: @unchecked Sendable {
    let connection: HTTP2Connection
}

/// The one way to answer a server request. Use it on the connection's loop thread.
public struct HTTP2ResponseWriter: @unchecked Sendable {
    // Invariant: used only on the loop thread that owns the connection. A strong reference, not a weak one: a weak
    // reference moves an object's reference count to a side table for good, which made every retain of every
    // connection (six nghttp2 callbacks per request) take the slow path. An answer given after the connection closed
    // does nothing.
    let connection: HTTP2Connection
    let streamID: Int32

    public func respond(status: Int, headers: [HTTP2Field] = [], body: [UInt8] = []) {
        connection.submitResponse(streamID: streamID, status: status, headers: headers, body: body)
    }

    /// Answers after `delay` seconds (a slow server), through the loop's timer.
    public func respond(after delay: Double, status: Int, headers: [HTTP2Field] = [], body: [UInt8] = []) {
        connection.loop.schedule(after: delay) { [connection] in
            connection.submitResponse(streamID: streamID, status: status, headers: headers, body: body)
        }
    }

    /// Resets the stream instead of answering (REFUSED_STREAM = 7, INTERNAL_ERROR = 2, ...).
    public func reset(code: UInt32) { connection.resetStream(streamID, code: code) }

    /// The connection this request came on.
    public var serverConnection: HTTP2ServerConnection { HTTP2ServerConnection(connection: connection) }
}

/// What any HTTP/2 server may do to one of its connections: change its settings, close it gracefully (GOAWAY) or
/// abort it. Use it on the connection's loop thread. (apns-sim plays APNs's faults with these; the faults are its.)
public struct HTTP2ServerConnection: @unchecked Sendable {
    // Invariant: as HTTP2ResponseWriter's.
    let connection: HTTP2Connection

    /// The common name of the client certificate the handshake verified, if the client presented one.
    public var peerCertificateCommonName: String? { connection.peerCertificateCommonName }

    /// Announces a new SETTINGS_MAX_CONCURRENT_STREAMS.
    public func updateMaximumConcurrentStreams(_ value: UInt32) {
        connection.submitSettings([(Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value)])
    }

    /// Sends GOAWAY and takes no new stream.
    public func goAway(code: UInt32 = 0, debugData: String = "", lastStreamID: Int32? = nil) {
        connection.goAway(code: code, debugData: debugData, lastStreamID: lastStreamID)
    }

    /// Closes the TCP connection at once, without GOAWAY.
    public func abort(reason: String) { connection.close(reason: reason) }
}

/// The server's side of a connection: requests dispatched to the handler, responses, settings and GOAWAY
/// submitted (`HTTP2Server` owns such connections).
extension HTTP2Connection {
    func submitResponse(streamID: Int32, status: Int, headers: [HTTP2Field], body: [UInt8]) {
        guard state == .open, let session, let stream = stream(streamID) else { return }
        var block = HTTP2HeaderBlock(capacity: 128)
        block.add(":status", String(status))
        for field in headers { block.add(field.name, field.value, indexed: field.indexed) }
        if !body.isEmpty { block.add("content-length", String(body.count)) }
        stream.outgoingBody = body
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: Unmanaged.passUnretained(stream).toOpaque()),
            read_callback: readOutgoingBody)
        _ = block.withNghttp2Fields { fields, count in
            body.isEmpty
                ? nghttp2_submit_response(session, streamID, fields, count, nil)
                : nghttp2_submit_response(session, streamID, fields, count, &provider)
        }
        if !processingInput { flush() }
    }

    func submitSettings(_ entries: [(id: Int32, value: UInt32)]) {
        guard state == .open, let session else { return }
        let settings = entries.map { nghttp2_settings_entry(settings_id: $0.id, value: $0.value) }
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), settings, settings.count)
        flush()
    }

    func resetStream(_ streamID: Int32, code: UInt32) {
        guard state == .open, let session else { return }
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, code)
        flush()
    }

    func goAway(code: UInt32, debugData: String, lastStreamID: Int32?) {
        guard state == .open, let session, !goAwaySent else { return }
        goAwaySent = true
        let last = lastStreamID ?? nghttp2_session_get_last_proc_stream_id(session)
        let data = Array(debugData.utf8)
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, code, data, data.count)
        flush()
    }

    func dispatchRequest(streamID: Int32) {
        guard case .server(let handler) = role, let stream = stream(streamID) else { return }
        let request = HTTP2ServerRequest(
            connectionID: id, streamID: streamID, headerBlock: stream.incomingHeaders,
            body: stream.incomingBody)
        handler(request, HTTP2ResponseWriter(connection: self, streamID: streamID))
    }
}
