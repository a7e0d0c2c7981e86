internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

// MARK: nghttp2 callbacks: C function pointers that find their connection through user_data.

/// The callbacks a session is made with (the caller deletes them once it is made); a client also hears of the frames
/// it sent.
func sessionCallbacks(client: Bool) -> OpaquePointer? {
    var callbacks: OpaquePointer?
    nghttp2_session_callbacks_new(&callbacks)
    nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
    nghttp2_session_callbacks_set_on_frame_not_send_callback(callbacks, onFrameNotSent)
    if client { nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, onFrameSent) }
    return callbacks
}

/// nghttp2 calls back only from inside mem_recv or mem_send, which the connection itself called, so it is alive for
/// the call: no retain and release (with a thousand streams in flight, six callbacks per request paid for them).
func withConnection<Result>(_ userData: UnsafeMutableRawPointer?, _ body: (HTTP2Connection) -> Result) -> Result {
    Unmanaged<HTTP2Connection>.fromOpaque(userData!)._withUnsafeGuaranteedRef(body)
}

let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, let name, let value else { return 0 }
    withConnection(userData) {
        $0.header(
            streamID: frame.pointee.hd.stream_id, name: UnsafeBufferPointer(start: name, count: nameLength),
            value: UnsafeBufferPointer(start: value, count: valueLength))
    }
    return 0
}

let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, userData in
    guard let data else { return 0 }
    withConnection(userData) { $0.dataChunk(streamID: streamID, UnsafeBufferPointer(start: data, count: length)) }
    return 0
}

let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame else { return 0 }
    withConnection(userData) {
        $0.frameReceived(
            type: frame.pointee.hd.type, flags: frame.pointee.hd.flags, streamID: frame.pointee.hd.stream_id,
            frame: frame)
    }
    return 0
}

let onStreamClose: nghttp2_on_stream_close_callback = { _, streamID, errorCode, userData in
    withConnection(userData) { $0.streamClosed(streamID: streamID, errorCode: errorCode) }
    return 0
}

let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    guard let frame else { return 0 }
    withConnection(userData) {
        $0.beginHeaders(streamID: frame.pointee.hd.stream_id, category: frame.pointee.headers.cat.rawValue)
    }
    return 0
}

let onFrameNotSent: nghttp2_on_frame_not_send_callback = { _, frame, libraryError, userData in
    guard let frame else { return 0 }
    withConnection(userData) {
        $0.frameNotSent(streamID: frame.pointee.hd.stream_id, type: frame.pointee.hd.type, libraryError: libraryError)
    }
    return 0
}

let onFrameSent: nghttp2_on_frame_send_callback = { _, frame, userData in
    guard let frame else { return 0 }
    withConnection(userData) { $0.frameSent(streamID: frame.pointee.hd.stream_id, type: frame.pointee.hd.type) }
    return 0
}

let readOutgoingBody: nghttp2_data_source_read_callback = { session, streamID, buffer, length, flags, source, _ in
    // The source is the stream. It is read only while it is still the stream's user data, that is open here (a
    // stream that timed out left the list, and may be gone, while its DATA was still queued in nghttp2).
    guard let buffer, let flags, let session, let stream = source?.pointee.ptr,
        nghttp2_session_get_stream_user_data(session, streamID) == stream
    else {
        return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }
    return HTTP2Connection.readOutgoing(
        Unmanaged<HTTP2Stream>.fromOpaque(stream).takeUnretainedValue(), into: buffer,
        length: length, flags: flags)
}
