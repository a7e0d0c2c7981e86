import APNsModel
import Foundation
import Telemetry

/// Broadcast jobs (`channel_id`): one request each, on a path of their own from start to settlement (no targets,
/// no token cache). The shared rate limit (and the credential's own) grants one permit per broadcast; the
/// idempotency record keeps a redelivered job from broadcasting twice; the outcome goes to the job's summary and
/// `apns_worker_broadcasts_total`. A broadcast APNs asks to try later goes to the lane's delay queue, at most
/// APNS_MAX_ATTEMPTS times in all, the attempts counted in a header of the copy.
/// A broadcast job on its way: its delivery, the job, and the channel its kind names.
struct BroadcastJob: Sendable {
    var delivery: JobDelivery
    var job: PushJob
    var channelID: String
    /// This attempt's summary went out on an earlier delivery (the idempotency record says so): none again.
    var summarySent = false

    /// 1, or the attempt a retry copy's header names (held to 1...`PushJob.maximumAttempt`: the header is a
    /// message property anyone publishing could set).
    var attempt: Int { Self.attempt(of: delivery) }

    /// The attempt a delivery's broadcast attempt header names, 1 without one.
    static func attempt(of delivery: JobDelivery) -> Int {
        let named = Int(delivery.properties.headers[SessionLoop.broadcastAttemptHeader] ?? "") ?? 1
        return min(max(named, 1), PushJob.maximumAttempt)
    }

    /// The idempotency record's member saying this attempt's summary went out (not base64, so never a channel id).
    var summaryMarker: String { "summary@\(attempt)" }

    /// Jobs by their kind: the broadcasts, and the jobs of device notifications.
    static func byKind(_ jobs: [(delivery: JobDelivery, job: PushJob)])
        -> (broadcasts: [BroadcastJob], devices: [(delivery: JobDelivery, job: PushJob)])
    {
        // Most batches hold no broadcast: their jobs are passed on as they are, not copied into another array.
        guard jobs.contains(where: { if case .broadcast = $0.job.kind { true } else { false } }) else {
            return ([], jobs)
        }
        var broadcasts: [BroadcastJob] = []
        var devices: [(delivery: JobDelivery, job: PushJob)] = []
        devices.reserveCapacity(jobs.count)
        for (delivery, job) in jobs {
            switch job.kind {
            case .devices, .liveActivity: devices.append((delivery, job))
            case .broadcast(let channelID):
                broadcasts.append(BroadcastJob(delivery: delivery, job: job, channelID: channelID))
            }
        }
        return (broadcasts, devices)
    }
}

/// A broadcast's answer, as the lane's thread hands it over.
struct BroadcastAnswer: Sendable {
    enum Kind: Sendable { case answered, alreadySent, expired }

    var generation: Int
    var broadcast: BroadcastJob
    var result: APNsResult
    var kind = Kind.answered

    var delivery: JobDelivery { broadcast.delivery }
    var job: PushJob { broadcast.job }
}

extension SessionLoop {
    /// Attempts so far, on the copies the worker schedules for a retry.
    static let broadcastAttemptHeader = "x-apns-worker-broadcast-attempt"

    /// The broadcast jobs of a started batch: skipped if an earlier delivery broadcast already, else queued for
    /// their permits and sent. One whose record's node does not answer waits (what an earlier delivery sent is
    /// unknown), as a device job does.
    func startBroadcasts(_ jobs: [BroadcastJob]) throws {
        guard !jobs.isEmpty else { return }
        // What an earlier session broadcast goes into the record before the lookup.
        try settleBroadcasts()
        let stable = jobs.filter { TargetResolver.hasStableID($0.job, $0.delivery) }.map(\.job.id)
        let lookup = stable.isEmpty ? SettledLookup() : try session.record.settled(jobIDs: stable)
        let waiting = jobs.filter { lookup.unavailable.contains($0.job.id) }
        for var broadcast in jobs where !lookup.unavailable.contains(broadcast.job.id) {
            underWay.started(broadcast.delivery, jobID: broadcast.job.id)
            let settled = lookup.settled[broadcast.job.id]?.tokens ?? []
            broadcast.summarySent = settled.contains(broadcast.summaryMarker)
            if settled.contains(broadcast.channelID) {
                // Broadcast by an earlier delivery that did not live to settle: settle now, send nothing.
                statistics.duplicatesAvoided.add(1, ordering: .relaxed)
                worker.broadcastAnswers.withLock {
                    $0.append(
                        BroadcastAnswer(
                            generation: generation, broadcast: broadcast,
                            result: APNsResult(outcome: .delivered), kind: .alreadySent))
                }
                continue
            }
            broadcastsWaiting.append(broadcast)
        }
        try putBackToWait(waiting.map(\.delivery))
        core.handle(.jobsStarted(jobs.count - waiting.count))
        try sendWaitingBroadcasts(now: Date())
    }

    /// Sends the waiting broadcasts the rate limits allow now; the rest wait for the next window
    /// (`broadcastsWaitUntil`, which the loop's wait takes into account).
    func sendWaitingBroadcasts(now: Date) throws {
        guard !broadcastsWaiting.isEmpty, now >= broadcastsWaitUntil else { return }
        while let waiting = broadcastsWaiting.first {
            let (delivery, job) = (waiting.delivery, waiting.job)
            let asked = LaneCounts(urgent: delivery.lane == .urgent ? 1 : 0, bulk: delivery.lane == .bulk ? 1 : 0)
            var limiters = session.rateLimiter.map { [$0] } ?? []
            if let group = job.rateGroup, let makeLimiter = session.groupRateLimiter {
                let limiter = groupLimiters[group] ?? makeLimiter(group)
                groupLimiters[group] = limiter
                limiters.append(limiter)
            }
            for limiter in limiters {
                let (granted, limited) = try reserve(asked, from: limiter)
                guard granted.total > 0 else {
                    broadcastsWaitUntil = now.addingTimeInterval(limited?.wait ?? 1)
                    return
                }
            }
            broadcastsWaiting.removeFirst()
            let answers = worker.broadcastAnswers
            let wakeup = worker.wakeup
            let generation = self.generation
            if let deadline = job.deadline, Double(deadline) <= now.timeIntervalSince1970 {
                // Its deadline passed while it waited for a permit: not sent.
                answers.withLock {
                    $0.append(
                        BroadcastAnswer(
                            generation: generation, broadcast: waiting,
                            result: APNsResult(outcome: .permanentFailure, error: "deadline passed"),
                            kind: .expired))
                }
                continue
            }
            worker.sender.send(
                job.broadcast(on: waiting.channelID), environment: job.environment,
                lane: delivery.lane
            ) { result in
                answers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, broadcast: waiting, result: result))
                }
                wakeup.signal()
            }
        }
    }

    /// When the first waiting broadcast may ask for its permit again, if any waits.
    var broadcastsDue: Date? { broadcastsWaiting.isEmpty ? nil : broadcastsWaitUntil }

    /// Settles the broadcasts answered since the last turn (one lock whether or not any came): the record first (a
    /// delivered broadcast is never sent again), then the retry copy and the summary, then the acknowledgement. A
    /// lost summary (no queue by its reply_to) holds nothing up; a retry copy the broker did not take gives the job
    /// back, to be tried again. Answers to an earlier session (its broker connection ended before it settled them)
    /// only go into the record, so that their redelivered jobs do not broadcast again.
    func settleBroadcasts() throws {
        let answered = worker.broadcastAnswers.withLock { answers in
            defer { answers.removeAll() }
            return answers
        }
        guard !answered.isEmpty else { return }
        do {
            try recordDelivered(answered.filter { $0.generation != generation })
            let current = answered.filter { $0.generation == generation }
            if !current.isEmpty { try settle(current) }
        } catch {
            // The session ends: the answers go back, for the next session to record what was delivered.
            worker.broadcastAnswers.withLock { $0.append(contentsOf: answered) }
            throw error
        }
    }

    /// Notes in the idempotency record the broadcasts that went out (of jobs that keep their id across deliveries).
    private func recordDelivered(_ answers: [BroadcastAnswer]) throws {
        let delivered = answers.filter {
            $0.kind == .answered && $0.result.outcome == .delivered && TargetResolver.hasStableID($0.job, $0.delivery)
        }
        try record(delivered.map { ($0.job.id, [SettledOutcome.done($0.broadcast.channelID)]) })
    }

    private func settle(_ answered: [BroadcastAnswer]) throws {
        try recordDelivered(answered)
        let plans = answered.map(plan)
        let outcomes = try publish(plans.flatMap(\.publications))
        var offset = 0
        var settled: [UInt64] = []
        var summariesSent: [(jobID: String, outcomes: [SettledOutcome])] = []
        for (entry, plan) in zip(answered, plans) {
            let own = outcomes[offset..<offset + plan.publications.count]
            offset += plan.publications.count
            underWay.settled(entry.delivery.tag)
            let stable = TargetResolver.hasStableID(entry.job, entry.delivery)
            if let summary = plan.summary, own[own.startIndex + summary] == .taken, stable {
                summariesSent.append((entry.job.id, [.done(entry.broadcast.summaryMarker)]))
            }
            // The retry copy or the parked job must be taken before the job is acknowledged; a summary need not.
            guard own.indices.allSatisfy({ $0 - own.startIndex == plan.summary || own[$0] == .taken }) else {
                // Given back, it is settled again (and counted then).
                statistics.countRefusedPublish("job_outputs")
                try session.broker.requeue(entry.delivery.tag)
                continue
            }
            if plan.summary.map({ own[own.startIndex + $0] != .taken }) == true {
                statistics.countRefusedPublish("summary")
            }
            count(entry, plan)
            settled.append(entry.delivery.tag)
            statistics.jobsCompleted.add(1, ordering: .relaxed)
            if stable { settledUnshared.append(Self.settledName(entry.job, entry.delivery)) }
        }
        // Before the acknowledgement: a redelivery then knows its summary went out.
        try record(summariesSent)
        try session.broker.acknowledge(settled)
        core.handle(.jobsSettled(answered.count))
    }

    /// What an answered broadcast publishes and how it is counted once it is settled.
    private struct BroadcastPlan {
        var publications: [Publication] = []
        /// Its summary's index among the publications, if it has one.
        var summary: Int?
        var outcome = "failed"
        var parkedReason: String?
        var unserved = false
        /// The reason a retry is counted under.
        var retried: String?
    }

    /// What one answered broadcast publishes: a retry copy if APNs asked to try later and attempts remain, the job
    /// parked with its reason when they are spent (or no credential serves its topic any more), and the summary its
    /// sender asked for (reply_to), once per attempt: none again on a redelivery.
    private func plan(_ entry: BroadcastAnswer) -> BroadcastPlan {
        let (delivery, job, result) = (entry.delivery, entry.job, entry.result)
        let attempt = entry.broadcast.attempt
        let reason =
            result.response?.reason?.label ?? result.response.map { "status \($0.status)" }
            ?? (result.outcome == .unserved ? result.error : nil) ?? "no_answer"
        var plan = BroadcastPlan()
        switch (entry.kind, result.outcome) {
        case (.expired, _), (_, .expired):
            plan.outcome = "expired"
        case (_, .delivered):
            plan.outcome = "delivered"
        case (_, .unserved):
            plan.parkedReason = "broadcast not sent: \(reason)"
            plan.unserved = true
        case (_, let answer) where Self.isRetryable(answer):
            // The same tiers as a device job's retries (one of the lane's delay queues), the same attempt limit.
            switch retryPolicy.decide(
                attempt: attempt, retryable: 1, suggestedDelay: Self.retryDelay(answer),
                deadline: job.deadline, now: Date().timeIntervalSince1970)
            {
            case .retry(let wait):
                plan.outcome = "retrying"
                plan.retried = result.response?.reason?.label ?? "no_answer"
                var properties = delivery.properties
                properties.persistent = true
                properties.headers[Self.broadcastAttemptHeader] = String(attempt + 1)
                plan.publications.append(
                    Publication(
                        destination: .retry(delay: wait, lane: delivery.lane),
                        body: delivery.body, properties: properties))
            case .expire:
                plan.outcome = "expired"
            case .park, .none:
                plan.parkedReason = "broadcast not delivered after \(attempt) attempts: \(reason)"
            }
        default:
            break
        }
        if let parkedReason = plan.parkedReason {
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Worker.reasonHeader] = parkedReason
            properties.headers[Worker.attemptsHeader] = String(attempt)
            plan.publications.append(Publication(destination: .failed, body: delivery.body, properties: properties))
        }
        if let replyTo = JobSummary.replyQueue(of: delivery), entry.kind != .alreadySent, !entry.broadcast.summarySent {
            plan.summary = plan.publications.count
            let body = Self.broadcastSummary(
                entry.broadcast, attempt: attempt, outcome: plan.outcome, reason: reason, result: result)
            plan.publications.append(JobSummary.publication(to: replyTo, body: body, of: delivery, jobID: job.id))
        }
        return plan
    }

    /// A settled broadcast's counts and log lines: in `apns_worker_broadcasts_total` only, a broadcast is no
    /// device notification; a job that broadcast already was counted when it did.
    private func count(_ entry: BroadcastAnswer, _ plan: BroadcastPlan) {
        guard entry.kind != .alreadySent else { return }
        statistics.countBroadcast(plan.outcome)
        if let retried = plan.retried { statistics.countRetries(CollectionOfOne(retried)) }
        if let parkedReason = plan.parkedReason {
            statistics.jobsParked.add(1, ordering: .relaxed)
            if plan.unserved { statistics.unservedJobsParked.add(1, ordering: .relaxed) }
            logger.error("job parked", ["job.id": entry.job.id, "job.reason": parkedReason])
        }
        if plan.outcome == "failed" || plan.outcome == "retrying" {
            let result = entry.result
            logger.warning(
                "broadcast not delivered",
                [
                    "job.id": entry.job.id, "apns.channel": entry.broadcast.channelID,
                    "apns.reason": Redact.outsideText(result.response?.reason?.rawValue ?? result.error ?? "no_answer"),
                    "broadcast.outcome": plan.outcome
                ])
        }
    }

    private static func broadcastSummary(
        _ broadcast: BroadcastJob, attempt: Int, outcome: String, reason: String,
        result: APNsResult
    ) -> [UInt8] {
        var summary = JobSummary(jobID: broadcast.job.id, attempt: attempt)
        summary.channelID = broadcast.channelID
        summary.notifications = 1
        switch outcome {
        case "delivered": summary.delivered = 1
        case "retrying": summary.retrying = 1
        case "expired": summary.expired = 1
        default:
            summary.failed = 1
            summary.failedByReason[reason] = 1
        }
        summary.apnsUniqueID = result.response?.apnsUniqueID
        return summary.json
    }

    private static func isRetryable(_ outcome: APNsOutcome) -> Bool {
        switch outcome {
        case .retryLater, .refreshTokenAndRetry, .replaceConnectionAndRetry: true
        default: false
        }
    }

    private static func retryDelay(_ outcome: APNsOutcome) -> Double {
        if case .retryLater(let delay) = outcome { return delay }
        return 1
    }
}
