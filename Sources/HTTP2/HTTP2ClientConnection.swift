internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// The client's side of a connection: requests submitted, their answers read (`HTTP2Client` owns such
/// connections).
extension HTTP2Connection {
    /// Queues a request on this connection; nghttp2 holds it back while the peer's stream limit is reached.
    /// Returns false if the connection cannot take it (closing, or nghttp2 refused), with nothing completed.
    /// `stream`: not opened yet (a submission that failed leaves it so, for another connection to take).
    func submitRequest(_ stream: HTTP2RequestStream) -> Bool {
        guard acceptsRequests, let session else { return false }
        let hasBody = !stream.outgoingBody.isEmpty
        let userData = Unmanaged.passUnretained(stream).toOpaque()
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: userData), read_callback: readOutgoingBody)
        // Lent, not copied: the stream holds its request until the HEADERS frame is out, and a stream that leaves
        // before that leaves its fields in `lentHeaders` (see `remove`). A separate path is copied at submission.
        let streamID = stream.batch[stream.index].headers.withNghttp2Fields(
            lent: true, path: stream.batch[stream.index].ownPath
        ) {
            fields, count in
            hasBody
                ? nghttp2_submit_request(session, nil, fields, count, &provider, userData)
                : nghttp2_submit_request(session, nil, fields, count, nil, userData)
        }
        guard streamID > 0 else { return false }
        append(stream, id: streamID)
        return true
    }

    /// Sends what is queued; call once after a batch of submissions.
    func flushSoon() { flush() }

    /// Ends requests that waited too long for their response: the stream is cancelled, the caller told.
    func expireStreams(startedBefore cutoff: UInt64) {
        guard let session else { return }
        let expired = openStreams.filter { $0.startedAt < cutoff }
        guard !expired.isEmpty else { return }
        for stream in expired where stream.listed {
            remove(stream)
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream.id, NGHTTP2_CANCEL.rawValue)
            answer(stream, .failure(.timedOut))
        }
        flush()
    }

    func ping() {
        guard state == .open, let session, pingSentAt == nil else { return }
        pingSentAt = EventLoop.now()
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        flush()
    }
}
