import APNsModel
import Foundation
import Telemetry

/// One broker session of the worker, on the broker thread: performs what `WorkerCore` and the rules decide, turn
/// after turn, until the core says to leave. It decides nothing itself: when to retry is `RetryPolicy`'s, which jobs
/// are poison `DeliveryTriage`'s, which tokens a job reaches `TargetResolver`'s, what a finished job publishes and
/// removes `SettlementPlan`'s, and the order of a turn, the lanes and the bounds `WorkerCore`'s.
///
/// What lives and dies with the session is here: the core, notifications waiting to go, bulk jobs read and not
/// started, publications the broker did not take, suspects waiting to run alone, and the job preparer (a thread with
/// a token-store connection of its own that decodes bulk jobs and resolves users of bulk and large jobs, so that this
/// thread never waits on them). All of it is bounded by the prefetch, as every job it holds is an unacknowledged
/// delivery.
final class SessionLoop {
    let worker: Worker
    let session: WorkerSession
    let generation: Int
    var core: WorkerCore
    let retryPolicy: RetryPolicy
    let storeWaits: StoreWaits
    let triage: DeliveryTriage
    let resolver: TargetResolver
    var backlogs = Backlogs()
    var unstartedBulk: [JobDelivery] = []
    var held = HeldPublishes()
    /// The shared limiters of the rate groups (credentials' own limits) met so far.
    var groupLimiters: [RateGroup: any RateLimiter] = [:]
    /// Notifications of rate groups whose window is spent, out of the lanes until it opens again.
    var rateGroupHolds = RateGroupHolds()
    /// A job of a rate group has started: from then on each hand-over looks for them (until then, none is looked at).
    var rateGroupsSeen = false
    /// Broadcast jobs waiting for a permit of the rate limit, in order, and when the next may ask.
    var broadcastsWaiting: [BroadcastJob] = []
    var broadcastsWaitUntil = Date.distantPast
    var suspects = SuspectQueue()
    var underWay = JobsUnderWay()
    /// Republished copies read while their job (same id) was under way here: started once it settled, so that they
    /// find what it sent in the idempotency record.
    var copiesWaiting: [(delivery: JobDelivery, jobID: String)] = []
    /// Large jobs under way with users still to resolve, a piece at a time.
    var assemblies: [JobAssembly] = []
    /// The fleet's cancelled jobs, as far as this worker has read them.
    var cancellations = CancellationWatch()
    /// Large jobs' progress since the last report to the fleet's record.
    var progressTracker = ProgressTracker()
    /// The large bulk jobs started and not complete (an assembly leaves `assemblies` once its users are all taken, and
    /// holds its memory until its last piece is answered): what `BulkAdmission` weighs.
    var largeBulkJobs: [JobAssembly] = []
    /// Decodes bulk jobs and resolves users of bulk and large jobs on a thread of its own.
    let preparer: JobPreparer
    /// The bulk jobs handed to the preparer and not back yet.
    var preparing: [JobDelivery] = []
    var lastProgress: (at: Date, snapshot: WorkerStatistics.Snapshot)
    /// Token-judging answers of finished jobs not yet added to the fleet's window: added with the next batch that
    /// has mismatches to weigh, or with the statistics report.
    var unsharedAnswers = InvalidationCounts()
    /// Stable ids of jobs settled here and not yet added to the fleet's record of settled jobs, and when it was last
    /// added to (monotonic nanoseconds). A list, not a set: the record is a Redis set, which drops an id settled twice,
    /// and only a republished copy looks an id up here (`skippingSettledCopies`), while every job adds one.
    var settledUnshared: [String] = []
    var settledSharedAt = DispatchTime.now().uptimeNanoseconds
    static let settledShareInterval = 0.1
    /// How often the lanes' windows follow what their connections can carry (`WorkerCore.noteStreamCapacity`): the
    /// streams APNs allows change now and then, and asking costs a lock and a look at every pool.
    static let streamCapacityInterval = 0.05
    var streamCapacityAskedAt = Date.distantPast
    /// Per lane, the notifications in flight at which an answer wakes this thread to send more (`WorkerCore.sendMoreAt`
    /// of the window now): read by every answer, so that one handed over before the window shrank still wakes it.
    let sendMoreAt = LaneCounters()
    /// How long a lost session waits for the answers to its notifications in flight before it records what it has.
    static let answersInFlightAtLoss = 2.0

    var statistics: WorkerStatistics { worker.statistics }
    var logger: Logger { worker.logger }

    init(worker: Worker, session: WorkerSession, generation: Int) {
        self.worker = worker
        self.session = session
        self.generation = generation
        let settings = worker.settings
        core = WorkerCore(settings: settings.core, generation: generation, now: Date())
        retryPolicy = RetryPolicy(maximumAttempts: settings.maximumSendAttempts, delays: settings.retryDelays)
        storeWaits = StoreWaits(delays: settings.retryDelays)
        triage = DeliveryTriage(maximumDeliveries: settings.maximumDeliveries)
        resolver = TargetResolver(defaultTopic: settings.defaultTopic)
        preparer = JobPreparer(
            tokens: session.preparationTokens, record: session.preparationRecord, settings: settings,
            resolver: resolver, sender: worker.sender, wakeup: worker.wakeup, logger: worker.logger)
        lastProgress = (Date(), worker.statistics.snapshot())
    }

    /// Runs turns until the core says to leave (a stop, drained or past its deadline). Throws when the broker or the
    /// store is lost.
    func serve() throws {
        // Ending this session is not dying: a suspect under way did not stop the worker.
        defer {
            if let key = suspects.alone?.key {
                do { try session.record.settledAlone(key) } catch {
                    worker.aloneMarksUnwritten.withLock { $0.append(key) }
                }
            }
        }
        defer { stopPreparer() }
        // What the last session left unwritten goes first: the answers this worker holds before any redelivered job is
        // looked up, and the deliveries it handed back before any is counted.
        try recordAnswered()
        try writeGivenBack()
        try clearAloneMarks()
        do {
            try turns()
        } catch {
            let unsettled = (error as? SystemFailure)?.failedSystem == .store ? settleWithoutTheStore() : []
            // Acknowledgements held back go out while the broker still answers: jobs settled without the store's
            // record of them must not be delivered again.
            try? session.broker.acknowledgeHeld(dueBy: .distantFuture)
            countAcknowledgementFrames()
            stopPreparer()
            handBack(completed: unsettled)
            throw error
        }
    }

    /// The store was lost while the broker still answers: the jobs completed meanwhile that need nothing from the
    /// store to settle (no mismatch to weigh; dead tokens are left to the cleanup consumer, their events published)
    /// are settled now, so that the broker does not hand them to another worker, which could not know they were
    /// sent. Returns the completed jobs left unsettled.
    private func settleWithoutTheStore() -> [JobProgress] {
        let completed = worker.answers.takeCompleted { core.isCurrent(generation: $0) }
        let settleable = completed.filter { $0.assembly == nil && $0.invalidationCounts.mismatches == 0 }
        guard !settleable.isEmpty else { return completed }
        // Acknowledged or not, whatever step failed after (the fleet's record of settled jobs is the store's).
        _ = try? finish(settleable)
        let underWayNow = Set(underWay.deliveries.values.map(\.delivery.tag))
        let unsettled = completed.filter { underWayNow.contains($0.delivery.tag) }
        logger.info(
            "settled the jobs answered before the store was lost",
            ["jobs": String(completed.count - unsettled.count)])
        return unsettled
    }

    /// Stops the preparer; the outcomes it did not write wait in the worker for the next write to the record.
    private func stopPreparer(finishingWrites: Bool = false) {
        let unwritten = preparer.stop(finishingWrites: finishingWrites)
        if !unwritten.isEmpty { worker.unwrittenOutcomes.withLock { $0 += unwritten } }
    }

    /// A session lost (the broker, or Redis) hands back every delivery it holds: the broker redelivers them, and
    /// their next delivery must not count towards making them suspects, as the worker did not die with them. What it
    /// answered goes to the idempotency record now, so that another worker that gets a redelivery skips it. Where
    /// the store is what was lost, both wait in the worker for the next session.
    private func handBack(completed unsettled: [JobProgress]) {
        var seen = Set<UInt64>()
        let handedBack =
            (underWay.deliveries.values.map(\.delivery) + unstartedBulk + preparing + suspects.giveBack()
            + copiesWaiting.map(\.delivery) + broadcastsWaiting.map(\.delivery) + held.deliveries)
            .filter { seen.insert($0.tag).inserted }
        worker.givenBackUnwritten.withLock { $0 += handedBack.map(DeliveryTriage.historyKey) }
        // APNs answers in milliseconds: what is in flight now is answered before the broker hands the jobs on.
        worker.awaitAnswersInFlight(for: Self.answersInFlightAtLoss)
        let completed = unsettled + worker.answers.takeCompleted()
        try? record(worker.answers.takeOutcomes() + completed.compactMap(settledOutcomes))
        try? writeGivenBack()
        // Acknowledgements sent just before may have been lost with the connection: the fleet learns that those jobs
        // settled, so that their redeliveries send nothing.
        try? shareSettled(force: true)
    }

    /// Notes the deliveries this worker handed back without dying (`IdempotencyRecord.gaveBack`).
    private func writeGivenBack() throws {
        let keys = worker.givenBackUnwritten.withLock { keys in
            defer { keys.removeAll() }
            return keys
        }
        guard !keys.isEmpty else { return }
        do { try session.record.gaveBack(keys) } catch {
            worker.givenBackUnwritten.withLock { $0 = keys + $0 }
            throw error
        }
    }

    private func clearAloneMarks() throws {
        let keys = worker.aloneMarksUnwritten.withLock { keys in
            defer { keys.removeAll() }
            return keys
        }
        for (index, key) in keys.enumerated() {
            do { try session.record.settledAlone(key) } catch {
                worker.aloneMarksUnwritten.withLock { $0 = Array(keys[index...]) + $0 }
                throw error
            }
        }
    }

    private func turns() throws {
        while true {
            // Counted, not taken: what a turn takes it settles (see `WorkerCore.BeginAction`).
            let completions = worker.answers.completedCounts { core.isCurrent(generation: $0) }
            let observation = WorkerCore.Observation(
                now: Date(), stopRequested: worker.isStopRequested, outcomesWaiting: worker.answers.hasOutcomes,
                completedJobs: completions.current, staleCompletions: completions.stale, heldDue: held.nextDue)
            var deliveriesRead = 0
            if observation.now.timeIntervalSince(streamCapacityAskedAt) >= Self.streamCapacityInterval {
                streamCapacityAskedAt = observation.now
                for lane in JobLane.allCases {
                    core.noteStreamCapacity(worker.sender.streamCapacity(lane), of: lane)
                    sendMoreAt.store(lane, core.sendMoreAt(lane))
                }
            }
            for action in core.beginTurn(observation) {
                guard try begin(action, deliveriesRead: &deliveriesRead) else { return }
            }
            try takePrepared()
            try startSuspectOrWaiting()
            try startCopiesWhoseJobSettled()
            try settleBroadcasts()
            let now = Date()
            try session.broker.acknowledgeHeld(dueBy: now)
            try readCancellations(at: now)
            try reportProgress(at: now)
            try sendWaitingBroadcasts(now: now)
            rateGroupHolds.release(dueAt: now, into: &backlogs)
            // One batch and one piece out to the preparer at a time, and bulk jobs only within their admission.
            let bulkAdmitted = bulkAdmissionOpen()
            statistics.bulkJobsAwaitingAdmission.store(bulkAdmitted ? 0 : unstartedBulk.count, ordering: .relaxed)
            for action in core.endTurn(
                now: now, deliveriesRead: deliveriesRead, queued: backlogs.counts,
                inFlight: statistics.inFlight.counts,
                unstartedBulkJobs: preparer.batchOut || !bulkAdmitted ? 0 : unstartedBulk.count,
                suspectsActive: suspects.isActive, piecesWaiting: piecesWaiting(at: now),
                heldDue: nextDue())
            {
                try perform(action, at: now)
            }
        }
    }

    /// Performs one of the turn's first actions; false once the session leaves.
    private func begin(_ action: WorkerCore.BeginAction, deliveriesRead: inout Int) throws -> Bool {
        switch action {
        case .announceStop(let jobs):
            logger.info(
                "stopping: finishing jobs under way",
                [
                    "jobs.in_flight": String(jobs),
                    "jobs.unstarted_bulk": String(unstartedBulk.count)
                ])
        case .requeueUnstarted:
            try giveBackUnstarted()
        case .exit(let exit):
            leave(exit)
            return false
        case .readDeliveries(let limit):
            deliveriesRead = try read(limit: limit)
        case .sendUrgent:
            try sendUrgent()
        case .recordOutcomes:
            let outcomes = worker.answers.takeOutcomesByWriter()
            if !outcomes.pieces.isEmpty { preparer.record(outcomes.pieces) }
            try record(outcomes.jobs)
        case .discardStale(let count):
            logger.debug("completions from an earlier broker connection dropped", ["jobs": String(count)])
            try recordUnsettled(worker.answers.takeCompleted { !core.isCurrent(generation: $0) })
        case .finishCompleted:
            try finishCompleted()
        case .publishHeld:
            try publishHeld()
        }
        return true
    }

    /// The soonest moment something waiting here is due (a held publication, a rate group's window, acknowledgements
    /// held back, a broadcast, the fleet's cancellations, a progress report, deferred users of a large job). Asked
    /// every turn: no array is made.
    private func nextDue() -> Date? {
        var soonest = held.nextDue
        func consider(_ date: Date?) {
            if let date, soonest.map({ date < $0 }) ?? true { soonest = date }
        }
        consider(rateGroupHolds.nextOpening)
        consider(session.broker.acknowledgementsDue)
        consider(broadcastsDue)
        consider(cancellationsDue)
        if progressTracker.hasPending { consider(progressTracker.nextReport) }
        for assembly in assemblies { consider(assembly.deferredDue) }
        return soonest
    }

    /// Whether another bulk job may start: the large bulk jobs under way (their bodies, users and tokens) are within
    /// `BulkAdmission`'s budget.
    private func bulkAdmissionOpen() -> Bool {
        let load = bulkLoad()
        return core.settings.bulkAdmission.admits(bytesUnderWay: load.bytes, targetsUnderWay: load.targets)
    }

    /// What the large bulk jobs started and not complete hold: the bytes of their bodies, their users and tokens.
    func bulkLoad() -> (bytes: Int, targets: Int) {
        largeBulkJobs.removeAll { $0.isComplete }
        var bytes = 0
        var targets = 0
        for assembly in largeBulkJobs {
            bytes += assembly.whole.delivery.body.count
            targets += assembly.job.users.count + assembly.job.tokens.count
        }
        return (bytes, targets)
    }

    /// A stop: the jobs not started yet (bulk jobs waiting, suspects, copies, a batch being prepared) go back.
    private func giveBackUnstarted() throws {
        let withdrawn = preparer.withdrawBatch()
        if !withdrawn.isEmpty { preparing.removeAll() }
        core.handle(.jobsSettled(withdrawn.count))
        let unstarted = unstartedBulk + suspects.giveBack() + copiesWaiting.map(\.delivery) + withdrawn
        copiesWaiting.removeAll()
        try giveBack(unstarted)
        unstartedBulk.removeAll()
    }

    /// The jobs whose last answer came in are settled; any stale completion that came in meanwhile goes as
    /// `discardStale` does.
    private func finishCompleted() throws {
        let completed = worker.answers.takeCompleted()
        try recordUnsettled(completed.filter { !core.isCurrent(generation: $0.generation) })
        let jobs = jobsToSettle(completed.filter { core.isCurrent(generation: $0.generation) })
        if !jobs.isEmpty { core.handle(.jobsSettled(try finish(jobs))) }
    }

    private func piecesWaiting(at now: Date) -> LaneCounts {
        var counts = LaneCounts()
        guard preparer.piecesOut == 0 else { return counts }
        for assembly in assemblies where !assembly.resolving && assembly.hasUsersReady(at: now) {
            counts[assembly.lane] += 1
        }
        return counts
    }

    private func perform(_ action: WorkerCore.EndAction, at now: Date) throws {
        switch action {
        case .send(let urgent, let bulk):
            if let limited = try send(LaneCounts(urgent: urgent, bulk: bulk)) {
                core.handle(.rateLimited(limited.lanes, nextWindowIn: limited.wait, at: now))
            }
        case .startBulk(let limit):
            // By size: as many jobs as fit in the turn's bytes, at least one.
            var bytes = 0
            let count = unstartedBulk.prefix(limit).prefix { delivery in
                defer { bytes += delivery.body.count }
                return bytes == 0 || bytes + delivery.body.count <= core.settings.bulkBytesPerTurn
            }.count
            let starting = Array(unstartedBulk.prefix(count))
            unstartedBulk.removeFirst(starting.count)
            // Delivered and not settled: they count as in flight from here (and once started, as started).
            core.handle(.jobsStarted(starting.count))
            preparing = starting
            preparer.prepare(starting)
        case .resolvePiece(let lane):
            // One piece out at a time: the first lane asked (urgent first) has it.
            if preparer.piecesOut == 0 { try askForNextPiece(of: lane) }
        case .probe:
            // Readiness is the broker and the store as they are now: a round trip to each. One that does not answer
            // within its timeout ends this session (reconnect); meanwhile /readyz goes stale.
            try session.store.probe()
            statistics.answered(.store)
            statistics.laneQueues = try session.broker.laneQueues()
            statistics.answered(.broker)
            statistics.jobsInFlight.store(core.jobsInFlight, ordering: .relaxed)
            try shareSettled(force: true)
            countAcknowledgementFrames()
            worker.markAlive()
            core.handle(.probed(now))
        case .reportStatistics:
            if unsharedAnswers.judged > 0 { _ = try shareAnswers() }
            if let refused = try worker.reportStatistics(to: session.statistics) {
                statistics.countDataError("statistics")
                logger.warning("Redis refused the shared statistics", ["redis.error": refused])
            }
            core.handle(.reported(now))
        case .logProgress:
            logProgress(at: now)
            core.handle(.progressLogged(now))
        case .wait(let seconds, let watchingBroker):
            // While stopping, deliveries are left unread (the broker requeues them), so only wake-ups count.
            if !session.broker.hasBufferedInput {
                worker.wakeup.wait(
                    alsoReadable: watchingBroker ? session.broker.readableDescriptor : nil, timeout: seconds)
            }
        }
    }

    private func leave(_ exit: WorkerCore.Exit) {
        if case .deadlinePassed(let unfinished) = exit {
            logger.warning(
                "shutdown deadline passed; the broker will redeliver unfinished jobs",
                ["jobs.in_flight": String(unfinished)])
            // Given back by an orderly stop: their next delivery is no sign of a job that stops workers.
            let unfinished = underWay.deliveries.values.map(\.delivery) + preparing
            try? session.record.gaveBack(unfinished.map(DeliveryTriage.historyKey))
        }
        _ = try? worker.reportStatistics(to: session.statistics)
        try? shareSettled(force: true)
        // The preparer's writes asked so far are made, then what waits in the worker (the outcomes of jobs given back
        // among them).
        stopPreparer(finishingWrites: true)
        try? record(worker.answers.takeOutcomes())
        try? reportProgress(at: .distantFuture)
        session.broker.close()
        countAcknowledgementFrames()
    }

    /// Adds the acknowledgement frames the session sent since the last count to the worker's statistics.
    private func countAcknowledgementFrames() {
        statistics.countAcknowledgementFrames(session.broker.takeAcknowledgementFrames())
    }

    private func logProgress(at now: Date) {
        let snapshot = statistics.snapshot()
        if snapshot != lastProgress.snapshot {
            let answered = snapshot.subtracting(lastProgress.snapshot)
            let rate =
                Double(answered.delivered + answered.deadTokens + answered.permanentFailures)
                / now.timeIntervalSince(lastProgress.at)
            logger.info(
                "progress",
                [
                    "stats": snapshot.summary, "jobs.in_flight": String(core.jobsInFlight),
                    "notifications_per_s": String(Int(rate.rounded())),
                    "apns.in_flight": String(statistics.notificationsInFlight)
                ])
        }
        lastProgress = (now, snapshot)
    }
}
