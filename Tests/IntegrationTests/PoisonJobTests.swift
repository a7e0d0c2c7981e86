import AMQP
import APNs
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

/// A job that makes the worker exit (the debug build's TEST_FAULT_EXIT_ON_JOB fault) comes back to the next worker
/// again and again; after WORKER_MAX_DELIVERIES deliveries it is parked on the failed queue with the reason, while
/// the jobs delivered with it are all sent. On classic queues the fleet counts deliveries in Redis; ClusterTests runs
/// the same scenario on quorum queues, which count them themselves.
@Suite struct PoisonJobTests {
    @Test func aPoisonJobIsParkedOnAClassicQueue() throws {
        try Self.poisonJobIsParked(amqpURL: try TestServices.value("AMQP_URL"), queueType: "classic")
    }

    /// Ten jobs, the poison job, ten jobs; worker processes started again each time one exits, as a supervisor
    /// would.
    static func poisonJobIsParked(amqpURL: String, queueType: String) throws {
        let logger = Logger(label: "poison", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("poison-jobs")
        let failed = TestServices.unique("poison-failed")
        let arguments: [String: AMQPArgument] = queueType == "quorum" ? ["x-queue-type": .string("quorum")] : [:]
        let firstNode = try AMQPURL(String(amqpURL.split(separator: ",")[0]))
        let publisher = try AMQPConnection(url: firstNode)
        defer { publisher.close() }
        _ = try publisher.declareQueue(jobs, arguments: arguments)
        let failedReader = try QueueReader(failed, url: firstNode, arguments: arguments)
        try publisher.enablePublisherConfirms()
        let poisonID = "\(jobs)-poison"
        let tokens = (0..<20).map { String(format: "%064x", 0xB0_0000 + $0) }
        var bodies = tokens.map {
            #"{"id": "\#(jobs)-\#($0.suffix(4))", "tokens": ["\#($0)"], "payload": {"aps": {}}}"#
        }
        bodies.insert(
            #"{"id": "\#(poisonID)", "tokens": ["\#(String(repeating: "e", count: 64))"], "payload": {"aps": {}}}"#,
            at: 10)
        var last: UInt64 = 0
        for (index, body) in bodies.enumerated() {
            // Message-ids as `enqueue` gives them: the key of a job's delivery count on classic queues.
            let messageID = index == 10 ? poisonID : "\(jobs)-\(index)"
            last = try publisher.publish(
                to: jobs, body: Array(body.utf8), properties: AMQPProperties(messageID: messageID))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)

        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "AMQP_URL": amqpURL, "PUSH_QUEUE_TYPE": queueType, "PUSH_FAILED_QUEUE": failed,
                "TEST_FAULT_EXIT_ON_JOB": poisonID, "LOG_FORMAT": "text", "LOG_LEVEL": "info"
            ])
        var exits: [Int32] = []
        var survivor: ExecutablesTests.Child?
        for _ in 0..<10 where survivor == nil {
            let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
            if let parked = worker.waitForLine(containing: "poison job parked", timeout: 60) {
                #expect(parked.contains("job.deliveries=6"), "\(parked)")
                survivor = worker
            } else {
                exits.append(worker.waitForExit())
            }
        }
        let worker = try #require(survivor, "the poison job was parked (worker exits: \(exits))")
        defer { _ = worker.stop() }
        #expect(exits == [70, 70, 70, 70, 70], "the job stopped a worker at each of its 5 deliveries: \(exits)")

        let parked = try #require(try failedReader.read(1).first, "the poison job is on the failed queue")
        #expect(String(decoding: parked.body, as: UTF8.self).contains(poisonID), "the job's own body")
        let reason = parked.properties.headers[Worker.reasonHeader] ?? ""
        #expect(reason.contains("delivered 6 times, more than the 5 allowed"), "\(reason)")
        let allDelivered = TestServices.waitUntil(timeout: 30) {
            Set(simulator.received().filter { $0.status == 200 }.map { $0.deviceToken }).isSuperset(of: tokens)
        }
        #expect(allDelivered, "every other job was delivered")
        #expect(!simulator.received().contains { $0.deviceToken.hasPrefix("eeee") }, "the poison job sent nothing")
        #expect(try failedReader.read(1, timeout: 1).isEmpty, "no other job was parked")
        let delivered = Set(simulator.received().filter { $0.status == 200 }.map(\.deviceToken)).intersection(tokens)
            .count
        print(
            "failover | poison job among 20 others, \(queueType) queue: \(exits.count) worker exits, parked | 21 | "
                + "\(delivered) + 1 parked | 0 | -")
        // Classic queues do not count deliveries: the fleet counted in Redis the 5 redeliveries of a job behind the
        // poison job. Quorum queues do (x-delivery-count), and Redis is not asked. A parked job's history is gone.
        let redis = try RedisConnection(url: TestServices.redisURL())
        let behind = try redis.command(["GET", RedisKeys.node.deliveries("id:\(jobs)-11")])
        #expect(behind.integer == (queueType == "quorum" ? nil : 5), "\(behind)")
        let forgotten = try redis.command([
            "EXISTS", RedisKeys.node.deliveries("id:" + poisonID),
            RedisKeys.node.alone("id:" + poisonID)
        ])
        #expect(forgotten.integer == 0, "the parked job's count and mark are deleted")
    }

    /// Slow bulk jobs (200 tokens each under APNS_RATE_LIMIT=20: ten seconds a job) with summaries, an urgent queue,
    /// and a Redis database of their own: the scene of the two tests below.
    struct SlowBulkLane {
        let simulator: APNsSimulator
        let environment: [String: String]
        let bulkIDs: [String]
        private let jobs: String, urgentReplies: String
        private let urgentReader: QueueReader, bulkReader: QueueReader
        private let publisher: AMQPConnection

        init(
            _ label: String, _ database: TestServices.IsolatedDatabase, bulkJobs: Int, tokenBase: Int,
            _ settings: [String: String] = [:]
        ) throws {
            simulator = try APNsSimulator(configuration: .init(), logger: Logger(label: label, level: .critical))
            let (redisURL, _) = try TestServices.isolatedRedis(database)
            (jobs, urgentReplies, urgentReader, publisher) = try TestServices.jobQueues()
            let bulk = TestServices.unique("\(label)-bulk")
            let bulkReplies = TestServices.unique("\(label)-bulk-replies")
            bulkReader = try QueueReader(bulkReplies)
            try publisher.declareQueue(bulk)
            bulkIDs = (0..<bulkJobs).map { "\(bulk)-\($0)" }
            for (job, id) in bulkIDs.enumerated() {
                let tokens = (0..<200).map { "\"" + String(format: "%064x", tokenBase + job * 1000 + $0) + "\"" }
                let body = #"{"id": "\#(id)", "tokens": [\#(tokens.joined(separator: ","))], "payload": {"aps": {}}}"#
                try publisher.publish(
                    to: bulk, body: Array(body.utf8), properties: AMQPProperties(replyTo: bulkReplies, messageID: id))
            }
            environment = try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_BULK_QUEUE": bulk, "REDIS_URL": redisURL, "APNS_RATE_LIMIT": "20", "LOG_FORMAT": "text",
                    "LOG_LEVEL": "info"
                ].merging(settings) { $1 })
        }

        /// Publishes an urgent single-token job and waits for its summary; returns the seconds it took, and whether a
        /// bulk job's summary had come before it was read.
        func urgentJob(token: String) throws -> (seconds: Double?, bulkSettledFirst: Bool) {
            let published = Date()
            try publisher.publish(
                to: jobs, body: Array(#"{"tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: urgentReplies))
            let delivered = try urgentReader.read(1, timeout: 30).count == 1
            let seconds = delivered ? Date().timeIntervalSince(published) : nil
            return (seconds, !(try bulkReader.read(1, timeout: 0.2).isEmpty))
        }

        /// Whether a bulk job's summary comes, waited for while the simulator still receives pushes: under the rate
        /// limit a job takes ten seconds, and what else the machine runs (a sanitizer build) can make that minutes.
        func bulkSettles() throws -> Bool {
            var settled = false
            _ = try TestServices.waitWhileProgressing(progress: { simulator.received().count }) {
                settled = try bulkReader.read(1, timeout: 0.2).count == 1
                return settled
            }
            return settled
        }
    }

    /// Two rolling restarts (SIGTERM, jobs given back unfinished) while two slow bulk jobs run: their third delivery
    /// makes no suspect, and an urgent job published after the third start is delivered while they are still under
    /// way, not after them.
    @Test func rollingRestartsDoNotHoldUpUrgentWork() throws {
        let lane = try SlowBulkLane(
            "rolling", .rollingRestarts, bulkJobs: 2, tokenBase: 0xD0_0000, ["SHUTDOWN_TIMEOUT": "1"])
        defer { lane.simulator.shutdown() }
        for restart in 1...2 {
            let sentBefore = lane.simulator.received().count
            let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: lane.environment)
            #expect(
                TestServices.waitUntil(timeout: 30) { lane.simulator.received().count >= sentBefore + 10 },
                "start \(restart): the bulk jobs are under way")
            #expect(worker.stop() == 0, "start \(restart): an orderly stop")
        }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: lane.environment)
        defer { _ = worker.stop() }
        #expect(worker.waitForLine(containing: "consuming") != nil)
        let urgent = try lane.urgentJob(token: String(repeating: "ab", count: 32))
        let seconds = try #require(urgent.seconds, "the urgent job was delivered")
        #expect(!urgent.bulkSettledFirst, "while the bulk jobs were still under way")
        print(
            String(
                format:
                    "rolling restarts | urgent job after two rolling restarts under two bulk jobs | summary in %.2f s",
                seconds))
    }

    /// A bulk job that stopped two workers (the test fault exits on it) is a suspect at its third delivery and runs
    /// alone among bulk work; slow under the rate limit, it does not hold up an urgent job published meanwhile.
    @Test func aBulkSuspectRunsAloneWhileUrgentJobsAreDelivered() throws {
        let lane = try SlowBulkLane("bulk-suspect", .bulkSuspect, bulkJobs: 1, tokenBase: 0xE0_0000)
        defer { lane.simulator.shutdown() }
        for start in 1...2 {
            let crashing = try ExecutablesTests.Child(
                "apns-worker", ["run"],
                environment: lane.environment.merging(
                    ["TEST_FAULT_EXIT_ON_JOB": lane.bulkIDs[0]]) { $1 })
            #expect(crashing.waitForExit() == 70, "start \(start): the job stopped the worker")
        }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: lane.environment)
        defer { _ = worker.stop() }
        #expect(worker.waitForLine(containing: "starting a job alone") != nil, "the bulk job runs alone")
        let urgent = try lane.urgentJob(token: String(repeating: "cd", count: 32))
        #expect(urgent.seconds != nil, "the urgent job was delivered")
        #expect(!urgent.bulkSettledFirst, "while the suspect was still running alone")
        #expect(try lane.bulkSettles(), "and the suspect settled after")
    }
}
