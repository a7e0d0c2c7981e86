import AMQP
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

/// `apns-worker jobs cancel`: a job cancelled fleet-wide sends nothing more within a second, settles (acknowledged,
/// never parked) with the rest counted as cancelled in its summary, and a copy that comes back later sends nothing.
@Suite struct JobCancelTests {
    let logger = Logger(label: "cancel", level: .critical)

    /// Runs `apns-worker jobs cancel` against `redisURL`; returns its exit code and output.
    static func cancel(_ jobID: String, redisURL: String, reason: String) throws -> (code: Int32, output: String) {
        let child = try ExecutablesTests.Child(
            "apns-worker", ["jobs", "cancel", jobID, "--reason", reason],
            environment: ["REDIS_URL": redisURL])
        let line = child.waitForLine(containing: jobID, timeout: 30) ?? ""
        return (child.waitForExit(), line)
    }

    /// A cancel of an id nothing is known of (a typo, or a job yet to come) says so, beside what it still does.
    @Test func aCancelOfAnIdNothingIsKnownOfSaysSo() throws {
        let settings = ["REDIS_URL": try TestServices.redisURL().description(revealingPassword: true)]
        let typo = TestServices.unique("no-such-job")
        let cancelled = try OperationsTests.apnsWorker(["jobs", "cancel", typo], environment: settings)
        #expect(cancelled.status == 0, "\(cancelled.errors)")
        #expect(cancelled.output.contains("no progress is recorded for this id"), "\(cancelled.output)")
        let again = try OperationsTests.apnsWorker(["jobs", "cancel", typo], environment: settings)
        #expect(again.output.contains("no progress is recorded for this id"), "still nothing known: \(again.output)")
    }

    /// `apns-worker jobs show JOB_ID --json`, parsed.
    static func show(_ jobID: String, redisURL: String) throws -> [String: Any] {
        let child = try ExecutablesTests.Child(
            "apns-worker", ["jobs", "show", jobID, "--json"],
            environment: ["REDIS_URL": redisURL])
        let line = child.waitForLine(containing: "\"job_id\"", timeout: 30) ?? ""
        try #require(child.waitForExit() == 0, "jobs show: \(line)")
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "\(line)")
    }

    /// `jobs show JOB_ID --json` once it says `state` (asked again until then, for up to 10 s), with whether it did.
    static func awaitState(_ state: String, of jobID: String, redisURL: String) throws -> (
        reached: Bool, shown: [String: Any]
    ) {
        var shown: [String: Any] = [:]
        let reached = try TestServices.waitUntil(timeout: 10) {
            shown = try show(jobID, redisURL: redisURL)
            return shown["state"] as? String == state
        }
        return (reached, shown)
    }

    static func summary(_ delivery: AMQPDelivery) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(delivery.body)) as? [String: Any])
    }

    /// A 20,000-user bulk job under APNS_RATE_LIMIT=1000, cancelled once 2,000 of its pushes went out: none reaches
    /// APNs later than a second after the command returned, and its summary counts the rest as cancelled.
    @Test func aCancelledCampaignStopsWithinASecondAndSettles() throws {
        let users = (0..<20_000).map { "c\($0)" }
        let (redisURL, redis) = try TestServices.isolatedRedis(.cancelledCampaign)
        for start in stride(from: 0, to: users.count, by: 5_000) {
            _ = try redis.pipeline(
                (start..<start + 5_000).map {
                    ["HSET", RedisKeys.node.tokens(users[$0]), String(format: "%064x", 0xCA_0000 + $0), "production"]
                })
        }
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let bulk = TestServices.unique("bulk")
        let failed = TestServices.unique("failed")
        _ = try publisher.declareQueue(bulk)
        let jobID = TestServices.unique("campaign")
        let list = users.map { "\"\($0)\"" }.joined(separator: ",")
        try publisher.publish(
            to: bulk, body: Array(#"{"id": "\#(jobID)", "users": [\#(list)], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_BULK_QUEUE": bulk, "PUSH_FAILED_QUEUE": failed, "REDIS_URL": redisURL,
                    "APNS_RATE_LIMIT": "1000"
                ]), logger: logger)
        defer { worker.stop() }
        try #require(
            TestServices.waitUntil(timeout: 60) { simulator.received().count >= 2_000 }, "the campaign is under way")
        // While it runs: its progress as the worker last reported it (about once a second), against what apns-sim had
        // received by then.
        let running = try Self.show(jobID, redisURL: redisURL)
        let updatedAt = try #require(running["updated_at"] as? Double, "\(running)")
        let receivedBy = simulator.received().filter { $0.receivedAt <= updatedAt }.count
        let sent = try #require(running["sent"] as? Int)
        #expect(running["state"] as? String == "running", "\(running)")
        #expect(abs(sent - receivedBy) <= 1_000, "sent \(sent) against apns-sim's \(receivedBy) at the same time")
        let eta = try #require(running["eta_seconds"] as? Double, "\(running)")
        let rate = try #require(running["rate_per_second"] as? Double)
        #expect(rate > 500 && rate < 1_500, "the rate limit is 1,000/s: \(rate)")
        #expect(abs(eta - Double(20_000 - sent) / 1_000) < 10, "ETA \(eta) s with \(sent) of 20,000 sent at 1,000/s")

        let (code, output) = try Self.cancel(jobID, redisURL: redisURL, reason: "wrong text")
        let returned = Date().timeIntervalSince1970
        #expect(code == 0, "jobs cancel: \(output)")
        #expect(output.contains("cancelled") && output.contains("wrong text"), "\(output)")

        let summary = try Self.summary(try #require(try replyReader.read(1, timeout: 30).first))
        let received = simulator.received()
        let latest = received.map(\.receivedAt).max() ?? 0
        #expect(latest <= returned + 1, "the last push reached APNs \(latest - returned) s after jobs cancel returned")
        #expect(received.count < 5_000, "\(received.count) of 20,000 sent")
        #expect(summary["job_id"] as? String == jobID)
        #expect(summary["notifications"] as? Int == 20_000, "\(summary)")
        #expect(summary["delivered"] as? Int == received.count, "\(summary)")
        #expect(summary["cancelled"] as? Int == 20_000 - received.count, "\(summary)")
        #expect(summary["failed"] as? Int == 0 && summary["retrying"] as? Int == 0, "\(summary)")
        #expect(worker.worker.statistics.cancelled.load(ordering: .relaxed) == 20_000 - received.count)
        // Acknowledged, not parked: both queues empty once the summary is out.
        #expect(
            TestServices.waitUntil(timeout: 10) { (try? publisher.declareQueue(bulk)) == 0 }, "the job acknowledged")
        #expect(try publisher.declareQueue(failed) == 0, "nothing parked")
        var settled: [String: Any] = [:]
        #expect(
            try TestServices.waitUntil(timeout: 10) {
                settled = try Self.show(jobID, redisURL: redisURL)
                return settled["sent"] as? Int == received.count
                    && settled["cancelled"] as? Int == 20_000 - received.count
            }, "its progress ends with the summary's counts: \(settled)")
        #expect(
            settled["state"] as? String == "cancelled" && settled["delivered"] as? Int == received.count, "\(settled)")
        print(
            "cancel | 20,000-user campaign at 1,000/s cancelled after \(received.count) pushes: the last "
                + String(format: "%.2f s after jobs cancel returned; ", latest - returned)
                + "jobs show while it ran: sent \(sent), apns-sim \(receivedBy), ETA \(eta) s")
    }

    /// A job of `count` tokens with an id and a reply_to, read by a worker with `settings` (and apns-sim).
    struct TokenJob {
        let id: String
        let simulator: APNsSimulator
        let worker: WorkerThread
        let replyReader: QueueReader
        let redisURL: String

        init(
            _ name: String, tokens count: Int, from first: Int, behaviour: APNsSimulator.Behaviour = .init(),
            settings: [String: String] = [:]
        ) throws {
            let logger = Logger(label: "test", level: .critical)
            simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
            let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
            self.replyReader = replyReader
            id = TestServices.unique(name)
            let list = (0..<count).map { "\"" + String(format: "%064x", first + $0) + "\"" }.joined(separator: ",")
            try publisher.publish(
                to: jobs, body: Array(#"{"id": "\#(id)", "tokens": [\#(list)], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
            worker = try WorkerThread(
                try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, settings), logger: logger)
            redisURL = try TestServices.redisURL().description(revealingPassword: true)
        }

        func stop() {
            worker.stop()
            simulator.shutdown()
        }

        /// The job's summary (of its last attempt: the `attempts`th), then `jobs show` once it says done (expected
        /// within 10 s), its counts of `names` checked against the summary's.
        func summaryAndDoneProgress(matching names: [String], attempts: Int = 1) throws
            -> (summary: [String: Any], shown: [String: Any])
        {
            let summaries = try replyReader.read(attempts, timeout: 30)
            try #require(summaries.count == attempts, "\(summaries.count) summaries of \(attempts) attempts")
            let summary = try JobCancelTests.summary(try #require(summaries.last))
            let (done, shown) = try JobCancelTests.awaitState("done", of: id, redisURL: redisURL)
            #expect(done, "done: \(shown)")
            for name in names {
                #expect(shown[name] as? Int == summary[name] as? Int, "\(name): \(shown) against \(summary)")
            }
            return (summary, shown)
        }
    }

    /// A finished job (1,000 tokens: the smallest whose progress is kept) shows as done with its summary's counts.
    @Test func aFinishedJobShowsDoneWithItsSummarysCounts() throws {
        let job = try TokenJob("finished", tokens: 1_000, from: 0xCC_0000)
        defer { job.stop() }
        let (_, shown) = try job.summaryAndDoneProgress(
            matching: ["delivered", "dead", "failed", "retrying", "held_back", "expired", "cancelled"])
        #expect(
            shown["sent"] as? Int == 1_000 && shown["resolved"] as? Int == 1_000
                && shown["eta_seconds"] as? Double == 0,
            "\(shown)")
    }

    /// A large job of tokens (6,000 at APNS_RATE_LIMIT=1000) shows its deliveries while it runs, not only once it
    /// ends, and ends with its summary's counts: what was reported on the way is not counted again.
    @Test func aLargeTokenJobShowsItsDeliveriesWhileItRuns() throws {
        let job = try TokenJob("large-tokens", tokens: 6_000, from: 0xCD_0000, settings: ["APNS_RATE_LIMIT": "1000"])
        defer { job.stop() }
        try #require(
            TestServices.waitUntil(timeout: 60) { job.simulator.received().count >= 1_500 }, "the job is under way")
        var running: [String: Any] = [:]
        #expect(
            try TestServices.waitUntil(timeout: 10) {
                running = try Self.show(job.id, redisURL: job.redisURL)
                return running["state"] as? String == "running" && (running["delivered"] as? Int ?? 0) >= 1_000
            }, "deliveries shown while the job runs: \(running)")
        let (summary, _) = try job.summaryAndDoneProgress(matching: ["delivered", "dead", "failed"])
        #expect(summary["delivered"] as? Int == 6_000, "\(summary)")
    }

    /// A large job five of whose notifications APNs fails (503) at both attempts is followed through its retry, five
    /// notifications however large the job: `jobs show` ends done with the last attempt's failures and what each
    /// attempt sent, not running with the first attempt's retries.
    @Test func aLargeJobRetriedToItsLastAttemptShowsDone() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = Dictionary(
            uniqueKeysWithValues: (0..<5).map { (String(format: "%064x", 0xCE_0000 + $0), 2) })
        let job = try TokenJob(
            "retried", tokens: 1_000, from: 0xCE_0000, behaviour: behaviour,
            settings: [
                "PUSH_FAILED_QUEUE": TestServices.unique("failed"), "APNS_MAX_ATTEMPTS": "2",
                "APNS_RETRY_DELAYS": "0.05"
            ])
        defer { job.stop() }
        let (summary, shown) = try job.summaryAndDoneProgress(matching: ["failed", "retrying"], attempts: 2)
        #expect(summary["failed"] as? Int == 5, "\(summary)")
        #expect(
            shown["sent"] as? Int == 1_005 && shown["resolved"] as? Int == 1_000 && shown["delivered"] as? Int == 995,
            "\(shown)")
    }

    /// A cancelled large job that comes back after an earlier delivery settled part of it (a worker died: here the
    /// idempotency record holds 1,000 deliveries and the copy is marked republished) counts each of its 3,000 users
    /// once in its summary: those settled earlier as they went, the users left as cancelled less those.
    @Test func aCancelledJobComingBackCountsWhatAnEarlierDeliverySettledOnce() throws {
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let record = SentRecord(redis: try RedisConnection(url: TestServices.redisURL()))
        let jobID = TestServices.unique("came-back")
        _ = try record.record([(jobID, (0..<1_000).map { .done(String(format: "%064x", 0xCF_0000 + $0)) })])
        #expect(try Self.cancel(jobID, redisURL: redisURL, reason: "test").code == 0)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let users = (0..<3_000).map { "\"came-back-\($0)\"" }.joined(separator: ",")
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "\#(jobID)", "users": [\#(users)], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies, headers: [Worker.republishedHeader: "1"]))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let summary = try Self.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(summary["notifications"] as? Int == 3_000, "\(summary)")
        #expect(summary["delivered"] as? Int == 1_000 && summary["cancelled"] as? Int == 2_000, "\(summary)")
        #expect(simulator.received().isEmpty)
    }

    /// A job whose retry waits in the delay queue when it is cancelled sends nothing when it comes back: its
    /// second attempt settles at once, its summary counting the retried notifications as cancelled.
    @Test func aCancelledJobWaitingForItsRetrySendsNothingWhenItComesBack() throws {
        let tokens = (0..<3).map { String(format: "%064x", 0xCB_0000 + $0) }
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = Dictionary(uniqueKeysWithValues: tokens.map { ($0, 1) })
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let jobID = TestServices.unique("retried")
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "\#(jobID)", "tokens": [\#(list)], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_RETRY_DELAYS": "2"
                ]), logger: logger)
        defer { worker.stop() }
        let first = try Self.summary(try #require(try replyReader.read(1, timeout: 30).first))
        try #require(first["retrying"] as? Int == 3, "the first attempt's notifications wait for a retry: \(first)")

        let (code, output) = try Self.cancel(jobID, redisURL: redisURL, reason: "no longer wanted")
        #expect(code == 0, "jobs cancel: \(output)")
        let second = try Self.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(second["attempt"] as? Int == 2 && second["cancelled"] as? Int == 3, "\(second)")
        #expect(second["delivered"] as? Int == 0 && second["failed"] as? Int == 0, "\(second)")
        #expect(simulator.received().map(\.status) == [503, 503, 503], "only the first attempt reached APNs")
    }
}
