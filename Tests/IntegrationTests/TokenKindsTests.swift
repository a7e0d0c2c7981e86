import AMQP
import AMQPBroker
import APNs
import APNsSimulator
import Configuration
import Foundation
import Operations
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// Tokens belong to a topic (a device token, a PushKit VoIP token, a Live Activity token, another app's token): a
/// job reaches only the tokens of its topic, and a wave of 400 mismatch answers is held back as a configuration error
/// instead of wiping the cache. Against real RabbitMQ, Redis and apns-sim (which knows token kinds, as APNs does).
@Suite struct TokenKindsTests {
    let logger = Logger(label: "token-kinds", level: .critical)

    /// `count` tokens starting with a prefix of their own, so that one apns-sim prefix rule covers them all.
    static func tokens(_ prefix: String, _ count: Int) -> [String] {
        (0..<count).map { prefix + String(format: "%0\(64 - prefix.count)x", $0) }
    }

    static func summary(_ delivery: AMQPDelivery) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(delivery.body)) as? [String: Any])
    }

    @Test func eachJobReachesExactlyTheTokenOfItsKind() throws {
        let device = String(repeating: "d1", count: 32)
        let voip = String(repeating: "d2", count: 32)
        let pushToStart = String(repeating: "d3", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.tokenTopics = [
            .init(pattern: device, value: "com.example.app"),
            .init(pattern: voip, value: "com.example.app.voip"),
            .init(pattern: pushToStart, value: "com.example.app.push-type.liveactivity")
        ]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let user = TestServices.unique("kim")
        let cache = TokenCache(redis: try RedisConnection(url: TestServices.redisURL()), logger: logger)
        try cache.register([
            TokenRegistration(user: user, token: device, scope: TokenScope(environment: .production), registeredAt: 1),
            TokenRegistration(
                user: user, token: voip, scope: TokenScope(environment: .production, topic: "com.example.app.voip"),
                registeredAt: 1),
            TokenRegistration(
                user: user, token: pushToStart,
                scope: TokenScope(environment: .production, topic: "com.example.app.push-type.liveactivity"),
                registeredAt: 1)
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        let bodies = [
            #"{"id": "alert", "users": ["\#(user)"], "payload": {"aps": {"alert": "Hi"}}}"#,
            #"{"id": "call", "users": ["\#(user)"], "push_type": "voip", "payload": {"caller": "Bob"}}"#,
            #"{"id": "activity", "users": ["\#(user)"], "push_type": "liveactivity", "payload": {"aps": {"timestamp": 1, "event": "start", "content-state": {}}}}"#
        ]
        for body in bodies {
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let summaries = try replyReader.read(3).map(Self.summary)
        #expect(summaries.count == 3)
        for summary in summaries {
            #expect(summary["notifications"] as? Int == 1 && summary["delivered"] as? Int == 1, "\(summary)")
        }
        let received = simulator.received()
        #expect(received.count == 3, "one request per job")
        #expect(received.allSatisfy { $0.status == 200 }, "\(received.map { ($0.status, $0.reason ?? "") })")
        let sent = Dictionary(received.map { ($0.topic ?? "", $0.deviceToken) }) { first, _ in first }
        #expect(
            sent == [
                "com.example.app": device, "com.example.app.voip": voip,
                "com.example.app.push-type.liveactivity": pushToStart
            ])
        #expect(try cache.entries(forUser: user).count == 3)
    }

    @Test func aJobWhoseTopicNoCachedTokenServesSendsAndDeletesNothing() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let device = String(repeating: "e1", count: 32)
        let voip = String(repeating: "e2", count: 32)
        let user = TestServices.unique("lou")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.command([
            "HSET", RedisKeys.node.tokens(user), device, "production", voip, "sandbox:com.example.app.voip"
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }
        for body in [
            #"{"id": "where", "users": ["\#(user)"], "push_type": "location", "payload": {"aps": {}}}"#,
            #"{"id": "sibling", "users": ["\#(user)"], "topic": "com.example.other", "payload": {"aps": {"alert": "x"}}}"#
        ] {
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let summaries = try replyReader.read(2).map(Self.summary)
        #expect(summaries.count == 2)
        #expect(summaries.allSatisfy { $0["notifications"] as? Int == 0 }, "\(summaries)")
        #expect(simulator.received().isEmpty, "nothing sent")
        #expect(
            try redis.command(["HGETALL", RedisKeys.node.tokens(user)]).elements.compactMap(\.text).sorted()
                == [device, voip, "production", "sandbox:com.example.app.voip"].sorted(), "nothing deleted")
    }

    /// A misconfigured campaign to 100 users, as a worker process runs it: production jobs sent to the sandbox, or
    /// APNS_TOPIC set to a sibling app's topic. Every answer is a 400 mismatch; none removes a token or becomes an
    /// event, and the log, /metrics and the job's summary say why.
    @Test(arguments: [("wrong environment", "BadDeviceToken"), ("sibling app's topic", "DeviceTokenNotForTopic")])
    func aMisconfiguredCampaignDeletesNothing(scenario: String, reason: String) throws {
        let directory = try TestServices.certificateDirectory("campaign")
        let prefix = reason == "BadDeviceToken" ? "c0ffee01" : "c0ffee02"
        let tokens = Self.tokens(prefix, 100)
        // apns-sim as a process, told token kinds with its flags: the app's tokens are production device tokens of
        // com.example.app; with --development it plays the sandbox, which refuses production tokens.
        var simulatorArguments = [
            "--port", "0", "--cert", directory + "/cert.pem", "--key", directory + "/key.pem",
            "--token-topic", "\(prefix)*=com.example.app",
            "--token-environment", "\(prefix)*=production"
        ]
        if reason == "BadDeviceToken" { simulatorArguments.append("--development") }
        let simulator = try ExecutablesTests.Child("apns-sim", simulatorArguments)
        defer { _ = simulator.stop() }
        let listening = try #require(simulator.waitForLine(containing: "listening on"))
        let port = try #require(listening.split(separator: ":").last.map(String.init))

        let users = (0..<100).map { _ in TestServices.unique("fan") }
        let (redisURL, redis) = try TestServices.isolatedRedis(
            reason == "BadDeviceToken"
                ? .wrongEnvironmentCampaign
                : .siblingTopicCampaign)
        _ = try redis.pipeline(zip(users, tokens).map { ["HSET", RedisKeys.node.tokens($0), $1, "production"] })
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let metricsPort = TestServices.freePort()
        let worker = try ExecutablesTests.Child(
            "apns-worker", ["run"],
            environment: [
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(metricsPort),
                "APNS_PRODUCTION_URL": "https://127.0.0.1:\(port)", "APNS_CA_FILE": directory + "/cert.pem",
                "APNS_KEY_FILE": try TestServices.temporaryFile(
                    "key.p8", contents: try ES256Key.generatePrivateKeyPEM()),
                "APNS_KEY_ID": "KEY0000001", "APNS_TEAM_ID": "TEAM000001",
                "APNS_TOPIC": reason == "BadDeviceToken" ? "com.example.app" : "com.example.other",
                "PUSH_JOBS_QUEUE": jobs, "PUSH_DEAD_TOKENS_QUEUE": dead,
                "PUSH_FAILED_QUEUE": TestServices.unique("failed"),
                "LOG_LEVEL": "info", "REDIS_URL": redisURL
            ])
        defer { _ = worker.stop() }
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        let body =
            #"{"id": "campaign-\#(prefix)", "users": [\#(users.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {"alert": "Sale"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))

        let summary = try Self.summary(try #require(try replyReader.read(1).first))
        #expect(summary["notifications"] as? Int == 100)
        #expect(summary["held_back"] as? Int == 100, "\(scenario): \(summary)")
        #expect(summary["dead"] as? Int == 0)
        #expect((summary["held_back_reason"] as? String)?.contains("100 \(reason)") == true, "\(summary)")
        // The summary is published after everything else the job caused was confirmed: an event would be there now.
        #expect(try publisher.queueStatus(dead)?.messages == 0, "no dead-token event")
        let remaining = try redis.pipeline(users.map { ["HLEN", RedisKeys.node.tokens($0)] }).compactMap(\.integer)
        #expect(remaining == Array(repeating: 1, count: 100), "every user keeps the token")

        let line = worker.waitForLine(containing: "mass invalidation guard: 400 answers held back")
        #expect(line?.contains("\"level\":\"error\"") == true, "\(line ?? "no log line")")
        #expect(line?.contains("campaign-\(prefix)") == true && line?.contains(reason) == true, "\(line ?? "")")
        let metrics = try TestServices.httpGet(port: metricsPort, "/metrics").body
        #expect(metrics.contains("apns_worker_notifications_total{outcome=\"held_back\"} 100"), "\(metrics)")
        #expect(metrics.contains("apns_worker_notifications_total{outcome=\"dead_token\"} 0"))
        #expect(metrics.contains("apns_worker_invalidation_guard_trips_total 1"))
        #expect(metrics.contains("apns_worker_apns_responses_total{status=\"400\",reason=\"\(reason)\"} 100"))
    }

    /// 410s are Apple's word about one token: never held back, even in numbers and beside a held-back wave of 400s.
    /// Below the threshold, and before any wave, 400 mismatches still remove their tokens.
    @Test func genuineUnregisteredTokensAreAlwaysRemovedWithEvents() throws {
        let unregistered = Self.tokens("a4100001", 40)
        let mismatched = Self.tokens("a4000001", 32)
        let live = Self.tokens("a2000001", 5)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.tokenTopics = [.init(pattern: "a4000001*", value: "com.example.other")]
        let simulator = try APNsSimulator(
            configuration: .init(
                unregisteredTokens: Dictionary(
                    uniqueKeysWithValues: unregistered.map { ($0, Int64(1_732_900_000_000)) }),
                behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        // Every token lives under a user of its own, registered before it died.
        let owners = Dictionary(
            uniqueKeysWithValues: (unregistered + mismatched + live).map { ($0, TestServices.unique("u")) })
        let (redisURL, redis) = try TestServices.isolatedRedis(.genuineTokens)
        _ = try redis.pipeline(owners.map { ["HSET", RedisKeys.node.tokens($1), $0, "production"] })
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let deadReader = try QueueReader(dead)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_DEAD_TOKENS_QUEUE": dead,
                    "REDIS_URL": redisURL
                ]), logger: logger)
        defer { worker.stop() }
        func users(_ tokens: some Sequence<String>) -> String {
            tokens.map { "\"\(owners[$0]!)\"" }.joined(separator: ",")
        }
        // First, alone: 2 mismatches beside 2 deliveries (under the threshold, in the job and in the fleet's window:
        // dead tokens). Then 25 410s alone, and a job of 30 mismatches, 15 410s and 5 deliveries (the 400s are held
        // back, the 410s are not).
        let few = #"{"id": "few", "users": [\#(users(mismatched[30..<32] + live[0..<2]))], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(few.utf8), properties: AMQPProperties(replyTo: replies))
        var read = try replyReader.read(1)
        let bodies = [
            #"{"id": "gone", "users": [\#(users(unregistered[0..<25]))], "payload": {"aps": {}}}"#,
            #"{"id": "mixed", "users": [\#(users(mismatched[0..<30] + unregistered[25..<40] + live))], "payload": {"aps": {}}}"#
        ]
        for body in bodies {
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        read += try replyReader.read(2)
        let summaries = Dictionary(
            uniqueKeysWithValues: try read.map(Self.summary).map { ($0["job_id"] as! String, $0) })
        #expect(summaries["gone"]?["dead"] as? Int == 25 && summaries["gone"]?["held_back"] as? Int == 0)
        #expect(
            summaries["mixed"]?["dead"] as? Int == 15 && summaries["mixed"]?["held_back"] as? Int == 30,
            "\(summaries["mixed"] ?? [:])")
        #expect(summaries["mixed"]?["delivered"] as? Int == 5)
        #expect(summaries["few"]?["dead"] as? Int == 2 && summaries["few"]?["held_back"] as? Int == 0)

        // Every event was confirmed before the summaries went out: all are on the queue by now, and a 43rd (a
        // duplicate, or a held-back token's) would arrive within the short wait.
        let events = try deadReader.read(43, timeout: 2).map { try Self.summary($0) }
        let eventTokens = events.compactMap { $0["token"] as? String }
        #expect(Set(eventTokens) == Set(unregistered + mismatched[30..<32]), "every 410 and the two lone 400s")
        #expect(eventTokens.count == 42, "each once")
        func cached(_ token: String) throws -> Bool {
            try redis.command(["HEXISTS", RedisKeys.node.tokens(owners[token]!), token]).integer == 1
        }
        #expect(try unregistered.allSatisfy { try !cached($0) }, "every 410 removed")
        #expect(try mismatched[0..<30].allSatisfy { try cached($0) }, "the held-back 400s kept")
        #expect(try mismatched[30..<32].allSatisfy { try !cached($0) }, "lone 400s removed")
        #expect(try live.allSatisfy { try cached($0) })
    }

    /// A token cached in two cases (other systems write the cache too) is one device: one push, and its 410 removes
    /// every spelling.
    @Test func spellingsOfOneTokenGetOnePushAndGoTogether() throws {
        let lower = Self.tokens("abcdef01", 1)[0]
        let upper = lower.uppercased()
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [lower: 1_732_900_000_000]), logger: logger)
        defer { simulator.shutdown() }
        let user = TestServices.unique("cases")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.pipeline([["HSET", RedisKeys.node.tokens(user), upper, "production", lower, "production"]])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let deadReader = try QueueReader(dead)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                ["PUSH_DEAD_TOKENS_QUEUE": dead]), logger: logger)
        defer { worker.stop() }
        let body = #"{"id": "cases", "users": ["\#(user)"], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let summary = try Self.summary(try #require(try replyReader.read(1).first))
        #expect(summary["notifications"] as? Int == 1 && summary["dead"] as? Int == 1, "\(summary)")
        #expect(simulator.received().map(\.deviceToken) == [lower], "one push, in lower case")
        // The summary goes out with the event; the cache is changed once both are confirmed.
        #expect(
            TestServices.waitUntil(timeout: 10) {
                (try? redis.command(["HLEN", RedisKeys.node.tokens(user)]).integer) == 0
            }, "both spellings removed")
        #expect(try deadReader.read(2, timeout: 1).count == 1, "one event")
    }

    /// The app's backend registers each kind with its topic; the cleanup consumer keeps each dead-token event to
    /// the token of its topic.
    @Test func registrationsAndDeadTokenEventsKeepToTheirTopic() throws {
        // A database of its own: cleanup's sweep covers every user in it, and other tests register tokens long ago.
        let redisURL = try TestServices.redisURL().withDatabase(13)
        let environment = [
            "AMQP_URL": try TestServices.value("AMQP_URL"), "REDIS_URL": redisURL.description(revealingPassword: true),
            "APNS_TOPIC": "com.example.app",
            "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"),
            "PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-x"),
            "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("registrations"),
            "PUSH_FAILED_QUEUE": TestServices.unique("failed"),
            "CLEANUP_INACTIVE_DAYS": "3650"
        ]
        let configuration = try WorkerConfiguration.load(from: environment, requiringCredentials: false)
        let user = TestServices.unique("mo")
        let device = String(repeating: "f1", count: 32)
        let voip = String(repeating: "f2", count: 32)
        let activity = String(repeating: "f3", count: 32)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try Topology.declareDeadTokens(on: publisher, configuration.broker.queues)
        try publisher.declareQueue(configuration.broker.queues.registrations)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        for (token, topic) in [
            (device, nil), (voip, "com.example.app.voip"), (activity, "com.example.app.push-type.liveactivity")
        ] {
            try publisher.publish(
                to: configuration.broker.queues.registrations,
                body: RegistrationEvent(
                    action: .register,
                    registration:
                        TokenRegistration(
                            user: user, token: token, scope: TokenScope(environment: .production, topic: topic),
                            registeredAt: now - 10_000)
                ).json)
        }
        let cleanup = TokenCleanup(configuration: configuration, logger: logger)
        try cleanup.run(untilIdle: true)
        let cache = TokenCache(redis: try RedisConnection(url: redisURL), logger: logger)
        #expect(
            Dictionary(uniqueKeysWithValues: try cache.entries(forUser: user).map { ($0.token, $0.value) }) == [
                device: "production", voip: "production:com.example.app.voip",
                activity: "production:com.example.app.push-type.liveactivity"
            ])

        func died(_ token: String, topic: String) throws {
            try publisher.publish(
                to: configuration.broker.queues.deadTokens,
                body: DeadTokenEvent(
                    token: token, user: user, topic: topic, environment: .production, status: 400,
                    reason: "DeviceTokenNotForTopic", timestamp: nil, jobID: "j"
                ).json)
        }
        try died(device, topic: "com.example.app.voip")  // a VoIP push that reached the device token: not its topic
        try died(voip, topic: "com.example.app")
        try died(activity, topic: "com.example.app.push-type.liveactivity")  // its own topic: removed
        try cleanup.run(untilIdle: true)
        #expect(Set(try cache.entries(forUser: user).map(\.token)) == [device, voip])
        #expect(cleanup.statistics.deadTokensRemoved.load(ordering: .relaxed) == 1)
        #expect(cleanup.statistics.deadTokensKept.load(ordering: .relaxed) == 2)
    }

    /// `apns-worker tokens` with `--topic`: add a token of another kind, list it with its topic, and refuse to remove
    /// a token for a topic it does not serve.
    @Test func theTokensCommandKnowsTopics() throws {
        let user = TestServices.unique("ned")
        let device = String(repeating: "b1", count: 32)
        let voip = String(repeating: "b2", count: 32)
        let environment = ["APNS_TOPIC": "com.example.app"]
        #expect(try OperationsTests.apnsWorker(["tokens", "add", user, device], environment: environment).status == 0)
        let added = try OperationsTests.apnsWorker(
            ["tokens", "add", user, voip, "--topic", "com.example.app.voip"],
            environment: environment)
        #expect(added.status == 0 && added.output.contains("production:com.example.app.voip"), "\(added)")

        let listed = try OperationsTests.apnsWorker(["tokens", "list", user], environment: environment).output
        #expect(
            listed.contains("TOPIC") && listed.contains("com.example.app (default app)")
                && listed.contains("com.example.app.voip"), "\(listed)")
        let json = try OperationsTests.apnsWorker(
            [
                "tokens", "list", user, "--json", "--full-tokens", "--topic",
                "com.example.app.voip"
            ], environment: environment
        ).output
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]])
        #expect(entries.count == 1 && entries.first?["token"] as? String == voip, "\(json)")
        #expect(
            entries.first?["topic"] as? String == "com.example.app.voip"
                && entries.first?["environment"] as? String == "production")

        let refused = try OperationsTests.apnsWorker(
            ["tokens", "remove", user, device, "--topic", "com.example.app.voip"],
            environment: environment)
        #expect(refused.status == 0 && refused.output.contains("kept"), "\(refused)")
        let bad = try OperationsTests.apnsWorker(
            ["tokens", "add", user, device, "--topic", "com.example app"],
            environment: environment)
        #expect(bad.status == 2 && bad.errors.contains("--topic"), "\(bad)")
        let removed = try OperationsTests.apnsWorker(
            ["tokens", "remove", user, voip, "--topic", "com.example.app.voip"],
            environment: environment)
        #expect(removed.output.contains("removed"), "\(removed)")
        let cache = TokenCache(redis: try RedisConnection(url: TestServices.redisURL()), logger: logger)
        #expect(try cache.entries(forUser: user).map(\.token) == [device])
    }
}
