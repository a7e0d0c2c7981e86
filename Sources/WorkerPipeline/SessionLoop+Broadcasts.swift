import APNsModel
import Foundation
import Telemetry

/// Broadcast jobs (`channel_id`): one request each, on a path of their own from start to settlement (no targets,
/// no token cache). The shared rate limit (and the credential's own) grants one permit per broadcast; the
/// idempotency record keeps a redelivered job from broadcasting twice; the outcome goes to the job's summary and
/// `apns_worker_broadcasts_total`. A broadcast APNs asks to try later goes to the lane's delay queue, at most
/// APNS_MAX_ATTEMPTS times in all, the attempts counted in a header of the copy.
/// A broadcast's answer, as the lane's thread hands it over.
struct BroadcastAnswer: Sendable {
    enum Kind: Sendable { case answered, alreadySent, expired }

    var generation: Int
    var delivery: JobDelivery
    var job: PushJob
    var result: APNsResult
    var kind = Kind.answered
}

extension SessionLoop {
    /// Attempts so far, on the copies the worker schedules for a retry.
    static let broadcastAttemptHeader = "x-apns-worker-broadcast-attempt"

    /// The broadcast jobs of a started batch: skipped if an earlier delivery broadcast already, else queued for
    /// their permits and sent.
    func startBroadcasts(_ jobs: [(delivery: JobDelivery, job: PushJob)]) throws {
        guard !jobs.isEmpty else { return }
        // What an earlier session broadcast goes into the record before the lookup.
        try settleBroadcasts()
        let stable = jobs.filter { TargetResolver.hasStableID($0.job, $0.delivery) }.map(\.job.id)
        let settled = stable.isEmpty ? [:] : try session.record.settled(jobIDs: stable).settled
        for (delivery, job) in jobs {
            underWay.started(delivery, jobID: job.id)
            if let channel = job.channelID, settled[job.id]?.tokens.contains(channel) == true {
                // Broadcast by an earlier delivery that did not live to settle: settle now, send nothing.
                statistics.duplicatesAvoided.add(1, ordering: .relaxed)
                worker.broadcastAnswers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, delivery: delivery, job: job,
                                              result: APNsResult(outcome: .delivered), kind: .alreadySent))
                }
                continue
            }
            broadcastsWaiting.append((delivery, job))
        }
        core.handle(.jobsStarted(jobs.count))
        try sendWaitingBroadcasts(now: Date())
    }

    /// Sends the waiting broadcasts the rate limits allow now; the rest wait for the next window
    /// (`broadcastsWaitUntil`, which the loop's wait takes into account).
    func sendWaitingBroadcasts(now: Date) throws {
        guard !broadcastsWaiting.isEmpty, now >= broadcastsWaitUntil else { return }
        while let (delivery, job) = broadcastsWaiting.first {
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
            guard let broadcast = job.broadcast else { continue }
            let answers = worker.broadcastAnswers, wakeup = worker.wakeup, generation = self.generation
            if let deadline = job.deadline, Double(deadline) <= now.timeIntervalSince1970 {
                // Its deadline passed while it waited for a permit: not sent.
                answers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, delivery: delivery, job: job,
                                              result: APNsResult(outcome: .permanentFailure, error: "deadline passed"),
                                              kind: .expired))
                }
                continue
            }
            worker.sender.send(broadcast, environment: job.environment, lane: delivery.lane) { result in
                answers.withLock {
                    $0.append(BroadcastAnswer(generation: generation, delivery: delivery, job: job, result: result))
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
        try record(delivered.compactMap { entry in entry.job.channelID.map { (entry.job.id, [SettledOutcome.done($0)]) } })
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
        let outcomes = try session.broker.publish(publications)
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
    /// parked with its reason when they are spent, and the summary its sender asked for (reply_to), once: a
    /// redelivered job that broadcast already publishes none. Counted in `apns_worker_broadcasts_total` only: a
    /// broadcast is no device notification.
    private func broadcastPublications(_ entry: BroadcastAnswer) -> [Publication] {
        let (delivery, job, result) = (entry.delivery, entry.job, entry.result)
        let attempt = Int(delivery.properties.headers[Self.broadcastAttemptHeader] ?? "") ?? 1
        let reason = result.response?.reason?.label ?? result.response.map { "status \($0.status)" } ?? "no_answer"
        var publications: [Publication] = []
        var outcome = "failed"
        if entry.kind == .expired {
            outcome = "expired"
        } else if result.outcome == .delivered {
            outcome = "delivered"
        } else if Self.isRetryable(result.outcome) {
            // The same tiers as a device job's retries (one of the lane's delay queues), the same attempt limit.
            switch retryPolicy.decide(attempt: attempt, retryable: 1, suggestedDelay: Self.retryDelay(result.outcome),
                                      deadline: job.deadline, now: Date().timeIntervalSince1970) {
            case .retry(let wait):
                outcome = "retrying"
                var properties = delivery.properties
                properties.persistent = true
                properties.headers[Self.broadcastAttemptHeader] = String(attempt + 1)
                publications.append(Publication(destination: .retry(delay: wait, lane: delivery.lane), body: delivery.body,
                                                properties: properties))
            case .expire:
                outcome = "expired"
            case .park:
                let parkedReason = "broadcast not delivered after \(attempt) attempts: \(reason)"
                var properties = delivery.properties
                properties.persistent = true
                properties.headers[Worker.reasonHeader] = parkedReason
                properties.headers[Worker.attemptsHeader] = String(attempt)
                publications.append(Publication(destination: .failed, body: delivery.body, properties: properties))
                statistics.jobsParked.add(1, ordering: .relaxed)
                logger.error("job parked after its last attempt", ["job.id": job.id, "job.reason": parkedReason])
            case .none:
                break
            }
        }
        if entry.kind != .alreadySent {
            // A job that broadcast already was counted when it did.
            statistics.countBroadcast(outcome)
        }
        if outcome == "failed" || outcome == "retrying" {
            logger.warning("broadcast not delivered", ["job.id": job.id, "apns.channel": job.channelID ?? "",
                                                       "apns.reason": Redact.outsideText(result.response?.reason?.rawValue
                                                                                         ?? result.error ?? reason),
                                                       "broadcast.outcome": outcome])
        }
        if let replyTo = delivery.properties.replyTo, entry.kind != .alreadySent {
            publications.append(Publication(destination: .reply(replyTo),
                                            body: Self.broadcastSummary(job: job, attempt: attempt, outcome: outcome,
                                                                        reason: reason, result: result),
                                            properties: Self.summaryProperties(delivery)))
        }
        return publications
    }

    private static func summaryProperties(_ delivery: JobDelivery) -> MessageProperties {
        var properties = MessageProperties(correlationID: delivery.properties.correlationID)
        properties.persistent = false
        return properties
    }

    private static func broadcastSummary(job: PushJob, attempt: Int, outcome: String, reason: String,
                                         result: APNsResult) -> [UInt8] {
        let failedByReason = outcome == "failed" ? "{\(JSONString.quote(reason)):1}" : "{}"
        var summary = "{\"job_id\":\(JSONString.quote(job.id)),\"attempt\":\(attempt),"
            + "\"channel_id\":\(JSONString.quote(job.channelID ?? "")),\"notifications\":1,"
            + "\"delivered\":\(outcome == "delivered" ? 1 : 0),\"dead\":0,\"failed\":\(outcome == "failed" ? 1 : 0),"
            + "\"retrying\":\(outcome == "retrying" ? 1 : 0),\"held_back\":0,\"expired\":\(outcome == "expired" ? 1 : 0),"
            + "\"failed_by_reason\":\(failedByReason)"
        if let uniqueID = result.response?.apnsUniqueID { summary += ",\"apns_unique_id\":\(JSONString.quote(uniqueID))" }
        return Array((summary + "}").utf8)
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
