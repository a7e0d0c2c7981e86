import Foundation
import Synchronization

/// What this worker did for each large job since its last report to the fleet's record of progress (`apns-worker jobs
/// show`), reported about once a second. Only jobs that name themselves and have at least
/// `JobProgressDelta.minimumTargets` users and tokens are tracked. Broker thread only.
struct ProgressTracker {
    static let interval: Double = 1

    private var pending: [String: JobProgressDelta] = [:]
    private(set) var nextReport = Date.distantPast
    /// Large jobs in flight whose answers are reported as they come, not only once the job has them all: what each
    /// report so far said of them.
    private var followed: [ObjectIdentifier: Followed] = [:]

    private struct Followed {
        let progress: JobProgress
        let soFar: JobProgress.AnswersSoFar
        var delivered = 0, dead = 0, failed = 0
    }

    /// Windowed and scheduled jobs of any size are: their parts wait for hours, or the job for its send_at, and
    /// `jobs show` is where that is seen (a scheduled job leaves the scheduled list as it starts, and ends done).
    static func isTracked(_ progress: JobProgress) -> Bool {
        progress.hasStableID
            && (progress.job.localWindow != nil || progress.job.sendAt != nil
                || named(progress) >= JobProgressDelta.minimumTargets)
    }

    /// The users and tokens the job named as it arrived; for a retry, as its sender enqueued it (a retry's body names
    /// no users or tokens), or if that is not known, the notifications it sends again.
    private static func named(_ progress: JobProgress) -> Int {
        progress.window?.named ?? progress.job.originalNamed ?? progress.job.retryTargets?.count
            ?? progress.job.users.count + progress.job.tokens.count
    }

    /// Whether a job has enough notifications for its answers to be reported as they come (`followed`).
    private static func mayBeFollowed(_ progress: JobProgress) -> Bool {
        progress.targets.count >= JobProgressDelta.minimumTargets
    }

    var hasPending: Bool { !pending.isEmpty || !followed.isEmpty }

    private mutating func change(_ progress: JobProgress, _ body: (inout JobProgressDelta) -> Void) {
        guard Self.isTracked(progress) else { return }
        let id = progress.job.id
        var delta = pending[id] ?? JobProgressDelta(jobID: id)
        if delta.targets == 0 { delta.targets = Self.named(progress) }
        if delta.since == 0 { delta.since = Date().timeIntervalSince1970 }
        // Every report of a windowed job says so: one part running must not take the job off the scheduled list
        // while others wait.
        if progress.job.localWindow != nil { delta.windowed = true }
        body(&delta)
        pending[id] = delta
    }

    /// Notifications of the job (or a piece of it) resolved and queued: its first attempt's only, so that a retry does
    /// not count them twice.
    mutating func resolved(_ progress: JobProgress) {
        if Self.mayBeFollowed(progress) && Self.isTracked(progress) {
            followed[ObjectIdentifier(progress)] = Followed(progress: progress, soFar: progress.followAnswers())
        }
        guard progress.job.attempt == 1 else { return }
        change(progress) { $0.counts[.resolved, default: 0] += progress.targets.count }
    }

    /// Handed to APNs: `entries` as one hand-over gives them, a job's entries next to each other.
    mutating func sent(_ entries: [QueuedNotification]) {
        var start = 0
        while start < entries.count {
            let progress = entries[start].progress
            var end = start + 1
            while end < entries.count && entries[end].progress === progress { end += 1 }
            let count = end - start
            change(progress) { $0.counts[.sent, default: 0] += count }
            start = end
        }
    }

    /// A job, or a piece of a large one, has every answer in: what earlier reports did not say of it.
    mutating func answered(_ progress: JobProgress) {
        // A job too small to be followed is not looked up: a lookup hashes its key, for every job.
        let reported = Self.mayBeFollowed(progress) ? followed.removeValue(forKey: ObjectIdentifier(progress)) : nil
        change(progress) { delta in
            delta.counts[.delivered, default: 0] += progress.delivered - (reported?.delivered ?? 0)
            delta.counts[.dead, default: 0] += progress.dead.count - (reported?.dead ?? 0)
            delta.counts[.failed, default: 0] += progress.failed.count - (reported?.failed ?? 0)
            delta.counts[.expired, default: 0] += progress.expired
            delta.counts[.cancelled, default: 0] += progress.cancelled
        }
    }

    /// A job (of any size) that waits for its `send_at`: the fleet's record shows it as scheduled until then.
    mutating func scheduled(_ job: PushJob, at sendAt: Int64) {
        var delta = pending[job.id] ?? JobProgressDelta(jobID: job.id)
        if delta.targets == 0 { delta.targets = job.users.count + job.tokens.count }
        delta.scheduledFor = sendAt
        pending[job.id] = delta
    }

    /// A large job's users dropped unresolved by its cancellation.
    mutating func cancelled(_ progress: JobProgress, users: Int) {
        change(progress) { $0.counts[.cancelled, default: 0] += users }
    }

    /// A job's retryable notifications expired as it settled (a retry would come after its deadline).
    mutating func expired(_ whole: JobProgress, count: Int) {
        guard count > 0 else { return }
        change(whole) { $0.counts[.expired, default: 0] += count }
    }

    /// A job settled (acknowledged): the guard's verdict and the retry decision are known; `cancelledAt`, when the
    /// job was cancelled, under whichever of its names (its record then says so whichever name `jobs show` is given).
    mutating func settled(_ whole: JobProgress, _ decision: RetryPolicy.Decision, cancelledAt: Double? = nil) {
        change(whole) { delta in
            if let cancelledAt { delta.cancelledAt = cancelledAt }
            delta.counts[.dead, default: 0] -= whole.heldBack.count
            delta.counts[.heldBack, default: 0] += whole.heldBack.count
            if let window = whole.window {
                // What waited and came (a part) leaves the count; what waits now (parts published) joins it.
                delta.counts[.waitingForWindow, default: 0] += window.waiting - (window.isPart ? window.named : 0)
                delta.counts[.expired, default: 0] += window.expired
                if let latest = window.parts.map(\.opensAt).max() {
                    delta.windowsUntil = max(delta.windowsUntil ?? 0, latest)
                }
            }
            switch decision {
            case .retry:
                delta.retrying = whole.retryable.count
            case .park:
                delta.counts[.failed, default: 0] += whole.retryable.count
                delta.retrying = 0
                delta.ended = true
            case .none, .expire:
                delta.retrying = 0
                delta.ended = true
            }
        }
    }

    func isDue(at now: Date) -> Bool { hasPending && now >= nextReport }

    /// The answers of followed jobs since the last report.
    private mutating func noteAnswersSoFar() {
        for (key, var entry) in followed {
            let delivered = entry.soFar.delivered.load(ordering: .relaxed)
            let dead = entry.soFar.dead.load(ordering: .relaxed)
            let failed = entry.soFar.failed.load(ordering: .relaxed)
            guard delivered != entry.delivered || dead != entry.dead || failed != entry.failed else { continue }
            change(entry.progress) { delta in
                delta.counts[.delivered, default: 0] += delivered - entry.delivered
                delta.counts[.dead, default: 0] += dead - entry.dead
                delta.counts[.failed, default: 0] += failed - entry.failed
            }
            (entry.delivered, entry.dead, entry.failed) = (delivered, dead, failed)
            followed[key] = entry
        }
    }

    /// The deltas to report now; the tracker starts afresh.
    mutating func take(at now: Date) -> [JobProgressDelta] {
        noteAnswersSoFar()
        nextReport = now.addingTimeInterval(Self.interval)
        defer { pending.removeAll(keepingCapacity: true) }
        return Array(pending.values)
    }

    /// Deltas the store did not take go back, added to what came meanwhile.
    mutating func putBack(_ deltas: [JobProgressDelta]) {
        for earlier in deltas {
            var delta = pending[earlier.jobID] ?? JobProgressDelta(jobID: earlier.jobID)
            delta.add(earlier)
            pending[earlier.jobID] = delta
        }
    }
}
