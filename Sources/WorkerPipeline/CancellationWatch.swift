import Foundation

/// What the session loop knows of the fleet's cancelled jobs (`apns-worker jobs cancel`): read from the store every
/// `interval` while jobs are under way, a read of what was cancelled since the last one. Broker thread only.
struct CancellationWatch {
    /// How often the store is asked while jobs are under way: a cancelled job's notifications stop within this, plus
    /// the answers of those already handed to APNs.
    static let interval: Double = 0.25
    /// Cancellations are read again from this far before the newest one read: they are stamped by the clock of the
    /// machine that ran `jobs cancel`, which may be behind another's.
    static let clockSkew: Double = 60

    /// The cancelled jobs' ids as far as this worker knows, with when each was cancelled (UNIX seconds).
    private var cancelledAt: [String: Double] = [:]
    /// The newest cancellation read (UNIX seconds); nil before the first read, which reads them all.
    private var newest: Double?
    private(set) var nextRead = Date.distantPast

    /// Only a job that names itself (an id of its own or a message-id) can be cancelled: a fallback id is no name an
    /// operator could give. A job with an id of its own answers to its message's message-id too (`jobs cancel` takes
    /// either, and a publisher knows the one it set).
    static func names(_ progress: JobProgress, among ids: Set<String>) -> Bool {
        (progress.hasStableID && ids.contains(progress.job.id))
            || progress.delivery.properties.idForJob.map(ids.contains) == true
    }

    /// `entries` in two, each in its order: those of jobs not among `ids`, and those of jobs among them.
    static func split(_ entries: some Collection<QueuedNotification>, among ids: Set<String>)
        -> (kept: [QueuedNotification], cancelled: [QueuedNotification])
    {
        var kept: [QueuedNotification] = []
        var cancelled: [QueuedNotification] = []
        kept.reserveCapacity(entries.count)
        for entry in entries {
            if names(entry.progress, among: ids) { cancelled.append(entry) } else { kept.append(entry) }
        }
        return (kept, cancelled)
    }

    /// Whether a job of this id, naming itself (`named`), or its message's message-id (`names`) is cancelled.
    func isCancelled(jobID: String, named: Bool, messageID: String?) -> Bool {
        guard !cancelledAt.isEmpty else { return false }
        return (named && cancelledAt[jobID] != nil) || messageID.map { cancelledAt[$0] != nil } == true
    }

    /// When `progress`'s job was cancelled (UNIX seconds), under either of its names; nil if it was not.
    func cancelledAt(of progress: JobProgress) -> Double? {
        guard !cancelledAt.isEmpty else { return nil }
        if progress.hasStableID, let at = cancelledAt[progress.job.id] { return at }
        return progress.delivery.properties.idForJob.flatMap { cancelledAt[$0] }
    }

    /// Whether `progress`'s job is among the cancelled ones: nothing to look up while none is.
    func isCancelled(_ progress: JobProgress) -> Bool {
        !cancelledAt.isEmpty
            && isCancelled(
                jobID: progress.job.id, named: progress.hasStableID,
                messageID: progress.delivery.properties.idForJob)
    }

    /// Whether the store is to be asked now.
    func isDue(at now: Date) -> Bool { now >= nextRead }

    /// Reads the cancellations since the last read; returns the jobs this worker had not known were cancelled. A
    /// store that refuses or does not answer is asked again at the next interval.
    mutating func refresh(from source: any JobCancellations, now: Date) throws -> (fresh: Set<String>, refused: String?)
    {
        nextRead = now.addingTimeInterval(Self.interval)
        switch try source.cancelled(since: newest.map { $0 - Self.clockSkew }) {
        case .answered(let jobs):
            var fresh = Set<String>()
            for job in jobs where cancelledAt.updateValue(job.at, forKey: job.jobID) == nil { fresh.insert(job.jobID) }
            if let last = jobs.map(\.at).max() { newest = max(newest ?? last, last) }
            // What the store no longer keeps goes here too, whether or not anything new came: a worker that kept an
            // old cancellation would drop a new job that reuses the id, which a worker started later would send.
            if !cancelledAt.isEmpty {
                let oldest = now.timeIntervalSince1970 - Double(CancelledJob.retention)
                cancelledAt = cancelledAt.filter { $0.value >= oldest }
            }
            return (fresh, nil)
        case .refused(let message):
            return ([], message)
        case .unavailable:
            return ([], nil)
        }
    }
}
