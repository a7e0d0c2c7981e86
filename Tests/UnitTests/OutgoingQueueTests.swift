import Foundation
import Testing

@testable import WorkerPipeline

@Suite struct OutgoingQueueTests {
    static let now = 1_800_000_000.0

    static func names(_ entries: some Collection<QueuedNotification>) -> [String] {
        entries.map { "\($0.progress.job.id)/\($0.index)" }
    }

    /// Taking the whole queue hands over its entries in order; those put back come first in the next take, in their
    /// order, before what was queued since.
    @Test func entriesPutBackAfterTakingTheWholeQueueComeFirstInOrder() throws {
        var queue = OutgoingQueue()
        queue.append(try ProgressTrackerTests.jobUnderWay("a", tokens: 2), count: 2)
        queue.append(try ProgressTrackerTests.jobUnderWay("b", tokens: 1), count: 1)
        let taken = queue.take(upTo: 10, liveAt: Self.now)
        #expect(Self.names(taken.live) == ["a/0", "a/1", "b/0"])
        #expect(taken.expired.isEmpty && queue.isEmpty)

        queue.putBack(taken.live[1...])
        queue.append(try ProgressTrackerTests.jobUnderWay("c", tokens: 1), count: 1)
        #expect(queue.count == 3)
        #expect(Self.names(queue.take(upTo: 10, liveAt: Self.now).live) == ["a/1", "b/0", "c/0"])
    }

    /// Taking part of the queue, then putting some back, keeps the queue's order too.
    @Test func entriesPutBackAfterTakingPartOfTheQueueComeFirstInOrder() throws {
        var queue = OutgoingQueue()
        queue.append(try ProgressTrackerTests.jobUnderWay("a", tokens: 4), count: 4)
        let taken = queue.take(upTo: 3, liveAt: Self.now)
        #expect(Self.names(taken.live) == ["a/0", "a/1", "a/2"])
        queue.putBack(taken.live[2...])
        #expect(Self.names(queue.take(upTo: 10, liveAt: Self.now).live) == ["a/2", "a/3"])
    }

    /// A job whose deadline has passed is taken out as expired, also where the take asks for the whole queue (whose
    /// storage it would otherwise hand over).
    @Test func entriesOfAJobPastItsDeadlineAreTakenAsExpired() throws {
        let late = try ProgressTrackerTests.jobUnderWay("late", tokens: 1, deadline: Int64(Self.now) - 1)
        let onTime = try ProgressTrackerTests.jobUnderWay("on-time", tokens: 1, deadline: Int64(Self.now) + 60)
        var queue = OutgoingQueue()
        queue.append(late, count: 1)
        queue.append(onTime, count: 1)
        let taken = queue.take(upTo: 10, liveAt: Self.now)
        #expect(Self.names(taken.live) == ["on-time/0"])
        #expect(Self.names(taken.expired) == ["late/0"])
        #expect(queue.isEmpty)
    }
}
