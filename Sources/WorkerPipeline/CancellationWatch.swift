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

    /// The cancelled jobs' ids, as far as this worker knows.
    private(set) var jobIDs: Set<String> = []
    private var cancelledAt: [String: Double] = [:]
    /// The newest cancellation read (UNIX seconds); nil before the first read, which reads them all.
    private var newest: Double?
    private(set) var nextRead = Date.distantPast

    /// Whether `progress`'s job is among the cancelled ones: nothing to look up while none is.
    func isCancelled(_ progress: JobProgress) -> Bool { !jobIDs.isEmpty && OutgoingQueue.isCancelled(progress, jobIDs) }

    /// Whether the store is to be asked now.
    func isDue(at now: Date) -> Bool { now >= nextRead }

    /// Reads the cancellations since the last read; returns the jobs this worker had not known were cancelled. A
    /// store that refuses or does not answer is asked again at the next interval.
    mutating func refresh(from source: any JobCancellations, now: Date) throws -> (fresh: Set<String>, refused: String?) {
        nextRead = now.addingTimeInterval(Self.interval)
        switch try source.cancelled(since: newest.map { $0 - Self.clockSkew }) {
        case .answered(let jobs):
            var fresh = Set<String>()
            for job in jobs where cancelledAt.updateValue(job.at, forKey: job.jobID) == nil {
                jobIDs.insert(job.jobID)
                fresh.insert(job.jobID)
            }
            if let last = jobs.map(\.at).max() { newest = max(newest ?? last, last) }
            forget(before: now.timeIntervalSince1970 - Double(Self.retention))
            return (fresh, nil)
        case .refused(let message):
            return ([], message)
        case .unavailable:
            return ([], nil)
        }
    }

    /// As long as the store keeps a cancellation (seconds).
    static let retention = 7 * 24 * 3600

    private mutating func forget(before oldest: Double) {
        guard cancelledAt.count > 1024 || (cancelledAt.values.min() ?? oldest) < oldest else { return }
        for (id, at) in cancelledAt where at < oldest {
            cancelledAt[id] = nil
            jobIDs.remove(id)
        }
    }
}
