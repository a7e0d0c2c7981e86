/// Which delivered jobs are poison: a job that stops every worker it is delivered to would otherwise go from worker
/// to worker for ever.
///
/// A job's deliveries are counted by the broker (quorum queues) or, where it does not count them, by the fleet in
/// the store under the job's history key. From `suspectFrom` deliveries on, a job came back twice without being
/// settled (one broker failover explains one redelivery, not two); if moreover the worker that last ran it died with
/// it (its running mark is still there: a redelivered job is marked while it runs), it is a suspect and runs alone,
/// so that if it stops this worker too, its next delivery knows it. Deliveries lost with a connection, a node or a
/// partition were never started, or were handed back: they leave no mark and make no suspect. A job delivered more
/// than `maximumDeliveries` times whose last lone run never settled is poison: parked unread.
public struct DeliveryTriage: Sendable, Equatable {
    /// Deliveries of one job at most.
    public var maximumDeliveries: Int

    public init(maximumDeliveries: Int) {
        self.maximumDeliveries = maximumDeliveries
    }

    /// A job at this delivery or later is a suspect.
    public var suspectFrom: Int { min(3, maximumDeliveries + 1) }

    /// The key a job's delivery history is kept under: its message-id or, without one, its body.
    public static func historyKey(_ delivery: JobDelivery) -> String {
        delivery.properties.idForJob.map { "id:" + $0 } ?? "body:" + fingerprint(delivery.body)
    }

    /// FNV-1a, 64 bits, in hex: the same body gives the same key in every worker (Swift's `Hasher` is seeded per
    /// process).
    public static func fingerprint(_ body: [UInt8]) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in body {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16)
    }

    /// Deliveries so far of a batch's redelivered jobs, as far as the broker counts them (by delivery tag, this
    /// delivery included); and the history keys of those it does not count, for the store to count. First
    /// deliveries cost nothing.
    public func brokerCounts(of batch: [JobDelivery]) -> (
        counts: [UInt64: Int], uncounted: [(tag: UInt64, key: String)]
    ) {
        var counts: [UInt64: Int] = [:]
        var uncounted: [(tag: UInt64, key: String)] = []
        for delivery in batch where delivery.redelivered {
            // On a classic queue the header is the publisher's: a negative count is none (the store counts), and Long.MAX
            // must make poison, not stop the worker.
            if let before = delivery.properties.deliveryCount, before >= 0 {
                counts[delivery.tag] = before == .max ? .max : before + 1
            } else {
                uncounted.append((delivery.tag, Self.historyKey(delivery)))
            }
        }
        return (counts, uncounted)
    }

    /// Adds what the store counted: redeliveries per history key (the first delivery is never counted there).
    public func merging(
        _ counts: [UInt64: Int], uncounted: [(tag: UInt64, key: String)],
        storeRedeliveries: [String: Int]
    ) -> [UInt64: Int] {
        var merged = counts
        for (tag, key) in uncounted {
            if let redelivered = storeRedeliveries[key] { merged[tag] = redelivered + 1 }
        }
        return merged
    }

    /// Deliveries that followed an orderly stop (the job given back unfinished) do not count: two rolling restarts
    /// make no suspect. A job's first delivery always counts.
    public func discounting(
        _ deliveries: [UInt64: Int], of batch: [JobDelivery],
        givenBack: [String: Int]
    ) -> [UInt64: Int] {
        guard !givenBack.isEmpty else { return deliveries }
        var discounted = deliveries
        for delivery in batch {
            guard let count = deliveries[delivery.tag], let back = givenBack[Self.historyKey(delivery)] else {
                continue
            }
            discounted[delivery.tag] = max(1, count - back)
        }
        return discounted
    }

    /// A poison job, with how often it was delivered.
    public struct Poison: Sendable {
        public var delivery: JobDelivery
        public var deliveries: Int
        public var historyKey: String

        public init(delivery: JobDelivery, deliveries: Int, historyKey: String) {
            self.delivery = delivery
            self.deliveries = deliveries
            self.historyKey = historyKey
        }
    }

    public struct Sorted: Sendable {
        /// Started as usual.
        public var usual: [JobDelivery] = []
        /// Started alone, one after the other.
        public var suspects: [JobDelivery] = []
        /// Parked unread.
        public var poison: [Poison] = []
    }

    /// The history keys of the jobs delivered often enough to be suspects, if the worker that last ran them died.
    public func suspectCandidates(_ batch: [JobDelivery], deliveries: [UInt64: Int]) -> [String] {
        batch.filter { (deliveries[$0.tag] ?? 1) >= suspectFrom }.map(Self.historyKey)
    }

    /// Sorts a batch by its jobs' deliveries so far (absent: a first delivery), the history keys whose last lone run
    /// ended without settling, and those whose last run ended without settling (`ranAndDied`).
    public func sort(
        _ batch: [JobDelivery], deliveries: [UInt64: Int], diedAlone: Set<String>,
        ranAndDied: Set<String>
    ) -> Sorted {
        guard !deliveries.isEmpty else { return Sorted(usual: batch) }
        var sorted = Sorted()
        for delivery in batch {
            let count = deliveries[delivery.tag] ?? 1
            let key = Self.historyKey(delivery)
            if count > maximumDeliveries, diedAlone.contains(key) {
                sorted.poison.append(Poison(delivery: delivery, deliveries: count, historyKey: key))
            } else if count >= suspectFrom && (ranAndDied.contains(key) || diedAlone.contains(key)) {
                sorted.suspects.append(delivery)
            } else {
                sorted.usual.append(delivery)
            }
        }
        return sorted
    }

    /// Why a poison job is parked, for its reason header.
    public func reason(_ poison: Poison) -> String {
        "delivered \(poison.deliveries) times, more than the \(maximumDeliveries) allowed, and the last time it was "
            + "the only job of a worker that ended without settling it: the job stops workers"
    }
}
