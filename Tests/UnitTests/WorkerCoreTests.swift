import Foundation
import Testing
import WorkerPipeline

/// What the worker's broker thread decides, without a broker, a store or APNs: each decision the loop performs.
@Suite struct WorkerCoreTests {
    static let start = Date(timeIntervalSince1970: 1_000_000)
    static let settings = WorkerCore.Settings(prefetch: 500, maximumNotificationsInFlight: 100, shutdownTimeout: 25)

    func core(generation: Int = 1) -> WorkerCore {
        WorkerCore(settings: Self.settings, generation: generation, now: Self.start)
    }

    func at(_ seconds: Double) -> Date { Self.start.addingTimeInterval(seconds) }

    /// The second half of a turn with urgent work only, unless said otherwise.
    func end(
        _ core: inout WorkerCore, at seconds: Double, read: Int = 0, queued: Int = 0, inFlight: Int = 0,
        bulkQueued: Int = 0, bulkInFlight: Int = 0, unstartedBulk: Int = 0, heldDue: Date? = nil
    ) -> [WorkerCore.EndAction] {
        core.endTurn(
            now: at(seconds), deliveriesRead: read, queued: LaneCounts(urgent: queued, bulk: bulkQueued),
            inFlight: LaneCounts(urgent: inFlight, bulk: bulkInFlight), unstartedBulkJobs: unstartedBulk,
            heldDue: heldDue)
    }

    @Test func whileRunningEveryTurnReadsUpToThePrefetchAndSendsUrgentWorkFirst() {
        var core = core()
        #expect(core.beginTurn(.init(now: at(0.1))) == [.readDeliveries(limit: 500), .sendUrgent])
    }

    @Test func urgentNotificationsReadAtATurnsStartGoWithinTheWindowAndTheBatchLimit() {
        var core = core()
        #expect(core.urgentToSend(queued: 250, inFlight: 30, now: at(1)) == 70, "the room left in flight")
        #expect(core.urgentToSend(queued: 0, inFlight: 0, now: at(1)) == 0)
        core.handle(.rateLimited([.urgent], nextWindowIn: 0.5, at: at(1)))
        #expect(core.urgentToSend(queued: 5, inFlight: 0, now: at(1.2)) == 0, "the rate limit's window is closed")
        #expect(core.urgentToSend(queued: 5, inFlight: 0, now: at(1.5)) == 5)
    }

    /// A lane hands APNs what its connections carry and a batch, within the setting: APNs allowing 40 streams in
    /// all, 40 + 256 in flight at most of 5,000; unknown again, the setting.
    @Test func aLaneHandsOverNoMoreThanItsConnectionsCarryAndABatch() {
        var core = WorkerCore(
            settings: .init(prefetch: 500, maximumNotificationsInFlight: 5000, shutdownTimeout: 25),
            generation: 1, now: Self.start)
        core.noteStreamCapacity(40, of: .urgent)
        #expect(core.inFlightWindow == LaneCounts(urgent: 296, bulk: 5000))
        #expect(core.urgentToSend(queued: 1000, inFlight: 250, now: at(1)) == 46)
        #expect(core.urgentToSend(queued: 1000, inFlight: 296, now: at(1)) == 0)
        #expect(core.sendMoreAt(.urgent) == 148, "woken at half the window")
        let ends = core.endTurn(
            now: at(1), deliveriesRead: 0, queued: LaneCounts(urgent: 1000, bulk: 1000),
            inFlight: LaneCounts(urgent: 290, bulk: 4000), unstartedBulkJobs: 0, heldDue: nil)
        #expect(ends.contains(.send(urgent: 6, bulk: 256)))
        core.noteStreamCapacity(100_000, of: .bulk)
        core.noteStreamCapacity(nil, of: .urgent)
        #expect(core.inFlightWindow == LaneCounts(urgent: 5000, bulk: 5000))
        #expect(core.sendMoreAt(.urgent) == 4744)
    }

    @Test func aStopReadsNothingMoreAndLeavesOnceTheJobsUnderWaySettle() {
        var core = core()
        core.handle(.jobsStarted(3))
        #expect(
            core.beginTurn(.init(now: at(1), stopRequested: true)) == [
                .announceStop(jobsInFlight: 3), .requeueUnstarted
            ],
            "no reading: the broker gives the unread deliveries to another worker")
        #expect(core.beginTurn(.init(now: at(2), stopRequested: true, completedJobs: 2)) == [.finishCompleted])
        core.handle(.jobsSettled(2))
        #expect(core.beginTurn(.init(now: at(3), stopRequested: true)) == [])
        core.handle(.jobsSettled(1))
        #expect(core.beginTurn(.init(now: at(4), stopRequested: true)) == [.exit(.drained)])
    }

    @Test func aStopWithNothingUnderWayLeavesAtOnce() {
        var core = core()
        #expect(
            core.beginTurn(.init(now: at(1), stopRequested: true))
                == [.announceStop(jobsInFlight: 0), .requeueUnstarted, .exit(.drained)])
    }

    @Test func theShutdownDeadlineLeavesWhatIsUnfinishedToTheBroker() {
        var core = core()
        core.handle(.jobsStarted(2))
        _ = core.beginTurn(.init(now: at(10), stopRequested: true))
        #expect(core.beginTurn(.init(now: at(34), stopRequested: true)) == [])
        #expect(
            core.beginTurn(.init(now: at(35.5), stopRequested: true)) == [.exit(.deadlinePassed(unfinishedJobs: 2))])
    }

    @Test func whileStoppingThePublicationsHeldBackAreStillMade() {
        var core = core()
        let due = at(6)
        #expect(
            core.beginTurn(.init(now: at(1), stopRequested: true, heldDue: due))
                == [.announceStop(jobsInFlight: 0), .requeueUnstarted],
            "not drained while something waits to be published again")
        #expect(core.beginTurn(.init(now: at(6), stopRequested: true, heldDue: due)) == [.publishHeld])
        let wait = end(&core, at: 1, unstartedBulk: 5, heldDue: due)
        #expect(wait.last == .wait(seconds: 1, watchingBroker: false), "waits for its due time, not for deliveries")
        #expect(!wait.contains(.startBulk(limit: 5)), "starts no bulk job while stopping")
    }

    @Test func completionsOfAnOlderConnectionAreDroppedNotSettled() {
        var core = core(generation: 2)
        #expect(!core.isCurrent(generation: 1) && core.isCurrent(generation: 2))
        #expect(
            core.beginTurn(.init(now: at(1), completedJobs: 1, staleCompletions: 3))
                == [.readDeliveries(limit: 500), .sendUrgent, .discardStale(3), .finishCompleted])
    }

    @Test func theIdempotencyRecordComesBeforeAnythingIsSettled() {
        var core = core()
        let actions = core.beginTurn(.init(now: at(6), outcomesWaiting: true, completedJobs: 2, heldDue: at(5)))
        #expect(actions == [.readDeliveries(limit: 500), .sendUrgent, .recordOutcomes, .finishCompleted, .publishHeld])
    }

    @Test func notificationsInFlightStayWithinTheBound() {
        var core = core()
        #expect(end(&core, at: 0.5, read: 1, queued: 250, inFlight: 30) == [.send(urgent: 70, bulk: 0)])
        #expect(
            end(&core, at: 0.6, read: 1, queued: 250, inFlight: 100) == [],
            "full: nothing goes until answers come back")
        #expect(end(&core, at: 0.7, read: 1, queued: 20) == [.send(urgent: 20, bulk: 0)])
    }

    @Test func handOversAreCutToTheBatchLimitAndTheNextComesAtOnce() {
        var core = WorkerCore(
            settings: .init(
                prefetch: 500, maximumNotificationsInFlight: 5_000, shutdownTimeout: 25,
                sendBatchLimit: 256), generation: 1, now: Self.start)
        core.handle(.probed(at(0.5)))
        core.handle(.reported(at(0.5)))
        #expect(
            end(&core, at: 0.5, queued: 30, bulkQueued: 40_000) == [.send(urgent: 30, bulk: 256)],
            "no wait: the rest of the bulk lane goes next turn")
        #expect(
            end(&core, at: 0.6, bulkQueued: 40_000, bulkInFlight: 4_900)
                == [.send(urgent: 0, bulk: 100), .wait(seconds: 1, watchingBroker: true)],
            "the window is full after this one")
    }

    @Test func eachLaneHasItsOwnWindowSoBulkWorkNeverKeepsUrgentWorkWaiting() {
        var core = core()
        #expect(
            end(&core, at: 0.5, read: 1, queued: 5, bulkQueued: 900, bulkInFlight: 100) == [.send(urgent: 5, bulk: 0)],
            "a full bulk window holds back no urgent notification")
        #expect(
            end(&core, at: 0.6, read: 1, queued: 5, inFlight: 20, bulkQueued: 900, bulkInFlight: 40)
                == [.send(urgent: 5, bulk: 60)])
    }

    @Test func bulkJobsStartAFewAtATimeAfterUrgentWorkAndOnlyWhileTheBulkLaneHasRoom() {
        var core = core()
        #expect(
            end(&core, at: 0.5, queued: 3, unstartedBulk: 40) == [.send(urgent: 3, bulk: 0), .startBulk(limit: 16)],
            "urgent notifications go before a bulk job is resolved; then no wait: round again at once")
        #expect(end(&core, at: 0.6, bulkQueued: 99, bulkInFlight: 100, unstartedBulk: 24) == [.startBulk(limit: 16)])
        let full = end(&core, at: 0.7, bulkQueued: 100, bulkInFlight: 100, unstartedBulk: 8)
        #expect(
            !full.contains(.startBulk(limit: 8)) && full.last == .wait(seconds: 1, watchingBroker: true),
            "a window's worth queued: the rest waits, unresolved")
        #expect(end(&core, at: 0.8, unstartedBulk: 5) == [.startBulk(limit: 5)])
    }

    @Test func aStopGivesUnstartedBulkJobsBackAndStartsNoMore() {
        var core = core()
        core.handle(.jobsStarted(1))
        #expect(
            core.beginTurn(.init(now: at(1), stopRequested: true)) == [
                .announceStop(jobsInFlight: 1), .requeueUnstarted
            ])
        let stopping = end(&core, at: 1.1, bulkQueued: 10, unstartedBulk: 3)
        #expect(stopping.first == .send(urgent: 0, bulk: 10), "started bulk jobs still finish")
        #expect(!stopping.contains(.startBulk(limit: 3)))
    }

    @Test func aRateLimitWindowHoldsTheRestUntilItOpens() {
        var core = core()
        #expect(end(&core, at: 0.5, queued: 50).first == .send(urgent: 50, bulk: 0))
        core.handle(.rateLimited([.urgent], nextWindowIn: 0.08, at: at(0.5)))
        let waiting = end(&core, at: 0.52, queued: 40)
        #expect(!waiting.contains { if case .send = $0 { true } else { false } }, "nothing before the window")
        guard case .wait(let seconds, true)? = waiting.last else {
            Issue.record("no wait: \(waiting)")
            return
        }
        #expect(abs(seconds - 0.06) < 0.001, "wakes when the window opens")
        #expect(end(&core, at: 0.58, queued: 40).first == .send(urgent: 40, bulk: 0))
    }

    @Test func aBulkLaneOutOfPermitsDoesNotHoldUrgentWorkBack() {
        var core = core()
        core.handle(.rateLimited([.bulk], nextWindowIn: 0.08, at: at(0.5)))
        #expect(end(&core, at: 0.52, queued: 2, bulkQueued: 500).first == .send(urgent: 2, bulk: 0))
        #expect(end(&core, at: 0.58, queued: 0, bulkQueued: 500).first == .send(urgent: 0, bulk: 100))
    }

    @Test func onlyTheLanesTheRateLimitShortenedWaitForTheNextWindow() {
        let asked = LaneCounts(urgent: 5, bulk: 500)
        #expect(RateReservation.granted(urgent: 5, bulk: 20, nextWindowIn: 0.05).lanesHeldBack(asked: asked) == [.bulk])
        #expect(
            RateReservation.granted(urgent: 2, bulk: 0, nextWindowIn: 0.05).lanesHeldBack(asked: asked) == [
                .urgent, .bulk
            ])
        #expect(RateReservation.granted(urgent: 5, bulk: 500, nextWindowIn: 0.05).lanesHeldBack(asked: asked) == [])
        #expect(RateReservation.refused("WRONGTYPE").lanesHeldBack(asked: asked) == [.urgent, .bulk])
    }

    @Test func choresComeAtTheirIntervalsAndNotWhileDeliveriesFlow() {
        var core = core()
        let flowing = end(&core, at: 6, read: 10)
        #expect(flowing == [.probe], "a probe even under load (readiness), but no wait: more may be waiting")
        core.handle(.probed(at(6)))
        let idle = end(&core, at: 11)
        #expect(idle == [.probe, .reportStatistics, .logProgress, .wait(seconds: 1, watchingBroker: true)])
        core.handle(.probed(at(11)))
        core.handle(.reported(at(11)))
        core.handle(.progressLogged(at(11)))
        #expect(end(&core, at: 11.5) == [.wait(seconds: 1, watchingBroker: true)])
    }
}
