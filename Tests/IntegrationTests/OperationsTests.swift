import AMQP
import AMQPBroker
import APNs
import APNsSimulator
import Configuration
import Foundation
import HTTP2
import Operations
import Redis
import RedisStore
import Synchronization
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// The operator's and the backend's commands (`apns-worker enqueue | tokens | dead-tokens tail | stats | cleanup`)
/// run as processes against the real broker and Redis, and the cleanup consumer in process.
@Suite struct OperationsTests {
    /// Runs `apns-worker` with `arguments` to its end: exit status and everything it printed (stdout, then stderr).
    static func apnsWorker(
        _ arguments: [String], environment: [String: String] = [:],
        input: String? = nil
    ) throws -> (status: Int32, output: String, errors: String) {
        let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: directory + "/apns-worker")
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(["LOG_FORMAT": "text", "METRICS_PORT": "0"]) {
            _, new in new
        }.merging(environment) { _, new in new }
        let output = Pipe()
        let errors = Pipe()
        let stdin = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = input == nil ? FileHandle.nullDevice : stdin
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        if let input {
            stdin.fileHandleForWriting.write(Data(input.utf8))
            try stdin.fileHandleForWriting.close()
        }
        // stderr is read on another thread so that neither pipe can fill up and block the child.
        let errorText = Locked("")
        let errorsRead = DispatchSemaphore(value: 0)
        Thread {
            let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            errorText.withLock { $0 = text }
            errorsRead.signal()
        }.start()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        errorsRead.wait()
        exited.wait()
        return (process.terminationStatus, text, errorText.withLock { $0 })
    }

    static func token(_ byte: String) -> String { String(repeating: byte, count: 32) }

    @Test func tokensAreAddedListedMovedAndRemoved() throws {
        let alice = TestServices.unique("alice")
        let bob = TestServices.unique("bob")
        let phone = Self.token("a1")
        let tablet = Self.token("b2")
        #expect(
            try Self.apnsWorker([
                "tokens", "add", alice, phone, "--environment", "sandbox",
                "--device", #"{"model":"iPhone15,2"}"#
            ]).status == 0)
        #expect(try Self.apnsWorker(["tokens", "add", alice, tablet]).status == 0)

        let listed = try Self.apnsWorker(["tokens", "list", alice])
        #expect(listed.status == 0)
        #expect(listed.output.contains("a1a1a1a1…(64)"), "tokens are shortened: \(listed.output)")
        #expect(!listed.output.contains(phone), "no full token without --full-tokens")
        #expect(listed.output.contains("sandbox") && listed.output.contains("iPhone15,2"))
        let year = Calendar(identifier: .gregorian).component(.year, from: Date())
        #expect(listed.output.contains("\(year)-") && listed.output.contains("(0 d)"), "last registration shown")

        // The tablet changes hands: it leaves alice for bob.
        #expect(try Self.apnsWorker(["tokens", "add", bob, tablet]).status == 0)
        let json = try Self.apnsWorker(["tokens", "list", alice, "--json", "--full-tokens"])
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [[String: Any]])
        #expect(entries.map { $0["token"] as? String } == [phone])
        #expect(entries.first?["environment"] as? String == "sandbox")
        #expect(
            (entries.first?["registered_at"] as? NSNumber).map {
                abs($0.doubleValue / 1000 - Date().timeIntervalSince1970) < 60
            } == true)

        let redis = try RedisConnection(url: TestServices.redisURL())
        // Device metadata another system wrote as plain text is listed as a string: the listing stays JSON.
        _ = try redis.command(["HSET", RedisKeys.node.devices(alice), phone, "iPhone 15"])
        let plain = try Self.apnsWorker(["tokens", "list", alice, "--json", "--full-tokens"])
        let plainEntries = try JSONSerialization.jsonObject(with: Data(plain.output.utf8)) as? [[String: Any]]
        #expect(plainEntries?.first?["device"] as? String == "iPhone 15", "\(plain.output)")
        #expect(try redis.command(["HGET", RedisKeys.node.tokens(bob), tablet]).text == "production")
        #expect(try redis.command(["GET", RedisKeys.node.owner(tablet)]).text == bob)

        #expect(try Self.apnsWorker(["tokens", "remove", alice, phone]).output.contains("removed"))
        #expect(try Self.apnsWorker(["tokens", "list", alice]).output.contains("has no tokens"))
        #expect(try redis.command(["EXISTS", RedisKeys.node.registered(alice)]).integer == 0)

        let bad = try Self.apnsWorker(["tokens", "add", alice, "not-hex"])
        #expect(bad.status == 2)
        #expect(bad.errors.contains("TOKEN"), "\(bad.errors)")
        #expect(try Self.apnsWorker(["tokens", "frobnicate"]).status == 2)
        let badActivity = try Self.apnsWorker([
            "tokens", "add", alice, phone, "--topic",
            "com.example.app.push-type.liveactivity", "--activity", "a b}{*"
        ])
        #expect(
            badActivity.status == 2 && badActivity.errors.contains("--activity must be 1 to 256 ASCII letters"),
            "\(badActivity)")
        #expect(try redis.command(["EXISTS", "apns:activity:a b}{*"]).integer == 0)
    }

    @Test func enqueueFromAFilePublishesGoodJobsAndNamesTheBadLines() throws {
        let jobs = TestServices.unique("jobs")
        let reader = try QueueReader(jobs)
        let file = try TestServices.temporaryFile(
            "jobs.jsonl",
            contents: """
                {"id": "file-1", "users": ["u1"], "payload": {"aps": {"alert": "one"}}}

                {"users": ["u2"], "payload": {"aps": {"alert": "two"}}}
                {"users": ["u3"], "push_type": "smoke-signal", "payload": {"aps": {}}}
                this is not JSON
                {"tokens": ["\(Self.token("c3"))"], "payload": {"aps": {"alert": "four"}}}
                """)
        let result = try Self.apnsWorker(["enqueue", file], environment: ["PUSH_JOBS_QUEUE": jobs])
        #expect(result.status == 65, "some jobs refused: \(result.errors)")
        #expect(result.output.contains("published 3 jobs"), "\(result.output)")
        #expect(result.errors.contains("line 4: unknown push_type \"smoke-signal\""), "\(result.errors)")
        #expect(result.errors.contains("line 5: body is not JSON"))
        #expect(result.errors.contains("3 published, 2 refused"), "a final progress line: \(result.errors)")

        let messages = try reader.read(3)
        #expect(messages.count == 3)
        #expect(messages.allSatisfy { $0.properties.persistent })
        #expect(messages.first?.properties.messageID == "file-1", "the job's own id is its message-id")
        #expect(
            messages.dropFirst().allSatisfy { ($0.properties.messageID ?? "").count == 36 },
            "jobs without an id get one, so a redelivery is recognised")
        #expect(
            String(decoding: messages[1].body, as: UTF8.self).contains("\"two\""),
            "bodies published unchanged, in order")
    }

    /// `enqueue --check`: the lines a worker would refuse, with their reasons, and nothing published; no broker is
    /// needed (an unreachable AMQP_URL changes nothing).
    @Test func enqueueCheckNamesWhatAWorkerWouldRefuseAndPublishesNothing() throws {
        let file = try TestServices.temporaryFile(
            "check.jsonl",
            contents: """
                {"id": "ok", "topic": "com.example.app", "users": ["u1"], "payload": {"aps": {"alert": "one"}}}
                {"users": ["u3"], "topic": "com.example.app", "push_type": "smoke-signal", "payload": {"aps": {}}}
                this is not JSON
                {"tokens": ["\(Self.token("c3"))"], "topic": "com.example.app", "priority": 7, "payload": {}}
                """)
        let result = try Self.apnsWorker(
            ["enqueue", "--check", file], environment: ["AMQP_URL": "amqp://127.0.0.1:9/%2f"])
        #expect(result.status == 65, "\(result.output) \(result.errors)")
        #expect(result.output.contains("refused line 2: unknown push_type \"smoke-signal\""), "\(result.output)")
        #expect(result.output.contains("refused line 3: body is not JSON"))
        #expect(result.output.contains("refused line 4: priority 7"))
        #expect(result.output.contains("checked 4 jobs: 1 would be accepted, 3 refused"), "\(result.output)")
        let good = try TestServices.temporaryFile(
            "good.jsonl", contents: #"{"topic": "t", "users": ["u1"], "payload": {}}"#)
        let clean = try Self.apnsWorker(
            ["enqueue", "--check", good], environment: ["AMQP_URL": "amqp://127.0.0.1:9/%2f"])
        #expect(
            clean.status == 0 && clean.output.contains("checked 1 jobs: 1 would be accepted, 0 refused"), "\(clean)")
    }

    /// A line past the message limit is refused at once and skipped; one that never ends (`/dev/zero`) stops the
    /// reading instead of filling memory, and the command says why.
    @Test func enqueueRefusesAnEndlessLine() throws {
        let jobs = TestServices.unique("jobs")
        let huge = String(repeating: "x", count: (1 << 20) + 10)
        let file = try TestServices.temporaryFile(
            "long.jsonl",
            contents: """
                \(huge)
                {"users": ["u1"], "payload": {"aps": {"alert": "after"}}}
                """)
        let long = try Self.apnsWorker(["enqueue", file, "--no-progress"], environment: ["PUSH_JOBS_QUEUE": jobs])
        #expect(long.status == 65 && long.output.contains("published 1 jobs"), "\(long.output) \(long.errors)")
        #expect(long.errors.contains("refused line 1: over the 1048576-byte message limit"), "\(long.errors)")

        let endless = try Self.apnsWorker(
            ["enqueue", "/dev/zero", "--no-progress"], environment: ["PUSH_JOBS_QUEUE": jobs])
        #expect(endless.status == 2, "\(endless.errors)")
        #expect(endless.errors.contains("refused line 1: over the 1048576-byte message limit"), "\(endless.errors)")
        #expect(endless.errors.contains("line 1 is over 64 MiB and still has no line end"), "\(endless.errors)")
    }

    @Test func enqueueFromFlagsAndFromStdin() throws {
        let jobs = TestServices.unique("jobs")
        let reader = try QueueReader(jobs)
        let flags = try Self.apnsWorker(
            [
                "enqueue", "--user", "alice", "--user", "bob", "--alert", "Shipped \"today\"",
                "--title", "Order 7", "--topic", "com.example.shop", "--priority", "5",
                "--id", "flags-1"
            ], environment: ["PUSH_JOBS_QUEUE": jobs])
        #expect(flags.status == 0, "\(flags.errors)")
        let stdin = try Self.apnsWorker(
            ["enqueue", "-"], environment: ["PUSH_JOBS_QUEUE": jobs],
            input: #"{"id": "stdin-1", "users": ["carol"], "payload": {"aps": {}}}"# + "\n")
        #expect(stdin.status == 0, "\(stdin.errors)")

        let messages = try reader.read(2)
        let job = try PushJob.decode(try #require(messages.first).body, defaultTopic: nil, fallbackID: "")
        #expect(job.id == "flags-1" && job.users == ["alice", "bob"] && job.topic == "com.example.shop")
        #expect(job.priority == .considerPower)
        #expect(
            String(decoding: job.payload, as: UTF8.self)
                == #"{"aps":{"alert":{"title":"Order 7","body":"Shipped \"today\""}}}"#)
        #expect(try PushJob.decode(try #require(messages.last).body, defaultTopic: "t", fallbackID: "").id == "stdin-1")

        let bulk = TestServices.unique("bulk")
        let bulkReader = try QueueReader(bulk)
        let campaign = try Self.apnsWorker(
            ["enqueue", "--bulk", "--user", "erin", "--alert", "Sale", "--deadline", "4102444800"],
            environment: ["PUSH_JOBS_QUEUE": jobs, "PUSH_BULK_QUEUE": bulk])
        #expect(
            campaign.status == 0 && campaign.output.contains("published 1 jobs to \(bulk)"),
            "\(campaign.output) \(campaign.errors)")
        let queued = try #require(try bulkReader.read(1).first, "--bulk publishes to PUSH_BULK_QUEUE")
        #expect(try PushJob.decode(queued.body, defaultTopic: "t", fallbackID: "").deadline == 4_102_444_800)
        let stamped = try #require(queued.properties.timestamp, "enqueue stamps jobs, so a lane's wait can be told")
        #expect(abs(Double(stamped) - Date().timeIntervalSince1970) < 60)

        #expect(try Self.apnsWorker(["enqueue", "--user", "alice"]).status == 2, "nothing to send")
        #expect(try Self.apnsWorker(["enqueue"]).status == 2, "no jobs given")
        #expect(try Self.apnsWorker(["enqueue", "--user", "a", "--alert", "x", "--priority", "high"]).status == 2)
        let unreachable = try Self.apnsWorker(
            ["enqueue", "--user", "a", "--alert", "x"],
            environment: ["AMQP_URL": "amqp://guest:guest@127.0.0.1:\(TestServices.freePort())/%2f"])
        #expect(unreachable.status == 69, "\(unreachable.errors)")
    }

    /// `tail` sees each event as published, and the dead-token queue still gets it.
    @Test func deadTokensTailWatchesWithoutTakingEvents() throws {
        let deadToken = Self.token("de")
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [deadToken: 1_732_900_000_123]),
            logger: Logger(label: "sim", level: .warning))
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            ["PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-exchange")])
        environment["LOG_FORMAT"] = "text"
        let deadReader = try QueueReader(try #require(environment["PUSH_DEAD_TOKENS_QUEUE"]))

        let tail = try ExecutablesTests.Child(
            "apns-worker", ["dead-tokens", "tail", "--count", "1"], environment: environment)
        #expect(tail.waitForLine(containing: "watching") != nil)
        let worker = try WorkerThread(environment, logger: Logger(label: "worker", level: .warning))
        defer { worker.stop() }
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "tail-1", "tokens": ["\#(deadToken)"], "payload": {"aps": {}}}"#.utf8))

        let line = try #require(tail.waitForLine(containing: "Unregistered"))
        #expect(line.contains("dededede…(64)") && !line.contains(deadToken), "shortened token: \(line)")
        #expect(line.contains("\"job_id\":\"tail-1\""))
        #expect(tail.waitForExit() == 0, "--count 1 stops after one event")
        let queued = try deadReader.read(1)
        #expect(queued.count == 1, "the cleanup consumers' queue still has the event")
        let queuedText = String(decoding: queued.first?.body ?? [], as: UTF8.self)
        #expect(queuedText.contains(deadToken))
    }

    /// Queue depths from the broker; fleet totals and live workers from what workers report to Redis.
    @Test func statsShowsQueuesTotalsAndWorkers() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: Logger(label: "sim", level: .warning))
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        // A database of its own: the totals are the whole Redis's, and other tests' workers report too.
        let redisURL = try TestServices.redisURL().withDatabase(10)
        let redis = try RedisConnection(url: redisURL)
        _ = try redis.command(["FLUSHDB"])
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "REDIS_URL": redisURL.description(revealingPassword: true)
            ])
        let user = TestServices.unique("dora")
        _ = try redis.command([
            "HSET", RedisKeys.node.tokens(user), Self.token("d0"), "production",
            Self.token("d1"), "production"
        ])
        let failedQueue = try #require(environment["PUSH_FAILED_QUEUE"])
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(failedQueue)
        for _ in 0..<2 { try publisher.publish(to: failedQueue, body: Array("parked".utf8)) }
        try publisher.declareQueue(jobs)
        let replies = TestServices.unique("replies")
        let replyReader = try QueueReader(replies)
        for index in 0..<3 {
            try publisher.publish(
                to: jobs,
                body: Array(#"{"id": "stats-\#(index)", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        // A bulk job that waited 30 s in its queue (its timestamp says so).
        let bulk = try #require(environment["PUSH_BULK_QUEUE"])
        try publisher.declareQueue(bulk)
        try publisher.publish(
            to: bulk, body: Array(#"{"id": "stats-bulk", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies, timestamp: Int64(Date().timeIntervalSince1970) - 30))
        // A job an hour ahead, which waits in one of the lane's schedule tiers (3,276.8 s): taken once, not sent.
        let sendAt = Int(Date().timeIntervalSince1970) + 3_600
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(TestServices.unique("stats-later"))", "users": ["\#(user)"], "send_at": \#(sendAt), "payload": {"aps": {}}}"#
                    .utf8))
        let worker = try WorkerThread(environment, logger: Logger(label: "worker", level: .warning))
        #expect(try replyReader.read(4).count == 4)
        #expect(
            TestServices.waitUntil(timeout: 10) {
                (try? publisher.queueStatus(jobs + ".retry.3276800ms"))??.messages == 1
            }, "the scheduled job waits in its tier")
        worker.stop()  // a stopping worker reports its last counts

        environment["PUSH_JOBS_QUEUE"] = jobs
        let stats = try Self.apnsWorker(["stats", "--json", "--minutes", "2"], environment: environment)
        #expect(stats.status == 0, "\(stats.errors)")
        let report = try #require(try JSONSerialization.jsonObject(with: Data(stats.output.utf8)) as? [String: Any])
        let totals = try #require(report["totals"] as? [String: Int])
        #expect(totals["delivered"] == 8 && totals["jobs"] == 4, "\(totals)")
        let lanes = try #require(report["lanes"] as? [[String: Any]])
        let urgentLane = try #require(lanes.first { $0["lane"] as? String == "urgent" })
        let bulkLane = try #require(lanes.first { $0["lane"] as? String == "bulk" })
        #expect(
            urgentLane["queue"] as? String == jobs && urgentLane["jobs_taken"] as? Int == 4
                && urgentLane["sent"] as? Int == 6,
            "\(urgentLane)")
        #expect(
            bulkLane["queue"] as? String == bulk && bulkLane["jobs_taken"] as? Int == 1
                && bulkLane["sent"] as? Int == 2,
            "\(bulkLane)")
        let waited = try #require(
            bulkLane["longest_wait_ms"] as? Int, "the bulk job's wait is known from its timestamp")
        #expect(waited >= 29_000 && waited < 120_000, "\(waited) ms")
        #expect(urgentLane["longest_wait_ms"] is NSNull, "urgent jobs carried no timestamp: no wait is claimed")
        let queues = try #require(report["queues"] as? [[String: Any]])
        let failed = queues.first { $0["name"] as? String == failedQueue }
        #expect((failed?["messages"] as? Int) == 2, "\(queues)")
        #expect(queues.first { $0["name"] as? String == jobs }?["messages"] as? Int == 0)
        let scheduled = queues.first { ($0["role"] as? String)?.hasPrefix("urgent scheduled") == true }
        #expect(scheduled?["messages"] as? Int == 1, "the scheduled job, in the urgent lane's tiers: \(queues)")
        #expect((report["workers"] as? [String])?.contains(Worker.identity) == true, "the worker reported itself alive")

        let text = try Self.apnsWorker(["stats"], environment: environment)
        #expect(text.output.contains("WORKERS ALIVE") && text.output.contains(failedQueue), "\(text.output)")
        #expect(text.output.contains("LONGEST WAIT") && text.output.contains("bulk     \(bulk)"), "\(text.output)")
        #expect(
            text.output.contains(try Regex(#"bulk +\S+ +0 +0 +[0-9.]+ +[0-9.]+ +(29|30|31) s"#)),
            "the bulk lane's wait in seconds")
        #expect(try Self.apnsWorker(["stats", "--minutes", "0"]).status == 2)
    }

    /// `stats --watch 1` into a pipe: a frame per second as plain lines, the rates since the previous frame
    /// following what workers add to the fleet's statistics, and Ctrl-C ending it with exit 0.
    @Test func statsWatchRedrawsRatesAsTheyChangeAndCtrlCExitsZero() throws {
        let (redisURL, redis) = try TestServices.isolatedRedis(.statsWatch)
        let jobs = TestServices.unique("jobs")
        let watch = try ExecutablesTests.Child(
            "apns-worker", ["stats", "--watch", "1", "--minutes", "1"],
            environment: [
                "REDIS_URL": redisURL, "PUSH_JOBS_QUEUE": jobs, "PUSH_BULK_QUEUE": TestServices.unique("bulk"),
                "LOG_FORMAT": "text", "METRICS_PORT": "0"
            ])
        defer { _ = watch.stop(SIGKILL) }
        let first = watch.waitForLine(containing: "NOW (all workers")
        #expect(first?.contains("rates from the next frame on") == true, "\(first ?? "no first frame")")
        #expect(watch.waitForLine(containing: "urgent   \(jobs)") != nil, "the frame holds the report's lanes")
        #expect(watch.waitForLine(containing: "INVALIDATION GUARD") != nil)
        #expect(watch.waitForLine(containing: "WORKERS ALIVE") != nil)
        // What a worker's report adds shows as a rate in a later frame, and is gone from the one after it.
        let minute = Int64(Date().timeIntervalSince1970) / 60
        _ = try redis.command(["HINCRBY", RedisKeys.node.statistics(minute: minute), "delivered", "500"])
        var sawRate = false
        var sawItFall = false
        for _ in 0..<5 {
            guard let line = watch.waitForLine(containing: "NOW (all workers, last 1 s)") else { break }
            let rate = line.firstMatch(of: /delivered ([0-9.]+)\/s/).flatMap { Double($0.1) } ?? -1
            if !sawRate {
                sawRate = rate > 100
            } else {
                sawItFall = rate == 0
                break
            }
        }
        #expect(sawRate, "500 delivered between two frames a second apart shows as hundreds per second")
        #expect(sawItFall, "the frame after shows what changed since, nothing")
        #expect(watch.stop(SIGINT) == 0, "Ctrl-C ends the live view with exit 0")
        #expect(try Self.apnsWorker(["stats", "--watch", "0"]).status == 2)
    }

    /// The token lifecycle: registrations (in order or not), logouts, dead tokens, unreadable messages, the sweep.
    @Test func cleanupAppliesEventsAndSweepsInactiveTokens() throws {
        // A database of its own: the sweep covers every user in it.
        let redisURL = try TestServices.redisURL().withDatabase(11)
        try Self.checkTokenLifecycle(
            redis: try RedisConnection(url: redisURL),
            settings: ["REDIS_URL": redisURL.description(revealingPassword: true)])
    }

    /// The lifecycle above on the Redis `settings` name, which `redis` reaches; every swept token in it is this
    /// test's.
    static func checkTokenLifecycle(redis: any RedisClient, settings: [String: String]) throws {
        let keys = RedisKeys(cluster: redis.isCluster)
        let environment = [
            "AMQP_URL": try TestServices.value("AMQP_URL"),
            "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"),
            "PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-x"),
            "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("registrations"),
            "PUSH_FAILED_QUEUE": TestServices.unique("failed"),
            "CLEANUP_INACTIVE_DAYS": "90"
        ].merging(settings) { $1 }
        let configuration = try WorkerConfiguration.load(from: environment, requiringCredentials: false)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let day: Int64 = 86_400_000
        let user = TestServices.unique("erin")
        let other = TestServices.unique("frank")
        let fresh = OperationsTests.token("f1")
        let old = OperationsTests.token("f2")
        let loggedOut = OperationsTests.token("f3")
        let revived = OperationsTests.token("f4")
        let dead = OperationsTests.token("f5")
        let direct = OperationsTests.token("f6")
        let unknownAge = OperationsTests.token("f7")
        _ = try redis.command(["HSET", keys.tokens(user), unknownAge, "production"])
        let cache = TokenCache(redis: redis, logger: Logger(label: "test", level: .warning))
        try cache.register([
            TokenRegistration(
                user: user, token: revived, scope: TokenScope(environment: .production), registeredAt: now - 1_000),
            TokenRegistration(
                user: user, token: dead, scope: TokenScope(environment: .production), registeredAt: now - 10 * day),
            TokenRegistration(
                user: other, token: direct, scope: TokenScope(environment: .production), registeredAt: now - 10 * day)
        ])

        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try Topology.declareDeadTokens(on: publisher, configuration.broker.queues)
        try publisher.declareQueue(configuration.broker.queues.registrations)
        let failedReader = try QueueReader(configuration.broker.queues.failed)
        func register(_ token: String, at: Int64, action: String = "register", device: String = "null") throws {
            try publisher.publish(
                to: configuration.broker.queues.registrations,
                body: Array(
                    """
                    {"user": "\(user)", "token": "\(token)", "environment": "sandbox", "timestamp": \(at),
                     "device": \(device), "action": "\(action)"}
                    """.utf8))
        }
        try register(fresh, at: now - 5_000, device: #"{"model": "iPhone15,2", "os": "17.1"}"#)
        try register(fresh, at: now - 9_000)  // older, arrives later: changes nothing
        try register(old, at: now - 100 * day)  // registered, but long ago: the sweep takes it
        try register(loggedOut, at: now - 3_000)
        try register(loggedOut, at: now - 2_000, action: "unregister")
        try publisher.publish(
            to: configuration.broker.queues.registrations, body: Array(#"{"user": "x", "token": "nope"}"#.utf8))
        func died(_ token: String, user: String?, at: Int64?) throws {
            let event = DeadTokenEvent(
                token: token, user: user, topic: "com.example.app", environment: .production,
                status: 410, reason: "Unregistered", timestamp: at, jobID: "j")
            try publisher.publish(to: configuration.broker.queues.deadTokens, body: event.json)
        }
        try died(revived, user: user, at: now - 5_000)  // registered again after APNs saw it die: kept
        try died(dead, user: user, at: now - 1_000)
        try died(direct, user: nil, at: now - 1_000)  // sent directly: found through its owner

        let cleanup = TokenCleanup(configuration: configuration, logger: Logger(label: "cleanup", level: .warning))
        try cleanup.run(untilIdle: true)

        let entries = Dictionary(uniqueKeysWithValues: try cache.entries(forUser: user).map { ($0.token, $0) })
        #expect(Set(entries.keys) == [fresh, revived, unknownAge], "\(entries.keys.map { Redact.token($0) })")
        #expect(entries[fresh]?.registeredAt == now - 5_000, "the older registration did not win")
        #expect(entries[fresh]?.value == "sandbox")
        #expect(entries[fresh]?.deviceJSON == #"{"model": "iPhone15,2", "os": "17.1"}"#)
        #expect(try cache.entries(forUser: other).isEmpty)
        #expect(try redis.command(["EXISTS", keys.owner(direct)]).integer == 0)
        let statistics = cleanup.statistics
        #expect(statistics.registrationsApplied.load(ordering: .relaxed) == 3)
        #expect(statistics.registrationsStale.load(ordering: .relaxed) == 1)
        #expect(statistics.unregistrations.load(ordering: .relaxed) == 1)
        #expect(statistics.deadTokensRemoved.load(ordering: .relaxed) == 2)
        #expect(statistics.deadTokensKept.load(ordering: .relaxed) == 1)
        #expect(statistics.sweptTokens.load(ordering: .relaxed) == 1)
        #expect(statistics.refused.load(ordering: .relaxed) == 1)
        let parked = try failedReader.read(1)
        #expect(
            parked.first?.properties.headers[Worker.reasonHeader]?.hasPrefix("token: ") == true,
            "\(parked.first?.properties.headers ?? [:])")
        let depth = try publisher.queueStatus(configuration.broker.queues.registrations)
        #expect(depth?.messages == 0, "everything acknowledged")
    }

    @Test func tokensImportAppliesRegistrationEvents() throws {
        try Self.checkTokensImport(redis: try RedisConnection(url: TestServices.redisURL()), settings: [:])
    }

    /// `tokens import` on the Redis `settings` name, which `redis` reaches: events applied as cleanup applies them (an
    /// older registration loses, a logout of a token not there changes nothing), a bad line reported by number and
    /// skipped, and the same file again leaves the cache as it was.
    static func checkTokensImport(redis: any RedisClient, settings: [String: String]) throws {
        let first = TestServices.unique("import-a")
        let second = TestServices.unique("import-b")
        // Tokens of this run only: owner keys are shared by everything on the same Redis.
        let base = String(UInt64.random(in: 1...UInt64.max), radix: 16)
        func token(_ byte: String) -> String { String((String(repeating: byte, count: 32) + base).suffix(64)) }
        // The last two lines, without a time of their own, have the same stand-in time: a logout, then a login
        // again, which wins as it comes later.
        let third = TestServices.unique("import-c")
        let lines = """
            {"user": "\(first)", "token": "\(token("a1"))", "timestamp": 1732900001000}
            {"user": "\(second)", "token": "\(token("a2"))", "environment": "sandbox", "timestamp": 1732900002000}
            {"user": "\(first)", "token": "\(token("a2"))", "timestamp": 1732900001500}

            not an event
            {"user": "\(second)", "token": "\(token("a3"))", "timestamp": 1732900003000, "action": "unregister"}
            {"user": "\(third)", "token": "\(token("a4"))", "action": "unregister"}
            {"user": "\(third)", "token": "\(token("a4"))"}

            """
        let cache = TokenCache(redis: redis, logger: Logger(label: "test", level: .critical))
        func expectCache(_ note: Comment) throws {
            let resolved = try cache.resolve([first, second, third]).tokens
            #expect(resolved[first]?.map(\.token) == [token("a1")], note)
            #expect(
                resolved[second]?.map(\.token) == [token("a2")]
                    && resolved[second]?.first?.scope.environment == .sandbox,
                note)
            #expect(resolved[third]?.map(\.token) == [token("a4")], "logged out, then in again: \(note)")
        }
        let imported = try apnsWorker(["tokens", "import"], environment: settings, input: lines)
        #expect(imported.status == 65, "a refused line: exit 65 once the rest is in: \(imported.errors)")
        #expect(
            imported.output.contains("imported 7 lines") && imported.output.contains("3 applied")
                && imported.output.contains("3 unchanged") && imported.output.contains("1 refused"),
            "\(imported.output)")
        #expect(imported.errors.contains("line 5: body is not JSON"), "\(imported.errors)")
        try expectCache("imported")

        let file = try TestServices.temporaryFile("registrations.jsonl", contents: lines)
        let again = try apnsWorker(["tokens", "import", file], environment: settings)
        #expect(again.status == 65 && again.output.contains("imported 7 lines"), "\(again.output)\(again.errors)")
        try expectCache("imported again")
        #expect(try apnsWorker(["tokens", "import", "/no/such/file"], environment: settings).status == 2)
    }

    /// `cleanup --once` as a cron job runs it: a registration becomes a token the worker can use.
    @Test func cleanupOnceAsAProcess() throws {
        let registrations = TestServices.unique("registrations")
        // A database of its own: the sweep covers every user in it, and other tests register tokens long ago.
        let redisURL = try TestServices.redisURL().withDatabase(14)
        let environment = [
            "PUSH_REGISTRATIONS_QUEUE": registrations, "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"),
            "PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-x"),
            "REDIS_URL": redisURL.description(revealingPassword: true), "CLEANUP_INACTIVE_DAYS": "3650"
        ]
        let user = TestServices.unique("gina")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(registrations)
        try publisher.publish(
            to: registrations, body: Array(#"{"user": "\#(user)", "token": "\#(Self.token("9a"))"}"#.utf8))
        let run = try Self.apnsWorker(["cleanup", "--once"], environment: environment)
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.errors.contains("registered=1"), "\(run.errors)")
        let targets = try TokenCache(redis: try RedisConnection(url: redisURL), logger: Logger(label: "test")).resolve([
            user
        ])
        #expect(targets.tokens[user]?.map(\.token) == [Self.token("9a")])
    }

    @Test func everyCommandExplainsItself() throws {
        let overview = try Self.apnsWorker(["--help"])
        #expect(overview.status == 0)
        for command in ["run", "enqueue", "tokens", "dead-tokens tail", "stats", "cleanup", "EXIT CODES"] {
            #expect(overview.output.contains(command), "\(command) in --help")
        }
        for command in ["run", "enqueue", "tokens", "dead-tokens", "stats", "cleanup"] {
            let help = try Self.apnsWorker([command, "--help"])
            #expect(
                help.status == 0 && help.output.contains("USAGE: apns-worker") && help.output.contains("EXIT CODES"),
                "\(command) --help: \(help.output)")
        }
        #expect(try Self.apnsWorker(["deploy"]).status == 2)
        #expect(try Self.apnsWorker(["stats", "--bogus"]).errors.contains("unknown option --bogus"))
    }

    /// Seconds that are not a usable wait ("inf" and "nan" are numbers to a parser; 1e19 overflows a timeval) are
    /// refused naming the option, before anything connects, rather than stopping the command later with a trap.
    @Test(arguments: ["inf", "nan", "1e19", "0", "-3", "soon"])
    func aTimeoutThatIsNoWaitIsRefusedNamingTheOption(_ value: String) throws {
        let tail = try Self.apnsWorker(["dead-tokens", "tail", "--timeout", value])
        #expect(tail.status == 2, "\(value): \(tail.errors)")
        #expect(tail.errors.contains("--timeout wants seconds from"), "\(value): \(tail.errors)")
    }

    /// Ready means able to deliver: consuming is not enough while no APNs connection is open. The APNs endpoint
    /// comes up at the end, and the same worker becomes ready: the missing connection was the only reason.
    @Test func aWorkerWithoutAPNsIsNotReady() throws {
        let pair = try SelfSignedCertificate.generate()
        let simulatorConfiguration = APNsSimulator.Configuration(
            port: TestServices.freePort(),
            certificatePEM: pair.certificatePEM,
            privateKeyPEM: pair.privateKeyPEM)
        let down = try APNsSimulator(
            configuration: simulatorConfiguration, logger: Logger(label: "sim", level: .warning))
        let jobs = TestServices.unique("jobs")
        let environment = try TestServices.workerEnvironment(simulator: down, jobs: jobs)
        down.shutdown()  // nothing listens on the worker's APNs port now
        let worker = try WorkerThread(environment, logger: Logger(label: "worker", level: .critical))
        defer { worker.stop() }
        let statistics = worker.worker.statistics
        let broker = try AMQPConnection(url: TestServices.amqpURL())
        #expect(try TestServices.waitUntil { try broker.queueStatus(jobs)?.consumers == 1 }, "consuming")
        #expect(
            TestServices.waitUntil { statistics.connectFailures.load(ordering: .relaxed) > 0 },
            "APNs tried, and refused")
        #expect(statistics.openConnections == 0)
        #expect(!worker.worker.isReady, "no APNs connection: not ready")
        let metrics = statistics.prometheusText(ready: worker.worker.isReady)
        #expect(
            metrics.contains("apns_worker_ready 0") && metrics.contains("apns_worker_apns_connections 0"), "\(metrics)")

        let simulator = try APNsSimulator(
            configuration: simulatorConfiguration, logger: Logger(label: "sim", level: .warning))
        defer { simulator.shutdown() }
        #expect(
            TestServices.waitUntil(timeout: 60) { worker.worker.isReady },
            "ready once APNs listens (\(statistics.openConnections) connections open)")
        #expect(statistics.prometheusText(ready: worker.worker.isReady).contains("apns_worker_ready 1"))
    }

    /// The long-running cleanup serves health and metrics like the worker, and drains on SIGTERM.
    @Test func theCleanupProcessServesHealthAndStopsOnSIGTERM() throws {
        let port = TestServices.freePort()
        let cleanup = try ExecutablesTests.Child(
            "apns-worker", ["cleanup"],
            environment: [
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(port), "LOG_FORMAT": "text",
                "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("registrations"),
                "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"),
                "PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-x"),
                // A database of its own: the sweep at start covers every user in it.
                "REDIS_URL": try TestServices.redisURL().withDatabase(15).description(revealingPassword: true)
            ])
        #expect(cleanup.waitForLine(containing: "cleanup consuming") != nil)
        #expect(try TestServices.httpGet(port: port, "/healthz").status == 200)
        #expect(try TestServices.httpGet(port: port, "/readyz").status == 200)
        let metrics = try TestServices.httpGet(port: port, "/metrics").body
        #expect(
            metrics.contains("apns_cleanup_ready 1")
                && metrics.contains("apns_cleanup_registrations_total{result=\"applied\"} 0"),
            "\(metrics)")
        #expect(cleanup.stop(SIGTERM) == 0)
    }
}
