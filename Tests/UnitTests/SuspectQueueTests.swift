import APNsModel
import Testing
import WorkerPipeline

/// The rules suspects follow: each runs alone, the jobs read meanwhile wait until no suspect is left, a stop gives
/// back everything not started.
@Suite struct SuspectQueueTests {
    static func delivery(_ tag: UInt64, lane: JobLane = .urgent) -> JobDelivery {
        JobDelivery(
            tag: tag, redelivered: true, body: [], properties: MessageProperties(messageID: "job-\(tag)"), lane: lane)
    }

    static func key(_ delivery: JobDelivery) -> String { delivery.properties.messageID ?? "" }

    static func tags(_ step: SuspectQueue.Step) -> (alone: UInt64?, dispatched: [UInt64]) {
        switch step {
        case .none: (nil, [])
        case .startAlone(let delivery, _): (delivery.tag, [])
        case .dispatch(let deliveries): (nil, deliveries.map(\.tag))
        }
    }

    @Test func withoutSuspectsJobsStartAtOnce() {
        var queue = SuspectQueue()
        #expect(queue.admit(usual: [Self.delivery(1), Self.delivery(2)], suspects: []).map(\.tag) == [1, 2])
        #expect(!queue.isActive)
        let (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 2), stopping: false, key: Self.key)
        #expect(ended == nil && Self.tags(next) == (nil, []))
    }

    @Test func aSuspectWaitsForNothingInFlightAndTheOthersWaitBehindIt() {
        var queue = SuspectQueue()
        #expect(
            queue.admit(usual: [Self.delivery(1)], suspects: [Self.delivery(2)]).isEmpty,
            "a job read with a suspect waits behind it")
        #expect(queue.isActive)
        // Jobs started before are still under way: the suspect waits, and so do the jobs behind it.
        var (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 3), stopping: false, key: Self.key)
        #expect(ended == nil && Self.tags(next) == (nil, []), "nothing starts while a suspect waits")
        #expect(queue.admit(usual: [Self.delivery(3)], suspects: []).isEmpty)
        (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        #expect(Self.tags(next).alone == 2 && queue.alone?.key == "job-2", "alone, once nothing is in flight")
        // Under way (one job in flight: the suspect): nothing else starts.
        (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 1), stopping: false, key: Self.key)
        #expect(ended == nil && Self.tags(next) == (nil, []))
        // Settled: its mark goes, and the jobs behind start together.
        (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        #expect(ended == "job-2" && Self.tags(next).dispatched == [1, 3])
        #expect(!queue.isActive && queue.behind.isEmpty)
    }

    @Test func suspectsRunOneAfterTheOther() {
        var queue = SuspectQueue()
        _ = queue.admit(usual: [], suspects: [Self.delivery(1), Self.delivery(2)])
        var (_, next) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        #expect(Self.tags(next).alone == 1)
        (_, next) = queue.step(jobsInFlight: LaneCounts(urgent: 1), stopping: false, key: Self.key)
        #expect(Self.tags(next) == (nil, []), "the second waits while the first runs")
        let (ended, second) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        #expect(ended == "job-1" && Self.tags(second).alone == 2)
    }

    @Test func aSuspectSettledAtOnceEndsAtTheNextStep() {
        // A suspect refused as a bad job, or with nothing left to send, never counts as in flight.
        var queue = SuspectQueue()
        _ = queue.admit(usual: [], suspects: [Self.delivery(1)])
        _ = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        let (ended, next) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: false, key: Self.key)
        #expect(ended == "job-1" && Self.tags(next) == (nil, []) && !queue.isActive)
    }

    @Test func aStopStartsNothingAndGivesBackWhatWaits() {
        var queue = SuspectQueue()
        _ = queue.admit(usual: [Self.delivery(1)], suspects: [Self.delivery(2)])
        let (_, next) = queue.step(jobsInFlight: LaneCounts(urgent: 0), stopping: true, key: Self.key)
        #expect(Self.tags(next) == (nil, []), "no suspect starts while stopping")
        #expect(queue.giveBack().map(\.tag).sorted() == [1, 2])
        #expect(!queue.isActive && queue.behind.isEmpty)
    }

    /// A campaign's suspect runs alone among bulk work only: urgent jobs keep starting while it waits and runs.
    @Test func aBulkSuspectLetsUrgentJobsThrough() {
        var queue = SuspectQueue()
        let admitted = queue.admit(
            usual: [Self.delivery(1), Self.delivery(2, lane: .bulk)],
            suspects: [Self.delivery(3, lane: .bulk)])
        #expect(admitted.map(\.tag) == [1] && queue.behind.map(\.tag) == [2], "urgent through, bulk behind")
        #expect(!queue.holdsUrgent)
        // Urgent jobs in flight do not keep a bulk suspect waiting; bulk ones do.
        var (_, next) = queue.step(jobsInFlight: LaneCounts(urgent: 5, bulk: 1), stopping: false, key: Self.key)
        #expect(Self.tags(next) == (nil, []))
        (_, next) = queue.step(jobsInFlight: LaneCounts(urgent: 5), stopping: false, key: Self.key)
        #expect(Self.tags(next).alone == 3 && queue.alone?.lane == .bulk)
        #expect(queue.admit(usual: [Self.delivery(4)], suspects: []).map(\.tag) == [4], "urgent still flows")
        let (ended, after) = queue.step(jobsInFlight: LaneCounts(urgent: 2), stopping: false, key: Self.key)
        #expect(ended == "job-3" && Self.tags(after).dispatched == [2], "settled while urgent work runs on")
    }

    @Test func anUrgentSuspectStillRunsAloneAmongEverything() {
        var queue = SuspectQueue()
        #expect(
            queue.admit(usual: [Self.delivery(1), Self.delivery(2, lane: .bulk)], suspects: [Self.delivery(3)]).isEmpty)
        #expect(queue.holdsUrgent)
        let (_, next) = queue.step(jobsInFlight: LaneCounts(bulk: 1), stopping: false, key: Self.key)
        #expect(Self.tags(next) == (nil, []), "an urgent suspect waits for every job in flight")
    }
}
