/// The deliveries a session started and has not settled yet, with a count per lane: what a bulk suspect waits for
/// (no other bulk job in progress), and what an orderly stop leaves to the broker.
struct JobsUnderWay {
    private(set) var deliveries: [UInt64: JobDelivery] = [:]
    private(set) var counts = LaneCounts()

    mutating func started(_ delivery: JobDelivery) {
        guard deliveries.updateValue(delivery, forKey: delivery.tag) == nil else { return }
        counts[delivery.lane] += 1
    }

    mutating func settled(_ tag: UInt64) {
        guard let delivery = deliveries.removeValue(forKey: tag) else { return }
        counts[delivery.lane] -= 1
    }
}
