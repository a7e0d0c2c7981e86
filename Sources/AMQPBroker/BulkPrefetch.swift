/// The bulk lane's prefetch, by bytes. RabbitMQ counts a consumer's prefetch in messages, and a bulk job is anything
/// from a few hundred bytes to a campaign of 100,000 users (about 900 KB): a prefetch of 100 has the broker hand over
/// a hundred campaigns at once, every body held as delivered. So the bulk consumer's prefetch is as many bodies of
/// the size seen lately as fit in `maximumBytes`, at most `maximumCount`, at least one. RabbitMQ fixes a consumer's
/// prefetch when it starts: one off by half or more is replaced, by one of what fits beside the bodies held (at
/// least one: the lane always has a consumer, and one job always runs).
///
/// A target, not a cap: what a consumer was handed before it was replaced stays held, and a prefetch set while the
/// bodies were small lets the broker hand over that many large ones before the first is read. The size seen lately
/// rises at once with a large body and falls slowly (each smaller body weighs an eighth), so that a campaign among
/// small jobs brings the prefetch down at its first body and a run of small jobs raises it only gradually.
///
/// This only decides, from the bulk deliveries held (`Acknowledgements` keeps them): `AMQPJobBroker` cancels and
/// consumes.
struct BulkPrefetch: Equatable {
    /// Bulk deliveries held unacknowledged at most, whatever their size.
    let maximumCount: Int
    /// Bytes of bulk bodies held unacknowledged, which the prefetch aims at.
    let maximumBytes: Int
    /// The first consumer's, before any body was seen: a session that starts on a backlog of campaigns holds a few.
    static let firstPrefetch = 4

    /// The size of the bodies seen lately: the largest at once, smaller ones by an eighth each.
    private(set) var typicalBytes: Double?
    /// The running consumer's prefetch; nil before one starts.
    private(set) var consumerPrefetch: Int?

    init(maximumCount: Int, maximumBytes: Int) {
        self.maximumCount = maximumCount
        self.maximumBytes = maximumBytes
    }

    /// The first consumer's prefetch.
    var initialPrefetch: Int { min(maximumCount, Self.firstPrefetch) }

    /// A bulk body delivered, of `bytes`.
    mutating func seen(bytes: Int) {
        let size = Double(bytes)
        typicalBytes = typicalBytes.map { size >= $0 ? size : $0 + (size - $0) / 8 } ?? size
    }

    mutating func started(prefetch: Int) { consumerPrefetch = prefetch }

    /// The prefetch that suits the bodies seen lately, held ones aside.
    private var suited: Int {
        guard let typicalBytes else { return initialPrefetch }
        return min(maximumCount, max(1, Int(Double(maximumBytes) / max(1, typicalBytes))))
    }

    /// What fits beside the deliveries `held`: `suited` at most, one at least.
    private func fitting(_ held: Acknowledgements.BulkHeld) -> Int {
        guard let typicalBytes, held.count > 0 else { return suited }
        return min(suited, max(1, Int(Double(maximumBytes - held.bytes) / max(1, typicalBytes))))
    }

    /// The prefetch of the consumer that should replace the running one (or start), if any, with `held` unsettled.
    func replacement(holding held: Acknowledgements.BulkHeld) -> Int? {
        let fit = fitting(held)
        guard let running = consumerPrefetch else { return fit }
        // Too generous for these bodies: replaced by what fits now (never more than suits them, so less than it).
        if running >= 2 * suited { return fit }
        // Twice as many fit, or as many as the setting allows.
        return fit > running && fit >= min(2 * running, maximumCount) ? fit : nil
    }
}
