import AMQP
import Foundation
import WorkerPipeline

/// Settles deliveries with as few frames as possible. Finished deliveries are held back, unacknowledged, and go in
/// one `multiple` ack up to the highest of them below the oldest delivery still under way, once a batch of them (a
/// fifth of the urgent prefetch) can go together or the oldest has waited `holdingTime`: an ack frame costs the broker
/// about as much as the deliveries of a small batch, so a steady flow of single-token jobs costs it one frame per
/// batch of jobs, as a consumer acknowledging per hundred does, instead of one per batch the worker happened to
/// settle. Not while the prefetch is nearly taken (APNs far away, each slot a job waiting for its answer): a held ack
/// would then keep a new job from coming. Jobs finish out of order (several connections to APNs answer in any order):
/// those above an older delivery under way wait for its ack, within `holdingTime` and up to half the prefetch of them,
/// after which they are acknowledged one by one. Nothing waits while a bulk delivery is under way, nor once one is
/// finished.
///
/// Broker thread only, one per AMQP connection (delivery tags are per channel).
final class Acknowledgements {
    private let amqp: AMQPConnection
    /// Delivered and neither acknowledged nor rejected yet, with the size of each bulk delivery's body (-1 for an
    /// urgent one): what the bulk lane holds (`BulkPrefetch`).
    private var unsettled = DeliveryTagWindow<Int>()
    private(set) var bulkHeld = BulkHeld()
    /// Urgent deliveries neither finished nor settled.
    private var urgentUnderWay = 0
    /// Finished deliveries waiting for an older one under way, unacknowledged, each with when it finished, oldest
    /// first: they count against the prefetch, hence the limit, and a crash would have them delivered again, hence
    /// the time.
    private var held: [(tag: UInt64, since: Date)] = []
    private let prefetch: Int
    private let holdingLimit: Int
    private let batchSize: Int
    private let holdingTime: TimeInterval
    /// Sent since the last `takeFrames`.
    private var frames = AcknowledgementFrames()

    /// The bulk deliveries unsettled: how many, and their bodies' bytes.
    struct BulkHeld: Equatable {
        var count = 0
        var bytes = 0
    }

    /// `prefetch`: the urgent consumer's; `holdingTime`: seconds any finished delivery may wait.
    init(amqp: AMQPConnection, prefetch: Int, holdingTime: TimeInterval = 0.02) {
        self.amqp = amqp
        self.prefetch = prefetch
        // Half the prefetch may wait for an older delivery's ack: the broker keeps handing over jobs. A fifth goes in
        // one ack (100 of the default 500), and four fifths stay in flight.
        holdingLimit = max(0, prefetch / 2)
        batchSize = max(1, prefetch / 5)
        self.holdingTime = holdingTime
    }

    /// `bulkBytes`: the body's size of a bulk delivery, nil for an urgent one.
    func received(_ deliveryTag: UInt64, bulkBytes: Int?) {
        unsettled.insert(bulkBytes ?? -1, for: deliveryTag)
        if let bulkBytes {
            bulkHeld.count += 1
            bulkHeld.bytes += bulkBytes
        } else {
            urgentUnderWay += 1
        }
    }

    /// Whether it was a bulk delivery.
    @discardableResult
    private func settle(_ tag: UInt64) -> Bool {
        guard let bulkBytes = unsettled.remove(tag) else { return false }
        guard bulkBytes >= 0 else {
            urgentUnderWay -= 1
            return false
        }
        bulkHeld.count -= 1
        bulkHeld.bytes -= bulkBytes
        return true
    }

    /// Acknowledges `tags` (all of them delivered on this connection, none settled yet): at once, or held back a
    /// little to go with others in one ack (`due`).
    func acknowledge(_ tags: [UInt64]) throws(AMQPError) {
        guard !tags.isEmpty else { return }
        let now = Date()
        var settledBulk = false
        for tag in tags {
            settledBulk = settle(tag) || settledBulk
            held.append((tag, now))
        }
        // A bulk job under way (a campaign's users, resolved a piece at a time) takes seconds: nothing waits for it.
        // Nor does a bulk job that finished: the bulk lane holds a few large jobs, and one held back keeps the next
        // from coming.
        try acknowledgeHeld(dueBy: settledBulk || bulkHeld.count > 0 ? .distantFuture : now)
    }

    /// When the oldest finished delivery held back must be acknowledged, if any is.
    var due: Date? { held.first.map { $0.since.addingTimeInterval(holdingTime) } }

    /// Acknowledges the finished deliveries held back that are due by `now` (every one of them if `now` is nil): in
    /// one `multiple` ack those no delivery under way is older than, once a batch of them can go or the oldest held
    /// is due; then one by one those above an older delivery under way that are due or beyond the limit.
    func acknowledgeHeld(dueBy now: Date?) throws(AMQPError) {
        let heldLongEnough = now.map { $0.addingTimeInterval(-holdingTime) } ?? .distantFuture
        guard let oldest = held.first else { return }
        let prefetchNearlyTaken = urgentUnderWay + held.count > prefetch - batchSize
        try acknowledgeCovered(
            batchOnly: oldest.since > heldLongEnough && held.count <= holdingLimit && !prefetchNearlyTaken)
        var sent = 0
        while sent < held.count && (held.count - sent > holdingLimit || held[sent].since <= heldLongEnough) {
            try amqp.ack(held[sent].tag)
            frames.single += 1
            sent += 1
        }
        held.removeFirst(sent)
    }

    /// One `multiple` ack for the held deliveries that no delivery under way is older than, if there are any, and
    /// with `batchOnly` at least `batchSize` of them; the others stay.
    private func acknowledgeCovered(batchOnly: Bool = false) throws(AMQPError) {
        // A multiple ack covers every outstanding tag up to its own: only safe below the oldest still under way.
        let oldestUnderWay = unsettled.oldest ?? .max
        if batchOnly && (held.count < batchSize || held.lazy.filter({ $0.tag < oldestUnderWay }).count < batchSize) {
            return
        }
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
