import AMQP
import APNs
import APNsSimulator
import Foundation
import HTTP2
import Redis
import RedisStore
import Telemetry
import Testing
import Threads
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

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
        let dead = String(repeating: "7a", count: 32)
        let live = String(repeating: "7b", count: 32)
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let u1 = TestServices.unique("u1")
        let u2 = TestServices.unique("u2")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([
            ["HSET", RedisKeys.node.tokens(u1), dead, "production"],
            ["HSET", RedisKeys.node.tokens(u2), live, "production"],
            ["SET", RedisKeys.node.registered(u1), "oops"]
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let deadQueue = TestServices.unique("dead")
        let deadReader = try QueueReader(deadQueue)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_DEAD_TOKENS_QUEUE": deadQueue
                ]), logger: logger)
        defer { worker.stop() }
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(TestServices.unique("wrongtype"))", "users": ["\#(u1)", "\#(u2)"], "payload": {"aps": {}}}"#
                    .utf8),
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
        TestServices.reportFault(
            "wrong-type apns:registered key of a dead token's user", notifications: 1, received: received)
    }

    /// `SET apns:tokens:<u3> hello`: u3 is skipped with a warning; the rest of the batch is delivered.
    @Test func aWrongTypeTokenKeySkipsThatUserOnly() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let u2 = TestServices.unique("u2")
        let u3 = TestServices.unique("u3")
        let u4 = TestServices.unique("u4")
        let tokens = [String(repeating: "7c", count: 32), String(repeating: "7d", count: 32)]
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([
            ["SET", RedisKeys.node.tokens(u3), "hello"],
            ["HSET", RedisKeys.node.tokens(u2), tokens[0], "production"],
            ["HSET", RedisKeys.node.tokens(u4), tokens[1], "production"]
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        // Published before the worker starts, so that they arrive as one batch.
        for (index, users) in [[u3, u2], [u4]].enumerated() {
            let body =
                #"{"id": "skip-\#(index)-\#(u2)", "users": [\#(users.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let summaries = try replyReader.read(2).map(Self.json)
        #expect(summaries.count == 2 && summaries.allSatisfy { $0["delivered"] as? Int == 1 }, "\(summaries)")
        worker.stop()
        let received = simulator.received()
        #expect(received.map(\.deviceToken).sorted() == tokens.sorted(), "each once")
        #expect(worker.worker.statistics.dataErrorCount("token_cache_read") == 1)
        #expect(try publisher.queueStatus(jobs)?.messages == 0, "both jobs settled")
        TestServices.reportFault(
            "wrong-type apns:tokens key of one user in a batch", notifications: 2, received: received)
    }

    /// Jobs that would mean something else to the worker than to their sender: "prevalidate" that is not a boolean
    /// (it sent the real campaign), a key given twice (the worker took the first, Python and Go the last), header
    /// values with control characters (sent, reset by the server, retried for 16 s), topics that would change a
    /// broadcast's path. Each is parked at once with its reason; nothing of them reaches APNs; the good job beside
    /// them is delivered.
    @Test func ambiguousJobsAreParkedBeforeAnythingIsSent() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let good = String(repeating: "8a", count: 32)
        let other = String(repeating: "8b", count: 32)
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let bad = [
            (
                "prevalidate",
                #"{"id": "pv", "tokens": ["\#(good)"], "prevalidate": "true", "payload": {"aps": {"alert": "Sale"}}}"#
            ),
            (
                "prevalidate",
                #"{"id": "pv1", "tokens": ["\#(good)"], "prevalidate": 1, "payload": {"aps": {"alert": "Sale"}}}"#
            ),
            (
                "duplicate key \"tokens\"",
                #"{"id": "dup", "tokens": ["\#(good)"], "tokens": ["\#(other)"], "payload": {"aps": {}}}"#
            ),
            (
                "\"topic\" holds a byte that is not",
                #"{"id": "nul", "tokens": ["\#(good)"], "topic": "com.example.app\u0000", "payload": {"aps": {}}}"#
            ),
            (
                "\"topic\" holds a byte that is not",
                #"{"id": "crlf", "tokens": ["\#(good)"], "topic": "com.example.app\r\nx: y", "payload": {"aps": {}}}"#
            ),
            // Topics that would change a request's path (a broadcast's is built from the bundle).
            (
                "\"topic\" holds \"/\"",
                #"{"id": "slash", "tokens": ["\#(good)"], "topic": "com.example/../other", "payload": {"aps": {}}}"#
            ),
            (
                "\"topic\" holds \"?\"",
                #"{"id": "query", "topic": "com.example?x", "channel_id": "dHdvIHdvcmRzCg==", "live_activity": {"event": "update", "timestamp": 1700000000, "content_state": {}}}"#
            ),
            (
                "\"topic\" holds \"#\"",
                #"{"id": "hash", "topic": "com.example#x", "channel_id": "dHdvIHdvcmRzCg==", "live_activity": {"event": "update", "timestamp": 1700000000, "content_state": {}}}"#
            ),
            (
                "\"topic\" holds \"%\"",
                #"{"id": "percent", "topic": "com.example%2Fother", "channel_id": "dHdvIHdvcmRzCg==", "live_activity": {"event": "update", "timestamp": 1700000000, "content_state": {}}}"#
            ),
            (
                "\"topic\" has an empty part",
                #"{"id": "dots", "tokens": ["\#(good)"], "topic": "com..example", "payload": {"aps": {}}}"#
            )
        ]
        for (_, body) in bad { try publisher.publish(to: jobs, body: Array(body.utf8)) }
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "fine", "tokens": ["\#(other)"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_FAILED_QUEUE": failed
                ]), logger: logger)
        defer { worker.stop() }
        let parked = try failedReader.read(bad.count)
        #expect(parked.count == bad.count)
        for ((expected, body), message) in zip(bad, parked) {
            #expect(String(decoding: message.body, as: UTF8.self) == body, "parked unchanged")
            let reason = message.properties.headers[Worker.reasonHeader] ?? ""
            #expect(reason.contains(expected), "\(reason)")
        }
        let summary = try Self.json(try #require(try replyReader.read(1).first, "the good job's summary"))
        #expect(
            summary["job_id"] as? String == "fine" && summary["notifications"] as? Int == 1
                && summary["delivered"] as? Int == 1 && summary["failed"] as? Int == 0 && summary["dead"] as? Int == 0
                && summary["failed_by_reason"] as? [String: Int] == [:],
            "the good job was delivered: \(summary)")
        let received = simulator.received()
        #expect(received.map(\.deviceToken) == [other], "only the good job reached APNs")
        #expect(simulator.broadcastsByChannel().isEmpty, "no broadcast left")
        TestServices.reportFault(
            "ambiguous jobs (prevalidate not a boolean, a key twice, topics that are no bundle ID)",
            notifications: 1 + bad.count, received: received, parked: bad.count)
        // enqueue refuses the same jobs before publishing them, naming the line and the key.
        let enqueued = try OperationsTests.apnsWorker(
            ["enqueue", "-", "--set", "PUSH_JOBS_QUEUE=\(jobs)"],
            input: bad[2].1 + "\n")
        #expect(
            enqueued.status == 65 && enqueued.errors.contains("line 1: body is not JSON: duplicate key \"tokens\""),
            "\(enqueued)")
    }

    /// The failed queue, then the dead-token queue, deleted at run time: a parked job and a dead-token event are
    /// handed back by the broker. Their jobs stay unacknowledged, the worker declares its queues again and publishes
    /// them again after a pause: nothing is acknowledged that was not published, nothing is sent twice. A summary
    /// to a reply_to queue that does not exist is logged and counted.
    @Test func publishesToDeletedQueuesAreHeldUntilTheyArePublished() throws {
        let dead = String(repeating: "9d", count: 32)
        let live = [String(repeating: "9e", count: 32), String(repeating: "9f", count: 32)]
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let deadQueue = TestServices.unique("dead")
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_FAILED_QUEUE": failed, "PUSH_DEAD_TOKENS_QUEUE": deadQueue
                ]), logger: logger)
        defer { worker.stop() }
        let statistics = worker.worker.statistics
        // A first job's summary: the worker is consuming, its queues are declared.
        try publisher.publish(
            to: jobs, body: Array(#"{"tokens": ["\#(live[0])"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1)

        try publisher.deleteQueue(failed)
        try publisher.publish(to: jobs, body: Array("not a job".utf8))
        let nowhere = TestServices.unique("nowhere")
        try publisher.publish(
            to: jobs, body: Array(#"{"tokens": ["\#(live[1])"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: nowhere))
        #expect(
            TestServices.waitUntil {
                statistics.refusedPublishCount("rejected_job") == 1 && statistics.refusedPublishCount("summary") == 1
            })
        #expect(statistics.jobsRejected.load(ordering: .relaxed) == 0, "not acknowledged while not parked")
        // The worker declared its queues again; the bad job is parked after the pause.
        let parked = try QueueReader(failed).read(1)
        #expect(parked.map { String(decoding: $0.body, as: UTF8.self) } == ["not a job"])

        try publisher.deleteQueue(deadQueue)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(TestServices.unique("gone"))", "tokens": ["\#(dead)"], "payload": {"aps": {}}}"#.utf8))
        #expect(TestServices.waitUntil { statistics.refusedPublishCount("job_outputs") == 1 })
        #expect(
            statistics.deadTokens.load(ordering: .relaxed) == 1
                && statistics.jobsCompleted.load(ordering: .relaxed) == 2,
            "the job is not acknowledged while its event is not published")
        let events = try QueueReader(deadQueue).read(2, timeout: 10)
        #expect(
            events.count == 1 && String(decoding: events.first?.body ?? [], as: UTF8.self).contains(dead),
            "the event once")

        worker.stop()
        #expect(try publisher.queueStatus(jobs)?.messages == 0, "every job settled in the end")
        #expect(try publisher.queueStatus(nowhere) == nil, "the missing reply queue was not created")
        let received = simulator.received()
        #expect(received.filter { $0.deviceToken == dead }.count == 1, "nothing sent twice")
        TestServices.reportFault(
            "failed and dead-token queues deleted at run time (parked job, event held, published again)",
            notifications: 2, received: received.filter { $0.deviceToken != dead }, parked: 0)
    }

    /// The dead-token exchange deleted at run time: the event's publish closes the channel (NOT_FOUND) and the
    /// session ends; the next one declares the worker's exchange and queues again, and the event goes out (the
    /// worker reconnected for ever, declaring nothing, until restarted).
    @Test func aDeletedDeadTokenExchangeIsDeclaredAgain() throws {
        let dead = String(repeating: "8d", count: 32)
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let deadQueue = TestServices.unique("dead")
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, ["PUSH_DEAD_TOKENS_QUEUE": deadQueue]),
            logger: logger)
        defer { worker.stop() }
        let live = String(repeating: "8e", count: 32)
        try publisher.publish(
            to: jobs, body: Array(#"{"tokens": ["\#(live)"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1, "consuming, its exchange declared")
        // Unset, PUSH_DEAD_TOKENS_EXCHANGE is the queue's name.
        try publisher.deleteExchange(deadQueue)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(TestServices.unique("after-delete"))", "tokens": ["\#(dead)"], "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1, timeout: 30).count == 1, "the job settled")
        let events = try QueueReader(deadQueue).read(1, timeout: 10)
        #expect(events.count == 1 && String(decoding: events.first?.body ?? [], as: UTF8.self).contains(dead))
        #expect(simulator.received().filter { $0.deviceToken == dead }.count == 1, "nothing sent twice")
    }

    /// A summary to RabbitMQ's direct reply-to (the RPC pattern of pika, Go's and Java's clients) reaches the requester
    /// and is not counted as refused: the broker hands a mandatory publish there back as unroutable although it
    /// delivered it, and every such summary was logged and counted as lost.
    @Test func aSummaryToDirectReplyToIsDeliveredAndNotCountedAsRefused() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, _) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let requester = #"""
            import sys, time, pika
            url, queue, job = sys.argv[1:4]
            channel = pika.BlockingConnection(pika.URLParameters(url)).channel()
            answers = []
            channel.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, body: answers.append(body), auto_ack=True)
            channel.basic_publish("", queue, job.encode(), pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
            deadline = time.time() + 20
            while not answers and time.time() < deadline:
                channel.connection.process_data_events(0.1)
            print(answers[0].decode() if answers else "no summary")
            """#
        let token = String(repeating: "8f", count: 32)
        let job = #"{"id": "rpc", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#
        let summary = try TestServices.python(requester, [try TestServices.value("AMQP_URL"), jobs, job])
        #expect(summary.contains(#""job_id":"rpc""#) && summary.contains(#""delivered":1"#), "\(summary)")
        worker.stop()
        #expect(worker.worker.statistics.refusedPublishCount("summary") == 0)
    }

    /// An endpoint that answers every push 400 with the request's path as its reason (a proxy echoing the path, a
    /// hostile stand-in): the reason becomes no metric label and no summary key (Apple's documented reasons or
    /// `other`), and no device token reaches /metrics or the log.
    @Test func anEchoedReasonBecomesOtherAndNoTokenReachesMetricsOrLogs() throws {
        let pair = try SelfSignedCertificate.generate()
        let echo = try HTTP2Server(
            configuration: .init(certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM),
            logger: logger
        ) { request, writer in
            writer.respond(
                status: 400, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                body: Array(#"{"reason": "\#(request.path)"}"#.utf8))
        }
        defer { echo.shutdown() }
        let tokens = (0..<56).map { String(format: "%064x", 0xEC40_0000 + $0) }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let metricsPort = TestServices.freePort()
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)  // for the environment's shape only
        defer { simulator.shutdown() }
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_PRODUCTION_URL": "https://127.0.0.1:\(echo.port)",
                "APNS_CA_FILE": try TestServices.temporaryFile("echo-ca.pem", contents: pair.certificatePEM),
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(metricsPort), "LOG_LEVEL": "debug"
            ])
        environment["APNS_TOPIC"] = "com.example.app"
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = worker.stop(SIGKILL) }
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "echo", "tokens": [\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        let summary = try Self.json(try #require(try replyReader.read(1).first))
        #expect(summary["failed_by_reason"] as? [String: Int] == ["other": 56], "\(summary)")
        let metrics = try TestServices.httpGet(port: metricsPort, "/metrics").body
        #expect(metrics.contains(#"apns_worker_apns_responses_total{status="400",reason="other"} 56"#), "\(metrics)")
        #expect(!tokens.contains { metrics.contains($0) }, "no device token in /metrics")
        TestServices.reportFault(
            "an endpoint echoing the path as its reason (56 answered 400: failed, labelled other)",
            notifications: 56, received: [], parked: 56)
        let logged = worker.waitForLine(containing: "notification failed")
        #expect(logged?.contains("/3/device/") == true, "the text is logged: \(logged ?? "no line")")
        #expect(!tokens.contains { logged?.contains($0) == true }, "but no device token whole")
    }

    /// apns-sim's control endpoint asked by another client (curl, which drops its connection without a TLS
    /// close_notify) while answers are delayed: the worker's connections are not disturbed, nothing is sent twice.
    @Test func theSimulatorsControlEndpointNeverDisturbsOtherConnections() throws {
        let pending = DispatchSemaphore(value: 0)
        let seen = Locked(0)
        var configuration = APNsSimulator.Configuration()
        configuration.behaviour.latency = 1
        configuration.observer = { _ in
            if seen.withLock({
                $0 += 1
                return $0
            }) == 100 {
                pending.signal()
            }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        func publish(_ range: Range<Int>) throws {
            for job in range {
                try publisher.publish(
                    to: jobs,
                    body: Array(
                        #"{"tokens": ["\#(String(format: "%064x", 0xC7_0000 + job))"], "payload": {"aps": {}}}"#.utf8),
                    properties: AMQPProperties(replyTo: replies))
            }
        }
        try publish(0..<100)
        #expect(pending.wait(timeout: .now() + 30) == .success, "answers are pending")
        for _ in 0..<3 {
            let stats = try TestServices.run(
                "/usr/bin/curl", ["-sk", "--http2", "https://127.0.0.1:\(simulator.port)/sim/stats"])
            #expect(stats.contains("\"received\""), "\(stats)")
        }
        // More requests while the first answers are still pending: the server reads the worker's connections again.
        try publish(100..<300)
        #expect(try replyReader.read(300, timeout: 60).count == 300)
        let received = simulator.received()
        #expect(received.count == 300, "nothing resent: no connection of the worker's was closed")
        #expect(worker.worker.statistics.connectionsClosed.load(ordering: .relaxed) == 0)
        TestServices.reportFault(
            "apns-sim control endpoint asked by curl while answers are delayed", notifications: 300,
            received: received)
    }
}
