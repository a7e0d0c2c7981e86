import APNsModel
import Foundation
import Telemetry
import Threads

/// The worker's side of the sender's lane threads: records each answer in its job's progress, and hands the broker thread
/// what it must act on, in batches: jobs whose every notification has an outcome (with one wake-up), and final
/// outcomes of jobs still under way for the idempotency record (at most every `outcomeInterval`).
final class AnswerCollector: Sendable {
    /// Final outcomes go to the idempotency record at least this often (seconds): a crash sends again what was
    /// unanswered plus at most this much of answers. One hand-over per interval, not one per answer.
    static let outcomeInterval = 0.01

    private let statistics: WorkerStatistics
    private let logger: Logger
    private let sender: any NotificationSender
    private let wakeup: Wakeup
    private let completions = Locked<[JobProgress]>([])
    /// Final outcomes handed over for the idempotency record; those of large jobs' pieces apart, as the preparer's
    /// thread writes them, not the broker thread.
    private let handedOver = Locked(HandedOver())
    private struct HandedOver {
        var jobs: [(jobID: String, outcomes: [SettledOutcome])] = []
        var pieces: [(jobID: String, outcomes: [SettledOutcome])] = []

        mutating func add(_ outcomes: [SettledOutcome], of progress: JobProgress) {
            if progress.assembly == nil {
                jobs.append((progress.job.id, outcomes))
            } else {
                pieces.append((progress.job.id, outcomes))
            }
        }
    }
    /// Per lane, on that lane's sender thread only: jobs with final outcomes not handed over yet, and whether a
    /// hand-over is scheduled.
    private let urgentOutcomesAwaiting: LoopConfined<(jobs: [JobProgress], scheduled: Bool)>
    private let bulkOutcomesAwaiting: LoopConfined<(jobs: [JobProgress], scheduled: Bool)>

    private func outcomesAwaiting(_ lane: JobLane) -> LoopConfined<(jobs: [JobProgress], scheduled: Bool)> {
        lane == .urgent ? urgentOutcomesAwaiting : bulkOutcomesAwaiting
    }

    init(statistics: WorkerStatistics, logger: Logger, sender: any NotificationSender, wakeup: Wakeup) {
        self.statistics = statistics
        self.logger = logger
        self.sender = sender
        self.wakeup = wakeup
        urgentOutcomesAwaiting = LoopConfined(([], false)) { [sender] in sender.isOnLaneThread(.urgent) }
        bulkOutcomesAwaiting = LoopConfined(([], false)) { [sender] in sender.isOnLaneThread(.bulk) }
    }

    // MARK: broker thread

    /// Jobs completed and not taken yet, by whether `isCurrent` says their broker connection is the current one.
    func completedCounts(isCurrent: (Int) -> Bool) -> (current: Int, stale: Int) {
        completions.withLock { queue in
            let current = queue.count { isCurrent($0.generation) }
            return (current, queue.count - current)
        }
    }

    var hasOutcomes: Bool { handedOver.withLock { !$0.jobs.isEmpty || !$0.pieces.isEmpty } }

    /// Takes the completed jobs of the broker connections `isStale` names, leaving the others.
    func takeCompleted(isStale: (Int) -> Bool) -> [JobProgress] {
        completions.withLock { queue in
            let stale = queue.filter { isStale($0.generation) }
            if !stale.isEmpty { queue.removeAll { isStale($0.generation) } }
            return stale
        }
    }

    /// The jobs completed since the last call.
    func takeCompleted() -> [JobProgress] {
        completions.withLock { queue in
            defer { queue.removeAll(keepingCapacity: true) }
            return queue
        }
    }

    /// The final outcomes handed over since the last call, large jobs' pieces' included.
    func takeOutcomes() -> [(jobID: String, outcomes: [SettledOutcome])] {
        let taken = takeOutcomesByWriter()
        return taken.pieces + taken.jobs
    }

    /// The final outcomes handed over since the last call: large jobs' pieces' (for the preparer to write) apart.
    func takeOutcomesByWriter() -> (
        jobs: [(jobID: String, outcomes: [SettledOutcome])], pieces: [(jobID: String, outcomes: [SettledOutcome])]
    ) {
        handedOver.withLock { handedOver in
            defer {
                handedOver.jobs.removeAll(keepingCapacity: true)
                handedOver.pieces.removeAll(keepingCapacity: true)
            }
            return (handedOver.jobs, handedOver.pieces)
        }
    }

    /// Notifications of one lane whose deadline passed before they could be handed to APNs: settled as expired on
    /// the lane's sender thread, which owns their jobs' progress while they are out.
    func settleExpired(_ expired: [QueuedNotification], lane: JobLane) {
        statistics.expired.add(expired.count, ordering: .relaxed)
        sender.schedule(after: 0, lane: lane) { [self] in
            for entry in expired {
                entry.progress.recordExpired(Int(entry.index))
                noteOutcome(of: entry.progress)
            }
        }
    }

    /// Notifications of one lane whose job was cancelled before they were handed to APNs: settled as cancelled on the
    /// lane's sender thread, which owns their jobs' progress while they are out.
    func settleCancelled(_ cancelled: [QueuedNotification], lane: JobLane) {
        guard !cancelled.isEmpty else { return }
        statistics.cancelled.add(cancelled.count, ordering: .relaxed)
        sender.schedule(after: 0, lane: lane) { [self] in
            for entry in cancelled {
                entry.progress.recordCancelled(Int(entry.index))
                noteOutcome(of: entry.progress)
            }
        }
    }

    // MARK: sender threads (each job's on its lane's)

    func record(_ result: APNsResult, for progress: JobProgress, _ index: Int) {
        if result.isPlainDelivery {
            // Nearly every answer, recorded without copying it out of the result (a few strings and header fields).
            progress.countJudgement()
            progress.recordDelivered(index)
            statistics.delivered.add(1, ordering: .relaxed)
            noteOutcome(of: progress)
            return
        }
        let answer = result.response
        if let answer { progress.countAnswer(answer) }
        // Metrics and summaries carry Apple's documented reasons or `other` (`APNsReason.label`), and without an
        // answer a fixed word: what an endpoint writes, or an error text, would make endless label values.
        let reasonLabel = answer?.reason?.label
        countUnsuccessful(result.outcome, answer: answer, reasonLabel: reasonLabel)
        switch result.outcome {
        case .delivered:
            progress.recordDelivered(index)
            statistics.delivered.add(1, ordering: .relaxed)
        case .deadToken:
            let response = answer ?? APNsResponse(status: 410)
            progress.recordDead(index, response)
            // A 400 mismatch is counted once the job is complete, as dead or as held back (the guard decides).
            if !APNsOutcome.isTokenMismatch(response) { statistics.deadTokens.add(1, ordering: .relaxed) }
        case .permanentFailure:
            recordFailed(
                index, of: progress,
                reason: answer.map { reasonLabel ?? "status \($0.status)" } ?? result.error ?? "not sent",
                answer: answer)
        case .expired:
            // Its deadline came while it waited for a connection or behind busy streams: not sent, as one that
            // expired before it was handed over (`settleExpired`).
            progress.recordExpired(index)
            statistics.expired.add(1, ordering: .relaxed)
        case .unserved:
            progress.recordUnserved(
                index, reason: result.error ?? "no APNs credential serves topic " + progress.job.topic)
        case .retryLater(let suggested):
            progress.recordRetryable(
                index, reason: reasonLabel ?? result.error ?? "retry later",
                label: reasonLabel ?? (answer == nil ? "no_answer" : "other"), delay: suggested)
        case .refreshTokenAndRetry, .replaceConnectionAndRetry:
            progress.recordRetryable(
                index, reason: reasonLabel ?? "provider token", label: reasonLabel ?? "other",
                delay: 1)
        }
        noteOutcome(of: progress)
    }

    /// What did not go through, by status and reason (without an answer, whether it was sent at all). An expired
    /// notification was not sent, and is counted as expired only.
    private func countUnsuccessful(_ outcome: APNsOutcome, answer: APNsResponse?, reasonLabel: String?) {
        guard outcome != .delivered && outcome != .expired else { return }
        let unanswered = outcome == .permanentFailure || outcome == .unserved ? "not_sent" : "no_answer"
        statistics.countUnsuccessful(status: answer?.status, reason: reasonLabel ?? (answer == nil ? unanswered : ""))
    }

    private func recordFailed(_ index: Int, of progress: JobProgress, reason: String, answer: APNsResponse?) {
        progress.recordFailed(index, reason: reason)
        statistics.permanentFailures.add(1, ordering: .relaxed)
        logger.warning(
            "notification failed",
            [
                "job.id": progress.job.id,
                "apns.reason": Redact.outsideText(answer?.reason?.rawValue ?? reason),
                "apns.status": String(answer?.status ?? 0),
                "apns.token": Redact.token(progress.targets[index].token)
            ])
    }

    /// After an outcome: a complete job goes back to the broker thread; final outcomes of a job still under way are
    /// handed over for the idempotency record within `outcomeInterval`.
    private func noteOutcome(of progress: JobProgress) {
        // A job's progress belongs to its lane's sender thread while its notifications are out: debug builds check
        // that every outcome is recorded there (the broker thread takes it back only once it is complete).
        assert(
            sender.isOnLaneThread(progress.delivery.lane),
            "job \(progress.job.id): outcome recorded off its lane's thread")
        if progress.isComplete {
            // A piece of a large job: its outcomes go to the idempotency record now, as those of a job under way do.
            // Carried into the whole job, they would wait in memory (a token each) until it all settles, and a crash
            // meanwhile would send again every notification the job had sent.
            if progress.assembly != nil, let outcomes = progress.takeUnrecordedFinal() {
                handedOver.withLock { $0.add(outcomes, of: progress) }
            }
            // From here the broker thread owns the job, its outcomes not yet recorded included (finishing settles it).
            progress.handedBack = true
            completions.withLock { $0.append(progress) }
            wakeup.signal()
        } else if progress.hasUnrecordedFinal && !progress.awaitsHandOver {
            progress.awaitsHandOver = true
            let lane = progress.delivery.lane
            let awaiting = outcomesAwaiting(lane)
            awaiting.value.jobs.append(progress)
            if !awaiting.value.scheduled {
                awaiting.value.scheduled = true
                sender.schedule(after: Self.outcomeInterval, lane: lane) { [self] in handOverOutcomes(of: lane) }
            }
        }
    }

    /// The final outcomes of a lane gathered over the last interval go to the broker thread in one hand-over.
    private func handOverOutcomes(of lane: JobLane) {
        let awaiting = outcomesAwaiting(lane)
        var batches = HandedOver()
        for progress in awaiting.value.jobs where !progress.handedBack {
            progress.awaitsHandOver = false
            if let outcomes = progress.takeUnrecordedFinal() { batches.add(outcomes, of: progress) }
        }
        awaiting.value = ([], false)
        guard !batches.jobs.isEmpty || !batches.pieces.isEmpty else { return }
        handedOver.withLock { handedOver in
            handedOver.jobs += batches.jobs
            handedOver.pieces += batches.pieces
        }
        wakeup.signal()
    }
}
