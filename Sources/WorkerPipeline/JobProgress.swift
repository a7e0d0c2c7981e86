import AMQP
import APNs
import Telemetry

/// One job on its way: which notifications still lack an outcome, and what the others became.
///
/// Built on the broker thread, then handed to the APNs client's loop thread, which alone mutates it until the
/// last outcome is in; then handed back through the worker's completion queue. Hand-offs go through the loop's
/// task queue and a Mutex, which order the memory accesses.
final class JobProgress: @unchecked Sendable {
    let job: PushJob
    let delivery: AMQPDelivery
    /// The broker connection the delivery came on: an ack on a newer connection would be meaningless.
    let generation: Int
    let targets: [DeviceTarget]
    private(set) var attempts: [Int]
    private(set) var remaining: Int
    private(set) var delivered = 0
    private(set) var dead: [(target: DeviceTarget, response: APNsResponse)] = []
    private(set) var failed: [(target: DeviceTarget, reason: String)] = []
    /// Still failing when the send attempts ran out; the job is parked on the failed queue.
    private(set) var undelivered: [(target: DeviceTarget, reason: String)] = []

    init(job: PushJob, delivery: AMQPDelivery, generation: Int, targets: [DeviceTarget]) {
        self.job = job
        self.delivery = delivery
        self.generation = generation
        self.targets = targets
        self.attempts = Array(repeating: 1, count: targets.count)
        self.remaining = targets.count
    }

    var isComplete: Bool { remaining == 0 }

    func notification(_ index: Int) -> (environment: APNsEnvironment, notification: APNsNotification) {
        let target = targets[index]
        return (target.environment,
                APNsNotification(deviceToken: target.token, topic: job.topic, pushType: job.pushType,
                                 priority: job.priority, expiration: job.expiration, collapseID: job.collapseID,
                                 payload: job.payload))
    }

    /// Counts one more send of notification `index`; false once `limit` sends were made.
    func allowsAnotherAttempt(_ index: Int, limit: Int) -> Bool {
        guard attempts[index] < limit else { return false }
        attempts[index] += 1
        return true
    }

    func recordDelivered() {
        delivered += 1
        remaining -= 1
    }

    func recordDead(_ index: Int, _ response: APNsResponse) {
        dead.append((targets[index], response))
        remaining -= 1
    }

    func recordFailed(_ index: Int, reason: String) {
        failed.append((targets[index], reason))
        remaining -= 1
    }

    func recordUndelivered(_ index: Int, reason: String) {
        undelivered.append((targets[index], reason))
        remaining -= 1
    }

    /// The summary a job's sender can ask for (reply_to), as JSON.
    var summaryJSON: [UInt8] {
        var reasons: [String: Int] = [:]
        for failure in failed { reasons[failure.reason, default: 0] += 1 }
        for failure in undelivered { reasons["undelivered: " + failure.reason, default: 0] += 1 }
        let failedByReason = reasons.keys.sorted().map { "\(JSONString.quote($0)):\(reasons[$0]!)" }.joined(separator: ",")
        let text = "{\"job_id\":\(JSONString.quote(job.id)),\"notifications\":\(targets.count),"
            + "\"delivered\":\(delivered),\"dead\":\(dead.count),\"failed\":\(failed.count + undelivered.count),"
            + "\"failed_by_reason\":{\(failedByReason)}}"
        return Array(text.utf8)
    }
}
