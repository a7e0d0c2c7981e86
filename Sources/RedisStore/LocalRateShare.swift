import Foundation
import WorkerPipeline

/// What a worker may send while the Redis node holding the shared rate limit does not answer (a cluster master lost):
/// its share of the limit, counted locally in tenth-of-a-second slots as the shared limit counts them, urgent work
/// first. Its share is the limit divided among the workers that reported to the fleet's statistics in the last 30 s,
/// as last read (`fleetSize`); a fleet of one, before any reading. Broker thread only, like the limiter it stands in
/// for.
final class LocalRateShare {
    /// The fleet's size is read again this often (seconds) while the shared limit answers.
    static let fleetSizeInterval = 10.0

    private(set) var fleetSize = 1
    private var fleetSizeReadAt = -Double.infinity
    private var slot = -1
    private var used = 0
    private let now: () -> Double

    init(now: @escaping () -> Double = { Date().timeIntervalSince1970 }) { self.now = now }

    /// Whether the fleet's size is due to be read again.
    var fleetSizeDue: Bool { now() - fleetSizeReadAt >= Self.fleetSizeInterval }

    func learnFleetSize(_ workers: Int?) {
        fleetSizeReadAt = now()
        if let workers, workers > 0 { fleetSize = workers }
    }

    /// Permits from this worker's share of `limit` per second, in the current tenth of a second.
    func reserve(urgent: Int, bulk: Int, limit: Int) -> RateReservation {
        let time = now()
        let tenths = Int((time * 10).rounded(.down))
        if tenths != slot {
            slot = tenths
            used = 0
        }
        // A tenth of the share, the remainder spread over the second as the shared limit spreads it.
        let share = max(1, limit / fleetSize)
        let tenth = tenths % 10
        let allowed = (tenth + 1) * share / 10 - tenth * share / 10
        let grantedUrgent = max(0, min(urgent, allowed - used))
        used += grantedUrgent
        let grantedBulk = max(0, min(bulk, allowed - used))
        used += grantedBulk
        return .granted(
            urgent: grantedUrgent, bulk: grantedBulk,
            nextWindowIn: max(0.001, Double(tenths + 1) / 10 - time))
    }
}
