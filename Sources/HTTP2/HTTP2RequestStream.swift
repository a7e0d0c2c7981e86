/// A client stream, made with its request: it passes through half a dozen hands (dispatch, the client's waiting
/// queue, its connection, the answer, the retry decision) as one reference, and a request costs one allocation. The
/// request's parts are the stream's own fields, not one struct's: a struct read from a class is copied, its counted
/// references with it, at each hand. A server's streams do without them, small enough for glibc's fast bins.
final class HTTP2RequestStream: HTTP2Stream {
    /// The batch its request came in, and its place there: the stream refers to its request where the batch holds
    /// it, one counted reference, where a copy of the request counted one for each of its strings and arrays. The
    /// batch lives until its last stream ends; its requests share their header block and body with one another.
    let batch: [HTTP2Request]
    let index: Int
    /// The batch's completion (shared by every request of the batch), called with the answer's index. The stream is
    /// handed back with its answer through the connection's `onResponse`: one callback per connection instead of a
    /// closure allocated per request.
    let completion: HTTP2Client.BatchCompletion
    /// Sends of the request so far, this one included, and when the client gives up resending it (`EventLoop.now`).
    let attempt: Int
    let deadline: UInt64
    /// When the request stops being worth sending (`HTTP2Request.sendBy` on the `EventLoop.now` clock; `.max` for
    /// none): a request whose HEADERS have not left by then is dropped unsent (`HTTP2StreamError.sendByPassed`).
    let sendBy: UInt64

    /// Room for an answer's kept fields at first: an apns-id (48 bytes as kept) and a little more, an allocation
    /// glibc serves from its fast bins (`AllocationSizeTests`).
    static let answerHeaderCapacity = 88

    /// To be submitted (`HTTP2Connection.submitRequest`); an answer that keeps more fields than
    /// `answerHeaderCapacity` holds grows its block.
    init(
        batch: [HTTP2Request], index: Int, attempt: Int, deadline: UInt64, sendBy: UInt64,
        completion: @escaping HTTP2Client.BatchCompletion
    ) {
        self.batch = batch
        self.index = index
        self.completion = completion
        self.attempt = attempt
        self.deadline = deadline
        self.sendBy = sendBy
        super.init(expectedHeaderBytes: Self.answerHeaderCapacity)
    }

    /// The request's body where its batch holds it (an APNs payload: where its job's body holds it).
    override var outgoingBytes: ArraySlice<UInt8> { batch[index].body }

    /// The same request, to be sent again as attempt `attempt` (a stream is submitted once).
    func resent(attempt: Int) -> HTTP2RequestStream {
        HTTP2RequestStream(
            batch: batch, index: index, attempt: attempt, deadline: deadline, sendBy: sendBy, completion: completion)
    }

    /// The request's fields (but a separate path), for a stream that leaves before nghttp2 sent them.
    var requestHeaders: HTTP2HeaderBlock { batch[index].headers }

    /// The request answered (or given up): its batch's completion is called with its index.
    func complete(_ result: Result<HTTP2Response, HTTP2StreamError>) {
        completion(index, result)
    }
}
