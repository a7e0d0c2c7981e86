import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Synchronization
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// Restarts the shared broker and raises its memory alarm, so scripts/test runs this suite alone, after the others
/// (see scripts/test), one test at a time.
@Suite(.serialized) struct BrokerRestartTests {
    /// The broker closes the worker's channel when a delivery stays unacknowledged past its consumer timeout (3 s
    /// here, under a job that takes longer): the session is lost, and every delivery it held comes back, the urgent
    /// jobs prefetched behind the long one included. Handed back by a worker that did not die, none of them becomes a
    /// suspect (in the run that found it, they then ran one at a time): they go out as usual, and the long job itself
    /// gets through a piece per session, as its redeliveries skip what was sent. Its one summary counts every
    /// notification of the job, over all its deliveries.
    @Test func aChannelClosedForTheConsumerTimeoutMakesNoSuspect() throws {
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        func set(_ key: String, _ value: Int) throws {
            _ = try TestServices.run(rabbitmqctl, ["eval", "application:set_env(rabbit, \(key), \(value))."])
        }
        // Read by each channel when it opens; restored to the defaults (unsetting the tick would crash channels).
        try set("consumer_timeout", 3_000)
        try set("channel_tick_interval", 500)
        defer {
            try? set("consumer_timeout", 1_800_000)
            try? set("channel_tick_interval", 60_000)
        }
        let logger = Logger(label: "consumer-timeout", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let long = (0..<400).map { String(format: "%064x", 0xC7_0000 + $0) }
        let urgent = (0..<50).map { String(format: "%064x", 0xC8_0000 + $0) }
        let longID = "\(jobs)-long"
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(longID)", "tokens": [\#(long.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies, messageID: longID))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_RATE_LIMIT": "50"
                ]), logger: logger)
        defer { worker.stop() }
        try #require(
            TestServices.waitUntil(timeout: 30) { simulator.received().count >= 20 }, "the long job is under way")
        for (index, token) in urgent.enumerated() {
            try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-urgent-\#(index)", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
        }
        let accepted = { Set(simulator.received().lazy.filter { $0.status == 200 }.map(\.deviceToken)) }
        #expect(TestServices.waitUntil(timeout: 60) { accepted().isSuperset(of: urgent) }, "every urgent job delivered")
        #expect(TestServices.waitUntil(timeout: 60) { accepted().isSuperset(of: long) }, "and the long job, in pieces")
        // The fleet counts a classic queue's redeliveries: the broker did close the channel, more than once.
        let redis = try RedisConnection(url: TestServices.redisURL())
        let redelivered = try redis.command(["GET", RedisKeys.node.deliveries("id:" + longID)]).integer ?? 0
        #expect(redelivered >= 2, "the long job came back \(redelivered) times")
        #expect(worker.worker.statistics.suspectJobs.load(ordering: .relaxed) == 0, "no job ran alone as a suspect")
        let summaries = try replyReader.read(1, timeout: 30).compactMap {
            try JSONSerialization.jsonObject(with: Data($0.body)) as? [String: Any]
        }
        #expect(
            summaries.count == 1 && summaries.first?["notifications"] as? Int == long.count
                && summaries.first?["delivered"] as? Int == long.count, "\(summaries)")
        #expect(try replyReader.read(1, timeout: 1).isEmpty, "one summary for the job")
        TestServices.reportFault(
            "channels closed for the consumer timeout (3 s) under a long job and 50 urgent jobs",
            notifications: long.count + urgent.count, received: simulator.received())
    }

    /// A memory alarm blocks the worker's publishes (dead-token events, summaries) mid-job: the worker waits for the
    /// alarm to clear, neither losing the job nor reconnecting, and /metrics counts the block.
    @Test func aMemoryAlarmHoldsPublishesUntilItClears() throws {
        let logger = Logger(label: "alarm", level: .critical)
        let tokens = (0..<20).map { String(format: "%064x", 0xA1A0 + $0) }
        let firstReceived = DispatchSemaphore(value: 0)
        let alarmRaised = DispatchSemaphore(value: 0)
        let held = Atomic<Bool>(false)
        let heldUntilAlarm = Locked<DispatchTimeoutResult?>(nil)
        var configuration = APNsSimulator.Configuration()
        // The simulator answers nothing until the alarm is up (the observer runs before each answer, on the
        // simulator's one thread), so the worker cannot publish its summary before the broker blocks it. The test
        // checks how the hold ended: answers let go by the timeout would prove nothing about the alarm.
        configuration.observer = { _ in
            guard !held.exchange(true, ordering: .relaxed) else { return }
            firstReceived.signal()
            let result = alarmRaised.wait(timeout: .now() + 120)
            heldUntilAlarm.withLock { $0 = result }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        defer { alarmRaised.signal() }  // a test that ends early lets the held answer go before the shutdown
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { workerThread.stop() }
        let body =
            #"{"id": "\#(jobs)-alarm", "tokens": [\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        publisher.close()

        try #require(firstReceived.wait(timeout: .now() + 30) == .success, "the job is under way")
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        _ = try TestServices.run(rabbitmqctl, ["set_vm_memory_high_watermark", "0"])
        defer { _ = try? TestServices.run(rabbitmqctl, ["set_vm_memory_high_watermark", "0.4"]) }
        func memoryAlarm() throws -> Bool {
            try TestServices.run(rabbitmqctl, ["eval", "rabbit_alarm:get_alarms()."]).contains("memory")
        }
        try #require(try TestServices.waitUntil(timeout: 30, memoryAlarm), "the broker raised its memory alarm")
        alarmRaised.signal()
        // Once the answers are in, the worker publishes the summary and the broker holds it. Condition, not
        // delay: the broker lists the worker's connection as blocked (each listing takes about a second).
        var blocked = false
        for _ in 0..<30 where !blocked {
            blocked = try TestServices.run(rabbitmqctl, ["list_connections", "state", "--quiet"]).contains("blocked")
        }
        #expect(blocked, "the broker blocked the worker's publishes")
        #expect(try replyReader.read(1, timeout: 0.5).isEmpty, "nothing gets through while blocked")
        _ = try TestServices.run(rabbitmqctl, ["set_vm_memory_high_watermark", "0.4"])

        let summary =
            try JSONSerialization.jsonObject(with: Data(try #require(try replyReader.read(1, timeout: 60).first).body))
            as? [String: Any]
        #expect(
            heldUntilAlarm.withLock { $0 } == .success,
            "APNs answered once the alarm was up, not after the 120 s hold ran out")
        #expect(summary?["delivered"] as? Int == 20, "the job completed once the alarm cleared: \(summary ?? [:])")
        #expect(simulator.received().count == 20, "each notification sent once: no reconnection, no redelivery")
        TestServices.reportFault(
            "broker memory alarm blocks publishing mid-job", notifications: 20,
            received: simulator.received())
        // The worker reads the broker's block and unblock notices in its loop, right after the job: poll for it.
        let statistics = workerThread.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) {
                statistics.brokerBlocks.load(ordering: .relaxed) == 1
                    && !statistics.brokerBlocked.load(ordering: .relaxed)
            },
            "the worker read the block and the unblock (blocks \(statistics.brokerBlocks.load(ordering: .relaxed)), blocked \(statistics.brokerBlocked.load(ordering: .relaxed)))"
        )
        let metrics = statistics.prometheusText(ready: true)
        #expect(metrics.contains("apns_worker_broker_blocks_total 1"), "\(metrics)")
        #expect(metrics.contains("apns_worker_broker_blocked 0"), "unblocked again")
    }

    @Test func aBrokerRestartMidRunLosesNothing() throws {
        let logger = Logger(label: "restart", level: .critical)
        let jobCount = 500
        let tokens = (0..<jobCount).map { String(format: "%064x", $0 + 1) }
        let delivered = Locked(Set<String>())
        let someDone = DispatchSemaphore(value: 0)
        let allDone = DispatchSemaphore(value: 0)
        var configuration = APNsSimulator.Configuration()
        configuration.behaviour.latency = 0.01
        configuration.observer = { notification in
            guard notification.status == 200 else { return }
            let count = delivered.withLock {
                $0.insert(notification.deviceToken)
                return $0.count
            }
            if count == 100 { someDone.signal() }
            if count == jobCount { allDone.signal() }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for token in tokens {
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-\#(token.suffix(6))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        publisher.close()

        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "WORKER_PREFETCH": "50"
                ]), logger: logger)
        defer { workerThread.stop() }

        try #require(someDone.wait(timeout: .now() + 60) == .success, "100 delivered before the restart")
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        _ = try TestServices.run(rabbitmqctl, ["stop_app"])
        _ = try TestServices.run(rabbitmqctl, ["start_app"])
        #expect(
            allDone.wait(timeout: .now() + 90) == .success,
            "\(delivered.withLock { $0.count }) of \(jobCount) delivered")

        // Every job was acknowledged in the end: the durable queue kept them across the restart, none is left.
        var listing = ""
        for _ in 0..<30 {
            listing = try TestServices.run(rabbitmqctl, ["list_queues", "name", "messages", "--quiet"])
            if listing.contains("\(jobs)\t0") { break }
        }
        #expect(listing.contains("\(jobs)\t0"), "\(listing)")
        TestServices.reportFault(
            "broker restart (stop_app, start_app) mid-run, 500 jobs", notifications: jobCount,
            received: simulator.received())
    }
}
