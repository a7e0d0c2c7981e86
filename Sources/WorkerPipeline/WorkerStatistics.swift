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

    /// APNs connections opened and closed, GOAWAYs received, failed connects (from the client's events).
    public let connectionsOpened = Atomic<Int>(0)
    public let connectionsClosed = Atomic<Int>(0)
    public let goAways = Atomic<Int>(0)
    public let connectFailures = Atomic<Int>(0)

    public init() {}

    /// The Prometheus text exposition of every counter.
    public func prometheusText(ready: Bool) -> String {
        func load(_ counter: borrowing Atomic<Int>) -> Int { counter.load(ordering: .relaxed) }
        var text = ""
        func family(_ name: String, _ type: String, _ help: String, _ samples: [(labels: String, value: Int)]) {
            text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for sample in samples { text += "\(name)\(sample.labels) \(sample.value)\n" }
        }
        family("apns_worker_jobs_total", "counter", "Jobs acknowledged, by what became of them.", [
            ("{result=\"completed\"}", load(jobsCompleted)), ("{result=\"rejected\"}", load(jobsRejected)),
            ("{result=\"parked\"}", load(jobsParked)),
        ])
        family("apns_worker_notifications_total", "counter", "Notifications with a final outcome, by outcome.", [
            ("{outcome=\"delivered\"}", load(delivered)), ("{outcome=\"dead_token\"}", load(deadTokens)),
            ("{outcome=\"failed\"}", load(permanentFailures)),
        ])
        family("apns_worker_retries_total", "counter", "Notifications scheduled for another attempt.", [("", load(retries))])
        family("apns_worker_rate_limit_waits_total", "counter", "Batches that waited for the shared rate limit.",
               [("", load(rateLimitWaits))])
        family("apns_worker_duplicates_avoided_total", "counter",
               "Notifications of redelivered jobs not sent again (idempotency record).", [("", load(duplicatesAvoided))])
        family("apns_worker_apns_connections", "gauge", "Open HTTP/2 connections to APNs.",
               [("", load(connectionsOpened) - load(connectionsClosed))])
        family("apns_worker_apns_goaways_total", "counter", "GOAWAY frames received from APNs.", [("", load(goAways))])
        family("apns_worker_apns_connect_failures_total", "counter", "Failed or unproductive APNs connections.",
               [("", load(connectFailures))])
        family("apns_worker_ready", "gauge", "1 while connected to the broker and Redis and consuming.", [("", ready ? 1 : 0)])
        return text
    }

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
