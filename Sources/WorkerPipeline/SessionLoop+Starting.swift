import APNsModel
import Foundation
import Telemetry

/// Reading and starting jobs: triage, suspects, copies, decoding, resolving users (a piece at a time for large
/// jobs) and queueing their notifications.
extension SessionLoop {
    /// Reads up to `limit` deliveries, parks the poison ones, and starts the rest as the suspects and lanes allow.
    /// Returns how many it read.
    func read(limit: Int) throws -> Int {
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
        if !batch.isEmpty { try readCancellations(at: Date(), jobsArriving: true) }
        let sorted = try sortByDeliveries(batch)
        // Redelivered jobs are marked as soon as they are taken, before any of their work (decoding included): a
        // worker that dies running one leaves the mark behind, which is what makes a job a suspect.
        let redelivered = (sorted.usual + sorted.suspects).lazy.filter(\.redelivered).map(DeliveryTriage.historyKey)
        if !redelivered.isEmpty { try session.record.markRunning(Array(redelivered)) }
        if !sorted.poison.isEmpty {
            try reject(sorted.poison.map { ($0.delivery, .park(reason: triage.reason($0), poison: true)) })
        }
        try dispatch(suspects.admit(usual: sorted.usual, suspects: sorted.suspects))
        return batch.count
    }

    /// Counts the jobs taken from each lane, and how long they had waited there (from their timestamp).
    func note(taken batch: [JobDelivery]) {
        let now = Date().timeIntervalSince1970
        // Each counter taken once for the batch: taken in the loop, each was counted on and off for every job.
        let jobsTaken = statistics.jobsTaken
        let longestWait = statistics.longestWait
        for delivery in batch {
            jobsTaken.add(delivery.lane, 1)
            if let published = delivery.properties.timestamp {
                longestWait.raise(delivery.lane, to: Int(max(0, (now - Double(published)) * 1000)))
            }
        }
    }

    /// The triage of a batch, with the counts it needs from the store; poison jobs' histories are forgotten, so that
    /// the same job sent again after a fix starts afresh.
    func sortByDeliveries(_ batch: [JobDelivery]) throws -> DeliveryTriage.Sorted {
        let (counted, uncounted) = triage.brokerCounts(of: batch)
        var deliveries = counted
        if !uncounted.isEmpty {
            let (redeliveries, unreadable) = try session.record.countRedeliveries(of: uncounted.map(\.key))
            for (key, message) in unreadable {
                statistics.countDataError("delivery_count")
                logger.error(
                    "a redelivered job's delivery count cannot be read; the job is handled",
                    ["redis.error": message, "job.history_key": key])
            }
            deliveries = triage.merging(counted, uncounted: uncounted, storeRedeliveries: redeliveries)
        }
        if !deliveries.isEmpty {
            let redelivered = batch.filter { deliveries[$0.tag] != nil }.map(DeliveryTriage.historyKey)
            deliveries = triage.discounting(deliveries, of: batch, givenBack: try session.record.givenBack(redelivered))
        }
        let candidates = triage.suspectCandidates(batch, deliveries: deliveries)
        let diedAlone = candidates.isEmpty ? [] : try session.record.diedAlone(candidates)
        let ranAndDied = candidates.isEmpty ? [] : try session.record.ranAndDied(candidates)
        let sorted = triage.sort(batch, deliveries: deliveries, diedAlone: diedAlone, ranAndDied: ranAndDied)
        for poison in sorted.poison {
            statistics.poisonJobs.add(1, ordering: .relaxed)
            logger.error(
                "poison job parked: delivered more often than allowed, and a worker died with it alone",
                [
                    "job.deliveries": String(poison.deliveries), "job.max_deliveries": String(triage.maximumDeliveries),
                    "amqp.message_id": poison.delivery.properties.messageID ?? ""
                ])
            try session.record.forget(poison.historyKey)
        }
        return sorted
    }

    /// After a turn's work: the suspect whose lone run settled is unmarked; the next suspect starts alone once
    /// nothing is in flight, and the jobs behind once no suspect is left.
    func startSuspectOrWaiting() throws {
        let (ended, next) = suspects.step(
            jobsInFlight: underWay.counts, stopping: core.isStopping,
            key: DeliveryTriage.historyKey)
        if let ended { try session.record.settledAlone(ended) }
        switch next {
        case .startAlone(let suspect, let key):
            statistics.suspectJobs.add(1, ordering: .relaxed)
            try session.record.startingAlone(key)
            logger.warning(
                "starting a job alone: it came back twice or more without being settled",
                [
                    "amqp.message_id": suspect.properties.messageID ?? "", "job.history_key": key,
                    "jobs.waiting": String(suspects.waiting.count + suspects.behind.count)
                ])
            try start([suspect])
        case .dispatch(let waiting):
            try dispatch(waiting)
        case .none:
            break
        }
    }

    func startCopiesWhoseJobSettled() throws {
        // With no copy waiting, jobs stop paying for the index by id (the next copy's lookup builds it again).
        guard !copiesWaiting.isEmpty else { return underWay.stopIndexingIDs() }
        guard !core.isStopping else { return }
        let ready = copiesWaiting.filter { !underWay.contains(jobID: $0.jobID) }
        guard !ready.isEmpty else { return }
        copiesWaiting.removeAll { !underWay.contains(jobID: $0.jobID) }
        try start(ready.map(\.delivery))
    }

    func dispatch(_ batch: [JobDelivery]) throws {
        let (startNow, later) = WorkerCore.arrivals(batch)
        unstartedBulk += later
        if !startNow.isEmpty { try start(startNow) }
    }

    /// Decodes a batch and resolves its users here, on the broker thread (urgent jobs, suspects, copies), then starts
    /// it.
    func start(_ batch: [JobDelivery]) throws {
        try start(
            PreparedBatch.prepare(
                batch, tokens: session.tokens, settings: worker.settings, resolver: resolver,
                sender: worker.sender, logger: logger))
    }

    /// Parks the bad jobs of a prepared batch and queues every notification for sending; jobs with nothing left to
    /// send are settled at once. A job with more users than a piece is resolved a piece at a time (`JobAssembly`) as
    /// its lane makes room.
    func start(_ prepared: PreparedBatch) throws {
        let rejected = prepared.rejected
        let (notDue, cancelledBeforeDue) = waitingForSendAt(prepared.scheduled)
        let all = try skippingSettledCopies(holdingBackCopies(prepared.jobs))
        let (broadcasts, devices) = BroadcastJob.byKind(all)
        try startBroadcasts(broadcasts)
        let resolved = prepared.resolved
        statistics.countDataError("token_cache_read", resolved.unreadable.count)
        var waiting = prepared.waitingForTimeZones
        var jobs = Self.startable(devices, of: prepared, waiting: &waiting)
        if !rateGroupsSeen { rateGroupsSeen = jobs.contains { $0.job.rateGroup != nil } }
        let unadmitted = holdingBackPastAdmission(&jobs)
        let lookup = try lookUpSettled(&jobs, waiting: &waiting)
        try skipCopiesOfStartedParts(&jobs)
        try skipCopiesOfStartedSchedules(&jobs)
        var finishedAtOnce = cancelledBeforeDue.map(settleUnsent)
        for (delivery, job) in jobs {
            underWay.started(delivery, jobID: job.id)
            let settled = lookup.settled[job.id]
            let large = PreparedBatch.isLarge(job, usersPerPiece: core.settings.usersPerPiece)
            var targets = DeviceTargets([])
            if !large {
                let skipped: Int
                (targets, skipped) = resolver.deviceTargets(
                    of: job, resolved: resolved.tokens,
                    activityTokens: job.activity.flatMap { prepared.activities.tokens[$0] } ?? [],
                    alreadySettled: settled?.tokens ?? [])
                statistics.duplicatesAvoided.add(skipped, ordering: .relaxed)
            }
            let progress = JobProgress(
                job: job, delivery: delivery, generation: generation, targets: targets,
                hasStableID: TargetResolver.hasStableID(job, delivery))
            if let settled { progress.restore(settled) }
            if let split = prepared.windows[delivery.tag] { cutByWindow(progress, split) }
            guard large else {
                if targets.isEmpty { finishedAtOnce.append(progress) } else { queue(progress) }
                continue
            }
            let assembly = JobAssembly(whole: progress, alreadySettled: settled?.tokens ?? [])
            assemblies.append(assembly)
            if delivery.lane == .bulk { largeBulkJobs.append(assembly) }
        }
        unstartedBulk.insert(contentsOf: unadmitted, at: 0)
        core.handle(.jobsStarted(jobs.count + cancelledBeforeDue.count))
        if !rejected.isEmpty { try reject(rejected.map { ($0.0, .park(reason: $0.1, poison: false)) }) }
        if !notDue.isEmpty { try reject(notDue) }
        try putBackToWait(waiting)
        if !finishedAtOnce.isEmpty { core.handle(.jobsSettled(try finish(finishedAtOnce))) }
    }

    /// The jobs that can start now; those whose users' tokens wait for a Redis node (`StoreWaits`) join `waiting`.
    /// The batch's array itself when none waits (nearly always): a filtered copy of it cost a copy and a destruction
    /// of each entry.
    private static func startable(
        _ jobs: [(delivery: JobDelivery, job: PushJob)], of prepared: PreparedBatch, waiting: inout [JobDelivery]
    ) -> [(delivery: JobDelivery, job: PushJob)] {
        let (users, activities) = (prepared.resolved, prepared.activities)
        let mustWait = { (entry: (delivery: JobDelivery, job: PushJob)) in
            StoreWaits.mustWait(entry.job, users: users, activities: activities)
        }
        guard jobs.contains(where: mustWait) else { return jobs }
        return jobs.filter { entry in
            guard mustWait(entry) else { return true }
            waiting.append(entry.delivery)
            return false
        }
    }

    /// Jobs whose `send_at` has not come go back to the broker's delay queues (`JobSchedule`), their time noted in the
    /// fleet's progress record; those cancelled meanwhile are settled now instead, nothing sent.
    private func waitingForSendAt(_ scheduled: [(delivery: JobDelivery, job: PushJob)])
        -> (notDue: [HeldPublishes.Rejection], cancelled: [(delivery: JobDelivery, job: PushJob)])
    {
        let now = Date().timeIntervalSince1970
        var notDue: [HeldPublishes.Rejection] = []
        var cancelled: [(delivery: JobDelivery, job: PushJob)] = []
        for (delivery, job) in scheduled {
            let named = TargetResolver.hasStableID(job, delivery)
            if cancellations.isCancelled(jobID: job.id, named: named, messageID: delivery.properties.idForJob) {
                cancelled.append((delivery, job))
                continue
            }
            let sendAt = job.sendAt ?? 0
            notDue.append((delivery, .waitUntilDue(delay: JobSchedule.delay(forRemaining: Double(sendAt) - now))))
            // A part of a windowed job waits for its users' hours: the job's record counts it as waiting_for_window.
            if named && !Self.isWindowPart(delivery) { progressTracker.scheduled(job, at: sendAt) }
        }
        return (notDue, cancelled)
    }

    /// A windowed job as it starts: what waits for users' hours leaves with it when it settles, what could only open
    /// after its deadline has expired.
    private func cutByWindow(_ progress: JobProgress, _ split: WindowSplit) {
        progress.cutByWindow(split, isPart: Self.isWindowPart(progress.delivery))
        statistics.expired.add(split.expired, ordering: .relaxed)
    }

    /// A job cancelled before it was due: settled with every user and token counted as cancelled, none resolved.
    private func settleUnsent(_ entry: (delivery: JobDelivery, job: PushJob)) -> JobProgress {
        underWay.started(entry.delivery, jobID: entry.job.id)
        let progress = JobProgress(
            job: entry.job, delivery: entry.delivery, generation: generation, targets: [],
            hasStableID: true)
        let count = entry.job.users.count + entry.job.tokens.count
        // A windowed job keeps its window's bookkeeping: a part leaves the count of what waits.
        if entry.job.localWindow != nil {
            progress.cutByWindow(WindowSplit(named: count), isPart: Self.isWindowPart(entry.delivery))
        }
        progress.cancelUnresolved(users: count)
        statistics.cancelled.add(count, ordering: .relaxed)
        progressTracker.cancelled(progress, users: count)
        return progress
    }

    /// Large bulk jobs of one batch past `BulkAdmission`'s budget (the batch decoded several small bodies with many
    /// users) leave `jobs` and go back unstarted, to start as the ones under way settle.
    private func holdingBackPastAdmission(_ jobs: inout [(delivery: JobDelivery, job: PushJob)]) -> [JobDelivery] {
        let usersPerPiece = core.settings.usersPerPiece
        // Not even looked at in place without a large bulk job: changing an array shared with the batch copies it.
        let isLargeBulk = { (entry: (delivery: JobDelivery, job: PushJob)) in
            entry.delivery.lane == .bulk && PreparedBatch.isLarge(entry.job, usersPerPiece: usersPerPiece)
        }
        guard jobs.contains(where: isLargeBulk) else { return [] }
        var (bytes, targets) = bulkLoad()
        var unadmitted: [JobDelivery] = []
        jobs.removeAll { delivery, job in
            guard isLargeBulk((delivery, job)) else { return false }
            guard core.settings.bulkAdmission.admits(bytesUnderWay: bytes, targetsUnderWay: targets) else {
                unadmitted.append(delivery)
                return true
            }
            bytes += delivery.body.count
            targets += job.users.count + job.tokens.count
            return false
        }
        return unadmitted
    }

    /// A redelivered job may have been under way when a worker died: what earlier deliveries settled, by job. What
    /// this worker has answered and not recorded (perhaps this very job, delivered on the connection it lost) goes
    /// into the record first, so that the lookup sees it. A job whose record's node does not answer moves from
    /// `jobs` to `waiting`: what an earlier delivery sent is unknown, and sending now could repeat it.
    private func lookUpSettled(
        _ jobs: inout [(delivery: JobDelivery, job: PushJob)],
        waiting: inout [JobDelivery]
    ) throws -> SettledLookup {
        let lookUp = resolver.jobsToLookUp(jobs)
        if !lookUp.isEmpty { try recordAnswered() }
        let lookup = try session.record.settled(jobIDs: lookUp)
        for (jobID, message) in lookup.unreadable {
            statistics.countDataError("idempotency_record")
            logger.error(
                "the idempotency record cannot be read; the redelivered job is sent whole",
                ["job.id": jobID, "redis.error": message])
        }
        if !lookup.unavailable.isEmpty {
            jobs.removeAll { entry in
                guard lookup.unavailable.contains(entry.job.id) else { return false }
                waiting.append(entry.delivery)
                return true
            }
        }
        return lookup
    }

    /// Queues a job's (or a piece's) notifications; those of a job cancelled by now settle as cancelled instead,
    /// counted as cancelled and not as resolved.
    func queue(_ progress: JobProgress) {
        if cancellations.isCancelled(progress) {
            let all = (0..<Int32(progress.targets.count)).map { QueuedNotification(progress: progress, index: $0) }
            worker.answers.settleCancelled(all, lane: progress.delivery.lane)
            return
        }
        progressTracker.resolved(progress)
        backlogs.withQueue(progress.delivery.lane) { $0.append(progress, count: progress.targets.count) }
    }

    /// One piece of a large job: these users' tokens (from `resolved`), with the job's own tokens in the first piece,
    /// queued as a progress of its own.
    func sendPiece(of assembly: JobAssembly, users: ArraySlice<String>, resolved: ResolvedTokens) {
        let (targets, skipped) = resolver.pieceTargets(
            of: assembly.job, users: users, withOwnTokens: assembly.takeOwnTokens(),
            resolved: resolved, alreadySettled: assembly.alreadySettled,
            firstTime: assembly.firstTime)
        statistics.duplicatesAvoided.add(skipped, ordering: .relaxed)
        guard !targets.isEmpty else { return }
        let piece = assembly.whole.piece(targets)
        assembly.sent(piece)
        queue(piece)
    }

    /// Asks the preparer for the users of the next piece of the first large job of `lane` with users left.
    /// A job cancelled before its next piece is resolved: its users left are not read at all.
    func askForNextPiece(of lane: JobLane) throws {
        guard let assembly = assemblies.first(where: { $0.lane == lane && !$0.resolving }) else { return }
        if cancellations.isCancelled(assembly.whole) {
            _ = try cancelUsersLeft(of: assembly)
            return
        }
        assembly.resolving = true
        preparer.resolve(assembly.takeUsers(core.settings.usersPerPiece), of: assembly)
    }

    /// What the preparer finished: bulk batches are started (or given back, if the worker is stopping, or put back
    /// behind a suspect that must run alone); pieces are queued, and a large job whose last piece that was and which has
    /// nothing out is settled. A lost connection on the preparer's side ends the session.
    func takePrepared() throws {
        for result in preparer.takeResults() {
            switch result {
            case .batch(let prepared):
                preparing.removeAll()
                // From here they count as started (by `start`), as given back, or as unstarted again.
                core.handle(.jobsSettled(prepared.deliveries.count))
                if core.isStopping {
                    try giveBack(prepared.deliveries)
                } else if suspects.isActive {
                    unstartedBulk.insert(contentsOf: prepared.deliveries, at: 0)
                } else {
                    try start(prepared)
                }
            case .piece(let assembly, let users, let resolved):
                assembly.resolving = false
                statistics.countDataError("token_cache_read", resolved.unreadable.count)
                if !resolved.unavailable.isEmpty {
                    // Those users' node does not answer: asked for again later, the rest sent now.
                    statistics.countStoreUnavailable("resolve", resolved.unavailable.count)
                    assembly.deferUsers(
                        users.filter(resolved.unavailable.contains),
                        until: Date().addingTimeInterval(storeWaits.delay(afterWaits: 0)))
                }
                sendPiece(
                    of: assembly, users: users.filter { !resolved.unavailable.contains($0) }[...],
                    resolved: resolved.tokens)
                guard !assembly.hasUsersLeft else { continue }
                assemblies.removeAll { $0 === assembly }
                if assembly.isComplete { core.handle(.jobsSettled(try finish([assembly.whole]))) }
            case .recorded(let outcomes, let written):
                noteRecordWrite(written, of: outcomes, counting: outcomes)
            case .failed(let error):
                throw error
            }
        }
    }

    /// Deliveries read and not started go back to the broker, noted as given back by an orderly stop (so that their
    /// next delivery does not count towards making them suspects).
    func giveBack(_ deliveries: [JobDelivery]) throws {
        guard !deliveries.isEmpty else { return }
        try session.record.gaveBack(deliveries.map(DeliveryTriage.historyKey))
        for delivery in deliveries { try session.broker.requeue(delivery.tag) }
    }

    /// Completed progresses as jobs to settle: a piece of a large job is absorbed into its job, which is settled once
    /// every user is resolved and no piece is out.
    func jobsToSettle(_ completed: [JobProgress]) -> [JobProgress] {
        var jobs: [JobProgress] = []
        for progress in completed {
            progressTracker.answered(progress)
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
    func holdingBackCopies(_ jobs: [(delivery: JobDelivery, job: PushJob)]) -> [(delivery: JobDelivery, job: PushJob)] {
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

    static func isCopy(_ delivery: JobDelivery) -> Bool {
        delivery.properties.headers.contains(Worker.republishedHeader)
    }

    /// Copies of parts of windowed jobs that started already (a job's settlement published again after the broker
    /// refused one of its publications, or repeated after a crash before its acknowledgement) are acknowledged without
    /// sending anything. A redelivered part is not a copy: it starts again, skipping what the idempotency record
    /// says it sent.
    private func skipCopiesOfStartedParts(_ jobs: inout [(delivery: JobDelivery, job: PushJob)]) throws {
        try skipCopies(&jobs, of: "windowed jobs' parts", claim: session.record.claimWindowParts) { entry in
            guard Self.isWindowPart(entry.delivery), !entry.delivery.redelivered else { return nil }
            return entry.job.id + ":" + (entry.delivery.properties.headers[Worker.windowPartHeader] ?? "")
        }
    }

    /// A scheduled job comes back from the delay queues at its `send_at`, and so does a copy its publisher made (after
    /// a broker failover, `enqueue --send-at` publishes again): the two arrive together, in either order, at one
    /// worker or two, each a first delivery, so neither the fleet's record of settled jobs nor holding a copy behind
    /// its job under way here keeps both from being sent. Each claims its start in Redis (`<job id>:<send_at>`);
    /// the one that finds it claimed is acknowledged without sending, no summary. A redelivery is not another copy
    /// (it starts again, skipping what the idempotency record says was sent), nor is a job back from waiting for a
    /// Redis node (it claimed before it waited), a window's part or a retry.
    private func skipCopiesOfStartedSchedules(_ jobs: inout [(delivery: JobDelivery, job: PushJob)]) throws {
        try skipCopies(&jobs, of: "scheduled jobs", claim: session.record.claimScheduledStarts) { entry in
            guard let sendAt = entry.job.sendAt, entry.job.attempt == 1, !entry.delivery.redelivered,
                !Self.isWindowPart(entry.delivery), StoreWaits.waits(of: entry.delivery) == 0,
                TargetResolver.hasStableID(entry.job, entry.delivery)
            else { return nil }
            return entry.job.id + ":" + String(sendAt)
        }
    }

    /// Claims the start of each job `key` names (nil: nothing to claim) and acknowledges, unsent, those whose start
    /// was claimed before, and every one after the first of a key this batch holds twice (the two came together).
    private func skipCopies(
        _ jobs: inout [(delivery: JobDelivery, job: PushJob)], of kind: String,
        claim: ([String]) throws -> Set<String>, key: ((delivery: JobDelivery, job: PushJob)) -> String?
    ) throws {
        var seen = Set<String>()
        let keys = jobs.compactMap(key).filter { seen.insert($0).inserted }
        guard !keys.isEmpty else { return }
        var claimedNow = try claim(keys)
        let copies = jobs.filter { entry in key(entry).map { claimedNow.remove($0) == nil } ?? false }
        guard !copies.isEmpty else { return }
        statistics.republishedCopiesSkipped.add(copies.count, ordering: .relaxed)
        logger.info(
            "copies of \(kind) that started already acknowledged without sending",
            ["jobs": String(copies.count), "job.id": copies.prefix(5).map(\.job.id).joined(separator: ",")])
        try session.broker.acknowledge(copies.map(\.delivery.tag))
        let skipped = Set(copies.map(\.delivery.tag))
        jobs.removeAll { skipped.contains($0.delivery.tag) }
    }

    /// A part of a windowed job that waited for its users' hours (`Worker.windowPartHeader`).
    static func isWindowPart(_ delivery: JobDelivery) -> Bool {
        delivery.properties.headers.contains(Worker.windowPartHeader)
    }

    /// Republished copies of jobs the fleet settled in the last half minute are acknowledged without sending anything
    /// (their summary included); copies of jobs under way elsewhere skip what the idempotency record says was sent. So
    /// are redeliveries of such jobs: a worker's acknowledgement lost with its connection (cut off, its node silent)
    /// leaves the job to be delivered again although it was settled and said so to the fleet.
    func skippingSettledCopies(_ jobs: [(delivery: JobDelivery, job: PushJob)]) throws
        -> [(delivery: JobDelivery, job: PushJob)]
    {
        // A job's parts share its id and settle one by one: one settled says nothing of the next (a redelivered part
        // still skips what the idempotency record holds).
        func mayBeSettled(_ delivery: JobDelivery) -> Bool {
            (delivery.redelivered || Self.isCopy(delivery)) && !Self.isWindowPart(delivery)
        }
        guard jobs.contains(where: { mayBeSettled($0.delivery) }) else { return jobs }
        let candidates = jobs.filter { mayBeSettled($0.delivery) && TargetResolver.hasStableID($0.job, $0.delivery) }
        guard !candidates.isEmpty else { return jobs }
        let names = candidates.map { Self.settledName($0.job, $0.delivery) }
        let settled = Set(names).intersection(settledUnshared).union(try session.record.recentlySettled(names))
        guard !settled.isEmpty else { return jobs }
        let isSettled = { (entry: (delivery: JobDelivery, job: PushJob)) in
            mayBeSettled(entry.delivery) && settled.contains(Self.settledName(entry.job, entry.delivery))
        }
        let skipped = jobs.filter(isSettled)
        statistics.republishedCopiesSkipped.add(skipped.count, ordering: .relaxed)
        logger.info(
            "copies and redeliveries of settled jobs acknowledged without sending", ["jobs": String(skipped.count)])
        try session.broker.acknowledge(skipped.map(\.delivery.tag))
        let marked = skipped.lazy.map(\.delivery).filter(\.redelivered).map(DeliveryTriage.historyKey)
        if !marked.isEmpty { try session.record.clearRunning(Array(marked)) }
        return jobs.filter { !isSettled($0) }
    }

    /// A job's name in the fleet's record of settled jobs: its id, and for a later attempt (a retry, a broadcast's
    /// copy) the attempt too. The attempts share the id, and one settled says nothing of the next: a retry delivered
    /// again after its session was lost was taken for a copy of the attempt before it, and acknowledged unsent.
    static func settledName(_ job: PushJob, _ delivery: JobDelivery) -> String {
        let attempt = max(job.attempt, BroadcastJob.attempt(of: delivery))
        return attempt == 1 ? job.id : job.id + " (attempt \(attempt))"
    }
}
