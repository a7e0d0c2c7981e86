import Foundation
import Testing
import WorkerPipeline

/// What the worker's broker thread decides, without a broker, a store or APNs: each decision the loop performs.
@Suite struct WorkerCoreTests {
    static let start = Date(timeIntervalSince1970: 1_000_000)
    static let settings = WorkerCore.Settings(prefetch: 500, maximumNotificationsInFlight: 100, shutdownTimeout: 25)

    func core(generation: Int = 1) -> WorkerCore { WorkerCore(settings: Self.settings, generation: generation, now: Self.start) }

    func at(_ seconds: Double) -> Date { Self.start.addingTimeInterval(seconds) }

    @Test func whileRunningEveryTurnReadsUpToThePrefetch() {
        var core = core()
        #expect(core.beginTurn(.init(now: at(0.1))) == [.readDeliveries(limit: 500)])
    }

    @Test func aStopReadsNothingMoreAndLeavesOnceTheJobsUnderWaySettle() {
        var core = core()
        core.handle(.jobsStarted(3))
        #expect(core.beginTurn(.init(now: at(1), stopRequested: true)) == [.announceStop(jobsInFlight: 3)],
                "no reading: the broker gives the unread deliveries to another worker")
        #expect(core.beginTurn(.init(now: at(2), stopRequested: true, completedJobs: 2)) == [.finishCompleted])
        core.handle(.jobsSettled(2))
        #expect(core.beginTurn(.init(now: at(3), stopRequested: true)) == [])
        core.handle(.jobsSettled(1))
        #expect(core.beginTurn(.init(now: at(4), stopRequested: true)) == [.exit(.drained)])
    }

    @Test func aStopWithNothingUnderWayLeavesAtOnce() {
        var core = core()
        #expect(core.beginTurn(.init(now: at(1), stopRequested: true)) == [.announceStop(jobsInFlight: 0), .exit(.drained)])
    }

    @Test func theShutdownDeadlineLeavesWhatIsUnfinishedToTheBroker() {
        var core = core()
        core.handle(.jobsStarted(2))
        _ = core.beginTurn(.init(now: at(10), stopRequested: true))
        #expect(core.beginTurn(.init(now: at(34), stopRequested: true)) == [])
        #expect(core.beginTurn(.init(now: at(35.5), stopRequested: true)) == [.exit(.deadlinePassed(unfinishedJobs: 2))])
    }

    @Test func whileStoppingThePublicationsHeldBackAreStillMade() {
        var core = core()
        let due = at(6)
        #expect(core.beginTurn(.init(now: at(1), stopRequested: true, heldDue: due)) == [.announceStop(jobsInFlight: 0)],
                "not drained while something waits to be published again")
        #expect(core.beginTurn(.init(now: at(6), stopRequested: true, heldDue: due)) == [.publishHeld])
        let wait = core.endTurn(now: at(1), deliveriesRead: 0, queuedNotifications: 0, notificationsInFlight: 0, heldDue: due)
        #expect(wait.last == .wait(seconds: 1, watchingBroker: false), "waits for its due time, not for deliveries")
    }

    @Test func completionsOfAnOlderConnectionAreDroppedNotSettled() {
        var core = core(generation: 2)
        #expect(!core.isCurrent(generation: 1) && core.isCurrent(generation: 2))
        #expect(core.beginTurn(.init(now: at(1), completedJobs: 1, staleCompletions: 3))
                == [.discardStale(3), .finishCompleted, .readDeliveries(limit: 500)])
    }

    @Test func theIdempotencyRecordComesBeforeAnythingThatCanFail() {
        var core = core()
        let actions = core.beginTurn(.init(now: at(6), outcomesWaiting: true, completedJobs: 2, heldDue: at(5)))
        #expect(actions == [.recordOutcomes, .finishCompleted, .publishHeld, .readDeliveries(limit: 500)])
    }

    @Test func notificationsInFlightStayWithinTheBound() {
        var core = core()
        #expect(core.endTurn(now: at(0.5), deliveriesRead: 1, queuedNotifications: 250, notificationsInFlight: 30,
                             heldDue: nil) == [.send(70)])
        #expect(core.endTurn(now: at(0.6), deliveriesRead: 1, queuedNotifications: 250, notificationsInFlight: 100,
                             heldDue: nil) == [], "full: nothing goes until answers come back")
        #expect(core.endTurn(now: at(0.7), deliveriesRead: 1, queuedNotifications: 20, notificationsInFlight: 0,
                             heldDue: nil) == [.send(20)])
    }

    @Test func aRateLimitWindowHoldsTheRestUntilItOpens() {
        var core = core()
        #expect(core.endTurn(now: at(0.5), deliveriesRead: 0, queuedNotifications: 50, notificationsInFlight: 0,
                             heldDue: nil).first == .send(50))
        core.handle(.rateLimited(nextWindowIn: 0.08, at: at(0.5)))
        let waiting = core.endTurn(now: at(0.52), deliveriesRead: 0, queuedNotifications: 40, notificationsInFlight: 0,
                                   heldDue: nil)
        #expect(!waiting.contains { if case .send = $0 { true } else { false } }, "nothing before the window")
        guard case .wait(let seconds, true)? = waiting.last else {
            Issue.record("no wait: \(waiting)")
            return
        }
        #expect(abs(seconds - 0.06) < 0.001, "wakes when the window opens")
        #expect(core.endTurn(now: at(0.58), deliveriesRead: 0, queuedNotifications: 40, notificationsInFlight: 0,
                             heldDue: nil).first == .send(40))
    }

    @Test func choresComeAtTheirIntervalsAndNotWhileDeliveriesFlow() {
        var core = core()
        let flowing = core.endTurn(now: at(6), deliveriesRead: 10, queuedNotifications: 0, notificationsInFlight: 0,
                                   heldDue: nil)
        #expect(flowing == [.probe], "a probe even under load (readiness), but no wait: more may be waiting")
        core.handle(.probed(at(6)))
        let idle = core.endTurn(now: at(11), deliveriesRead: 0, queuedNotifications: 0, notificationsInFlight: 0,
                                heldDue: nil)
        #expect(idle == [.probe, .reportStatistics, .logProgress, .wait(seconds: 1, watchingBroker: true)])
        core.handle(.probed(at(11)))
        core.handle(.reported(at(11)))
        core.handle(.progressLogged(at(11)))
        #expect(core.endTurn(now: at(11.5), deliveriesRead: 0, queuedNotifications: 0, notificationsInFlight: 0,
                             heldDue: nil) == [.wait(seconds: 1, watchingBroker: true)])
    }
}
