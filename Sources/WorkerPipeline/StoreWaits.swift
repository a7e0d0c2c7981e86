/// Which jobs wait for a Redis node that does not answer (a cluster master frozen, cut off or gone), and for how long.
///
/// Nothing is known of a user whose tokens sit on such a node, nor of a Live Activity's update tokens there, nor of
/// what an earlier delivery of a job settled when its idempotency record is there: such a job is not sent (it could
/// reach too few devices, or some twice), not parked (nothing is wrong with it), and not held in the worker (it would
/// fill the prefetch window and stop the jobs every other node serves). It waits in its lane's delay queues: a copy,
/// its body and properties unchanged and its waits counted in `header`, is published there, and the delivery is
/// acknowledged once the broker confirmed the copy. The copy comes back to its lane's queue when its delay passes and
/// is resolved again: sent once its node answers, waiting again until then, with delays that grow as the waits add up.
/// A job of more users than one piece (`JobAssembly`) waits in the worker instead, only for its users on that node.
public struct StoreWaits: Sendable, Equatable {
    /// How many times a job waited for the store, on the copy that waits.
    public static let header = "x-apns-worker-waits"
    /// Waits at each delay tier before the next, longer one.
    public static let waitsPerTier = 30

    /// The lane's delay queues (APNS_RETRY_DELAYS), shortest first.
    public private(set) var delays: [Double]

    public init(delays: [Double]) {
        self.delays = delays.isEmpty ? [1] : delays.sorted()
    }

    /// Whether a job must wait: one of its users, or its Live Activity, is on a node that does not answer. `users`
    /// and `activities`: what resolving this batch found.
    public static func mustWait(_ job: PushJob, users: ResolvedUsers, activities: ResolvedUsers) -> Bool {
        if !users.unavailable.isEmpty, job.retryTargets == nil, job.users.contains(where: users.unavailable.contains) {
            return true
        }
        if !activities.unavailable.isEmpty, let activity = job.activity, activities.unavailable.contains(activity) {
            return true
        }
        return false
    }

    /// How many times this delivery's job waited already: the header is the worker's, but any publisher can set it,
    /// so it is held to a million (one more than Int.max trapped).
    public static func waits(of delivery: JobDelivery) -> Int {
        guard let text = delivery.properties.headers[header] else { return 0 }
        return min(max(0, Int(text) ?? 0), 1_000_000)
    }

    /// The delay before a job that waited `waits` times already is tried again: the shortest tier for the first
    /// `waitsPerTier` waits (an outage of a few seconds costs about that), then each longer tier in turn, the last
    /// repeating (an outage of hours costs a message every few minutes per job).
    public func delay(afterWaits waits: Int) -> Double {
        delays[min(waits / Self.waitsPerTier, delays.count - 1)]
    }

    /// The copy of a delivery that waits in its lane's delay queue.
    public func waitingCopy(of delivery: JobDelivery) -> Publication {
        let waits = Self.waits(of: delivery)
        var copy = Publication.delayed(delivery, by: delay(afterWaits: waits))
        copy.properties.headers[Self.header] = String(waits + 1)
        return copy
    }
}

extension Publication {
    /// `delivery` again, persistent, to wait `delay` seconds in its lane's delay queue and come back to the lane.
    static func delayed(_ delivery: JobDelivery, by delay: Double) -> Publication {
        var properties = delivery.properties
        properties.persistent = true
        return Publication(
            destination: .retry(delay: delay, lane: delivery.lane), body: delivery.body,
            properties: properties)
    }
}
