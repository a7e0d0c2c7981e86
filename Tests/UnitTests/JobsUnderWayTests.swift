import Testing

@testable import WorkerPipeline

/// The session's jobs under way, as republished copies ask for them by id.
struct JobsUnderWayTests {
    private func delivery(_ tag: UInt64) -> JobDelivery {
        JobDelivery(tag: tag, redelivered: false, body: [], properties: MessageProperties())
    }

    @Test func anIdIsUnderWayUntilItsLastDeliverySettles() {
        var underWay = JobsUnderWay()
        underWay.started(delivery(1), jobID: "a")
        underWay.started(delivery(2), jobID: "a")
        var found = (underWay.contains(jobID: "a"), underWay.contains(jobID: "b"))
        #expect(found == (true, false))
        // Once indexed, the index follows the jobs that start and settle.
        underWay.started(delivery(3), jobID: "b")
        found.1 = underWay.contains(jobID: "b")
        #expect(found.1)
        underWay.settled(1)
        found.0 = underWay.contains(jobID: "a")
        #expect(found.0, "another delivery of a is still under way")
        underWay.settled(2)
        found.0 = underWay.contains(jobID: "a")
        #expect(!found.0)
        // Dropped and built again: the same answers.
        underWay.stopIndexingIDs()
        underWay.started(delivery(4), jobID: "c")
        underWay.settled(3)
        let afterRebuild = [underWay.contains(jobID: "c"), underWay.contains(jobID: "b"), underWay.contains(jobID: "a")]
        #expect(afterRebuild == [true, false, false])
        #expect(underWay.counts.total == 1)
    }
}
