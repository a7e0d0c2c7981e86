import AMQP
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// A job's `send_at`: held in the broker's delay queues until then (a worker restart loses nothing), sent within a
/// second after, shown as scheduled, and cancellable while it waits.
@Suite struct JobScheduleTests {
    let logger = Logger(label: "schedule", level: .critical)

    /// Publishes a job of `tokens` with `send_at` `seconds` from now (whole seconds, rounded up), and `messageID` if
    /// given; returns its id and send_at.
    static func publishScheduled(
        _ publisher: AMQPConnection, to queue: String, replies: String, tokens: [String],
        in seconds: Int64, messageID: String? = nil
    ) throws -> (id: String, sendAt: Int64) {
        let jobID = TestServices.unique("scheduled")
        let sendAt = Int64(Date().timeIntervalSince1970.rounded(.up)) + seconds
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        try publisher.publish(
            to: queue,
            body: Array(
                #"{"id": "\#(jobID)", "tokens": [\#(list)], "send_at": \#(sendAt), "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(
                replyTo: replies, messageID: messageID, timestamp: Int64(Date().timeIntervalSince1970)))
        return (jobID, sendAt)
    }

    /// Waits until `jobs show` says the job is scheduled for `sendAt`.
    static func awaitScheduled(_ jobID: String, at sendAt: Int64, redisURL: String) throws -> Bool {
        var shown: [String: Any] = [:]
        return try TestServices.waitUntil(timeout: 10) {
            shown = try JobCancelTests.show(jobID, redisURL: redisURL)
            return shown["state"] as? String == "scheduled"
                && (shown["scheduled_for"] as? Int).map(Int64.init) == sendAt
        }
    }

    /// `send_at` 10 s ahead, the worker stopped and another started while the job waits: nothing reaches APNs before
    /// send_at, and everything within a second after.
    @Test func aScheduledJobGoesOutOnTimeAcrossAWorkerRestart() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let tokens = (0..<3).map { String(format: "%064x", 0xCD_0000 + $0) }
        let (jobID, sendAt) = try Self.publishScheduled(publisher, to: jobs, replies: replies, tokens: tokens, in: 10)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs)
        let first = try WorkerThread(environment, logger: logger)
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL), "jobs show: scheduled for \(sendAt)")
        first.stop()
        #expect(simulator.received().isEmpty, "nothing sent while it waits")
        let second = try WorkerThread(environment, logger: logger)
        defer { second.stop() }
        let summary = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 40).first))
        #expect(summary["delivered"] as? Int == 3, "\(summary)")
        let times = simulator.received().map(\.receivedAt)
        #expect(times.count == 3)
        let earliest = times.min() ?? 0
        let latest = times.max() ?? .infinity
        #expect(earliest >= Double(sendAt), "the first push \(Double(sendAt) - earliest) s before send_at")
        #expect(latest <= Double(sendAt) + 1, "the last push \(latest - Double(sendAt)) s after send_at")
        print(
            String(
                format:
                    "schedule | send_at 10 s ahead, worker restarted while it waited: pushes %.3f-%.3f s after send_at",
                earliest - Double(sendAt), latest - Double(sendAt)))
    }

    /// A job cancelled while it waits for its send_at settles when it next comes back from a delay queue, before its
    /// time and without resolving anything, nothing sent, every token counted as cancelled. (8 s ahead, it waits 6.4 s
    /// in its first tier: cancelled meanwhile, it is settled on its return, more than a second before send_at.) Named
    /// by its `id` or by its message's message-id: `jobs cancel` takes either, and `jobs show` of its id says
    /// cancelled either way.
    @Test(arguments: [false, true]) func aCancelledScheduledJobSendsNothing(byMessageID: Bool) throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let tokens = (0..<3).map { String(format: "%064x", 0xCE_0000 + $0) }
        let messageID = TestServices.unique("message")
        let (jobID, sendAt) = try Self.publishScheduled(
            publisher, to: jobs, replies: replies, tokens: tokens, in: 8, messageID: messageID)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL), "jobs show: scheduled for \(sendAt)")
        let (code, output) = try JobCancelTests.cancel(
            byMessageID ? messageID : jobID, redisURL: redisURL, reason: "called off")
        #expect(code == 0, "jobs cancel: \(output)")
        let summary = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(summary["cancelled"] as? Int == 3 && summary["delivered"] as? Int == 0, "\(summary)")
        let settledAt = Date().timeIntervalSince1970
        #expect(settledAt < Double(sendAt), "settled \(settledAt - Double(sendAt)) s from send_at: at its first return")
        #expect(simulator.received().isEmpty, "nothing sent")
        let (cancelled, shown) = try JobCancelTests.awaitState("cancelled", of: jobID, redisURL: redisURL)
        #expect(cancelled, "jobs show \(jobID): \(shown)")
    }

    /// A scheduled job and the copy its publisher made after a broker failover (`x-apns-worker-republished`) come back
    /// from the delay queues together at send_at, in either order: the job is sent once, with one summary.
    @Test(arguments: [true, false]) func aScheduledJobAndItsPublishersCopyAreSentOnce(copyFirst: Bool) throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let tokens = (0..<3).map { String(format: "%064x", 0xCF_0000 + $0) }
        let jobID = TestServices.unique("scheduled-copy")
        let sendAt = Int64(Date().timeIntervalSince1970.rounded(.up)) + 3
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        let body = Array(
            #"{"id": "\#(jobID)", "tokens": [\#(list)], "send_at": \#(sendAt), "payload": {"aps": {}}}"#.utf8)
        let original = AMQPProperties(replyTo: replies)
        let copy = AMQPProperties(replyTo: replies, headers: [Worker.republishedHeader: "1"])
        for properties in copyFirst ? [copy, original] : [original, copy] {
            try publisher.publish(to: jobs, body: body, properties: properties)
        }
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let summary = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(summary["delivered"] as? Int == 3, "\(summary)")
        #expect(
            TestServices.waitUntil(timeout: 10) {
                worker.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1
            }, "the copy was acknowledged unsent")
        #expect(simulator.received().count == 3, "each token once: \(simulator.received().map(\.deviceToken))")
        #expect(try replyReader.read(1, timeout: 1).isEmpty, "one summary")
    }

    /// A scheduled job of a few tokens is shown as scheduled until a worker starts it, past its send_at too (no worker
    /// ran then), listed by `jobs list`; once it ran it is done and off the list.
    @Test func aScheduledJobShowsScheduledUntilAWorkerStartsItThenDone() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let (jobID, sendAt) = try Self.publishScheduled(
            publisher, to: jobs, replies: replies, tokens: [String(format: "%064x", 0xD5_0000)], in: 2)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs)
        let first = try WorkerThread(environment, logger: logger)
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL), "jobs show: scheduled for \(sendAt)")
        first.stop()
        // What is under test is the clock passing send_at with no worker running.
        #expect(TestServices.waitUntil(timeout: 10) { Date().timeIntervalSince1970 > Double(sendAt) + 0.5 })
        #expect(try JobCancelTests.show(jobID, redisURL: redisURL)["state"] as? String == "scheduled", "overdue")
        #expect(try Self.listed(redisURL: redisURL).contains(jobID), "jobs list names the overdue job")
        let second = try WorkerThread(environment, logger: logger)
        defer { second.stop() }
        #expect(try replyReader.read(1, timeout: 30).count == 1, "sent")
        #expect(
            try TestServices.waitUntil(timeout: 10) {
                try JobCancelTests.show(jobID, redisURL: redisURL)["state"] as? String == "done"
            }, "jobs show: done")
        #expect(try !Self.listed(redisURL: redisURL).contains(jobID), "off the list")
    }

    /// A job scheduled six days ahead keeps its progress record until a day after its send_at, not a day after its
    /// last update: `jobs show` says scheduled all the while it waits.
    @Test func aJobScheduledDaysAheadKeepsItsRecordUntilItsTime() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, _, publisher) = try TestServices.jobQueues()
        let sixDays: Int64 = 6 * 86_400
        let (jobID, sendAt) = try Self.publishScheduled(
            publisher, to: jobs, replies: replies, tokens: [String(format: "%064x", 0xD6_0000)], in: sixDays)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL), "jobs show: scheduled for \(sendAt)")
        let redis = try RedisConnection(url: TestServices.redisURL())
        let ttl = try redis.command(["TTL", RedisKeys.node.progress(jobID)]).integer ?? -2
        #expect(ttl > sixDays + 86_400 - 60 && ttl <= sixDays + 86_400 + 5, "kept \(ttl) s")
    }

    /// A job waiting for its send_at goes through a delay queue stamped with when it comes back to its lane, so that
    /// the lane's longest wait (`apns-worker stats`) counts its time there, not the delay. 60 s ahead, it waits in
    /// the 51.2 s tier, read here.
    @Test func aScheduledJobsCopyIsStampedWithWhenItComesBack() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, _, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let published = Date().timeIntervalSince1970
        let (jobID, sendAt) = try Self.publishScheduled(
            publisher, to: jobs, replies: replies, tokens: [String(format: "%064x", 0xD7_0000)], in: 60)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        // Shown scheduled: the worker took it and put it in its delay queue.
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL))
        let delayQueue = try AMQPConnection(url: TestServices.amqpURL())
        try delayQueue.consume(jobs + ".retry.51200ms")
        let deadline = Date().addingTimeInterval(20)
        var copy: AMQPDelivery?
        while copy == nil, deadline.timeIntervalSinceNow > 0 {
            if case .delivery(let delivery)? = try delayQueue.nextEvent(timeout: deadline.timeIntervalSinceNow) {
                copy = delivery
            }
        }
        let timestamp = try #require(copy?.properties.timestamp, "the copy in the 51.2 s tier, with a timestamp")
        #expect(
            Double(timestamp) >= published + 51 && Double(timestamp) <= Date().timeIntervalSince1970 + 53,
            "stamped \(Double(timestamp) - published) s after the job was published")
    }

    /// A scheduled job cancelled while no worker runs, taken after its send_at passed: nothing is sent, and `jobs show`
    /// counts its token as cancelled, none resolved.
    @Test func aScheduledJobCancelledWhileNoWorkerRanResolvesNothing() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let (jobID, sendAt) = try Self.publishScheduled(
            publisher, to: jobs, replies: replies, tokens: [String(format: "%064x", 0xD8_0000)], in: 2)
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs)
        let first = try WorkerThread(environment, logger: logger)
        #expect(try Self.awaitScheduled(jobID, at: sendAt, redisURL: redisURL))
        first.stop()
        #expect(try JobCancelTests.cancel(jobID, redisURL: redisURL, reason: "off").code == 0)
        #expect(TestServices.waitUntil(timeout: 10) { Date().timeIntervalSince1970 > Double(sendAt) + 0.5 })
        let second = try WorkerThread(environment, logger: logger)
        defer { second.stop() }
        let summary = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(summary["cancelled"] as? Int == 1, "\(summary)")
        // The cancellation alone shows the job cancelled: what is waited for is the worker's count of it.
        var shown: [String: Any] = [:]
        #expect(
            try TestServices.waitUntil(timeout: 10) {
                shown = try JobCancelTests.show(jobID, redisURL: redisURL)
                return shown["cancelled"] as? Int == 1
            }, "\(shown)")
        #expect(shown["state"] as? String == "cancelled" && shown["resolved"] as? Int == 0, "\(shown)")
        #expect(simulator.received().isEmpty)
    }

    /// The ids `jobs list --json` prints.
    static func listed(redisURL: String) throws -> [String] {
        let child = try ExecutablesTests.Child(
            "apns-worker", ["jobs", "list", "--json"], environment: ["REDIS_URL": redisURL])
        let line = child.waitForLine(containing: "[", timeout: 30) ?? ""
        try #require(child.waitForExit() == 0, "jobs list: \(line)")
        let reports = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [[String: Any]])
        return reports.compactMap { $0["job_id"] as? String }
    }
}
