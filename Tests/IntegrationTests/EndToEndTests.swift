import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Synchronization
import Telemetry
import Testing
import WorkerPipeline

/// The whole path with real RabbitMQ, Redis and apns-sim: jobs in, notifications at the simulator,
/// dead-token events and refused jobs on their queues, a summary for the job's sender.
@Suite struct EndToEndTests {
    let logger = Logger(label: "e2e", level: .critical)

    @Test func jobsFlowThroughToTheSimulatorAndDeadTokensComeBack() throws {
        let keyPEM = try ES256Key.generatePrivateKeyPEM()
        let keyFile = try TestServices.temporaryFile("key.p8", contents: keyPEM)
        let deadToken = "dead" + String(repeating: "0", count: 60)
        let liveTokens = [String(repeating: "1a", count: 32), String(repeating: "2b", count: 32)]
        let directToken = String(repeating: "3c", count: 40)
        let simulator = try APNsSimulator(
            configuration: .init(
                unregisteredTokens: [deadToken: 1_732_900_000_123],
                trustedKeys: ["ABC123DEFG": .init(teamID: "TEAM123456", key: try ES256Key(pem: keyPEM))]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("sim-ca.pem", contents: simulator.certificatePEM)

        let alice = TestServices.unique("alice")
        let bob = TestServices.unique("bob")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([
            ["HSET", RedisKeys.node.tokens(alice), liveTokens[0], "production", liveTokens[1], "sandbox"],
            ["HSET", RedisKeys.node.tokens(bob), deadToken, "production"]
        ])

        let jobs = TestServices.unique("jobs")
        let dead = TestServices.unique("dead")
        let failed = TestServices.unique("failed")
        let replies = TestServices.unique("replies")
        let environment = [
            "AMQP_URL": try TestServices.value("AMQP_URL"), "REDIS_URL": try TestServices.value("REDIS_URL"),
            "APNS_PRODUCTION_URL": "https://127.0.0.1:\(simulator.port)",
            "APNS_SANDBOX_URL": "https://localhost:\(simulator.port)", "APNS_CA_FILE": caFile,
            "APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "ABC123DEFG", "APNS_TEAM_ID": "TEAM123456",
            "APNS_TOPIC": "com.example.app", "PUSH_JOBS_QUEUE": jobs, "PUSH_DEAD_TOKENS_QUEUE": dead,
            "PUSH_FAILED_QUEUE": failed
        ]
        let deadReader = try QueueReader(dead)
        let failedReader = try QueueReader(failed)
        let replyReader = try QueueReader(replies)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        try publisher.enablePublisherConfirms()
        let replyTo = AMQPProperties(replyTo: replies)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "fan-out", "users": ["\#(alice)", "\#(bob)"], "payload": {"aps": {"alert": "Hello"}}}"#.utf8),
            properties: replyTo)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "direct", "tokens": ["\#(directToken)"], "environment": "sandbox", "push_type": "background", "payload": {"aps": {"content-available": 1}}}"#
                    .utf8),
            properties: replyTo)
        let last = try publisher.publish(to: jobs, body: Array("this is not json".utf8), properties: replyTo)
        #expect(try publisher.waitForConfirms(through: last).isEmpty)

        let workerThread = try WorkerThread(environment, logger: logger)
        defer { workerThread.stop() }

        let summaries = try replyReader.read(2).map {
            try JSONSerialization.jsonObject(with: Data($0.body)) as! [String: Any]
        }
        let byID = Dictionary(uniqueKeysWithValues: summaries.map { ($0["job_id"] as! String, $0) })
        #expect((byID["fan-out"]?["notifications"] as? Int) == 3)
        #expect((byID["fan-out"]?["delivered"] as? Int) == 2)
        #expect((byID["fan-out"]?["dead"] as? Int) == 1)
        #expect((byID["direct"]?["delivered"] as? Int) == 1)

        let events = try deadReader.read(1)
        #expect(events.count == 1)
        let event = try JSONSerialization.jsonObject(with: Data(try #require(events.first).body)) as! [String: Any]
        #expect(event["token"] as? String == deadToken)
        #expect(event["user"] as? String == bob)
        #expect(event["topic"] as? String == "com.example.app")
        #expect(event["environment"] as? String == "production")
        #expect(event["status"] as? Int == 410)
        #expect(event["reason"] as? String == "Unregistered")
        #expect((event["timestamp"] as? NSNumber)?.int64Value == 1_732_900_000_123)
        #expect(event["job_id"] as? String == "fan-out")
        #expect(try #require(events.first).properties.persistent)

        let refused = try failedReader.read(1)
        #expect(refused.count == 1)
        #expect(
            refused.first.map { String(decoding: $0.body, as: UTF8.self) } == "this is not json", "the body is kept")
        #expect(refused.first?.properties.headers[Worker.reasonHeader]?.contains("not JSON") == true)

        let received = simulator.received()
        #expect(received.count == 4)
        #expect(
            received.allSatisfy { $0.status == 200 || $0.status == 410 }, "JWT, topic and headers were all accepted")
        #expect(Set(received.map(\.deviceToken)) == Set(liveTokens + [deadToken, directToken]))
        let background = try #require(received.first { $0.deviceToken == directToken })
        #expect(background.pushType == "background")
        #expect(background.priority == "5")
        #expect(String(decoding: background.payload, as: UTF8.self) == #"{"aps": {"content-available": 1}}"#)
        #expect(received.first { $0.deviceToken == liveTokens[0] }?.topic == "com.example.app")

        // Stopping waits for the jobs under way, so their acknowledgements are counted by then.
        workerThread.stop()
        #expect(
            try redis.command(["HEXISTS", RedisKeys.node.tokens(bob), deadToken]).integer == 0,
            "the dead token left bob's cache entry")
        #expect(try redis.command(["HLEN", RedisKeys.node.tokens(alice)]).integer == 2)
        let stats = workerThread.worker.statistics.snapshot()
        #expect(stats.delivered == 3)
        #expect(stats.deadTokens == 1)
        #expect(stats.jobsRejected == 1)
        #expect(stats.jobsCompleted == 2)
    }

    /// A campaign's tokens checked with silent pushes before the real send: dead ones come back as events.
    @Test func prevalidationReportsDeadTokensWithSilentPushes() throws {
        let dead = String(repeating: "0e", count: 32)
        let live = String(repeating: "0f", count: 32)
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_777]), logger: logger)
        defer { simulator.shutdown() }
        let user = TestServices.unique("ivy")
        _ = try RedisConnection(url: TestServices.redisURL())
            .command(["HSET", RedisKeys.node.tokens(user), dead, "production", live, "production"])
        let jobs = TestServices.unique("jobs")
        let deadQueue = TestServices.unique("dead")
        let deadReader = try QueueReader(deadQueue)
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_DEAD_TOKENS_QUEUE": deadQueue
                ]), logger: logger)
        defer { workerThread.stop() }
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        let campaign = TestServices.unique("campaign")
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(campaign)", "users": ["\#(user)"], "prevalidate": true, "payload": {"aps": {"alert": "Sale!"}}}"#
                    .utf8))
        let event =
            try JSONSerialization.jsonObject(with: Data(try #require(try deadReader.read(1).first).body))
            as! [String: Any]
        #expect(event["token"] as? String == dead)
        #expect(event["job_id"] as? String == campaign)
        let received = simulator.received()
        #expect(received.count == 2)
        #expect(received.allSatisfy { $0.pushType == "background" && $0.priority == "5" && $0.expiration == "0" })
        #expect(
            received.allSatisfy { String(decoding: $0.payload, as: UTF8.self) == #"{"aps":{"content-available":1}}"# })
    }

    /// A fan-out job larger than WORKER_MAX_IN_FLIGHT goes out in waves: never more than the limit unanswered,
    /// and every notification delivered.
    @Test func notificationsInFlightStayWithinTheLimit() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.02
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let tokens = (0..<40).map { String(format: "%064x", 0xF1F0 + $0) }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "WORKER_MAX_IN_FLIGHT": "4"
                ]), logger: logger)
        defer { workerThread.stop() }
        let body =
            #"{"id": "waves", "tokens": [\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))

        // Sampled while the job runs: with 40 notifications at 20 ms each, a missing bound shows at once.
        let peak = Atomic<Int>(0)
        let sampling = Atomic<Bool>(true)
        let statistics = workerThread.worker.statistics
        let sampler = Thread {
            while sampling.load(ordering: .acquiring) {
                let now = statistics.notificationsInFlight
                if now > peak.load(ordering: .relaxed) { peak.store(now, ordering: .relaxed) }
            }
        }
        sampler.start()
        let summary =
            try JSONSerialization.jsonObject(with: Data(try #require(try replyReader.read(1).first).body))
            as! [String: Any]
        sampling.store(false, ordering: .releasing)
        #expect(summary["delivered"] as? Int == 40)
        #expect(simulator.received().count == 40, "each sent once")
        #expect(peak.load(ordering: .relaxed) <= 4, "at most WORKER_MAX_IN_FLIGHT unanswered")
        #expect(peak.load(ordering: .relaxed) >= 1, "the sampler saw the job under way")
    }

    /// An exchange of that name declared by someone else as `direct` still routes the events to the queue.
    @Test func deadTokenEventsReachTheQueueThroughAnExchangeDeclaredAsDirect() throws {
        let dead = String(repeating: "0d", count: 32)
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_001]), logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        let deadQueue = TestServices.unique("dead")
        let exchange = TestServices.unique("direct-x")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareExchange(exchange, type: "direct")
        try publisher.declareQueue(jobs)
        let deadReader = try QueueReader(deadQueue)
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_DEAD_TOKENS_QUEUE": deadQueue, "PUSH_DEAD_TOKENS_EXCHANGE": exchange
                ]), logger: logger)
        defer { workerThread.stop() }
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "direct-1", "tokens": ["\#(dead)"], "payload": {"aps": {}}}"#.utf8))
        let event = try #require(try deadReader.read(1).first)
        #expect(String(decoding: event.body, as: UTF8.self).contains(dead))
    }

    /// Queues someone else declared with other arguments (here a quorum jobs queue) are used, not fought over.
    @Test func aJobsQueueDeclaredWithOtherArgumentsIsUsedAsItIs() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("quorum-jobs")
        let replies = TestServices.unique("replies")
        let replyReader = try QueueReader(replies)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs, arguments: ["x-queue-type": .string("quorum")])
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "q-1", "tokens": ["\#(String(repeating: "1b", count: 32))"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { workerThread.stop() }
        let summary =
            try JSONSerialization.jsonObject(with: Data(try #require(try replyReader.read(1).first).body))
            as! [String: Any]
        #expect(summary["job_id"] as? String == "q-1")
        #expect(summary["delivered"] as? Int == 1)
    }
}
