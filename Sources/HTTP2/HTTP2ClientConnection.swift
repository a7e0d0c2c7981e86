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
        let hasBody = !stream.outgoingBytes.isEmpty
        let userData = Unmanaged.passUnretained(stream).toOpaque()
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: userData), read_callback: readOutgoingBody)
        // Lent, not copied: the stream holds its request until the HEADERS frame is out, and a stream that leaves
        // before that leaves its fields in `lentHeaders` (see `remove`). A separate path is copied at submission.
        let streamID = stream.batch[stream.index].headers.withLentNghttp2Fields(
            path: stream.batch[stream.index].ownPath, cache: &lentFields
        ) {
            fields, count in
            hasBody
                ? nghttp2_submit_request(session, nil, fields, count, &provider, userData)
                : nghttp2_submit_request(session, nil, fields, count, nil, userData)
        }
        guard streamID > 0 else { return false }
        append(stream, id: streamID)
        if stream.sendBy < earliestQueuedSendBy { earliestQueuedSendBy = stream.sendBy }
        return true
    }

    /// Drops the requests whose send-by time has come while their HEADERS wait in nghttp2's queue (behind the
    /// server's stream limit), and answers them `sendByPassed`. Called as frames are about to be produced (`flush`),
    /// so that none of them leaves late, and by the client's sweep, for a connection that sends nothing meanwhile.
    func dropUnsentRequests(pastSendByAt now: UInt64) {
        guard isClient, let session, now >= earliestQueuedSendBy else { return }
        var earliest = UInt64.max
        var dropped: [HTTP2Stream] = []
        var current = firstStream
        while let stream = current {
            current = stream.next
            let request = Self.requestStream(stream)
            // nghttp2 makes its stream as it encodes the HEADERS: one it has not made yet is still queued, its
            // fields not encoded. One encoded is sent whatever happens: cancelling it then would leave the server's
            // HPACK table out of step with the one its fields were encoded against.
            guard !stream.headersSent, request.sendBy != .max, nghttp2_session_find_stream(session, stream.id) == nil
            else { continue }
            if request.sendBy > now {
                earliest = min(earliest, request.sendBy)
            } else {
                dropped.append(stream)
            }
        }
        earliestQueuedSendBy = earliest
        for stream in dropped {
            remove(stream)
            // Marks the queued HEADERS cancelled: nghttp2 drops them when their turn comes, and sends nothing.
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream.id, NGHTTP2_CANCEL.rawValue)
            answer(stream, .failure(.sendByPassed))
        }
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
