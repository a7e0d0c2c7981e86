import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// Notifications APNs asks to retry go through delay queues and come back, and give up after APNS_MAX_ATTEMPTS.
@Suite struct RetryTests {
    let logger = Logger(label: "retry", level: .critical)

    /// A burst of 500s and 503s (40% of pushes) with slow answers: every notification is delivered through the
    /// delay queues, none twice.
    @Test func serverErrorBurstsAreRetriedUntilDelivered() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.internalErrorRate = 0.3
        behaviour.unavailableRate = 0.1
        behaviour.latency = 0.05
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    // Short tiers and enough attempts that 40% failures cannot exhaust them (0.4^20 per notification).
                    "APNS_RETRY_DELAYS": "0.05,0.2", "APNS_MAX_ATTEMPTS": "20"
                ]), logger: logger)
        defer { workerThread.stop() }
        let tokens = (0..<100).map { String(format: "%064x", 0xE000 + $0) }
        for token in tokens {
            try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "burst-\#(token.suffix(4))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        // One summary per attempt: read until every job reported its delivery.
        var delivered = Set<String>()
        while delivered.count < tokens.count, let message = try replyReader.read(1, timeout: 60).first {
            let summary = try JSONSerialization.jsonObject(with: Data(message.body)) as! [String: Any]
            if summary["delivered"] as? Int == 1, let id = summary["job_id"] as? String { delivered.insert(id) }
        }
        #expect(delivered.count == tokens.count)
        let received = simulator.received()
        let accepted = received.filter { $0.status == 200 }
        #expect(Set(accepted.map(\.deviceToken)) == Set(tokens), "every notification delivered")
        #expect(accepted.count == tokens.count, "none delivered twice")
        #expect(received.count > tokens.count, "the burst did fail some pushes")
        // The operator sees it: every failed push as an answer by status and reason, and as a retry.
        let metrics = workerThread.worker.statistics.prometheusText(ready: true)
        let failures = received.count - accepted.count
        let counted = ["500", "503"].compactMap { status in
            metrics.firstMatch(
                of: try! Regex("apns_worker_apns_responses_total\\{status=\"\(status)\",reason=\"[A-Za-z]+\"\\} (\\d+)")
            )
            .flatMap { Int($0.output[1].substring ?? "") }
        }.reduce(0, +)
        #expect(counted == failures, "\(failures) failed pushes, /metrics counts \(counted)")
        #expect(workerThread.worker.statistics.retries.load(ordering: .relaxed) >= failures)
        TestServices.reportFault(
            "500/503 burst (40% of pushes) with 50 ms answers, 100 jobs", notifications: tokens.count,
            received: received)
    }

    /// A notification whose connection dies before its answer may have been delivered: it is sent again through the
    /// delay queues only, APNS_MAX_ATTEMPTS times in all (the client resent it too, three times in each attempt).
    @Test func aNotificationLostWithItsConnectionIsSentAtMostMaxAttemptsTimes() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.dropConnectionAfterStreams = 0
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let workerThread = try WorkerThread.retrying(simulator: simulator, jobs: jobs, failed: failed, logger: logger)
        defer { workerThread.stop() }
        let token = String(repeating: "d1", count: 32)
        let job = #"{"id": "lost", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(job.utf8), properties: AMQPProperties(replyTo: replies))
        let summaries = try replyReader.read(3, timeout: 30).map {
            try JSONSerialization.jsonObject(with: Data($0.body)) as! [String: Any]
        }
        #expect(summaries.map { $0["attempt"] as? Int } == [1, 2, 3])
        #expect(try failedReader.read(1).count == 1, "parked after its last attempt")
        // Every connection drops at its first push: one connection per send.
        #expect(simulator.connectionsSeen() == 3, "sent \(simulator.connectionsSeen()) times")
    }

    @Test func retriesComeBackThroughTheDelayQueueUntilDeliveredOrParked() throws {
        let flaky = String(repeating: "f1", count: 32)
        let throttled = String(repeating: "f2", count: 32)
        let healthy = String(repeating: "f3", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = [flaky: 1]
        behaviour.throttledTokens = [throttled]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let user = TestServices.unique("hank")
        _ = try RedisConnection(url: TestServices.redisURL())
            .command(["HSET", RedisKeys.node.tokens(user), flaky, "production", throttled, "sandbox"])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let workerThread = try WorkerThread.retrying(
            simulator: simulator, jobs: jobs, failed: failed, delays: "0.1,0.2", logger: logger)
        defer { workerThread.stop() }
        let job =
            #"{"id": "retry-1", "users": ["\#(user)"], "tokens": ["\#(healthy)"], "collapse_id": "c-1", "payload": {"aps": {"alert": "again"}}}"#
        try publisher.publish(to: jobs, body: Array(job.utf8), properties: AMQPProperties(replyTo: replies))

        // Attempt 1: healthy delivered, flaky 503, throttled 429. Attempt 2: flaky delivered, throttled 429.
        // Attempt 3: throttled 429 again, and out of attempts: parked.
        let summaries = try replyReader.read(3).map {
            try JSONSerialization.jsonObject(with: Data($0.body)) as! [String: Any]
        }
        #expect(summaries.map { $0["attempt"] as? Int } == [1, 2, 3])
        #expect(summaries.map { $0["delivered"] as? Int } == [1, 1, 0])
        #expect(summaries.map { $0["retrying"] as? Int } == [2, 1, 0])
        #expect((summaries.last?["failed"] as? Int) == 1)
        let statistics = workerThread.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) { statistics.permanentFailures.load(ordering: .relaxed) == 1 },
            "the parked notification is a failure in notifications_total, as in the summary")

        let parked = try #require(try failedReader.read(1).first)
        #expect(String(decoding: parked.body, as: UTF8.self) == job, "parked as its sender enqueued it")
        #expect(
            parked.properties.headers[Worker.reasonHeader]?.contains(
                "1 of 1 notifications not delivered after 3 attempts: TooManyRequests") == true,
            "\(parked.properties.headers)")
        #expect(parked.properties.headers[Worker.attemptsHeader] == "3")
        #expect(parked.properties.headers[Worker.undeliveredHeader] == throttled, "what is left, in headers")

        let received = simulator.received()
        #expect(received.filter { $0.deviceToken == healthy }.count == 1, "a delivered notification is never resent")
        #expect(received.filter { $0.deviceToken == flaky }.map(\.status) == [503, 200])
        #expect(received.filter { $0.deviceToken == throttled }.map(\.status) == [429, 429, 429])
        TestServices.reportFault(
            "503 once, then TooManyRequests for one token on every attempt: parked as enqueued after 3",
            notifications: 3, received: received, parked: 1)
        #expect(
            received.allSatisfy { $0.collapseID == "c-1" && $0.payload == Array(#"{"aps": {"alert": "again"}}"#.utf8) },
            "retries keep every header and the payload byte for byte")
    }
}
