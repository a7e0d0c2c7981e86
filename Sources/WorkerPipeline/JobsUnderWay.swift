/// The deliveries a session started and has not settled yet, with a count per lane and per job id: what a bulk
/// suspect waits for (no other bulk job in progress), what a job's republished copy waits for (its original settled
/// here first), and what an orderly stop leaves to the broker.
struct JobsUnderWay {
    private(set) var deliveries: [UInt64: (delivery: JobDelivery, jobID: String)] = [:]
    private(set) var counts = LaneCounts()
    private var jobIDs: [String: Int] = [:]

    mutating func started(_ delivery: JobDelivery, jobID: String) {
        guard deliveries.updateValue((delivery, jobID), forKey: delivery.tag) == nil else { return }
        counts[delivery.lane] += 1
        jobIDs[jobID, default: 0] += 1
    }

    mutating func settled(_ tag: UInt64) {
        guard let (delivery, jobID) = deliveries.removeValue(forKey: tag) else { return }
        counts[delivery.lane] -= 1
        // One lookup (one hash of the id) for both the count and its removal.
        guard let index = jobIDs.index(forKey: jobID) else { return }
        if jobIDs.values[index] == 1 { jobIDs.remove(at: index) } else { jobIDs.values[index] -= 1 }
    }

    func contains(jobID: String) -> Bool { jobIDs[jobID] != nil }
}
