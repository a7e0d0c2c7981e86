import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import Telemetry
import Testing
import WorkerPipeline

/// Bad data and bad settings, as an attacker or a careless operator brings them, against real RabbitMQ, Redis and
/// apns-sim: each is settled where it belongs (one user, token or job) and never causes duplicates, stalls or
/// silent loss. Each scenario prints a `fault |` line for scripts/chaos.
@Suite struct BadDataTests {
    let logger = Logger(label: "bad-data", level: .critical)

    static func json(_ delivery: AMQPDelivery) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(delivery.body)) as? [String: Any])
    }

    /// `SET apns:registered:<u1> oops`: the removal of u1's dead token fails with WRONGTYPE. That costs the removal
    /// (logged, counted), not the job: u2 gets one push, the event goes out once, the job settles.
    @Test func aWrongTypeRegistrationKeyCostsOnlyThatRemoval() throws {
        let dead = String(repeating: "7a", count: 32), live = String(repeating: "7b", count: 32)
        let simulator = try APNsSimulator(configuration: .init(unregisteredTokens: [dead: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let u1 = TestServices.unique("u1"), u2 = TestServices.unique("u2")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([["HSET", TokenCache.key(forUser: u1), dead, "production"],
                                ["HSET", TokenCache.key(forUser: u2), live, "production"],
                                ["SET", TokenCache.registeredKey(forUser: u1), "oops"]])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let deadQueue = TestServices.unique("dead")
        let deadReader = try QueueReader(deadQueue)
        let worker = try WorkerThread(try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            "PUSH_DEAD_TOKENS_QUEUE": deadQueue]), logger: logger)
        defer { worker.stop() }
        try publisher.publish(to: jobs, body: Array(#"{"id": "\#(TestServices.unique("wrongtype"))", "users": ["\#(u1)", "\#(u2)"], "payload": {"aps": {}}}"#.utf8),
                              properties: AMQPProperties(replyTo: replies))
        let summary = try Self.json(try #require(try replyReader.read(1).first))
        #expect(summary["delivered"] as? Int == 1 && summary["dead"] as? Int == 1, "\(summary)")
        // The event was confirmed before the summary: a second one (a redelivered job) would follow within the wait.
        #expect(try deadReader.read(2, timeout: 2).count == 1, "the dead-token event exactly once")
        worker.stop()  // unacknowledged jobs would go back to the queue now
        #expect(try publisher.queueStatus(jobs)?.messages == 0, "the job settled")
        let received = simulator.received()
        #expect(received.filter { $0.deviceToken == live }.count == 1, "u2 received exactly one push")
        #expect(worker.worker.statistics.dataErrorCount("token_removal") == 1)
        TestServices.reportFault("wrong-type apns:registered key of a dead token's user", notifications: 1, received: received)
    }

    /// `SET apns:tokens:<u3> hello`: u3 is skipped with a warning; the rest of the batch is delivered.
    @Test func aWrongTypeTokenKeySkipsThatUserOnly() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let u2 = TestServices.unique("u2"), u3 = TestServices.unique("u3"), u4 = TestServices.unique("u4")
        let tokens = [String(repeating: "7c", count: 32), String(repeating: "7d", count: 32)]
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([["SET", TokenCache.key(forUser: u3), "hello"],
                                ["HSET", TokenCache.key(forUser: u2), tokens[0], "production"],
                                ["HSET", TokenCache.key(forUser: u4), tokens[1], "production"]])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        // Published before the worker starts, so that they arrive as one batch.
        for (index, users) in [[u3, u2], [u4]].enumerated() {
            let body = #"{"id": "skip-\#(index)-\#(u2)", "users": [\#(users.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let worker = try WorkerThread(try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let summaries = try replyReader.read(2).map(Self.json)
        #expect(summaries.count == 2 && summaries.allSatisfy { $0["delivered"] as? Int == 1 }, "\(summaries)")
        worker.stop()
        let received = simulator.received()
        #expect(received.map(\.deviceToken).sorted() == tokens.sorted(), "each once")
        #expect(worker.worker.statistics.dataErrorCount("token_cache_read") == 1)
        #expect(try publisher.queueStatus(jobs)?.messages == 0, "both jobs settled")
        TestServices.reportFault("wrong-type apns:tokens key of one user in a batch", notifications: 2, received: received)
    }

    /// Jobs that would mean something else to the worker than to their sender: "prevalidate" that is not a boolean
    /// (it sent the real campaign), a key given twice (the worker took the first, Python and Go the last), header
    /// values with control characters (sent, reset by the server, retried for 16 s). Each is parked at once with
    /// its reason; nothing of them reaches APNs; the good job beside them is delivered.
    @Test func ambiguousJobsAreParkedBeforeAnythingIsSent() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let good = String(repeating: "8a", count: 32), other = String(repeating: "8b", count: 32)
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let bad = [
            ("prevalidate", #"{"id": "pv", "tokens": ["\#(good)"], "prevalidate": "true", "payload": {"aps": {"alert": "Sale"}}}"#),
            ("prevalidate", #"{"id": "pv1", "tokens": ["\#(good)"], "prevalidate": 1, "payload": {"aps": {"alert": "Sale"}}}"#),
            ("duplicate key \"tokens\"", #"{"id": "dup", "tokens": ["\#(good)"], "tokens": ["\#(other)"], "payload": {"aps": {}}}"#),
            ("\"topic\" holds control character", #"{"id": "nul", "tokens": ["\#(good)"], "topic": "com.example.app\u0000", "payload": {"aps": {}}}"#),
            ("\"topic\" holds control character", #"{"id": "crlf", "tokens": ["\#(good)"], "topic": "com.example.app\r\nx: y", "payload": {"aps": {}}}"#),
        ]
        for (_, body) in bad { try publisher.publish(to: jobs, body: Array(body.utf8)) }
        try publisher.publish(to: jobs, body: Array(#"{"id": "fine", "tokens": ["\#(other)"], "payload": {"aps": {}}}"#.utf8),
                              properties: AMQPProperties(replyTo: replies))
        let worker = try WorkerThread(try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            "PUSH_FAILED_QUEUE": failed]), logger: logger)
        defer { worker.stop() }
        let parked = try failedReader.read(bad.count)
        #expect(parked.count == bad.count)
        for ((expected, body), message) in zip(bad, parked) {
            #expect(String(decoding: message.body, as: UTF8.self) == body, "parked unchanged")
            let reason = message.properties.headers[Worker.reasonHeader] ?? ""
            #expect(reason.contains(expected), "\(reason)")
        }
        #expect(try replyReader.read(1).first != nil)
        let received = simulator.received()
        #expect(received.map(\.deviceToken) == [other], "only the good job reached APNs")
        TestServices.reportFault("ambiguous jobs (prevalidate not a boolean, a key twice, control characters in topic)",
                                 notifications: 1 + bad.count, received: received, parked: bad.count)
    }

    /// The failed queue, then the dead-token queue, deleted at run time: a parked job and a dead-token event are
    /// handed back by the broker. Their jobs stay unacknowledged, the worker declares its queues again and publishes
    /// them again after a pause: nothing is acknowledged that was not published, nothing is sent twice. A summary
    /// to a reply_to queue that does not exist is logged and counted.
    @Test func publishesToDeletedQueuesAreHeldUntilTheyArePublished() throws {
        let dead = String(repeating: "9d", count: 32)
        let live = [String(repeating: "9e", count: 32), String(repeating: "9f", count: 32)]
        let simulator = try APNsSimulator(configuration: .init(unregisteredTokens: [dead: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed"), deadQueue = TestServices.unique("dead")
        let worker = try WorkerThread(try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            "PUSH_FAILED_QUEUE": failed, "PUSH_DEAD_TOKENS_QUEUE": deadQueue]), logger: logger)
        defer { worker.stop() }
        let statistics = worker.worker.statistics
        // A first job's summary: the worker is consuming, its queues are declared.
        try publisher.publish(to: jobs, body: Array(#"{"tokens": ["\#(live[0])"], "payload": {"aps": {}}}"#.utf8),
                              properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1)

        try publisher.deleteQueue(failed)
        try publisher.publish(to: jobs, body: Array("not a job".utf8))
        let nowhere = TestServices.unique("nowhere")
        try publisher.publish(to: jobs, body: Array(#"{"tokens": ["\#(live[1])"], "payload": {"aps": {}}}"#.utf8),
                              properties: AMQPProperties(replyTo: nowhere))
        #expect(TestServices.waitUntil {
            statistics.refusedPublishCount("rejected_job") == 1 && statistics.refusedPublishCount("summary") == 1
        })
        #expect(statistics.jobsRejected.load(ordering: .relaxed) == 0, "not acknowledged while not parked")
        // The worker declared its queues again; the bad job is parked after the pause.
        let parked = try QueueReader(failed).read(1)
        #expect(parked.map { String(decoding: $0.body, as: UTF8.self) } == ["not a job"])

        try publisher.deleteQueue(deadQueue)
        try publisher.publish(to: jobs, body: Array(#"{"id": "\#(TestServices.unique("gone"))", "tokens": ["\#(dead)"], "payload": {"aps": {}}}"#.utf8))
        #expect(TestServices.waitUntil { statistics.refusedPublishCount("job_outputs") == 1 })
        #expect(statistics.deadTokens.load(ordering: .relaxed) == 1 && statistics.jobsCompleted.load(ordering: .relaxed) == 2,
                "the job is not acknowledged while its event is not published")
        let events = try QueueReader(deadQueue).read(2, timeout: 10)
        #expect(events.count == 1 && String(decoding: events.first?.body ?? [], as: UTF8.self).contains(dead), "the event once")

        worker.stop()
        #expect(try publisher.queueStatus(jobs)?.messages == 0, "every job settled in the end")
        #expect(try publisher.queueStatus(nowhere) == nil, "the missing reply queue was not created")
        let received = simulator.received()
        #expect(received.filter { $0.deviceToken == dead }.count == 1, "nothing sent twice")
        TestServices.reportFault("failed and dead-token queues deleted at run time (parked job, event held, published again)",
                                 notifications: 2, received: received.filter { $0.deviceToken != dead }, parked: 0)
    }
}
