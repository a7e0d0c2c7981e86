internal import CNghttp2
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// A request on its way through the client: what to send, and where its answer goes. `completion` is its batch's,
/// shared by every request of the batch.
///
/// A class: it passes through half a dozen hands (dispatch, its stream, the answer, the retry decision), and as a
/// struct each hand would copy and destroy three reference-counted fields; one allocation and one reference cost
/// less.
final class HTTP2PendingRequest {
    let request: HTTP2Request
    let index: Int
    let attempt: Int
    let deadline: UInt64
    let completion: HTTP2Client.BatchCompletion

    init(
        request: HTTP2Request, index: Int, attempt: Int, deadline: UInt64,
        completion: @escaping HTTP2Client.BatchCompletion
    ) {
        self.request = request
        self.index = index
        self.attempt = attempt
        self.deadline = deadline
        self.completion = completion
    }
}

/// The client's side of a connection: requests submitted, their answers read (`HTTP2Client` owns such
/// connections).
extension HTTP2Connection {
    /// Queues a request on this connection; nghttp2 holds it back while the peer's stream limit is reached.
    /// Returns false if the connection cannot take it (closing, or nghttp2 refused), with nothing completed.
    func submitRequest(_ pending: HTTP2PendingRequest) -> Bool {
        guard acceptsRequests, let session else { return false }
        // The request's parts are read from `pending` where they are needed: a closure that captured the request
        // copied it (and counted its references) at each level, a dozen times per request in the callgrind profile.
        let hasBody = !pending.request.body.isEmpty
        // An answer that keeps more fields than `answerHeaderCapacity` holds grows the block once.
        let stream = HTTP2Stream(
            outgoingBody: pending.request.body, expectedHeaderBytes: HTTP2Stream.answerHeaderCapacity,
            pending: pending)
        let userData = Unmanaged.passUnretained(stream).toOpaque()
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: userData), read_callback: readOutgoingBody)
        // Lent, not copied: the stream holds its request until the HEADERS frame is out, and a stream that leaves
        // before that leaves its fields in `lentHeaders` (see `remove`). A separate path is copied at submission.
        let streamID = pending.request.headers.withNghttp2Fields(lent: true, path: pending.request.path) {
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
        let expired = openStreams.filter { $0.pending != nil && $0.startedAt < cutoff }
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
