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

#if canImport(Glibc)
    import Glibc
#endif

/// At-least-once delivery when things die: the worker process, and Redis under a running worker.
@Suite struct CrashRecoveryTests {
    let logger = Logger(label: "crash", level: .critical)

    @Test func killingTheWorkerMidBatchLosesNothing() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.05  // keeps notifications in flight long enough to kill the worker among them
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        let jobCount = 200
        var last: UInt64 = 0
        // Ids of this run's own: the idempotency record of an earlier run's "crash-7" must not count here.
        let prefix = TestServices.unique("crash")
        for job in 0..<jobCount {
            let tokens = (0..<5).map { "\"" + String(format: "%064x", job * 5 + $0 + 1) + "\"" }.joined(separator: ",")
            last = try publisher.publish(
                to: jobs,
                body: Array(#"{"id": "\#(prefix)-\#(job)", "tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "WORKER_PREFETCH": "20", "LOG_LEVEL": "info"
            ])
        let first = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(first.waitForLine(containing: "\"consuming\"") != nil)
        // Some jobs finish; then the worker dies without a chance to acknowledge the rest.
        let before = try replyReader.read(20, timeout: 30)
        #expect(first.stop(SIGKILL) == -SIGKILL)
        let sentBeforeCrash = simulator.received().count

        let second = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = second.stop(SIGTERM) }
        func jobID(_ message: AMQPDelivery) -> String? {
            (try? JSONSerialization.jsonObject(with: Data(message.body)) as? [String: Any])?["job_id"] as? String
        }
        var completed = Set(before.compactMap(jobID))
        while completed.count < jobCount, let next = try replyReader.read(1, timeout: 30).first {
            if let id = jobID(next) { completed.insert(id) }
        }
        #expect(completed.count == jobCount, "every job completed, \(jobCount - completed.count) missing")
        let received = simulator.received().filter { $0.status == 200 }
        let distinct = Set(received.map(\.deviceToken))
        #expect(distinct.count == jobCount * 5, "every notification delivered at least once")
        let duplicates = received.count - distinct.count
        // Redelivered jobs resend what was in flight at the kill: bounded by the prefetch (20 jobs x 5).
        #expect(duplicates <= 20 * 5, "duplicates \(duplicates), sent before the crash \(sentBeforeCrash)")
        TestServices.reportFault(
            "worker kill -9 mid-batch (200 jobs x 5, prefetch 20)", notifications: jobCount * 5,
            received: simulator.received())
    }

    /// A large job redelivered after a crash: what already had a final outcome is not sent again, and its one
    /// summary counts every notification of the job, over both deliveries. APNs stops
    /// answering after 300 pushes; the idempotency record must then hold all 300 within moments (it is written
    /// every 10 ms of answers, not in batches that a pause leaves unwritten), and after kill -9 only the pushes
    /// left unanswered go again.
    /// By tokens, and by users (a large job, resolved and sent in pieces of 250 users: each piece's answers go to the
    /// record as it completes).
    @Test(arguments: [false, true]) func aRedeliveredJobSkipsWhatWasAlreadySent(byUsers: Bool) throws {
        let tokenCount = 600
        let answered = 300
        let simulatorBox = Locked<APNsSimulator?>(nil)
        var configuration = APNsSimulator.Configuration(maximumConcurrentStreams: 50)
        configuration.behaviour.latency = 0.05
        let seen = Locked(0)
        configuration.observer = { _ in
            // From the 301st push on, answers wait (the server's loop judges requests one at a time, in order).
            if seen.withLock({
                $0 += 1
                return $0
            }) == answered, let simulator = simulatorBox.withLock({ $0 }) {
                var held = APNsSimulator.Behaviour()
                held.latency = 600
                simulator.setBehaviour(held)
            }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        simulatorBox.withLock { $0 = simulator }
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let jobID = TestServices.unique("big-job")
        let redis = try RedisConnection(url: TestServices.redisURL())
        let tokens = (0..<tokenCount).map { String(format: "%064x", $0 + 1) }
        let users = tokens.indices.map { "\(jobID)-user-\($0)" }
        if byUsers {
            _ = try redis.pipeline(
                zip(users, tokens).map { ["HSET", RedisKeys.node.tokens($0), $1, "production"] })
        }
        let targets =
            byUsers
            ? #""users": [\#(users.map { "\"\($0)\"" }.joined(separator: ","))]"#
            : #""tokens": [\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))]"#
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "\#(jobID)", \#(targets), "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        // One connection, never more: what APNs holds unanswered at the kill is bounded by its streams.
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_CONNECTIONS": "1", "APNS_MAX_CONNECTIONS": "1", "LOG_LEVEL": "info"
            ])
        let first = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        let recorded = TestServices.waitUntil {
            (try? redis.command(["SCARD", RedisKeys.node.job(jobID)]).integer) == Int64(answered)
        }
        #expect(recorded, "every answered push in the idempotency record while the rest wait")
        #expect(first.stop(SIGKILL) == -SIGKILL)
        let unanswered = simulator.received().count - answered

        var normal = APNsSimulator.Behaviour()
        normal.latency = 0.05
        simulator.setBehaviour(normal)
        let second = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = second.stop(SIGTERM) }
        let summary = try #require(try replyReader.read(1, timeout: 60).first)
        let object = try JSONSerialization.jsonObject(with: Data(summary.body)) as! [String: Any]
        // One summary for the job, counting its notifications over both deliveries (the idempotency record knows
        // what the first one settled); what was sent twice is counted below, at APNs.
        #expect(
            object["notifications"] as? Int == tokenCount && object["delivered"] as? Int == tokenCount
                && object["failed"] as? Int == 0, "\(object)")
        #expect(try replyReader.read(1, timeout: 1).isEmpty, "one summary")
        let received = simulator.received()
        #expect(Set(received.map(\.deviceToken)).count == tokenCount, "every notification delivered at least once")
        // Sent again: only the pushes APNs held unanswered at the kill (at most the 50 streams of the connection).
        #expect(
            received.count - tokenCount == unanswered && unanswered <= 50,
            "duplicates \(received.count - tokenCount), unanswered at the kill \(unanswered)")
        TestServices.reportFault(
            "worker kill -9 halfway through one 600-\(byUsers ? "user" : "token") job, APNs holding answers "
                + "(idempotency record)",
            notifications: tokenCount, received: received)
    }

    /// kill -9 at full speed with the default settings (prefetch 500, 5,000 in flight, 2 connections): 200 jobs of
    /// 100 users, the worker killed a quarter of the way through. The idempotency record keeps up (every 10 ms of
    /// answers), so a redelivery sends again only what was in flight at the kill and at most 10 ms of answers.
    @Test func killingTheWorkerAtFullSpeedResendsOnlyWhatWasInFlight() throws {
        let jobCount = 200
        let usersPerJob = 100
        let total = jobCount * usersPerJob
        let quarter = DispatchSemaphore(value: 0)
        let seen = Locked(0)
        var configuration = APNsSimulator.Configuration()
        // Answers out of order, as APNs's: many jobs are partly answered at any moment.
        configuration.behaviour.latencyJitter = 0.02
        configuration.observer = { _ in
            if seen.withLock({
                $0 += 1
                return $0
            }) == total / 4 {
                quarter.signal()
            }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let prefix = TestServices.unique("fast")
        let redis = try RedisConnection(url: TestServices.redisURL())
        for chunk in stride(from: 0, to: total, by: 1000) {
            _ = try redis.pipeline(
                (chunk..<min(total, chunk + 1000)).map {
                    [
                        "HSET", RedisKeys.node.tokens("\(prefix)-\($0)"), String(format: "%064x", 0x5000_0000 + $0),
                        "production"
                    ]
                })
        }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for job in 0..<jobCount {
            let users = (0..<usersPerJob).map { "\"\(prefix)-\(job * usersPerJob + $0)\"" }.joined(separator: ",")
            last = try publisher.publish(
                to: jobs,
                body: Array(#"{"id": "\#(prefix)-\#(job)", "users": [\#(users)], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        var environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs)
        environment.removeValue(forKey: "METRICS_PORT")  // everything else at its default
        environment["METRICS_PORT"] = "0"
        let first = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(quarter.wait(timeout: .now() + 60) == .success)
        #expect(first.stop(SIGKILL) == -SIGKILL)
        let sentBeforeCrash = simulator.received().count

        let second = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = second.stop(SIGTERM) }
        var completed = Set<String>()
        while completed.count < jobCount, let next = try replyReader.read(1, timeout: 60).first {
            if let id = (try? JSONSerialization.jsonObject(with: Data(next.body)) as? [String: Any])?["job_id"]
                as? String
            {
                completed.insert(id)
            }
        }
        #expect(completed.count == jobCount)
        let received = simulator.received().filter { $0.status == 200 }
        let duplicates = received.count - Set(received.map(\.deviceToken)).count
        // In flight at the kill: at most the worker's in-flight window (WORKER_MAX_IN_FLIGHT, 5,000 by default: with
        // every stream busy the pool grows until the window is out), answered by APNs but not yet read by the
        // worker, plus the last 10 ms of answers (a few hundred at this speed) not yet in Redis.
        #expect(duplicates <= 5000 + 500, "duplicates \(duplicates), sent before the kill \(sentBeforeCrash)")
        TestServices.reportFault(
            "worker kill -9 at full speed, default settings (200 jobs x 100 users, killed after "
                + "\(sentBeforeCrash) sent)", notifications: total, received: received)
    }

    /// The broker closes the worker's connection (as on a broker restart or a network cut) while jobs are under way.
    @Test func aCutBrokerConnectionIsReopenedAndNothingIsLost() throws {
        var configuration = APNsSimulator.Configuration()
        configuration.behaviour.latency = 0.02
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        func publish(_ range: Range<Int>) throws {
            for job in range {
                try publisher.publish(
                    to: jobs,
                    body: Array(
                        #"{"id": "cut-\#(job)", "tokens": ["\#(String(format: "%064x", job + 1))"], "payload": {"aps": {}}}"#
                            .utf8),
                    properties: AMQPProperties(replyTo: replies))
            }
        }
        let worker = try ExecutablesTests.Child(
            "apns-worker", ["run"],
            environment: try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "LOG_LEVEL": "info"
                ]))
        defer { _ = worker.stop(SIGTERM) }
        let consuming = try #require(worker.waitForLine(containing: "\"consuming\""))
        let localPort = try #require(consuming.firstMatch(of: /"amqp.local_port":"(\d+)"/).map { String($0.1) })
        try publish(0..<200)
        #expect(try replyReader.read(10).count == 10)

        // Close exactly this worker's connection, from the broker's side (rabbitmqctl names it by its Erlang pid).
        let listing = try TestServices.run(
            TestServices.value("RABBITMQCTL"), ["list_connections", "pid", "peer_port", "--quiet"])
        var name: String?
        for line in listing.split(separator: "\n") {
            let columns = line.split(separator: "\t").map(String.init)
            if columns.count == 2 && columns[1] == localPort { name = columns[0] }
        }
        let connectionName = try #require(name, "\(listing)")
        _ = try TestServices.run(
            TestServices.value("RABBITMQCTL"), ["close_connection", connectionName, "cut by the test"])
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil, "the worker connected again")
        try publish(200..<300)

        var completed = Set<String>()
        while completed.count < 290, let next = try replyReader.read(1, timeout: 30).first {
            if let id = (try? JSONSerialization.jsonObject(with: Data(next.body)) as? [String: Any])?["job_id"]
                as? String
            {
                completed.insert(id)
            }
        }
        #expect(completed.count == 290, "the 290 jobs after the first 10 all completed")
        TestServices.reportFault(
            "broker cuts the worker's connection (300 jobs)", notifications: 300,
            received: simulator.received())
    }

    /// Someone deletes the jobs queue under a running worker: the broker cancels its consumer, and the worker
    /// connects again, declares the queue anew and takes the jobs published to it afterwards.
    @Test func aDeletedJobsQueueIsDeclaredAgainAndConsumed() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        func publish(_ id: String, token: Int) throws {
            try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(id)", "tokens": ["\#(String(format: "%064x", token))"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        let worker = try ExecutablesTests.Child(
            "apns-worker", ["run"],
            environment: try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "LOG_LEVEL": "info"
                ]))
        defer { _ = worker.stop(SIGTERM) }
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        try publish(TestServices.unique("before-delete"), token: 1)
        #expect(try replyReader.read(1).count == 1)

        _ = try TestServices.run(TestServices.value("RABBITMQCTL"), ["delete_queue", jobs])
        #expect(worker.waitForLine(containing: "cancelled consumer") != nil, "the cancellation is logged")
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil, "the worker consumes again")
        // Only now does the queue exist again (the worker declared it); a job published before would have been dropped.
        #expect(try publisher.queueStatus(jobs)?.consumers == 1)
        let afterDelete = TestServices.unique("after-delete")
        try publish(afterDelete, token: 2)
        let summary = try #require(try replyReader.read(1).first)
        #expect(String(decoding: summary.body, as: UTF8.self).contains(afterDelete))
    }

    @Test func aRedisRestartUnderARunningWorkerIsSurvived() throws {
        let redisPort = TestServices.freePort()
        let redisDirectory = NSTemporaryDirectory() + TestServices.unique("redis")
        try FileManager.default.createDirectory(atPath: redisDirectory, withIntermediateDirectories: true)
        let redisArguments = [
            "--port", String(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", redisDirectory
        ]
        let firstRedis = try TestServices.Daemon("/usr/bin/redis-server", redisArguments)
        defer { firstRedis.stop() }
        let redisURL = RedisURL(host: "127.0.0.1", port: redisPort)
        let seeded = try connectWithRetry(redisURL)
        let user = TestServices.unique("gina")
        let token = String(repeating: "9a", count: 32)
        _ = try seeded.command(["HSET", RedisKeys.node.tokens(user), token, "production"])

        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "REDIS_URL": redisURL.description
                ]), logger: logger)
        defer { workerThread.stop() }
        let job = Array(#"{"id": "before", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8)
        try publisher.publish(to: jobs, body: job, properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1)

        // Redis goes away (its data with it, as on a restart without persistence) and comes back.
        firstRedis.stop()
        let secondRedis = try TestServices.Daemon("/usr/bin/redis-server", redisArguments)
        defer { secondRedis.stop() }
        // The app registered again meanwhile, with a new token: what Redis holds now is what the job reaches.
        let newToken = String(repeating: "9b", count: 32)
        _ = try connectWithRetry(redisURL).command(["HSET", RedisKeys.node.tokens(user), newToken, "production"])
        let after = TestServices.unique("after")
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "\#(after)", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let summary = try #require(try replyReader.read(1, timeout: 60).first)
        let object = try JSONSerialization.jsonObject(with: Data(summary.body)) as! [String: Any]
        #expect(object["job_id"] as? String == after)
        #expect(object["delivered"] as? Int == 1)
        #expect(simulator.received().last?.deviceToken == newToken)
        TestServices.reportFault(
            "Redis restart, data lost and re-seeded (a job before, a job after)", notifications: 2,
            received: simulator.received())
    }

    /// A freshly started redis-server takes a moment to listen; connection refusals until then are expected.
    private func connectWithRetry(_ url: RedisURL) throws -> RedisConnection {
        for _ in 0..<500 {
            if let connection = try? RedisConnection(url: url) { return connection }
            _ = poll(nil, 0, 20)  // the server's listen() is the event; there is no way to wait on it
        }
        return try RedisConnection(url: url)
    }
}
