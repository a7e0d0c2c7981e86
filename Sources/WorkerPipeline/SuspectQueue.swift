/// Jobs that came back twice or more without being settled: they may be what stopped the workers they were delivered
/// to. Each runs alone (nothing else in progress from its start to its settling), so that if it stops this worker
/// too, its next delivery knows it; the jobs read meanwhile wait behind until no suspect is left. A value the broker
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
    /// The history key of the suspect under way, alone.
    public private(set) var alone: String?
    /// Deliveries read while suspects wait or run.
    public private(set) var behind: [JobDelivery] = []

    public init() {}

    /// Whether a suspect waits or runs: jobs read now wait behind, and no bulk job starts.
    public var isActive: Bool { alone != nil || !waiting.isEmpty }

    /// Takes what was just read; returns the jobs that may start now.
    public mutating func admit(usual: [JobDelivery], suspects: [JobDelivery]) -> [JobDelivery] {
        waiting += suspects
        guard isActive else { return usual }
        behind += usual
        return []
    }

    /// After a turn's work, with `jobsInFlight` jobs under way: the key of the suspect whose lone run ended (it
    /// settled), and what to start. A suspect starts once nothing is in flight; the jobs behind once no suspect is
    /// left; nothing while stopping.
    public mutating func step(jobsInFlight: Int, stopping: Bool,
                              key: (JobDelivery) -> String) -> (ended: String?, next: Step) {
        var ended: String?
        if let running = alone, jobsInFlight == 0 {
            ended = running
            alone = nil
        }
        guard alone == nil, !stopping else { return (ended, .none) }
        if !waiting.isEmpty {
            guard jobsInFlight == 0 else { return (ended, .none) }
            let suspect = waiting.removeFirst()
            let running = key(suspect)
            alone = running
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
