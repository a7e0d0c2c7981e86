import APNsModel
import Foundation
import Telemetry

/// Settling jobs: parking bad ones, weighing mismatches, publishing what finished jobs produced, removing dead tokens,
/// acknowledging.
extension SessionLoop {
    /// Sends deliveries elsewhere whole (bad jobs parked with their reason, jobs put back to wait for the store),
    /// waits for the broker's confirms, then acknowledges them. One the broker hands back (its queue was deleted) or
    /// refuses stays unacknowledged and goes again after a pause.
    func reject(_ rejected: [HeldPublishes.Rejection]) throws {
        let publications = rejected.map { delivery, departure in
            switch departure {
            case .park(let reason, _):
                logger.warning("job rejected", ["job.reason": reason, "amqp.delivery_tag": String(delivery.tag)])
                var properties = delivery.properties
                properties.persistent = true
                properties.headers[Worker.reasonHeader] = reason
                return Publication(destination: .failed, body: delivery.body, properties: properties)
            case .waitForStore:
                return storeWaits.waitingCopy(of: delivery)
            case .waitUntilDue(let delay):
                return Publication.delayed(delivery, by: delay)
            }
        }
        let outcomes = try publish(publications)
        var settled: [UInt64] = []
        for (rejection, outcome) in zip(rejected, outcomes) {
            guard outcome == .taken else {
                held.hold(rejection: rejection)
                let kind =
                    switch rejection.departure {
                    case .waitForStore: "waiting_job"
                    case .waitUntilDue: "scheduled_job"
                    case .park: "rejected_job"
                    }
                statistics.countRefusedPublish(kind)
                continue
            }
            settled.append(rejection.delivery.tag)
            switch rejection.departure {
            case .park(_, let poison):
                statistics.jobsRejected.add(1, ordering: .relaxed)
                if poison {
                    statistics.poisonJobsParked.add(1, ordering: .relaxed)
                } else {
                    statistics.invalidJobsParked.add(1, ordering: .relaxed)
                }
            case .waitForStore:
                statistics.jobsWaiting.add(1, ordering: .relaxed)
            case .waitUntilDue:
                statistics.jobsScheduled.add(1, ordering: .relaxed)
            }
        }
        if settled.count < rejected.count {
            logger.error(
                "the broker did not take jobs parked or put back to wait; kept unacknowledged, sent again shortly",
                ["jobs": String(rejected.count - settled.count), "retry_in_s": String(HeldPublishes.pause)])
        }
        try session.broker.acknowledge(settled)
        let settledTags = Set(settled)
        let marked = rejected.lazy.map(\.delivery).filter { $0.redelivered && settledTags.contains($0.tag) }
            .map(DeliveryTriage.historyKey)
        if !marked.isEmpty { try session.record.clearRunning(Array(marked)) }
    }

    /// The broker's outcome for each publication, one per publication.
    func publish(_ publications: [Publication]) throws -> [PublicationOutcome] {
        try PortAnswerMismatch.checked(
            try session.broker.publish(publications), asked: publications.count, of: .broker,
            "publish")
    }

    /// Jobs that cannot be resolved now (a Redis node that holds their users, their Live Activity or their record does
    /// not answer) wait in their lane's delay queue (`StoreWaits`).
    func putBackToWait(_ deliveries: [JobDelivery]) throws {
        guard !deliveries.isEmpty else { return }
        statistics.countStoreUnavailable("resolve", deliveries.count)
        logger.warning(
            "jobs wait for a Redis node that does not answer",
            [
                "jobs": String(deliveries.count), "job.waits": String(deliveries.map(StoreWaits.waits).max() ?? 0),
                "retry_in_s": String(
                    deliveries.map { storeWaits.delay(afterWaits: StoreWaits.waits(of: $0)) }.min() ?? 0)
            ])
        try reject(deliveries.map { ($0, .waitForStore) })
    }

    func publishHeld() throws {
        guard let due = held.takeDue() else { return }
        if !due.jobs.isEmpty { core.handle(.jobsSettled(try finish(due.jobs))) }
        if !due.rejections.isEmpty { try reject(due.rejections) }
    }

    /// Settles finished jobs as their plans say: publishes, waits for the broker's confirms, takes dead tokens out of
    /// the cache, then acknowledges. A job whose publications the broker did not all take stays unacknowledged and
    /// is held for another try. Returns how many jobs it settled. A connection lost on the way (the broker's or the
    /// store's) leaves them to be redelivered: their answers go to the idempotency record first, so that whoever gets
    /// them sends nothing twice.
    func finish(_ finished: [JobProgress]) throws -> Int {
        var acknowledged = false
        do {
            return try settle(finished, acknowledged: &acknowledged)
        } catch {
            if !acknowledged { try? record(finished.compactMap(settledOutcomes)) }
            throw error
        }
    }

    /// Per finished job, by position: the rules' decision and, for a job that publishes or removes anything, its
    /// plan; and every plan's publications in order. A job that publishes and removes nothing (most jobs) has no
    /// plan: carried through the settling steps as tuples of plans, every job cost a dozen reference counts more.
    private func plans(_ finished: [JobProgress])
        -> (decisions: [RetryPolicy.Decision], plans: [SettlementPlan?], publications: [Publication])
    {
        let now = Date().timeIntervalSince1970
        var decisions: [RetryPolicy.Decision] = []
        var plans: [SettlementPlan?] = []
        var publications: [Publication] = []
        decisions.reserveCapacity(finished.count)
        plans.reserveCapacity(finished.count)
        for progress in finished {
            // Work whose topic lost its credential is parked whatever its attempts.
            let decision =
                progress.isUnserved
                ? .park
                : retryPolicy.decide(
                    attempt: progress.job.attempt, retryable: progress.retryable.count,
                    suggestedDelay: progress.retryable.map(\.delay).max() ?? 0,
                    deadline: progress.job.deadline, now: now)
            if decision == .expire {
                let expired = progress.expireRetryable()
                statistics.expired.add(expired, ordering: .relaxed)
                progressTracker.expired(progress, count: expired)
            }
            if progress.window?.parts.isEmpty == false && cancellations.isCancelled(progress) {
                let cancelled = progress.cancelWaitingParts()
                statistics.cancelled.add(cancelled, ordering: .relaxed)
                progressTracker.cancelled(progress, users: cancelled)
            }
            let plan =
                SettlementPlan.isNeeded(for: progress, retry: decision)
                ? SettlementPlan(progress, retry: decision, defaultTopic: worker.settings.defaultTopic) : nil
            if let plan { publications += plan.publications }
            decisions.append(decision)
            plans.append(plan)
        }
        return (decisions, plans, publications)
    }

    /// Counts each settled job (`confirmed`, indices in `finished`) and tells the progress tracker and the jobs under
    /// way; gathers, in this one pass over them, what settling them needs next: their delivery tags, the history keys
    /// of those delivered before, and the names of those with a stable id (a pass each counted every job and its
    /// delivery on and off again).
    private func noteSettled(
        _ confirmed: [Int], of finished: [JobProgress], decisions: [RetryPolicy.Decision], plans: [SettlementPlan?]
    ) -> (tags: [UInt64], settledAgain: [String], settledNames: [String]) {
        var tags: [UInt64] = []
        tags.reserveCapacity(confirmed.count)
        var settledAgain: [String] = []
        var settledNames: [String] = []
        for index in confirmed {
            let progress = finished[index]
            count(settled: progress, decisions[index], parkedReason: plans[index]?.parkedReason)
            progressTracker.settled(
                progress, decisions[index],
                cancelledAt: progress.cancelled > 0 ? cancellations.cancelledAt(of: progress) : nil)
            let delivery = progress.delivery
            underWay.settled(delivery.tag)
            tags.append(delivery.tag)
            if delivery.redelivered { settledAgain.append(DeliveryTriage.historyKey(delivery)) }
            if progress.hasStableID { settledNames.append(Self.settledName(progress.job, delivery)) }
        }
        return (tags, settledAgain, settledNames)
    }

    private func settle(_ finished: [JobProgress], acknowledged: inout Bool) throws -> Int {
        try weighMismatches(finished.filter { !$0.guardApplied })
        let (decisions, plans, publications) = self.plans(finished)
        let outcomes = try publish(publications)
        var confirmed: [Int] = []
        var refused: [JobProgress] = []
        var removals: [(jobID: String, removal: TokenRemoval)] = []
        var offset = 0
        for (index, progress) in finished.enumerated() {
            guard let plan = plans[index] else {
                confirmed.append(index)
                continue
            }
            let own = outcomes[offset..<offset + plan.publications.count]
            offset += plan.publications.count
            // Once out, never again: not when the job's other publications are made again (nor, held, on a redelivery).
            if let summary = plan.summary, own[own.startIndex + summary] == .taken { progress.summarySent = true }
            guard plan.isSafe(own) else {
                refused.append(progress)
                continue
            }
            confirmed.append(index)
            removals += plan.removals.map { (progress.job.id, $0) }
            if plan.summaryLost(own) {
                statistics.countRefusedPublish("summary")
                logger.warning(
                    "a job's summary was not taken: no queue named by its reply_to",
                    ["job.id": progress.job.id, "amqp.reply_to": progress.delivery.properties.replyTo ?? ""])
            }
        }
        let storeLost = removeDeadTokensUnlessTheStoreIsLost(removals)
        if storeLost == nil {
            try hold(refused)
        } else {
            // Not acknowledged, they go back with the session; their answers wait in the worker for the store.
            try? record(refused.compactMap(settledOutcomes))
        }
        let (tags, settledAgain, settledNames) = noteSettled(
            confirmed, of: finished, decisions: decisions, plans: plans)
        try session.broker.acknowledge(tags)
        acknowledged = true
        forgetUnwrittenOutcomes(ofSettled: confirmed.lazy.map { finished[$0].job.id })
        if let storeLost { throw storeLost }
        if !settledAgain.isEmpty { try session.record.clearRunning(settledAgain) }
        // After the acknowledgement (a Redis failure before it would redeliver the job, summary and all): which jobs
        // settled, so that a copy its publisher made after a failover sends nothing.
        settledUnshared += settledNames
        try shareSettled()
        return confirmed.count
    }

    /// The jobs settled since the last share go to the fleet's record of settled jobs every `settledShareInterval`
    /// (or every 1,000 jobs, or with `force`): a few round trips a second however fast jobs settle. Until then this
    /// worker recognises their copies itself.
    func shareSettled(force: Bool = false) throws {
        guard !settledUnshared.isEmpty else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        guard
            force || settledUnshared.count >= 1000
                || Double(now &- settledSharedAt) / 1e9 >= Self.settledShareInterval
        else { return }
        try session.record.settledRecently(settledUnshared)
        settledUnshared.removeAll(keepingCapacity: true)
        settledSharedAt = now
    }

    /// The store lost while dead tokens are taken out does not keep their jobs from settling: every publication of
    /// those jobs is out (the tokens' events among them), so their tokens are left to the cleanup consumer, as for a
    /// node that does not answer, and the failure is returned for the session to end once the jobs are acknowledged.
    /// Handed back instead, the jobs would go to another worker, which could not know what was sent: the idempotency
    /// record is the store's too.
    private func removeDeadTokensUnlessTheStoreIsLost(
        _ removals: [(jobID: String, removal: TokenRemoval)]
    ) -> (any Error)? {
        do {
            try removeDeadTokens(removals)
            return nil
        } catch {
            statistics.countStoreUnavailable("token_removal", removals.count)
            logger.warning(
                "dead tokens left in the cache: Redis was lost while they were removed; the cleanup consumer removes "
                    + "them from their events", ["tokens": String(removals.count), "error": "\(error)"])
            return error
        }
    }

    /// A removal the store refuses (a key of the wrong type) concerns that token only: its event is out, the job is
    /// settled, and the cleanup consumer will meet the same key and park the event with the reason. A removal whose
    /// node does not answer is left to the cleanup consumer too: it applies the token's event once the node answers.
    func removeDeadTokens(_ removals: [(jobID: String, removal: TokenRemoval)]) throws {
        guard !removals.isEmpty else { return }
        var unavailable = 0
        let changes = try PortAnswerMismatch.checked(
            try session.tokens.remove(removals.map(\.removal)),
            asked: removals.count, of: .store, "token removal")
        for ((jobID, removal), change) in zip(removals, changes) {
            switch change {
            case .applied, .unchanged:
                continue
            case .unavailable:
                unavailable += 1
            case .failed(let message):
                statistics.countDataError("token_removal")
                logger.error(
                    "Redis refused to remove a dead token",
                    [
                        "job.id": jobID, "user": removal.user,
                        "apns.token": Redact.token(removal.token),
                        "redis.error": message
                    ])
            }
        }
        guard unavailable > 0 else { return }
        statistics.countStoreUnavailable("token_removal", unavailable)
        logger.warning(
            "dead tokens left in the cache: their Redis node does not answer; the cleanup consumer removes "
                + "them from their events", ["tokens": String(unavailable)])
    }

    /// Jobs whose publications the broker did not take. Their outcomes (and whether their summary went out) go to
    /// the idempotency record now: if this connection drops before their publications are made again, a redelivery
    /// sends nothing twice, publishes no second summary, and still publishes its dead tokens' events.
    func hold(_ refused: [JobProgress]) throws {
        let unrecorded = refused.compactMap(settledOutcomes)
        try record(unrecorded)
        for progress in refused {
            held.hold(job: progress)
            statistics.countRefusedPublish("job_outputs")
            logger.error(
                "the broker did not take what a job produced; kept unacknowledged, published again shortly",
                ["job.id": progress.job.id, "retry_in_s": String(HeldPublishes.pause)])
        }
    }

    /// Jobs completed on an earlier broker connection are not settled (an acknowledgement would mean nothing there, and
    /// the broker redelivers them), but their outcomes go to the idempotency record, so that the redelivery sends
    /// nothing twice.
    func recordUnsettled(_ stale: [JobProgress]) throws {
        let unrecorded = stale.compactMap(settledOutcomes)
        try record(unrecorded)
    }

    /// Every answer this worker has and the idempotency record has not: the outcomes handed over, and those of jobs
    /// completed on an earlier broker connection. Before the record is read for redelivered jobs, which may be those.
    func recordAnswered() throws {
        let stale = worker.answers.takeCompleted { !core.isCurrent(generation: $0) }
        let unrecorded = worker.answers.takeOutcomes() + stale.compactMap(settledOutcomes)
        try record(unrecorded)
    }

    /// A stable-id job's final outcomes not recorded yet, and its summary if it went out.
    func settledOutcomes(of progress: JobProgress) -> (jobID: String, outcomes: [SettledOutcome])? {
        guard progress.hasStableID else { return nil }
        let outcomes = (progress.takeUnrecordedFinal() ?? []) + (progress.summarySent ? [.summarySent] : [])
        return outcomes.isEmpty ? nil : (progress.job.id, outcomes)
    }

    func count(settled progress: JobProgress, _ decision: RetryPolicy.Decision, parkedReason: String?) {
        statistics.jobsCompleted.add(1, ordering: .relaxed)
        switch decision {
        case .retry: statistics.countRetries(progress.retryable.lazy.map(\.label))
        case .park:
            statistics.jobsParked.add(1, ordering: .relaxed)
            // What was still to retry has failed for good: counted with the failures, as the summary counts it.
            statistics.permanentFailures.add(progress.retryable.count, ordering: .relaxed)
            if progress.isUnserved { statistics.unservedJobsParked.add(1, ordering: .relaxed) }
        case .none, .expire: break
        }
        if let parkedReason {
            logger.error("job parked", ["job.id": progress.job.id, "job.reason": parkedReason])
        }
        logger.debug(
            "job done",
            [
                "job.id": progress.job.id, "job.attempt": String(progress.job.attempt),
                "job.notifications": String(progress.notificationCount),
                "job.delivered": String(progress.delivered), "job.dead": String(progress.dead.count),
                "job.failed": String(progress.failed.count),
                "job.retryable": String(progress.retryable.count)
            ])
    }

    /// The mass-invalidation guard, once jobs' outcomes are all in: their 400 mismatch answers either count as dead
    /// tokens (removed, with events) or, when the job's answers or the fleet's recent ones look like a configuration
    /// mistake, are held back, logged at error level and counted. 410s are never held back. The fleet's window is
    /// asked only when there are mismatches to weigh.
    func weighMismatches(_ jobs: [JobProgress]) throws {
        let counts = jobs.map(\.invalidationCounts)
        let batch = counts.reduce(InvalidationCounts(), +)
        unsharedAnswers = unsharedAnswers + batch
        guard batch.mismatches > 0 else {
            for progress in jobs { _ = progress.applyGuard(.remove) }
            return
        }
        // Without the fleet's totals (refused, or their node silent) the guard removes nothing on a guess; only what
        // the window said is news about the fleet.
        let answer = try shareAnswers()
        let fleet: FleetInvalidationCounts? = if case .answered(let totals) = answer { totals } else { nil }
        if case .unavailable = answer {} else { noteFleetGuard(fleet) }
        for (progress, job) in zip(jobs, counts) {
            let verdict = worker.settings.invalidationGuard.verdict(job: job, fleet: fleet)
            let heldBack = progress.applyGuard(verdict)
            guard heldBack > 0 else {
                statistics.deadTokens.add(job.mismatches, ordering: .relaxed)
                continue
            }
            statistics.heldBack.add(heldBack, ordering: .relaxed)
            guard verdict == .heldBackByJob else { continue }
            statistics.invalidationGuardTrips.add(1, ordering: .relaxed)
            let reasons = Set(progress.heldBack.compactMap { $0.response.reason?.rawValue }).sorted().joined(
                separator: ",")
            logger.error(
                "mass invalidation guard: 400 answers held back as a configuration error, no token removed",
                [
                    "job.id": progress.job.id, "apns.reason": reasons, "apns.topic": progress.job.topic,
                    "job.held_back": String(heldBack), "job.judged": String(progress.judged),
                    "job.dead": String(progress.dead.count), "job.problem": progress.heldBackExplanation ?? ""
                ])
        }
    }

    /// Adds the answers not yet shared to the fleet's window and returns what the store said. Answers it could not
    /// take are dropped: the window weighs recent answers, and old answers added late would weigh on a new minute.
    func shareAnswers() throws -> StoreAnswer<FleetInvalidationCounts> {
        let answer = try session.invalidationWindow.add(unsharedAnswers)
        unsharedAnswers = InvalidationCounts()
        switch answer {
        case .answered: break
        case .refused: statistics.countDataError("invalidation_window")
        case .unavailable: statistics.countStoreUnavailable("guard_window")
        }
        return answer
    }

    private static func fleetGuardMetadata(_ fleet: FleetInvalidationCounts?) -> [String: String] {
        guard let fleet else { return ["guard.mismatches": "unreadable", "guard.judged": "unreadable"] }
        return [
            "guard.mismatches": String(fleet.lastMinute.mismatches), "guard.judged": String(fleet.lastMinute.judged),
            "guard.hour_mismatches": String(fleet.lastHour.mismatches),
            "guard.hour_judged": String(fleet.lastHour.judged)
        ]
    }

    /// The fleet guard's state as this worker last saw it: a trip and its end are logged once, not per job.
    func noteFleetGuard(_ fleet: FleetInvalidationCounts?) {
        let tripped = fleet.map(worker.settings.invalidationGuard.holdsBack) ?? true
        guard statistics.fleetGuardTripped.exchange(tripped, ordering: .relaxed) != tripped else { return }
        if tripped {
            statistics.invalidationGuardFleetTrips.add(1, ordering: .relaxed)
            logger.error(
                "mass invalidation guard (fleet): 400 answers across the fleet look like a configuration error; "
                    + "no worker removes tokens for them until their share falls",
                Self.fleetGuardMetadata(fleet))
        } else {
            logger.warning(
                "mass invalidation guard (fleet): the share of 400 answers fell back; mismatches count again",
                Self.fleetGuardMetadata(fleet))
        }
    }

    /// Adds final outcomes to the idempotency record, after those the worker holds unwritten. A record the store
    /// refuses concerns that job only: logged and counted (a redelivery of it would send its notifications again),
    /// never a reconnect. Outcomes whose node does not answer, or that a lost connection kept from the store, stay
    /// with the worker and go with the next write.
    func record(_ outcomes: [(jobID: String, outcomes: [SettledOutcome])]) throws {
        let held = worker.unwrittenOutcomes.withLock { held in
            defer { held.removeAll() }
            return held
        }
        let batch = held.isEmpty ? outcomes : held + outcomes
        guard !batch.isEmpty else { return }
        let written: RecordWrite
        do { written = try session.record.record(batch) } catch {
            worker.unwrittenOutcomes.withLock { $0 = batch + $0 }
            throw error
        }
        noteRecordWrite(written, of: batch, counting: outcomes)
    }

    /// What became of a write to the record (`record`, or the preparer's): refusals logged and counted, outcomes whose
    /// node did not answer kept in the worker for the next write (counted once, when first `counting`).
    func noteRecordWrite(
        _ written: RecordWrite, of batch: [(jobID: String, outcomes: [SettledOutcome])],
        counting: [(jobID: String, outcomes: [SettledOutcome])]
    ) {
        for (jobID, message) in written.refused {
            statistics.countDataError("idempotency_record")
            logger.error("Redis refused the idempotency record", ["job.id": jobID, "redis.error": message])
        }
        guard !written.unavailable.isEmpty else { return }
        statistics.countStoreUnavailable("record", counting.count { written.unavailable.contains($0.jobID) })
        worker.unwrittenOutcomes.withLock { $0 += batch.filter { written.unavailable.contains($0.jobID) } }
    }

    /// Outcomes held unwritten for jobs now acknowledged are needed no more: no redelivery of those jobs can come.
    func forgetUnwrittenOutcomes(ofSettled jobIDs: some Sequence<String>) {
        worker.unwrittenOutcomes.withLock { held in
            guard !held.isEmpty else { return }
            let settled = Set(jobIDs)
            held.removeAll { settled.contains($0.jobID) }
        }
    }
}
