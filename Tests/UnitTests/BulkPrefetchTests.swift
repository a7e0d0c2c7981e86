import Testing

@testable import AMQPBroker

/// The bulk lane's prefetch by bytes: how many bulk deliveries the broker may hand over follows the size of the
/// bodies, so that campaigns of 100,000 users are held a few at a time and small jobs a hundred at a time.
struct BulkPrefetchTests {
    static let budget = 4 << 20

    /// A consumer started as asked, with the deliveries the broker hands it (tags from `firstTag`).
    static func receiving(
        _ prefetch: inout BulkPrefetch, _ count: Int, bytes: Int, firstTag: UInt64
    ) {
        for tag in firstTag..<firstTag + UInt64(count) { prefetch.delivered(tag, bytes: bytes) }
    }

    @Test func smallBodiesTakeTheWholePrefetch() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        #expect(prefetch.initialPrefetch == 4)
        prefetch.started(prefetch: prefetch.initialPrefetch)
        #expect(prefetch.change == nil, "nothing seen yet: the first consumer stays")
        Self.receiving(&prefetch, 4, bytes: 300, firstTag: 1)
        #expect(prefetch.change == .start(prefetch: 100), "small bodies: as many as WORKER_BULK_PREFETCH")
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 100, bytes: 300, firstTag: 5)
        #expect(prefetch.change == nil)
        #expect(prefetch.heldBytes == 104 * 300)
    }

    @Test func campaignsAreHeldAFewAtATime() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: prefetch.initialPrefetch)
        Self.receiving(&prefetch, 4, bytes: 900_000, firstTag: 1)
        // Four bodies of 900 KB fit in 4 MiB: the first consumer suits them.
        #expect(prefetch.change == nil)
        for tag: UInt64 in 1...4 { prefetch.settled(tag) }
        #expect(prefetch.heldBytes == 0)
        #expect(prefetch.change == nil, "the consumer's own prefetch keeps what it hands over within the bytes")
    }

    @Test func aConsumerTooGenerousForItsBodiesIsStoppedUntilThereIsRoom() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 3, bytes: 2_000_000, firstTag: 1)
        #expect(prefetch.change == .stop, "two such bodies fit; a consumer of 100 could hand over far more")
        prefetch.stopped()
        #expect(prefetch.change == nil, "6 MB held: nothing fits beside it")
        prefetch.settled(1)
        #expect(prefetch.change == nil, "4 MB held: still nothing")
        prefetch.settled(2)
        #expect(prefetch.change == .start(prefetch: 1), "one more fits beside the one held")
        prefetch.started(prefetch: 1)
        prefetch.settled(3)
        #expect(prefetch.change == .start(prefetch: 2), "nothing held: as many as suit the bodies")
    }

    @Test func oneBodyAlwaysFitsWhenNothingIsHeld() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: 1_000)
        prefetch.started(prefetch: prefetch.initialPrefetch)
        Self.receiving(&prefetch, 1, bytes: 50_000, firstTag: 7)
        #expect(prefetch.change == .stop)
        prefetch.stopped()
        #expect(prefetch.change == nil)
        prefetch.settled(7)
        #expect(prefetch.change == .start(prefetch: 1), "a job larger than the bytes still runs, one at a time")
    }

    @Test func urgentTagsAreNotHeld() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        Self.receiving(&prefetch, 1, bytes: 1_000, firstTag: 3)
        prefetch.settled(2)
        prefetch.settled(4)
        #expect(prefetch.heldBytes == 1_000)
        prefetch.settled(3)
        #expect(prefetch.heldBytes == 0)
    }

    @Test func theSizeFollowsTheBodiesSeenLately() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 50, bytes: 1_000, firstTag: 1)
        for tag: UInt64 in 1...50 { prefetch.settled(tag) }
        #expect(prefetch.change == nil)
        // Campaigns after small jobs: a few of them move the average far enough to stop a consumer of 100.
        var tag: UInt64 = 51
        while prefetch.change == nil, tag < 60 {
            prefetch.delivered(tag, bytes: 900_000)
            tag += 1
        }
        #expect(prefetch.change == .stop)
        #expect(tag - 51 <= 3, "stopped after \(tag - 51) campaigns")
    }
}
