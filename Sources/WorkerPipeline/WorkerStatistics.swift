import Synchronization

/// Process-wide counters, safe to bump from any thread.
public final class WorkerStatistics: Sendable {
    public let jobsCompleted = Atomic<Int>(0)
    public let jobsRejected = Atomic<Int>(0)
    public let jobsParked = Atomic<Int>(0)
    public let delivered = Atomic<Int>(0)
    public let deadTokens = Atomic<Int>(0)
    public let permanentFailures = Atomic<Int>(0)
    public let retries = Atomic<Int>(0)
    /// Times a batch found the shared rate window spent and waited for the next one.
    public let rateLimitWaits = Atomic<Int>(0)
    /// Notifications of redelivered jobs not sent again because the idempotency record showed them done.
    public let duplicatesAvoided = Atomic<Int>(0)

    public init() {}

    public struct Snapshot: Sendable, Equatable {
        public var jobsCompleted, jobsRejected, jobsParked, delivered, deadTokens, permanentFailures, retries: Int

        public var summary: String {
            "jobs=\(jobsCompleted) rejected=\(jobsRejected) parked=\(jobsParked) delivered=\(delivered) "
                + "dead_tokens=\(deadTokens) failed=\(permanentFailures) retries=\(retries)"
        }
    }

    public func snapshot() -> Snapshot {
        Snapshot(jobsCompleted: jobsCompleted.load(ordering: .relaxed),
                 jobsRejected: jobsRejected.load(ordering: .relaxed),
                 jobsParked: jobsParked.load(ordering: .relaxed),
                 delivered: delivered.load(ordering: .relaxed),
                 deadTokens: deadTokens.load(ordering: .relaxed),
                 permanentFailures: permanentFailures.load(ordering: .relaxed),
                 retries: retries.load(ordering: .relaxed))
    }
}
