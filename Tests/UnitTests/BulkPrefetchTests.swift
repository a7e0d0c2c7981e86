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
        #expect(prefetch.replacement == nil, "nothing seen yet: the first consumer stays")
        Self.receiving(&prefetch, 4, bytes: 300, firstTag: 1)
        #expect(prefetch.replacement == 100, "small bodies: as many as WORKER_BULK_PREFETCH")
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 100, bytes: 300, firstTag: 5)
        #expect(prefetch.replacement == nil)
        #expect(prefetch.heldBytes == 104 * 300)
    }

    @Test func campaignsAreHeldAFewAtATime() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: prefetch.initialPrefetch)
        Self.receiving(&prefetch, 4, bytes: 900_000, firstTag: 1)
        // Four bodies of 900 KB fit in 4 MiB: the first consumer suits them.
        #expect(prefetch.replacement == nil)
        for tag: UInt64 in 1...4 { prefetch.settled(tag) }
        #expect(prefetch.heldBytes == 0)
        #expect(prefetch.replacement == nil, "the consumer's own prefetch keeps what it hands over within the bytes")
    }

    @Test func aConsumerTooGenerousForItsBodiesIsReplacedByOneOfWhatFits() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 3, bytes: 2_000_000, firstTag: 1)
        #expect(prefetch.replacement == 1, "two such bodies fit, three are held: one at a time, never none")
        prefetch.started(prefetch: 1)
        prefetch.settled(1)
        prefetch.settled(2)
        #expect(prefetch.replacement == nil, "one more would fit beside the one held: no better than the one running")
        prefetch.settled(3)
        #expect(prefetch.replacement == 2, "nothing held: as many as suit the bodies")
    }

    @Test func oneBodyAlwaysFits() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: 1_000)
        prefetch.started(prefetch: prefetch.initialPrefetch)
        Self.receiving(&prefetch, 1, bytes: 50_000, firstTag: 7)
        #expect(prefetch.replacement == 1, "a job larger than the bytes still runs, one at a time")
        prefetch.started(prefetch: 1)
        #expect(prefetch.replacement == nil)
        prefetch.settled(7)
        #expect(prefetch.replacement == nil)
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

    /// A campaign among small jobs brings the prefetch down at its first body; small jobs after it raise it only
    /// gradually.
    @Test func theSizeRisesAtOnceAndFallsSlowly() {
        var prefetch = BulkPrefetch(maximumCount: 100, maximumBytes: Self.budget)
        prefetch.started(prefetch: 100)
        Self.receiving(&prefetch, 50, bytes: 1_000, firstTag: 1)
        for tag: UInt64 in 1...50 { prefetch.settled(tag) }
        #expect(prefetch.replacement == nil)
        prefetch.delivered(51, bytes: 900_000)
        #expect(prefetch.replacement == 3, "4 such bodies suit the bytes; 3 fit beside the one held")
        prefetch.started(prefetch: 3)
        prefetch.settled(51)
        var smallJobs = 0
        while prefetch.consumerPrefetch != 100, smallJobs < 200 {
            prefetch.delivered(52 + UInt64(smallJobs), bytes: 1_000)
            prefetch.settled(52 + UInt64(smallJobs))
            smallJobs += 1
            if let next = prefetch.replacement { prefetch.started(prefetch: next) }
        }
        #expect(prefetch.consumerPrefetch == 100)
        #expect(smallJobs >= 20, "back to 100 after \(smallJobs) small jobs")
    }
}
