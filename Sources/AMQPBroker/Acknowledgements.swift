import AMQP
import Foundation
import WorkerPipeline

/// Settles deliveries with as few frames as possible. Jobs finish out of order, so each finished batch is
/// acknowledged with one `multiple` ack up to its highest tag below the oldest delivery still under way. Finished
/// deliveries above that one are held back to go with its `multiple` ack, rather than taking a frame each: within
/// `holdingTime` and up to `holdingLimit` of them, after which they are acknowledged one by one, as they are at once
/// while a bulk delivery is under way. A single-token job flow over several connections to APNs, whose answers come
/// back in any order, thus costs the broker about one ack frame per batch, not one per job that finished before an
/// older one.
///
/// Broker thread only, one per AMQP connection (delivery tags are per channel).
final class Acknowledgements {
    private let amqp: AMQPConnection
    /// Delivered and neither acknowledged nor rejected yet, with the size of each bulk delivery's body (-1 for an
    /// urgent one): what the bulk lane holds (`BulkPrefetch`).
    private var unsettled = DeliveryTagWindow<Int>()
    private(set) var bulkHeld = BulkHeld()
    /// Finished deliveries waiting for an older one under way, unacknowledged, each with when it finished, oldest
    /// first: they count against the prefetch, hence the limit, and a crash would have them delivered again, hence
    /// the time.
    private var held: [(tag: UInt64, since: Date)] = []
    private let holdingLimit: Int
    private let holdingTime: TimeInterval
    /// Sent since the last `takeFrames`.
    private var frames = AcknowledgementFrames()

    /// The bulk deliveries unsettled: how many, and their bodies' bytes.
    struct BulkHeld: Equatable {
        var count = 0
        var bytes = 0
    }

    /// `holdingLimit`: finished deliveries that may wait for an older one, at most; `holdingTime`: seconds they may.
    init(amqp: AMQPConnection, holdingLimit: Int, holdingTime: TimeInterval = 0.02) {
        self.amqp = amqp
        self.holdingLimit = max(0, holdingLimit)
        self.holdingTime = holdingTime
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

    /// Acknowledges `tags` (all of them delivered on this connection, none settled yet): at once, or held back a
    /// little to go with an older delivery's ack (`due`).
    func acknowledge(_ tags: [UInt64]) throws(AMQPError) {
        guard !tags.isEmpty else { return }
        let now = Date()
        for tag in tags {
            settle(tag)
            held.append((tag, now))
        }
        try acknowledgeCovered()
        // A bulk job under way (a campaign's users, resolved a piece at a time) takes seconds: nothing waits for it.
        try acknowledgeHeld(dueBy: bulkHeld.count > 0 ? .distantFuture : now)
    }

    /// When the oldest finished delivery held back must be acknowledged, if any is.
    var due: Date? { held.first.map { $0.since.addingTimeInterval(holdingTime) } }

    /// Acknowledges one by one the finished deliveries held back that are due by `now` or beyond the limit, every
    /// one of them if `now` is nil.
    func acknowledgeHeld(dueBy now: Date?) throws(AMQPError) {
        let heldLongEnough = now.map { $0.addingTimeInterval(-holdingTime) } ?? .distantFuture
        var sent = 0
        while sent < held.count && (held.count - sent > holdingLimit || held[sent].since <= heldLongEnough) {
            try amqp.ack(held[sent].tag)
            frames.single += 1
            sent += 1
        }
        held.removeFirst(sent)
    }

    /// One `multiple` ack for the held deliveries that no delivery under way is older than; the others stay.
    private func acknowledgeCovered() throws(AMQPError) {
        // A multiple ack covers every outstanding tag up to its own: only safe below the oldest still under way.
        let oldestUnderWay = unsettled.oldest ?? .max
        var highestCovered: UInt64?
        var kept = 0
        for index in held.indices {
            let tag = held[index].tag
            if tag < oldestUnderWay {
                highestCovered = max(highestCovered ?? 0, tag)
            } else {
                held[kept] = held[index]
                kept += 1
            }
        }
        held.removeLast(held.count - kept)
        if let highestCovered {
            try amqp.ack(highestCovered, multiple: true)
            frames.multiple += 1
        }
    }

    /// The acknowledgement frames sent since the last call.
    func takeFrames() -> AcknowledgementFrames {
        defer { frames = AcknowledgementFrames() }
        return frames
    }

    /// Gives a delivery back to the broker for another try.
    func requeue(_ deliveryTag: UInt64) throws(AMQPError) {
        settle(deliveryTag)
        try amqp.reject(deliveryTag, requeue: true)
        // It may have been the delivery the held ones waited for.
        if !held.isEmpty { try acknowledgeCovered() }
    }
}
