import Testing

@testable import AMQPBroker

/// The bulk lane's prefetch by bytes: how many bulk deliveries the broker may hand over follows the size of the
/// bodies, so that campaigns of 100,000 users are held a few at a time and small jobs a hundred at a time.
struct BulkPrefetchTests {
    static let budget = 4 << 20

    /// The bulk deliveries held, as `Acknowledgements` counts them, and what the broker hands over.
    struct Lane {
        var prefetch: BulkPrefetch
        var held = Acknowledgements.BulkHeld()

        init(maximumCount: Int = 100, maximumBytes: Int = BulkPrefetchTests.budget, running: Int? = nil) {
            prefetch = BulkPrefetch(maximumCount: maximumCount, maximumBytes: maximumBytes)
            prefetch.started(prefetch: running ?? prefetch.initialPrefetch)
        }

        mutating func receive(_ count: Int, bytes: Int) {
            for _ in 0..<count {
                prefetch.seen(bytes: bytes)
                held.count += 1
                held.bytes += bytes
            }
        }

        mutating func settle(_ count: Int, bytes: Int) {
            held.count -= count
            held.bytes -= count * bytes
        }

        var replacement: Int? { prefetch.replacement(holding: held) }
    }

    @Test func smallBodiesTakeTheWholePrefetch() {
        var lane = Lane()
        #expect(lane.prefetch.initialPrefetch == 4)
        #expect(lane.replacement == nil, "nothing seen yet: the first consumer stays")
        lane.receive(4, bytes: 300)
        #expect(lane.replacement == 100, "small bodies: as many as WORKER_BULK_PREFETCH")
        lane.prefetch.started(prefetch: 100)
        lane.receive(100, bytes: 300)
        #expect(lane.replacement == nil)
    }

    @Test func campaignsAreHeldAFewAtATime() {
        var lane = Lane()
        lane.receive(4, bytes: 900_000)
        // Four bodies of 900 KB fit in 4 MiB: the first consumer suits them.
        #expect(lane.replacement == nil)
        lane.settle(4, bytes: 900_000)
        #expect(lane.replacement == nil, "the consumer's own prefetch keeps what it hands over within the bytes")
    }

    @Test func aConsumerTooGenerousForItsBodiesIsReplacedByOneOfWhatFits() {
        var lane = Lane(running: 100)
        lane.receive(3, bytes: 2_000_000)
        #expect(lane.replacement == 1, "two such bodies fit, three are held: one at a time, never none")
        lane.prefetch.started(prefetch: 1)
        lane.settle(2, bytes: 2_000_000)
        #expect(lane.replacement == nil, "one more would fit beside the one held: no better than the one running")
        lane.settle(1, bytes: 2_000_000)
        #expect(lane.replacement == 2, "nothing held: as many as suit the bodies")
    }

    @Test func oneBodyAlwaysFits() {
        var lane = Lane(maximumBytes: 1_000)
        lane.receive(1, bytes: 50_000)
        #expect(lane.replacement == 1, "a job larger than the bytes still runs, one at a time")
        lane.prefetch.started(prefetch: 1)
        #expect(lane.replacement == nil)
        lane.settle(1, bytes: 50_000)
        #expect(lane.replacement == nil)
    }

    /// A campaign among small jobs brings the prefetch down at its first body; small jobs after it raise it only
    /// gradually.
    @Test func theSizeRisesAtOnceAndFallsSlowly() {
        var lane = Lane(running: 100)
        lane.receive(50, bytes: 1_000)
        lane.settle(50, bytes: 1_000)
        #expect(lane.replacement == nil)
        lane.receive(1, bytes: 900_000)
        #expect(lane.replacement == 3, "4 such bodies suit the bytes; 3 fit beside the one held")
        lane.prefetch.started(prefetch: 3)
        lane.settle(1, bytes: 900_000)
        var smallJobs = 0
        while lane.prefetch.consumerPrefetch != 100, smallJobs < 200 {
            lane.receive(1, bytes: 1_000)
            lane.settle(1, bytes: 1_000)
            smallJobs += 1
            if let next = lane.replacement { lane.prefetch.started(prefetch: next) }
        }
        #expect(lane.prefetch.consumerPrefetch == 100)
        #expect(smallJobs >= 20, "back to 100 after \(smallJobs) small jobs")
    }
}
