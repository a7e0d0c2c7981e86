import Foundation

/// What the broker did not take (handed back: no queue; or refused), kept unacknowledged and published again after
/// a pause: finished jobs with everything they produce, bad jobs to park, and jobs put back to wait for the store. Bounded by the prefetch, as every one
/// of them is an unacknowledged delivery. A pause rather than at once, so that a queue someone deleted costs a
/// retry every few seconds (the broker adapter declares the queues again meanwhile), not a loop.
struct HeldPublishes {
    static let pause = 5.0

    private var jobs: [(progress: JobProgress, due: Date)] = []
    private var rejections: [(rejection: Rejection, due: Date)] = []

    /// Where a delivery goes whole, instead of being sent: parked on the failed queue for `reason` (`poison`: for
    /// being delivered too often rather than for what it says, counted apart), or to a delay queue to wait for a
    /// Redis node that does not answer (`StoreWaits`).
    enum Departure: Sendable, Equatable {
        case park(reason: String, poison: Bool)
        case waitForStore
        /// Not due yet (`send_at`): back to the broker, to wait `delay` seconds in a delay queue.
        case waitUntilDue(delay: Double)
    }

    typealias Rejection = (delivery: JobDelivery, departure: Departure)

    mutating func hold(job: JobProgress, now: Date = Date()) {
        jobs.append((job, now.addingTimeInterval(Self.pause)))
    }

    mutating func hold(rejection: Rejection, now: Date = Date()) {
        rejections.append((rejection, now.addingTimeInterval(Self.pause)))
    }

    /// Every delivery held here.
    var deliveries: [JobDelivery] { jobs.map(\.progress.delivery) + rejections.map(\.rejection.delivery) }

    var nextDue: Date? { (jobs.map(\.due) + rejections.map(\.due)).min() }

    /// What is due now, taken out; nil if nothing is.
    mutating func takeDue(now: Date = Date()) -> (jobs: [JobProgress], rejections: [Rejection])? {
        guard let next = nextDue, next <= now else { return nil }
        let dueJobs = jobs.filter { $0.due <= now }.map(\.progress)
        let dueRejections = rejections.filter { $0.due <= now }.map(\.rejection)
        jobs.removeAll { $0.due <= now }
        rejections.removeAll { $0.due <= now }
        return (dueJobs, dueRejections)
    }
}
