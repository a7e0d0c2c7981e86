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

    /// Jobs by their kind: the broadcasts, and the jobs of device notifications.
    static func byKind(_ jobs: [(delivery: JobDelivery, job: PushJob)])
        -> (broadcasts: [BroadcastJob], devices: [(delivery: JobDelivery, job: PushJob)]) {
        var broadcasts: [BroadcastJob] = []
        var devices: [(delivery: JobDelivery, job: PushJob)] = []
        devices.reserveCapacity(jobs.count)
        for (delivery, job) in jobs {
            switch job.kind {
            case .devices, .liveActivity: devices.append((delivery, job))
            case .broadcast(let channelID): broadcasts.append(BroadcastJob(delivery: delivery, job: job, channelID: channelID))
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
    /// their permits and sent.
    func startBroadcasts(_ jobs: [BroadcastJob]) throws {
        guard !jobs.isEmpty else { return }
        // What an earlier session broadcast goes into the record before the lookup.
        try settleBroadcasts()
        let stable = jobs.filter { TargetResolver.hasStableID($0.job, $0.delivery) }.map(\.job.id)
        let settled = stable.isEmpty ? [:] : try session.record.settled(jobIDs: stable).settled
        for broadcast in jobs {
            underWay.started(broadcast.delivery, jobID: broadcast.job.id)
            if settled[broadcast.job.id]?.tokens.contains(broadcast.channelID) == true {
                // Broadcast by an earlier delivery that did not live to settle: settle now, send nothing.
                statistics.duplicatesAvoided.add(1, ordering: .relaxed)
                worker.broadcastAnswers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, broadcast: broadcast,
                                              result: APNsResult(outcome: .delivered), kind: .alreadySent))
                }
                continue
            }
            broadcastsWaiting.append(broadcast)
        }
        core.handle(.jobsStarted(jobs.count))
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
            let answers = worker.broadcastAnswers, wakeup = worker.wakeup, generation = self.generation
            if let deadline = job.deadline, Double(deadline) <= now.timeIntervalSince1970 {
                // Its deadline passed while it waited for a permit: not sent.
                answers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, broadcast: waiting,
                                              result: APNsResult(outcome: .permanentFailure, error: "deadline passed"),
                                              kind: .expired))
                }
                continue
            }
            worker.sender.send(job.broadcast(on: waiting.channelID), environment: job.environment,
                               lane: delivery.lane) { result in
                answers.withLock { $0.append(BroadcastAnswer(generation: generation, broadcast: waiting, result: result)) }
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
        var publications: [Publication] = []
        // The retry copy or the parked job must be taken before the job is acknowledged; a summary need not.
        var owners: [(index: Int, mustBeTaken: Bool)] = []
        for (index, entry) in answered.enumerated() {
            for publication in broadcastPublications(entry) {
                publications.append(publication)
                let isSummary = if case .reply = publication.destination { true } else { false }
                owners.append((index, !isSummary))
            }
        }
        let outcomes = try publish(publications)
        var notTaken = Set<Int>()
        for (owner, outcome) in zip(owners, outcomes) where outcome != .taken {
            if owner.mustBeTaken { notTaken.insert(owner.index) } else { statistics.countRefusedPublish("summary") }
        }
        var settled: [UInt64] = []
        for (index, entry) in answered.enumerated() {
            underWay.settled(entry.delivery.tag)
            if notTaken.contains(index) {
                // Its retry copy or its parked copy was not taken: given back, it is settled again.
                statistics.countRefusedPublish("job_outputs")
                try session.broker.requeue(entry.delivery.tag)
            } else {
                settled.append(entry.delivery.tag)
                statistics.jobsCompleted.add(1, ordering: .relaxed)
                if TargetResolver.hasStableID(entry.job, entry.delivery) { settledUnshared.append(entry.job.id) }
            }
        }
        try session.broker.acknowledge(settled)
        core.handle(.jobsSettled(answered.count))
    }

    /// What one answered broadcast publishes: a retry copy if APNs asked to try later and attempts remain, the job
    /// parked with its reason when they are spent (or no credential serves its topic any more), and the summary its
    /// sender asked for (reply_to), once: a redelivered job that broadcast already publishes none. Counted in
    /// `apns_worker_broadcasts_total` only: a broadcast is no device notification.
    private func broadcastPublications(_ entry: BroadcastAnswer) -> [Publication] {
        let (delivery, job, result) = (entry.delivery, entry.job, entry.result)
        let attempt = Int(delivery.properties.headers[Self.broadcastAttemptHeader] ?? "") ?? 1
        let reason = result.response?.reason?.label ?? result.response.map { "status \($0.status)" }
            ?? (result.outcome == .unserved ? result.error : nil) ?? "no_answer"
        var publications: [Publication] = []
        let outcome: String
        switch (entry.kind, result.outcome) {
        case (.expired, _):
            outcome = "expired"
        case (_, .delivered):
            outcome = "delivered"
        case (_, .unserved):
            outcome = "failed"
            publications.append(parked(delivery, job, reason: "broadcast not sent: \(reason)", attempt: attempt))
            statistics.unservedJobsParked.add(1, ordering: .relaxed)
        case (_, let answer) where Self.isRetryable(answer):
            // The same tiers as a device job's retries (one of the lane's delay queues), the same attempt limit.
            switch retryPolicy.decide(attempt: attempt, retryable: 1, suggestedDelay: Self.retryDelay(answer),
                                      deadline: job.deadline, now: Date().timeIntervalSince1970) {
            case .retry(let wait):
                outcome = "retrying"
                statistics.countRetries(CollectionOfOne(result.response?.reason?.label ?? "no_answer"))
                var properties = delivery.properties
                properties.persistent = true
                properties.headers[Self.broadcastAttemptHeader] = String(attempt + 1)
                publications.append(Publication(destination: .retry(delay: wait, lane: delivery.lane), body: delivery.body,
                                                properties: properties))
            case .expire:
                outcome = "expired"
            case .park, .none:
                outcome = "failed"
                publications.append(parked(delivery, job,
                                           reason: "broadcast not delivered after \(attempt) attempts: \(reason)",
                                           attempt: attempt))
            }
        default:
            outcome = "failed"
        }
        if entry.kind != .alreadySent {
            // A job that broadcast already was counted when it did.
            statistics.countBroadcast(outcome)
        }
        if outcome == "failed" || outcome == "retrying" {
            logger.warning("broadcast not delivered", ["job.id": job.id, "apns.channel": entry.broadcast.channelID,
                                                       "apns.reason": Redact.outsideText(result.response?.reason?.rawValue
                                                                                         ?? result.error ?? reason),
                                                       "broadcast.outcome": outcome])
        }
        if let replyTo = delivery.properties.replyTo, entry.kind != .alreadySent {
            publications.append(Publication(destination: .reply(replyTo),
                                            body: Self.broadcastSummary(entry.broadcast, attempt: attempt,
                                                                        outcome: outcome, reason: reason, result: result),
                                            properties: JobSummary.properties(delivery, jobID: job.id)))
        }
        return publications
    }

    /// The broadcast job parked on PUSH_FAILED_QUEUE as it came, with its reason.
    private func parked(_ delivery: JobDelivery, _ job: PushJob, reason: String, attempt: Int) -> Publication {
        var properties = delivery.properties
        properties.persistent = true
        properties.headers[Worker.reasonHeader] = reason
        properties.headers[Worker.attemptsHeader] = String(attempt)
        statistics.jobsParked.add(1, ordering: .relaxed)
        logger.error("job parked", ["job.id": job.id, "job.reason": reason])
        return Publication(destination: .failed, body: delivery.body, properties: properties)
    }

    private static func broadcastSummary(_ broadcast: BroadcastJob, attempt: Int, outcome: String, reason: String,
                                         result: APNsResult) -> [UInt8] {
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
