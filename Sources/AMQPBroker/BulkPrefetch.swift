/// The bulk lane's prefetch, by bytes. RabbitMQ counts a consumer's prefetch in messages, and a bulk job is anything
/// from a few hundred bytes to a campaign of 100,000 users (about 900 KB): a prefetch of 100 has the broker hand over
/// a hundred campaigns at once, every body held as delivered. So the bulk consumer's prefetch is as many bodies of
/// the size seen lately as fit in `maximumBytes`, at most `maximumCount`, at least one; as RabbitMQ fixes a
/// consumer's prefetch when it starts, a prefetch that is off by half or more means a new consumer: one too large is
/// stopped at once and started again once what it handed over leaves room, one too small is replaced as soon as
/// twice as many fit.
///
/// Bodies of a size in between take the prefetch in steps: this only decides, `AMQPJobBroker` cancels and consumes.
struct BulkPrefetch: Equatable {
    /// Bulk deliveries held unacknowledged at most, whatever their size.
    let maximumCount: Int
    /// Bytes of bulk bodies held unacknowledged, which the prefetch aims at.
    let maximumBytes: Int
    /// The first consumer's, before any body was seen: a session that starts on a backlog of campaigns holds a few.
    static let firstPrefetch = 4

    /// Held bulk deliveries: their delivery tags and body sizes.
    private var held: [UInt64: Int] = [:]
    private(set) var heldBytes = 0
    /// The size of the bodies seen lately: a moving average, each new body weighing an eighth.
    private(set) var typicalBytes: Double?
    /// The running consumer's prefetch; nil while none runs.
    private(set) var consumerPrefetch: Int?

    /// What the consumer should do.
    enum Change: Equatable {
        /// Cancel it: it may hand over more than fits.
        case stop
        /// Start one with this prefetch, in place of the one running if there is one.
        case start(prefetch: Int)
    }

    init(maximumCount: Int, maximumBytes: Int) {
        self.maximumCount = maximumCount
        self.maximumBytes = maximumBytes
    }

    /// The first consumer's prefetch.
    var initialPrefetch: Int { min(maximumCount, Self.firstPrefetch) }

    mutating func delivered(_ tag: UInt64, bytes: Int) {
        held[tag] = bytes
        heldBytes += bytes
        typicalBytes = typicalBytes.map { $0 + (Double(bytes) - $0) / 8 } ?? Double(bytes)
    }

    /// A delivery settled (acknowledged or handed back); tags of the urgent lane are not held here.
    mutating func settled(_ tag: UInt64) {
        guard !held.isEmpty, let bytes = held.removeValue(forKey: tag) else { return }
        heldBytes -= bytes
    }

    mutating func started(prefetch: Int) { consumerPrefetch = prefetch }
    mutating func stopped() { consumerPrefetch = nil }

    /// The prefetch that suits the bodies seen lately, held ones aside.
    private var suited: Int {
        guard let typicalBytes else { return initialPrefetch }
        return min(maximumCount, max(1, Int(Double(maximumBytes) / max(1, typicalBytes))))
    }

    /// What fits beside the deliveries held now: `suited` at most, and one when nothing is held (one job always runs).
    private var fitting: Int {
        guard let typicalBytes, !held.isEmpty else { return suited }
        return min(suited, max(0, Int(Double(maximumBytes - heldBytes) / max(1, typicalBytes))))
    }

    /// The change the consumer needs now, if any.
    var change: Change? {
        guard let running = consumerPrefetch else {
            let fit = fitting
            return fit >= 1 ? .start(prefetch: fit) : nil
        }
        if running >= 2 * suited { return .stop }
        let fit = fitting
        return fit >= 2 * running ? .start(prefetch: fit) : nil
    }
}
