/// The deliveries a session started and has not settled yet, with a count per lane: what a bulk suspect waits for
/// (no other bulk job in progress), what a job's republished copy waits for (its original settled here first), and
/// what an orderly stop leaves to the broker.
struct JobsUnderWay {
    private(set) var deliveries: [UInt64: (delivery: JobDelivery, jobID: String)] = [:]
    private(set) var counts = LaneCounts()

    mutating func started(_ delivery: JobDelivery, jobID: String) {
        guard deliveries.updateValue((delivery, jobID), forKey: delivery.tag) == nil else { return }
        counts[delivery.lane] += 1
    }

    mutating func settled(_ tag: UInt64) {
        guard let (delivery, _) = deliveries.removeValue(forKey: tag) else { return }
        counts[delivery.lane] -= 1
    }

    /// The ids of the jobs under way, gathered when asked for: only republished copies ask, which is rare, while an
    /// index kept by id would cost every job two hashes of its id.
    var jobIDs: Set<String> { Set(deliveries.values.lazy.map(\.jobID)) }
}
