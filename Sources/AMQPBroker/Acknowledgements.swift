import AMQP
import WorkerPipeline

/// Settles deliveries with as few frames as possible. Jobs finish out of order, so each finished batch is
/// acknowledged with one `multiple` ack up to its highest tag when no delivery below that tag is still under way,
/// and one by one otherwise. A single-token job flow thus costs the broker one ack frame per batch, not per job.
///
/// Broker thread only, one per AMQP connection (delivery tags are per channel).
final class Acknowledgements {
    private let amqp: AMQPConnection
    /// Delivered and neither acknowledged nor rejected yet, with the size of each bulk delivery's body (-1 for an
    /// urgent one): what the bulk lane holds (`BulkPrefetch`).
    private var unsettled = DeliveryTagWindow<Int>()
    private(set) var bulkHeld = BulkHeld()

    /// The bulk deliveries unsettled: how many, and their bodies' bytes.
    struct BulkHeld: Equatable {
        var count = 0
        var bytes = 0
    }

    init(amqp: AMQPConnection) {
        self.amqp = amqp
    }

    /// `bulkBytes`: the body's size of a bulk delivery, nil for an urgent one.
    func received(_ deliveryTag: UInt64, bulkBytes: Int?) {
        unsettled.insert(bulkBytes ?? -1, for: deliveryTag)
        if let bulkBytes {
            bulkHeld.count += 1
            bulkHeld.bytes += bulkBytes
        }
    }

    private func settle(_ tag: UInt64) {
        guard let bulkBytes = unsettled.remove(tag), bulkBytes >= 0 else { return }
        bulkHeld.count -= 1
        bulkHeld.bytes -= bulkBytes
    }

    /// Acknowledges `tags` (all of them delivered on this connection, none settled yet).
    func acknowledge(_ tags: [UInt64]) throws(AMQPError) {
        guard !tags.isEmpty else { return }
        for tag in tags { settle(tag) }
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
        settle(deliveryTag)
        try amqp.reject(deliveryTag, requeue: true)
    }
}
