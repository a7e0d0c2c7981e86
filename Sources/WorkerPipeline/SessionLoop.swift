import APNsModel
import Foundation
import Telemetry

/// One broker session of the worker, on the broker thread: performs what `WorkerCore` and the rules decide, turn
/// after turn, until the core says to leave. It decides nothing itself: when to retry is `RetryPolicy`'s, which jobs
/// are poison `DeliveryTriage`'s, which tokens a job reaches `TargetResolver`'s, what a finished job publishes and
/// removes `SettlementPlan`'s, and the order of a turn, the lanes and the bounds `WorkerCore`'s.
///
/// What lives and dies with the session is here: the core, notifications waiting to go, bulk jobs read and not
/// started, publications the broker did not take, and suspects waiting to run alone. All of it is bounded by the
/// prefetch, as every job it holds is an unacknowledged delivery.
final class SessionLoop {
    private let worker: Worker
    private let session: WorkerSession
    private let generation: Int
    private var core: WorkerCore
    private let retryPolicy: RetryPolicy
    private let triage: DeliveryTriage
    private let resolver: TargetResolver
    private var backlogs = Backlogs()
    private var unstartedBulk: [JobDelivery] = []
    private var held = HeldPublishes()
    private var suspects = SuspectQueue()
    private var underWay = JobsUnderWay()
    /// Republished copies read while their job (same id) was under way here: started once it settled, so that they
    /// find what it sent in the idempotency record.
    private var copiesWaiting: [(delivery: JobDelivery, jobID: String)] = []
    /// Large jobs under way with users still to resolve, a piece at a time.
    private var assemblies: [JobAssembly] = []
    private var lastProgress: (at: Date, snapshot: WorkerStatistics.Snapshot)
    /// Token-judging answers of finished jobs not yet added to the fleet's window: added with the next batch that
    /// has mismatches to weigh, or with the statistics report.
    private var unsharedAnswers = InvalidationCounts()

    private var statistics: WorkerStatistics { worker.statistics }
    private var logger: Logger { worker.logger }

    init(worker: Worker, session: WorkerSession, generation: Int) {
        self.worker = worker
        self.session = session
        self.generation = generation
        let settings = worker.settings
        core = WorkerCore(settings: settings.core, generation: generation, now: Date())
        retryPolicy = RetryPolicy(maximumAttempts: settings.maximumSendAttempts, delays: settings.retryDelays)
        triage = DeliveryTriage(maximumDeliveries: settings.maximumDeliveries)
        resolver = TargetResolver(defaultTopic: settings.defaultTopic)
        lastProgress = (Date(), worker.statistics.snapshot())
    }

    /// Runs turns until the core says to leave (a stop, drained or past its deadline). Throws when the broker or the
    /// store is lost.
    func serve() throws {
        // Ending this session is not dying: a suspect under way did not stop the worker.
        defer { if let key = suspects.alone?.key { try? session.record.settledAlone(key) } }
        while true {
            let completed = worker.answers.takeCompleted()
            let current = completed.filter { core.isCurrent(generation: $0.generation) }
            let outcomes = worker.answers.takeOutcomes()
            let observation = WorkerCore.Observation(
                now: Date(), stopRequested: worker.isStopRequested, outcomesWaiting: !outcomes.isEmpty,
                completedJobs: current.count, staleCompletions: completed.count - current.count, heldDue: held.nextDue)
            var deliveriesRead = 0
            for action in core.beginTurn(observation) {
                switch action {
                case .announceStop(let jobs):
                    logger.info("stopping: finishing jobs under way", ["jobs.in_flight": String(jobs),
                                                                      "jobs.unstarted_bulk": String(unstartedBulk.count)])
                case .requeueUnstarted:
                    let unstarted = unstartedBulk + suspects.giveBack() + copiesWaiting.map(\.delivery)
                    copiesWaiting.removeAll()
                    try session.record.gaveBack(unstarted.map(DeliveryTriage.historyKey))
                    for delivery in unstarted { try session.broker.requeue(delivery.tag) }
                    unstartedBulk.removeAll()
                case .exit(let exit):
                    leave(exit)
                    return
                case .recordOutcomes:
                    try record(outcomes)
                case .discardStale(let count):
                    logger.debug("completions from an earlier broker connection dropped", ["jobs": String(count)])
                case .finishCompleted:
                    let jobs = jobsToSettle(current)
                    if !jobs.isEmpty { core.handle(.jobsSettled(try finish(jobs))) }
                case .publishHeld:
                    try publishHeld()
                case .readDeliveries(let limit):
                    deliveriesRead = try read(limit: limit)
                }
            }
            try startSuspectOrWaiting()
            try startCopiesWhoseJobSettled()
            let now = Date()
            for action in core.endTurn(now: now, deliveriesRead: deliveriesRead, queued: backlogs.counts,
                                       inFlight: statistics.inFlight.counts, unstartedBulkJobs: unstartedBulk.count,
                                       suspectsActive: suspects.isActive, piecesWaiting: piecesWaiting,
                                       heldDue: held.nextDue) {
                try perform(action, at: now)
            }
        }
    }

    private var piecesWaiting: LaneCounts {
        var counts = LaneCounts()
        for assembly in assemblies { counts[assembly.lane] += 1 }
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
            try start(starting)
        case .resolvePiece(let lane):
            try resolveNextPiece(of: lane)
        case .probe:
            // Readiness is the broker and the store as they are now: a round trip to each. One that does not answer
            // within its timeout ends this session (reconnect); meanwhile /readyz goes stale.
            try session.store.probe()
            try session.broker.probe()
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
                worker.wakeup.wait(alsoReadable: watchingBroker ? session.broker.readableDescriptor : nil, timeout: seconds)
            }
        }
    }

    private func leave(_ exit: WorkerCore.Exit) {
        if case .deadlinePassed(let unfinished) = exit {
            logger.warning("shutdown deadline passed; the broker will redeliver unfinished jobs",
                           ["jobs.in_flight": String(unfinished)])
            // Given back by an orderly stop: their next delivery is no sign of a job that stops workers.
            try? session.record.gaveBack(underWay.deliveries.values.map { DeliveryTriage.historyKey($0.delivery) })
        }
        _ = try? worker.reportStatistics(to: session.statistics)
        session.broker.close()
    }

    private func logProgress(at now: Date) {
        let snapshot = statistics.snapshot()
        if snapshot != lastProgress.snapshot {
            let answered = snapshot.subtracting(lastProgress.snapshot)
            let rate = Double(answered.delivered + answered.deadTokens + answered.permanentFailures)
                / now.timeIntervalSince(lastProgress.at)
            logger.info("progress", ["stats": snapshot.summary, "jobs.in_flight": String(core.jobsInFlight),
                                     "notifications_per_s": String(Int(rate.rounded())),
                                     "apns.in_flight": String(statistics.notificationsInFlight)])
        }
        lastProgress = (now, snapshot)
    }

    // MARK: reading and starting

    /// Reads up to `limit` deliveries, parks the poison ones, and starts the rest as the suspects and lanes allow.
    /// Returns how many it read.
    private func read(limit: Int) throws -> Int {
        var batch: [JobDelivery] = []
        for notice in try session.broker.receive(limit: limit) {
            switch notice {
            case .delivery(let delivery):
                batch.append(delivery)
            case .publishingBlocked(let blocked):
                logger.warning(blocked ? "broker blocks publishers (resource alarm)" : "broker unblocked")
                statistics.brokerBlocked.store(blocked, ordering: .relaxed)
                if blocked { statistics.brokerBlocks.add(1, ordering: .relaxed) }
            }
        }
        note(taken: batch)
        let sorted = try sortByDeliveries(batch)
        if !sorted.poison.isEmpty { try reject(sorted.poison.map { ($0.delivery, triage.reason($0)) }) }
        try dispatch(suspects.admit(usual: sorted.usual, suspects: sorted.suspects))
        return batch.count
    }

    /// Counts the jobs taken from each lane, and how long they had waited there (from their timestamp).
    private func note(taken batch: [JobDelivery]) {
        let now = Date().timeIntervalSince1970
        for delivery in batch {
            statistics.jobsTaken.add(delivery.lane, 1)
            if let published = delivery.properties.timestamp {
                statistics.longestWait.raise(delivery.lane, to: Int(max(0, (now - Double(published)) * 1000)))
            }
        }
    }

    /// The triage of a batch, with the counts it needs from the store; poison jobs' histories are forgotten, so that
    /// the same job sent again after a fix starts afresh.
    private func sortByDeliveries(_ batch: [JobDelivery]) throws -> DeliveryTriage.Sorted {
        let (counted, uncounted) = triage.brokerCounts(of: batch)
        var deliveries = counted
        if !uncounted.isEmpty {
            let (redeliveries, unreadable) = try session.record.countRedeliveries(of: uncounted.map(\.key))
            for (key, message) in unreadable {
                statistics.countDataError("delivery_count")
                logger.error("a redelivered job's delivery count cannot be read; the job is handled",
                             ["redis.error": message, "job.history_key": key])
            }
            deliveries = triage.merging(counted, uncounted: uncounted, storeRedeliveries: redeliveries)
        }
        if !deliveries.isEmpty {
            let redelivered = batch.filter { deliveries[$0.tag] != nil }.map(DeliveryTriage.historyKey)
            deliveries = triage.discounting(deliveries, of: batch, givenBack: try session.record.givenBack(redelivered))
        }
        let overLimit = triage.overLimit(batch, deliveries: deliveries)
        let diedAlone = overLimit.isEmpty ? [] : try session.record.diedAlone(overLimit)
        let sorted = triage.sort(batch, deliveries: deliveries, diedAlone: diedAlone)
        for poison in sorted.poison {
            statistics.poisonJobs.add(1, ordering: .relaxed)
            logger.error("poison job parked: delivered more often than allowed, and a worker died with it alone",
                         ["job.deliveries": String(poison.deliveries), "job.max_deliveries": String(triage.maximumDeliveries),
                          "amqp.message_id": poison.delivery.properties.messageID ?? ""])
            try session.record.forget(poison.historyKey)
        }
        return sorted
    }

    /// After a turn's work: the suspect whose lone run settled is unmarked; the next suspect starts alone once
    /// nothing is in flight, and the jobs behind once no suspect is left.
    private func startSuspectOrWaiting() throws {
        let (ended, next) = suspects.step(jobsInFlight: underWay.counts, stopping: core.isStopping,
                                          key: DeliveryTriage.historyKey)
        if let ended { try session.record.settledAlone(ended) }
        switch next {
        case .startAlone(let suspect, let key):
            try session.record.startingAlone(key)
            logger.warning("starting a job alone: it came back twice or more without being settled",
                           ["amqp.message_id": suspect.properties.messageID ?? "", "job.history_key": key,
                            "jobs.waiting": String(suspects.waiting.count + suspects.behind.count)])
            try start([suspect])
        case .dispatch(let waiting):
            try dispatch(waiting)
        case .none:
            break
        }
    }

    private func startCopiesWhoseJobSettled() throws {
        guard !copiesWaiting.isEmpty, !core.isStopping else { return }
        let ready = copiesWaiting.filter { !underWay.contains(jobID: $0.jobID) }
        guard !ready.isEmpty else { return }
        copiesWaiting.removeAll { !underWay.contains(jobID: $0.jobID) }
        try start(ready.map(\.delivery))
    }

    private func dispatch(_ batch: [JobDelivery]) throws {
        let (startNow, later) = WorkerCore.arrivals(batch)
        unstartedBulk += later
        if !startNow.isEmpty { try start(startNow) }
    }

    /// Decodes a batch, parks the bad jobs, resolves users in one round trip to the store, and queues every
    /// notification for sending; jobs with nothing left to send are settled at once. A job with more users than a
    /// piece starts with its first piece (`JobAssembly`); the next ones come as its lane makes room.
    private func start(_ batch: [JobDelivery]) throws {
        let (decoded, rejected) = decode(batch)
        let jobs = try skippingSettledCopies(holdingBackCopies(decoded))
        let piece = core.settings.usersPerPiece
        let resolved = try session.tokens.resolve(resolver.usersToResolve(jobs.map(\.job), upTo: piece))
        statistics.countDataError("token_cache_read", resolved.unreadable.count)
        // A redelivered job may have been under way when a worker died: skip what already had a final outcome.
        let (alreadySettled, unreadableRecords) = try session.record.settled(jobIDs: resolver.jobsToLookUp(jobs))
        for (jobID, message) in unreadableRecords {
            statistics.countDataError("idempotency_record")
            logger.error("the idempotency record cannot be read; the redelivered job is sent whole",
                         ["job.id": jobID, "redis.error": message])
        }
        var finishedAtOnce: [JobProgress] = []
        for (delivery, job) in jobs {
            underWay.started(delivery, jobID: job.id)
            let settled = alreadySettled[job.id]
            let large = job.retryTargets == nil && job.users.count > piece
            var targets: [DeviceTarget] = []
            if !large {
                let skipped: Int
                (targets, skipped) = resolver.targets(of: job, resolved: resolved.tokens, alreadySettled: settled?.tokens ?? [])
                statistics.duplicatesAvoided.add(skipped, ordering: .relaxed)
            }
            let progress = JobProgress(job: job, delivery: delivery, generation: generation, targets: targets,
                                       hasStableID: TargetResolver.hasStableID(job, delivery))
            if let settled {
                progress.restore(settled: settled.tokens.count, dead: settled.dead)
                progress.summarySent = settled.summarySent
            }
            guard large else {
                if targets.isEmpty { finishedAtOnce.append(progress) } else { queue(progress) }
                continue
            }
            let assembly = JobAssembly(whole: progress, alreadySettled: settled?.tokens ?? [])
            sendPiece(of: assembly, resolved: resolved.tokens)
            if assembly.hasUsersLeft { assemblies.append(assembly) } else if assembly.isComplete { finishedAtOnce.append(progress) }
        }
        core.handle(.jobsStarted(jobs.count))
        if !rejected.isEmpty { try reject(rejected) }
        if !finishedAtOnce.isEmpty { core.handle(.jobsSettled(try finish(finishedAtOnce))) }
    }

    private func queue(_ progress: JobProgress) {
        backlogs.withQueue(progress.delivery.lane) { $0.append(progress, count: progress.targets.count) }
    }

    /// The next piece of a large job: its users taken, their tokens (from `resolved`) queued as a progress of its own.
    private func sendPiece(of assembly: JobAssembly, resolved: [String: [CachedToken]]) {
        let withOwnTokens = assembly.nextUser == 0
        let users = assembly.takeUsers(core.settings.usersPerPiece)
        let (targets, skipped) = resolver.pieceTargets(of: assembly.job, users: users, withOwnTokens: withOwnTokens,
                                                       resolved: resolved, alreadySettled: assembly.alreadySettled,
                                                       firstTime: assembly.firstTime)
        statistics.duplicatesAvoided.add(skipped, ordering: .relaxed)
        guard !targets.isEmpty else { return }
        let piece = assembly.whole.piece(targets)
        assembly.sent(piece)
        queue(piece)
    }

    /// Resolves and queues the next piece of the first large job of `lane` with users left; settles the job if that
    /// was its last piece and nothing of it is out.
    private func resolveNextPiece(of lane: JobLane) throws {
        guard let index = assemblies.firstIndex(where: { $0.lane == lane }) else { return }
        let assembly = assemblies[index]
        let users = Array(assembly.job.users[assembly.nextUser..<min(assembly.job.users.count,
                                                                      assembly.nextUser + core.settings.usersPerPiece)])
        let resolved = try session.tokens.resolve(users)
        statistics.countDataError("token_cache_read", resolved.unreadable.count)
        sendPiece(of: assembly, resolved: resolved.tokens)
        guard !assembly.hasUsersLeft else { return }
        assemblies.remove(at: index)
        if assembly.isComplete { core.handle(.jobsSettled(try finish([assembly.whole]))) }
    }

    /// Completed progresses as jobs to settle: a piece of a large job is absorbed into its job, which is settled once
    /// every user is resolved and no piece is out.
    private func jobsToSettle(_ completed: [JobProgress]) -> [JobProgress] {
        var jobs: [JobProgress] = []
        for progress in completed {
            guard let assembly = progress.assembly else {
                jobs.append(progress)
                continue
            }
            assembly.absorb(progress)
            if assembly.isComplete { jobs.append(assembly.whole) }
        }
        return jobs
    }

    /// A republished copy whose job (same id) is under way here, or earlier in the same batch, waits for it to settle.
    private func holdingBackCopies(_ jobs: [(delivery: JobDelivery, job: PushJob)]) -> [(delivery: JobDelivery, job: PushJob)] {
        guard jobs.contains(where: { Self.isCopy($0.delivery) }) else { return jobs }
        var starting: [(delivery: JobDelivery, job: PushJob)] = []
        var ids = Set<String>()
        for entry in jobs {
            if Self.isCopy(entry.delivery) && (underWay.contains(jobID: entry.job.id) || ids.contains(entry.job.id)) {
                copiesWaiting.append((entry.delivery, entry.job.id))
                continue
            }
            starting.append(entry)
            ids.insert(entry.job.id)
        }
        return starting
    }

    private static func isCopy(_ delivery: JobDelivery) -> Bool {
        delivery.properties.headers[Worker.republishedHeader] != nil
    }

    /// Republished copies of jobs the fleet settled in the last half minute are acknowledged without sending anything
    /// (their summary included); copies of jobs under way elsewhere skip what the idempotency record says was sent.
    private func skippingSettledCopies(_ jobs: [(delivery: JobDelivery, job: PushJob)]) throws
        -> [(delivery: JobDelivery, job: PushJob)] {
        let copies = jobs.filter { Self.isCopy($0.delivery) && TargetResolver.hasStableID($0.job, $0.delivery) }
        guard !copies.isEmpty else { return jobs }
        let settled = try session.record.recentlySettled(copies.map(\.job.id))
        guard !settled.isEmpty else { return jobs }
        let skipped = jobs.filter { Self.isCopy($0.delivery) && settled.contains($0.job.id) }
        statistics.republishedCopiesSkipped.add(skipped.count, ordering: .relaxed)
        logger.info("republished copies of settled jobs acknowledged without sending", ["jobs": String(skipped.count)])
        try session.broker.acknowledge(skipped.map(\.delivery.tag))
        return jobs.filter { !(Self.isCopy($0.delivery) && settled.contains($0.job.id)) }
    }

    private func decode(_ batch: [JobDelivery]) -> (jobs: [(delivery: JobDelivery, job: PushJob)],
                                                    rejected: [(JobDelivery, String)]) {
        var jobs: [(delivery: JobDelivery, job: PushJob)] = []
        var rejected: [(JobDelivery, String)] = []
        for delivery in batch {
            let fallbackID = delivery.properties.messageID ?? "delivery-\(delivery.tag)"
            do {
                let job = try PushJob.decode(delivery.body, defaultTopic: worker.settings.defaultTopic,
                                             fallbackID: fallbackID)
                if let exitOnJobID = worker.settings.exitOnJobID, job.id == exitOnJobID {
                    logger.critical("test fault: exiting on this job", ["job.id": job.id])
                    exit(70)
                }
                jobs.append((delivery, job))
            } catch {
                rejected.append((delivery, error.description))
            }
        }
        return (jobs, rejected)
    }

    // MARK: sending

    /// Hands up to `wanted` queued notifications of each lane to the sender, urgent first (fewer if the shared rate
    /// limit grants fewer); returns the lanes the rate limit held back, with the seconds until more may go.
    /// Notifications whose job's deadline has passed are settled as expired on the way, without a permit or a
    /// request.
    private func send(_ wanted: LaneCounts) throws -> (lanes: [JobLane], wait: Double)? {
        let now = Date().timeIntervalSince1970
        var sending: [JobLane: [(progress: JobProgress, index: Int32)]] = [:]
        var expired: [(progress: JobProgress, index: Int32)] = []
        for lane in JobLane.allCases where wanted[lane] > 0 {
            let taken = backlogs.withQueue(lane) { $0.take(upTo: wanted[lane], liveAt: now) }
            sending[lane] = taken.live
            expired += taken.expired
        }
        if !expired.isEmpty { worker.answers.settleExpired(expired) }
        var limited: (lanes: [JobLane], wait: Double)?
        if let rateLimiter = session.rateLimiter {
            let asked = LaneCounts(urgent: sending[.urgent]?.count ?? 0, bulk: sending[.bulk]?.count ?? 0)
            guard asked.total > 0 else { return nil }
            let granted: LaneCounts
            (granted, limited) = try reserve(asked, from: rateLimiter)
            for lane in JobLane.allCases {
                guard let entries = sending[lane], granted[lane] < entries.count else { continue }
                backlogs.withQueue(lane) { $0.putBack(entries[granted[lane]...]) }
                sending[lane] = Array(entries.prefix(granted[lane]))
            }
        }
        for lane in JobLane.allCases {
            guard let entries = sending[lane], !entries.isEmpty else { continue }
            hand(entries, of: lane)
        }
        return limited
    }

    /// Permits for what is asked, per lane, and the lanes held back with the seconds until the next window.
    private func reserve(_ asked: LaneCounts, from rateLimiter: any RateLimiter) throws
        -> (granted: LaneCounts, limited: (lanes: [JobLane], wait: Double)?) {
        let reservation = try rateLimiter.reserve(urgent: asked.urgent, bulk: asked.bulk)
        switch reservation {
        case .granted(let urgent, let bulk, let nextWindowIn):
            let short = reservation.lanesHeldBack(asked: asked)
            guard !short.isEmpty else { return (LaneCounts(urgent: urgent, bulk: bulk), nil) }
            statistics.rateLimitWaits.add(1, ordering: .relaxed)
            return (LaneCounts(urgent: urgent, bulk: bulk), (short, nextWindowIn))
        case .refused(let message):
            // The store refused the reservation (a slot key of the wrong type): nothing goes out unmetered; the slot
            // keys expire within 10 s, so waiting a second and asking again is enough.
            statistics.countDataError("rate_limit")
            logger.error("Redis refused the rate-limit reservation; waiting", ["redis.error": message])
            return (LaneCounts(), (JobLane.allCases, 1))
        }
    }

    /// One hand-over of a lane's notifications to the sender; each answer is recorded on the sender's thread, and
    /// wakes this thread when the lane's notifications in flight fall to the core's `sendMoreAt`.
    private func hand(_ entries: [(progress: JobProgress, index: Int32)], of lane: JobLane) {
        let statistics = self.statistics, answers = worker.answers, wakeup = worker.wakeup
        let sendMoreAt = core.settings.sendMoreAt
        statistics.inFlight.add(lane, entries.count)
        statistics.sent.add(lane, entries.count)
        let handedOver = DispatchTime.now().uptimeNanoseconds
        let latency = statistics.latency(lane)
        worker.sender.send(entries.map { $0.progress.notification(Int($0.index)) }, lane: lane) { position, result in
            latency.observe(nanoseconds: DispatchTime.now().uptimeNanoseconds &- handedOver)
            if statistics.inFlight.add(lane, -1) == sendMoreAt { wakeup.signal() }
            let (progress, index) = entries[position]
            answers.record(result, for: progress, Int(index))
        }
    }

    // MARK: settling

    /// Parks bad jobs with their reason, waits for the broker's confirms, then acknowledges them. One the broker hands
    /// back (the failed queue was deleted) or refuses stays unacknowledged and is parked again after a pause.
    private func reject(_ rejected: [(JobDelivery, String)]) throws {
        let publications = rejected.map { delivery, reason in
            logger.warning("job rejected", ["job.reason": reason, "amqp.delivery_tag": String(delivery.tag)])
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Worker.reasonHeader] = reason
            return Publication(destination: .failed, body: delivery.body, properties: properties)
        }
        let outcomes = try session.broker.publish(publications)
        var settled: [UInt64] = []
        for ((delivery, reason), outcome) in zip(rejected, outcomes) {
            if outcome == .taken {
                settled.append(delivery.tag)
                statistics.jobsRejected.add(1, ordering: .relaxed)
            } else {
                held.hold(rejection: (delivery, reason))
                statistics.countRefusedPublish("rejected_job")
            }
        }
        if settled.count < rejected.count {
            logger.error("the broker did not take parked jobs; kept unacknowledged, parked again shortly",
                         ["jobs": String(rejected.count - settled.count), "retry_in_s": String(HeldPublishes.pause)])
        }
        try session.broker.acknowledge(settled)
    }

    private func publishHeld() throws {
        guard let due = held.takeDue() else { return }
        if !due.jobs.isEmpty { core.handle(.jobsSettled(try finish(due.jobs))) }
        if !due.rejections.isEmpty { try reject(due.rejections) }
    }

    /// Settles finished jobs as their plans say: publishes, waits for the broker's confirms, takes dead tokens out of
    /// the cache, then acknowledges. A job whose publications the broker did not all take stays unacknowledged and
    /// is held for another try. Returns how many jobs it settled.
    private func finish(_ finished: [JobProgress]) throws -> Int {
        let now = Date().timeIntervalSince1970
        try weighMismatches(finished.filter { !$0.guardApplied })
        let plans = finished.map { progress in
            let decision = retryPolicy.decide(attempt: progress.job.attempt, retryable: progress.retryable.count,
                                              suggestedDelay: progress.retryable.map(\.delay).max() ?? 0,
                                              deadline: progress.job.deadline, now: now)
            if decision == .expire { statistics.expired.add(progress.expireRetryable(), ordering: .relaxed) }
            return (progress: progress, decision: decision,
                    plan: SettlementPlan(progress, retry: decision, defaultTopic: worker.settings.defaultTopic))
        }
        let outcomes = try session.broker.publish(plans.flatMap(\.plan.publications))
        var confirmed: [(progress: JobProgress, decision: RetryPolicy.Decision, plan: SettlementPlan)] = []
        var refused: [JobProgress] = []
        var offset = 0
        for job in plans {
            let own = outcomes[offset..<offset + job.plan.publications.count]
            offset += job.plan.publications.count
            // Once out, never again: not when the job's other publications are made again (nor, held, on a redelivery).
            if let summary = job.plan.summary, own[own.startIndex + summary] == .taken { job.progress.summarySent = true }
            guard job.plan.isSafe(own) else {
                refused.append(job.progress)
                continue
            }
            confirmed.append(job)
            if job.plan.summaryLost(own) {
                statistics.countRefusedPublish("summary")
                logger.warning("a job's summary was not taken: no queue named by its reply_to",
                               ["job.id": job.progress.job.id, "amqp.reply_to": job.progress.delivery.properties.replyTo ?? ""])
            }
        }
        try removeDeadTokens(confirmed.flatMap { job in job.plan.removals.map { (job.progress.job.id, $0) } })
        try hold(refused)
        for job in confirmed {
            count(settled: job.progress, job.decision, parkedReason: job.plan.parkedReason)
            underWay.settled(job.progress.delivery.tag)
        }
        try session.broker.acknowledge(confirmed.map(\.progress.delivery.tag))
        // After the acknowledgement (a Redis failure before it would redeliver the job, summary and all): which jobs
        // settled, so that a copy its publisher made after a failover sends nothing (one command per batch).
        let settledIDs = confirmed.filter(\.progress.hasStableID).map(\.progress.job.id)
        if !settledIDs.isEmpty { try session.record.settledRecently(settledIDs) }
        return confirmed.count
    }

    /// A removal the store refuses (a key of the wrong type) concerns that token only: its event is out, the job is
    /// settled, and the cleanup consumer will meet the same key and park the event with the reason.
    private func removeDeadTokens(_ removals: [(jobID: String, removal: TokenRemoval)]) throws {
        guard !removals.isEmpty else { return }
        for ((jobID, removal), change) in zip(removals, try session.tokens.remove(removals.map(\.removal))) {
            guard case .failed(let message) = change else { continue }
            statistics.countDataError("token_removal")
            logger.error("Redis refused to remove a dead token", ["job.id": jobID, "user": removal.user,
                                                                  "apns.token": Redact.token(removal.token),
                                                                  "redis.error": message])
        }
    }

    /// Jobs whose publications the broker did not take. Their outcomes (and whether their summary went out) go to
    /// the idempotency record now: if this connection drops before their publications are made again, a redelivery
    /// sends nothing twice, publishes no second summary, and still publishes its dead tokens' events.
    private func hold(_ refused: [JobProgress]) throws {
        let unrecorded = refused.compactMap(settledOutcomes)
        if !unrecorded.isEmpty { try record(unrecorded) }
        for progress in refused {
            held.hold(job: progress)
            statistics.countRefusedPublish("job_outputs")
            logger.error("the broker did not take what a job produced; kept unacknowledged, published again shortly",
                         ["job.id": progress.job.id, "retry_in_s": String(HeldPublishes.pause)])
        }
    }

    /// A stable-id job's final outcomes not recorded yet, and its summary if it went out.
    private func settledOutcomes(of progress: JobProgress) -> (jobID: String, outcomes: [SettledOutcome])? {
        guard progress.hasStableID else { return nil }
        let outcomes = (progress.takeUnrecordedFinal() ?? []) + (progress.summarySent ? [.summarySent] : [])
        return outcomes.isEmpty ? nil : (progress.job.id, outcomes)
    }

    private func count(settled progress: JobProgress, _ decision: RetryPolicy.Decision, parkedReason: String?) {
        statistics.jobsCompleted.add(1, ordering: .relaxed)
        switch decision {
        case .retry: statistics.retries.add(progress.retryable.count, ordering: .relaxed)
        case .park: statistics.jobsParked.add(1, ordering: .relaxed)
        case .none, .expire: break
        }
        if let parkedReason {
            logger.error("job parked after its last attempt", ["job.id": progress.job.id, "job.reason": parkedReason])
        }
        logger.debug("job done", ["job.id": progress.job.id, "job.attempt": String(progress.job.attempt),
                                  "job.notifications": String(progress.notificationCount),
                                  "job.delivered": String(progress.delivered), "job.dead": String(progress.dead.count),
                                  "job.failed": String(progress.failed.count),
                                  "job.retryable": String(progress.retryable.count)])
    }

    /// The mass-invalidation guard, once jobs' outcomes are all in: their 400 mismatch answers either count as dead
    /// tokens (removed, with events) or, when the job's answers or the fleet's recent ones look like a configuration
    /// mistake, are held back, logged at error level and counted. 410s are never held back. The fleet's window is
    /// asked only when there are mismatches to weigh.
    private func weighMismatches(_ jobs: [JobProgress]) throws {
        let batch = jobs.reduce(InvalidationCounts()) { $0 + $1.invalidationCounts }
        unsharedAnswers = unsharedAnswers + batch
        let fleet = batch.mismatches > 0 ? try shareAnswers() : nil
        if batch.mismatches > 0 { noteFleetGuard(fleet) }
        for progress in jobs {
            let verdict = worker.settings.invalidationGuard.verdict(job: progress.invalidationCounts, fleet: fleet)
            let heldBack = progress.applyGuard(verdict)
            statistics.deadTokens.add(progress.dead.filter { APNsOutcome.isTokenMismatch($0.response) }.count,
                                      ordering: .relaxed)
            guard heldBack > 0 else { continue }
            statistics.heldBack.add(heldBack, ordering: .relaxed)
            guard verdict == .heldBackByJob else { continue }
            statistics.invalidationGuardTrips.add(1, ordering: .relaxed)
            let reasons = Set(progress.heldBack.compactMap { $0.response.reason?.rawValue }).sorted().joined(separator: ",")
            logger.error("mass invalidation guard: 400 answers held back as a configuration error, no token removed", [
                "job.id": progress.job.id, "apns.reason": reasons, "apns.topic": progress.job.topic,
                "job.held_back": String(heldBack), "job.judged": String(progress.judged),
                "job.dead": String(progress.dead.count), "job.problem": progress.heldBackExplanation ?? "",
            ])
        }
    }

    /// Adds the answers not yet shared to the fleet's window; returns its totals (nil: the store refused).
    private func shareAnswers() throws -> InvalidationCounts? {
        let totals = try session.invalidationWindow.add(unsharedAnswers)
        unsharedAnswers = InvalidationCounts()
        if totals == nil { statistics.countDataError("invalidation_window") }
        return totals
    }

    /// The fleet guard's state as this worker last saw it: a trip and its end are logged once, not per job.
    private func noteFleetGuard(_ fleet: InvalidationCounts?) {
        let tripped = fleet.map(worker.settings.invalidationGuard.holdsBack) ?? true
        guard statistics.fleetGuardTripped.exchange(tripped, ordering: .relaxed) != tripped else { return }
        if tripped {
            statistics.invalidationGuardFleetTrips.add(1, ordering: .relaxed)
            logger.error("mass invalidation guard (fleet): 400 answers across the fleet look like a configuration error; "
                         + "no worker removes tokens for them until their share falls", [
                "guard.mismatches": fleet.map { String($0.mismatches) } ?? "unreadable",
                "guard.judged": fleet.map { String($0.judged) } ?? "unreadable",
            ])
        } else {
            logger.warning("mass invalidation guard (fleet): the share of 400 answers fell back; mismatches count again",
                           ["guard.mismatches": String(fleet?.mismatches ?? 0), "guard.judged": String(fleet?.judged ?? 0)])
        }
    }

    /// Adds final outcomes to the idempotency record. A record the store refuses concerns that job only: logged and
    /// counted (a redelivery of it would send its notifications again), never a reconnect.
    private func record(_ outcomes: [(jobID: String, outcomes: [SettledOutcome])]) throws {
        for (jobID, message) in try session.record.record(outcomes) {
            statistics.countDataError("idempotency_record")
            logger.error("Redis refused the idempotency record", ["job.id": jobID, "redis.error": message])
        }
    }
}
