/// The deliveries a session started and has not settled yet, with a count per lane: what a bulk suspect waits for
/// (no other bulk job in progress), what a job's republished copy waits for (its original settled here first), and
/// what an orderly stop leaves to the broker.
struct JobsUnderWay {
    /// By delivery tag: a window, not a dictionary (no hash per job).
    private(set) var deliveries = DeliveryTagWindow<(delivery: JobDelivery, jobID: String)>()
    private(set) var counts = LaneCounts()
    /// Jobs under way per id, kept only while republished copies wait (`contains(jobID:)` builds it, the session loop
    /// drops it with `stopIndexingIDs` on a turn with no copy waiting): kept always, it would cost every job two hashes
    /// of its id.
    private var idCounts: [String: Int]?

    mutating func started(_ delivery: JobDelivery, jobID: String) {
        guard deliveries.insert((delivery, jobID), for: delivery.tag) else { return }
        counts[delivery.lane] += 1
        if idCounts != nil { idCounts![jobID, default: 0] += 1 }
    }

    mutating func settled(_ tag: UInt64) {
        guard let (delivery, jobID) = deliveries.remove(tag) else { return }
        counts[delivery.lane] -= 1
        guard idCounts != nil, let index = idCounts!.index(forKey: jobID) else { return }
        if idCounts!.values[index] == 1 { idCounts!.remove(at: index) } else { idCounts!.values[index] -= 1 }
    }

    /// Whether a job with this id is under way. The first call indexes the jobs under way by id; the index is kept up
    /// to date from then on, until `stopIndexingIDs`.
    mutating func contains(jobID: String) -> Bool {
        if idCounts == nil {
            idCounts = Dictionary(deliveries.values.lazy.map { ($0.jobID, 1) }, uniquingKeysWith: +)
        }
        return idCounts![jobID] != nil
    }

    /// No copy waits any more: jobs stop paying for the index by id.
    mutating func stopIndexingIDs() { idCounts = nil }
}
