import AMQP

/// Settles deliveries with as few frames as possible. Jobs finish out of order, so each finished batch is
/// acknowledged with one `multiple` ack up to its highest tag when no delivery below that tag is still under way,
/// and one by one otherwise. A single-token job flow thus costs the broker one ack frame per batch, not per job.
///
/// Broker thread only, one per AMQP connection (delivery tags are per channel).
final class Acknowledgements {
    private let amqp: AMQPConnection
    /// Delivered and neither acknowledged nor rejected yet.
    private var unsettled = UnsettledTags()

    init(amqp: AMQPConnection) {
        self.amqp = amqp
    }

    func received(_ deliveryTag: UInt64) { unsettled.insert(deliveryTag) }

    /// Acknowledges `tags` (all of them delivered on this connection, none settled yet).
    func acknowledge(_ tags: [UInt64]) throws(AMQPError) {
        guard !tags.isEmpty else { return }
        for tag in tags { unsettled.remove(tag) }
        // A multiple ack covers every outstanding tag up to its own: only safe below the oldest still under way.
        let oldestUnderWay = unsettled.oldest ?? .max
        var highestCovered: UInt64?
        for tag in tags {
            if tag < oldestUnderWay {
                highestCovered = max(highestCovered ?? 0, tag)
            } else {
                try amqp.ack(tag)
            }
        }
        if let highestCovered { try amqp.ack(highestCovered, multiple: true) }
    }

    /// Gives a delivery back to the broker for another try.
    func requeue(_ deliveryTag: UInt64) throws(AMQPError) {
        unsettled.remove(deliveryTag)
        try amqp.reject(deliveryTag, requeue: true)
    }
}

/// Delivery tags received and not settled yet. A channel numbers its deliveries 1, 2, 3, ... in the order it sends
/// them, so they are kept as a window of flags from the oldest unsettled tag on: no hash per delivery, and the oldest,
/// which every acknowledgement asks for, at hand. A tag out of that order (below the window, or far past it: which a
/// broker does not send) goes to a set beside it, so that nothing is ever forgotten.
struct UnsettledTags {
    /// `flags[head + i]`: whether tag `first + i` is unsettled. Tags skipped over (never received here) are false.
    private var flags: [Bool] = []
    private var head = 0
    private var first: UInt64 = 0
    private var outsideWindow = Set<UInt64>()

    private var windowEnd: UInt64 { first + UInt64(flags.count - head) }

    mutating func insert(_ tag: UInt64) {
        if !outsideWindow.isEmpty && outsideWindow.contains(tag) { return }
        if head == flags.count {
            flags.removeAll(keepingCapacity: true)
            head = 0
            first = tag
            flags.append(true)
        } else if tag >= windowEnd && tag - windowEnd < 1 << 16 {
            flags.append(contentsOf: repeatElement(false, count: Int(tag - windowEnd)))
            flags.append(true)
        } else if tag >= first && tag < windowEnd {
            flags[head + Int(tag - first)] = true
        } else {
            outsideWindow.insert(tag)
        }
    }

    mutating func remove(_ tag: UInt64) {
        if !outsideWindow.isEmpty { outsideWindow.remove(tag) }
        guard tag >= first && tag < windowEnd else { return }
        flags[head + Int(tag - first)] = false
        while head < flags.count && !flags[head] {
            head += 1
            first += 1
        }
        // The settled front is dropped in bulk, not one flag at a time.
        if head == flags.count {
            flags.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 1024 && head >= flags.count / 2 {
            flags.removeFirst(head)
            head = 0
        }
    }

    /// The oldest tag still unsettled.
    var oldest: UInt64? {
        let inWindow: UInt64? = head < flags.count ? first : nil
        guard let lowest = outsideWindow.min() else { return inWindow }
        return min(lowest, inWindow ?? .max)
    }
}
