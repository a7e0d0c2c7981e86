import APNsModel

/// Jobs that came back twice or more without being settled: they may be what stopped the workers they were delivered
/// to. Each runs alone in its lane's sense (nothing else in progress from its start to its settling: for a bulk
/// suspect, no other bulk job; for an urgent one, no other job at all), so that if it stops this worker too, its next
/// delivery knows it. Urgent jobs keep flowing while a bulk suspect waits or runs: a campaign's poison job must not
/// stop the urgent lane. The jobs a suspect holds back wait behind until no suspect is left. A value the broker
/// thread owns; the worker performs what it says (the Redis mark, starting the jobs).
public struct SuspectQueue: Sendable {
    /// What to do after a turn's work.
    public enum Step: Sendable {
        case none
        /// Start this suspect, alone (`key`: its history key, now `alone`).
        case startAlone(JobDelivery, key: String)
        /// Start these jobs, as usual (no suspect is left).
        case dispatch([JobDelivery])
    }

    public private(set) var waiting: [JobDelivery] = []
    /// The history key of the suspect under way, alone, and its lane.
    public private(set) var alone: (key: String, lane: JobLane)?
    /// Deliveries read while suspects wait or run, and held back by them.
    public private(set) var behind: [JobDelivery] = []

    public init() {}

    /// Whether a suspect waits or runs: bulk jobs read now wait behind, and no bulk job starts.
    public var isActive: Bool { alone != nil || !waiting.isEmpty }

    /// Whether an urgent suspect waits or runs: then urgent jobs wait behind too.
    public var holdsUrgent: Bool { alone?.lane == .urgent || waiting.contains { $0.lane == .urgent } }

    /// Takes what was just read; returns the jobs that may start now.
    public mutating func admit(usual: [JobDelivery], suspects: [JobDelivery]) -> [JobDelivery] {
        waiting += suspects
        guard isActive else { return usual }
        guard !holdsUrgent else {
            behind += usual
            return []
        }
        behind += usual.filter { $0.lane == .bulk }
        return usual.filter { $0.lane == .urgent }
    }

    /// After a turn's work, with `jobsInFlight` jobs under way per lane: the key of the suspect whose lone run ended
    /// (it settled), and what to start. A bulk suspect starts once no bulk job is in flight, an urgent one once no job
    /// is; the jobs behind once no suspect is left; nothing while stopping.
    public mutating func step(
        jobsInFlight: LaneCounts, stopping: Bool,
        key: (JobDelivery) -> String
    ) -> (ended: String?, next: Step) {
        func clear(for lane: JobLane) -> Bool { lane == .urgent ? jobsInFlight.total == 0 : jobsInFlight.bulk == 0 }
        var ended: String?
        if let running = alone, clear(for: running.lane) {
            ended = running.key
            alone = nil
        }
        guard alone == nil, !stopping else { return (ended, .none) }
        if let suspect = waiting.first {
            guard clear(for: suspect.lane) else { return (ended, .none) }
            waiting.removeFirst()
            let running = key(suspect)
            alone = (running, suspect.lane)
            return (ended, .startAlone(suspect, key: running))
        }
        guard !behind.isEmpty else { return (ended, .none) }
        defer { behind.removeAll() }
        return (ended, .dispatch(behind))
    }

    /// Everything read and not started, to give back to the broker (a stop).
    public mutating func giveBack() -> [JobDelivery] {
        defer {
            waiting.removeAll()
            behind.removeAll()
        }
        return waiting + behind
    }
}
