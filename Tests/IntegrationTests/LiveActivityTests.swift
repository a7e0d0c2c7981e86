import AMQP
import APNs
import APNsSimulator
import Configuration
import Foundation
import HTTP2
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

/// Live Activities against apns-sim: broadcast channels managed with `apns-worker channels` (Apple's channel
/// management API), broadcasts, and activities started, updated and ended through jobs.
@Suite struct LiveActivityTests {
    let logger = Logger(label: "live-activity", level: .critical)

    /// `apns-worker channels ARGUMENTS` with `environment`: its exit code and what it printed (standard output, then
    /// standard error).
    static func channels(_ arguments: [String], _ environment: [String: String]) throws -> (code: Int32, output: String)
    {
        let run = try OperationsTests.apnsWorker(["channels"] + arguments, environment: environment)
        return (run.status, run.output + run.errors)
    }

    static func json(_ text: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], "\(text)")
    }

    /// A simulator checking team A's provider tokens, and the settings that point the programs at it.
    static func simulatorWithKey(_ logger: Logger) throws -> (APNsSimulator, [String: String]) {
        let pem = try ES256Key.generatePrivateKeyPEM()
        let key = try TestServices.temporaryFile("channels.p8", contents: pem)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: [
                "KEY000000A": .init(
                    teamID: "TEAM00000A",
                    key: try ES256Key(pem: pem))
            ]),
            logger: logger)
        let url = "https://127.0.0.1:\(simulator.port)"
        return (
            simulator,
            [
                "APNS_CHANNELS_PRODUCTION_URL": url, "APNS_CHANNELS_SANDBOX_URL": url,
                "APNS_PRODUCTION_URL": url, "APNS_SANDBOX_URL": url,
                "APNS_CA_FILE": try TestServices.temporaryFile("ca.pem", contents: simulator.certificatePEM),
                "APNS_KEY_FILE": key, "APNS_KEY_ID": "KEY000000A", "APNS_TEAM_ID": "TEAM00000A",
                "APNS_TOPIC": "com.example.scores"
            ]
        )
    }

    func broadcast(
        _ client: APNsClient, channel: String, bundle: String = "com.example.scores",
        expiration: Int64 = 0
    ) -> APNsResult? {
        let result = Locked<APNsResult?>(nil)
        let done = DispatchSemaphore(value: 0)
        let payload =
            #"{"aps":{"timestamp":\#(Int(Date().timeIntervalSince1970)),"event":"update","content-state":{"score":"1-0"}}}"#
        client.send(
            APNsBroadcast(bundle: bundle, channelID: channel, expiration: expiration, payload: Array(payload.utf8)),
            environment: .production
        ) { answer in
            result.withLock { $0 = answer }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 30) == .success)
        return result.withLock { $0 }
    }

    /// The channel's life cycle through the command line: created (its id printed), listed, shown, broadcast on,
    /// deleted; after that, showing it exits 65 with Apple's reason and a broadcast to it fails with the same.
    @Test func aChannelIsCreatedListedShownBroadcastOnAndDeleted() throws {
        let (simulator, environment) = try Self.simulatorWithKey(logger)
        defer { simulator.shutdown() }
        let created = try Self.channels(["create", "--storage", "most-recent", "--json"], environment)
        #expect(created.code == 0, "\(created.output)")
        let channel = try #require(try Self.json(created.output)["channel_id"] as? String)
        #expect(Data(base64Encoded: channel) != nil, "a base64 id like Apple's: \(channel)")
        let plain = try Self.channels(["create"], environment)
        #expect(
            plain.code == 0 && Data(base64Encoded: plain.output.trimmingCharacters(in: .whitespacesAndNewlines)) != nil)

        let listed = try Self.channels(["list", "--json"], environment)
        let ids = try #require(try Self.json(listed.output)["channels"] as? [String])
        #expect(Set(ids) == [channel, plain.output.trimmingCharacters(in: .whitespacesAndNewlines)])
        let shown = try Self.channels(["show", channel, "--json"], environment)
        #expect(try Self.json(shown.output)["storage"] as? String == "most-recent")
        let otherApp = try Self.channels(["show", channel, "--topic", "com.example.other"], environment)
        #expect(otherApp.code == 65 && otherApp.output.contains("ChannelNotRegistered"), "\(otherApp.output)")

        let configuration = try WorkerConfiguration.load(from: environment)
        let client = APNsClient(
            configuration: configuration.apns, credentials: try configuration.credential.makeCredentials(),
            logger: logger)
        defer { client.shutdown() }
        #expect(
            broadcast(client, channel: channel, expiration: Int64(Date().timeIntervalSince1970) + 3600)?.outcome
                == .delivered)
        let deleted = try Self.channels(["delete", channel], environment)
        #expect(deleted.code == 0 && deleted.output.contains("deleted \(channel)"))
        let gone = try Self.channels(["show", channel], environment)
        #expect(gone.code == 65 && gone.output.contains("ChannelNotRegistered"), "\(gone.output)")
        let late = broadcast(client, channel: channel)
        #expect(
            late?.outcome == .permanentFailure && late?.response?.reason == .channelNotRegistered,
            "\(String(describing: late))")
        #expect(simulator.broadcastsByChannel() == [channel: 1], "one broadcast accepted on the channel")
    }

    /// What the channel management API and broadcasts refuse, as Apple documents it.
    @Test func channelRequestsAreCheckedAsAppleDoes() throws {
        let (simulator, environment) = try Self.simulatorWithKey(logger)
        defer { simulator.shutdown() }
        let created = try Self.channels(["create"], environment)  // storage: none
        let channel = created.output.trimmingCharacters(in: .whitespacesAndNewlines)
        let configuration = try WorkerConfiguration.load(from: environment)
        let client = APNsClient(
            configuration: configuration.apns, credentials: try configuration.credential.makeCredentials(),
            logger: logger)
        defer { client.shutdown() }
        let expiring = broadcast(client, channel: channel, expiration: Int64(Date().timeIntervalSince1970) + 60)
        #expect(expiring?.response?.reason == .badExpirationDate, "a no-storage channel takes expiration 0 only")
        #expect(broadcast(client, channel: channel)?.outcome == .delivered)
        let unknown = try Self.channels(["show", "dW5rbm93bg=="], environment)
        #expect(unknown.code == 65 && unknown.output.contains("ChannelNotRegistered"))
        let usage = try Self.channels(["show"], environment)
        #expect(usage.code == 2)
        // A channel id goes into a request header: one that is no channel id is refused before any request.
        let connections = simulator.connectionsSeen()
        let notAnID = try Self.channels(["delete", "not base64!"], environment)
        #expect(notAnID.code == 2 && notAnID.output.contains("is not base64"), "\(notAnID)")
        #expect(simulator.connectionsSeen() == connections, "no connection made for it")
        let badStorage = try Self.channels(["create", "--storage", "forever"], environment)
        #expect(badStorage.code == 2 && badStorage.output.contains("none or most-recent"))
    }

    /// A Live Activity's life through jobs: started by push-to-start on a user's cached token (subscribing it to a
    /// channel made with `channels create`), updated by a broadcast on that channel and by the activity's update
    /// token (addressed by the activity's id, as `tokens add --activity` registered it), ended; a broadcast after the channel was deleted fails with Apple's reason in its summary and the
    /// metrics; Live Activity jobs the worker refuses are parked with their reasons.
    @Test func anActivityIsStartedUpdatedAndEndedThroughJobs() throws {
        let (simulator, settings) = try Self.simulatorWithKey(logger)
        defer { simulator.shutdown() }
        let channel = try Self.channels(["create"], settings).output.trimmingCharacters(in: .whitespacesAndNewlines)
        let user = TestServices.unique("fan")
        let pushToStart = String(repeating: "f1", count: 32)
        let updateToken = String(repeating: "f2", count: 32)
        let cache = TokenCache(redis: try RedisConnection(url: TestServices.redisURL()), logger: logger)
        try cache.register([
            TokenRegistration(
                user: user, token: pushToStart,
                scope: TokenScope(
                    environment: .production,
                    topic: "com.example.scores.push-type.liveactivity"),
                registeredAt: 1)
        ])
        // The activity's update token, as the app reports it with the activity's id.
        let activity = TestServices.unique("match")
        let added = try OperationsTests.apnsWorker(
            [
                "tokens", "add", user, updateToken, "--topic",
                "com.example.scores.push-type.liveactivity", "--activity", activity
            ],
            environment: settings)
        #expect(added.status == 0 && added.output.contains("activity \(activity)"), "\(added)")
        #expect(try cache.entries(forUser: user).map(\.token) == [pushToStart], "an update token is not the user's")
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging([
                    "PUSH_FAILED_QUEUE": failed
                ]) { $1 }), logger: logger)
        defer { worker.stop() }
        let now = Int(Date().timeIntervalSince1970)
        func publish(_ body: String) throws {
            try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let steps = [
            #"{"id": "start", "users": ["\#(user)"], "live_activity": {"event": "start", "timestamp": \#(now), "content_state": {"score": "0-0"}, "attributes_type": "MatchAttributes", "attributes": {"match": "LYO-NAN"}, "alert": {"title": "Kick-off", "body": "Lyon - Nantes"}, "input_push_channel": "\#(channel)"}}"#,
            #"{"id": "goal", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now + 1), "content_state": {"score": "1-0"}, "relevance_score": 100}}"#,
            #"{"id": "minute", "activity": "\#(activity)", "priority": 5, "live_activity": {"event": "update", "timestamp": \#(now + 2), "content_state": {"score": "1-0", "minute": 60}}}"#,
            #"{"id": "end", "tokens": ["\#(updateToken)"], "live_activity": {"event": "end", "timestamp": \#(now + 3), "content_state": {"score": "2-1"}, "dismissal_date": \#(now + 600)}}"#
        ]
        var summaries: [String: [String: Any]] = [:]
        for step in steps {
            try publish(step)
            let summary = try Self.json(
                String(decoding: try #require(try replyReader.read(1).first).body, as: UTF8.self))
            summaries[summary["job_id"] as? String ?? ""] = summary
        }
        for id in ["start", "goal", "minute", "end"] {
            #expect(summaries[id]?["delivered"] as? Int == 1, "\(id): \(summaries[id] ?? [:])")
        }
        #expect(summaries["goal"]?["channel_id"] as? String == channel && summaries["goal"]?["apns_unique_id"] != nil)
        #expect(simulator.broadcastsByChannel() == [channel: 1])
        let received = simulator.received()
        #expect(
            received.count == 3
                && received.allSatisfy {
                    $0.status == 200 && $0.pushType == "liveactivity"
                        && $0.topic == "com.example.scores.push-type.liveactivity"
                }, "\(received.map { ($0.status, $0.reason ?? "") })")
        let start = try #require(received.first { $0.deviceToken == pushToStart })
        let aps = try #require(try Self.json(String(decoding: start.payload, as: UTF8.self))["aps"] as? [String: Any])
        #expect(
            aps["event"] as? String == "start" && aps["input-push-channel"] as? String == channel
                && aps["attributes-type"] as? String == "MatchAttributes")
        #expect(received.first { $0.deviceToken == updateToken }?.priority == "5")

        #expect(try Self.channels(["delete", channel], settings).code == 0)
        try publish(
            #"{"id": "\#(TestServices.unique("late"))", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now + 4), "content_state": {"score": "2-1"}}}"#
        )
        let late = try Self.json(String(decoding: try #require(try replyReader.read(1).first).body, as: UTF8.self))
        #expect(
            late["failed"] as? Int == 1 && (late["failed_by_reason"] as? [String: Int]) == ["ChannelNotRegistered": 1],
            "\(late)")
        // Counted once settled, which the summary can outrun.
        let statistics = worker.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) {
                statistics.broadcastCount("delivered") == 1 && statistics.broadcastCount("failed") == 1
            })

        let refused = [
            (
                #"{"users": ["\#(user)"], "live_activity": {"event": "start", "timestamp": \#(now), "content_state": {}, "alert": {}}}"#,
                "a start needs \"attributes_type\""
            ),
            (
                #"{"tokens": ["\#(updateToken)"], "live_activity": {"event": "update", "timestamp": \#(now)}}"#,
                "an update needs \"content_state\""
            ),
            (
                #"{"tokens": ["\#(updateToken)"], "live_activity": {"event": "update", "timestamp": \#(now + 3600), "content_state": {}}}"#,
                "in the future"
            ),
            (
                #"{"channel_id": "\#(channel)", "live_activity": {"event": "start", "timestamp": \#(now), "content_state": {}, "attributes_type": "A", "attributes": {}, "alert": {}}}"#,
                "a broadcast cannot start a Live Activity"
            )
        ]
        for (body, _) in refused { try publish(body) }
        let parked = try failedReader.read(refused.count)
        #expect(parked.count == refused.count)
        for ((body, reason), message) in zip(refused, parked) {
            #expect(String(decoding: message.body, as: UTF8.self) == body, "parked unchanged")
            #expect(
                message.properties.headers[Worker.reasonHeader]?.contains(reason) == true,
                "\(message.properties.headers[Worker.reasonHeader] ?? "no reason"): wanted \(reason)")
        }
    }

    /// A simulator that answers the first `throttled` broadcasts 429, the worker's settings for it, and a channel.
    private static func throttlingSimulator(_ throttled: Int, _ logger: Logger) throws
        -> (simulator: APNsSimulator, settings: [String: String], channel: String)
    {
        try broadcastSimulator(logger) { $0.behaviour.throttleFirstBroadcasts = throttled }
    }

    /// A simulator configured by `adjust`, the worker's settings for it (retries after 1 s), and a channel.
    private static func broadcastSimulator(_ logger: Logger, _ adjust: (inout APNsSimulator.Configuration) -> Void)
        throws
        -> (simulator: APNsSimulator, settings: [String: String], channel: String)
    {
        var (simulator, settings) = try Self.simulatorWithKey(logger)
        simulator.shutdown()
        let pem = try String(contentsOfFile: try #require(settings["APNS_KEY_FILE"]), encoding: .utf8)
        var configuration = APNsSimulator.Configuration(trustedKeys: [
            "KEY000000A": .init(
                teamID: "TEAM00000A",
                key: try ES256Key(pem: pem))
        ])
        adjust(&configuration)
        simulator = try APNsSimulator(configuration: configuration, logger: logger)
        let url = "https://127.0.0.1:\(simulator.port)"
        settings.merge([
            "APNS_CHANNELS_PRODUCTION_URL": url, "APNS_PRODUCTION_URL": url, "APNS_SANDBOX_URL": url,
            "APNS_CA_FILE": try TestServices.temporaryFile("ca.pem", contents: simulator.certificatePEM),
            "APNS_RETRY_DELAYS": "1"
        ]) { $1 }
        let channel = try Self.channels(["create"], settings).output.trimmingCharacters(in: .whitespacesAndNewlines)
        return (simulator, settings, channel)
    }

    /// A broadcast APNs asks to try later goes through the lane's delay queue and out again, once: a summary says
    /// retrying, the next says delivered. The same job published again (a copy its publisher made, its record saying
    /// it went out) is acknowledged with no second broadcast and no second summary. Broadcasts are no device
    /// notifications.
    @Test func aThrottledBroadcastIsRetriedAndNeverSentOrSummarisedTwice() throws {
        let (simulator, settings, channel) = try Self.throttlingSimulator(1, logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, settings), logger: logger)
        defer { worker.stop() }
        let now = Int(Date().timeIntervalSince1970)
        let id = TestServices.unique("busy")
        let body =
            #"{"id": "\#(id)", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "0-1"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let summaries = try replyReader.read(2, timeout: 30).map {
            try Self.json(String(decoding: $0.body, as: UTF8.self))
        }
        #expect(summaries.first?["retrying"] as? Int == 1 && summaries.first?["attempt"] as? Int == 1, "\(summaries)")
        #expect(summaries.last?["delivered"] as? Int == 1 && summaries.last?["attempt"] as? Int == 2, "\(summaries)")
        #expect(simulator.broadcastsByChannel() == [channel: 1])
        let statistics = worker.worker.statistics
        // A summary goes out before its job is settled and counted: both attempts (the throttled one, whose retry
        // copy was published, and the delivered one) are counted before the same job is sent again.
        #expect(
            TestServices.waitUntil(timeout: 20) { statistics.jobsCompleted.load(ordering: .relaxed) == 2 },
            "both attempts settled: \(statistics.jobsCompleted.load(ordering: .relaxed))")
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        // Acknowledged means settled: a summary it published would be on the queue by then.
        #expect(
            TestServices.waitUntil(timeout: 20) { statistics.jobsCompleted.load(ordering: .relaxed) == 3 },
            "the same job again was settled")
        #expect(statistics.duplicatesAvoided.load(ordering: .relaxed) == 1)
        #expect(try replyReader.read(1, timeout: 1).isEmpty, "no second summary")
        #expect(simulator.broadcastsByChannel() == [channel: 1], "not broadcast a second time")
        #expect(statistics.broadcastCount("retrying") == 1 && statistics.broadcastCount("delivered") == 1)
        #expect(
            statistics.delivered.load(ordering: .relaxed) == 0
                && statistics.sent[.urgent] + statistics.sent[.bulk] == 0,
            "a broadcast is no device notification")
    }

    /// A broadcast whose job's deadline comes while it waits behind busy streams is dropped there, never sent, and
    /// summarised as expired, as a device notification is.
    @Test func aBroadcastWhoseDeadlineComesWhileItWaitsForAStreamIsExpiredNotSent() throws {
        let (simulator, settings, channel) = try Self.broadcastSimulator(logger) {
            $0.maximumConcurrentStreams = 1
            $0.behaviour.latency = 0.3
        }
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging(["APNS_CONNECTIONS": "1", "APNS_MAX_CONNECTIONS": "1"]) { $1 }),
            logger: logger)
        defer { worker.stop() }
        let sender = worker.worker.sender
        #expect(TestServices.waitUntil(timeout: 60) { sender.streamCapacity(.urgent) == 1 }, "one stream known")
        // Twelve answers of 0.3 s on the one stream ahead of it; its deadline is one to two seconds away.
        let tokens = (0..<12).map { "\"" + String(format: "%064x", 0xB4000 + $0) + "\"" }.joined(separator: ",")
        try publisher.publish(
            to: jobs, body: Array(#"{"tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8))
        // Those notifications are on their way (a broadcast read in the same batch would go first).
        #expect(TestServices.waitUntil(timeout: 30) { !simulator.received().isEmpty }, "the device job is sending")
        let now = Int(Date().timeIntervalSince1970)
        let id = TestServices.unique("late-broadcast")
        let body =
            #"{"id": "\#(id)", "channel_id": "\#(channel)", "deadline": \#(now + 2), "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "9-9"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let summary = try Self.json(
            String(decoding: try #require(try replyReader.read(1, timeout: 30).first).body, as: UTF8.self))
        #expect(summary["expired"] as? Int == 1 && summary["delivered"] as? Int == 0, "\(summary)")
        #expect(simulator.broadcastsByChannel().isEmpty, "the broadcast never reached APNs")
        // The summary goes out before the broadcast is settled and counted.
        let statistics = worker.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) { statistics.broadcastCount("expired") == 1 },
            "counted once settled: \(statistics.broadcastCount("expired"))")
    }

    /// A broadcast APNs keeps throttling until its attempts are spent is parked on PUSH_FAILED_QUEUE with its reason,
    /// as a device job is, not acknowledged and dropped.
    @Test func aBroadcastThrottledUntilItsAttemptsRunOutIsParkedWithItsReason() throws {
        let (simulator, settings, channel) = try Self.throttlingSimulator(100, logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging([
                    "APNS_MAX_ATTEMPTS": "2", "PUSH_FAILED_QUEUE": failed
                ]) { $1 }), logger: logger)
        defer { worker.stop() }
        let now = Int(Date().timeIntervalSince1970)
        let body =
            #"{"id": "\#(TestServices.unique("busy"))", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "0-2"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let parked = try #require(try failedReader.read(1, timeout: 30).first, "the broadcast was parked")
        #expect(String(decoding: parked.body, as: UTF8.self) == body, "parked as it was sent")
        let reason = parked.properties.headers[Worker.reasonHeader] ?? ""
        #expect(reason == "broadcast not delivered after 2 attempts: TooManyRequests", "\(reason)")
        let summaries = try replyReader.read(2, timeout: 10).map {
            try Self.json(String(decoding: $0.body, as: UTF8.self))
        }
        #expect(
            summaries.map { $0["retrying"] as? Int } == [1, 0] && summaries.last?["failed"] as? Int == 1
                && summaries.last?["failed_by_reason"] as? [String: Int] == ["TooManyRequests": 1], "\(summaries)")
        #expect(simulator.broadcastsByChannel().isEmpty, "nothing went out")
        let statistics = worker.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) { statistics.jobsParked.load(ordering: .relaxed) == 1 },
            "counted once settled")
    }

    /// A real redelivery: the broadcast is answered and recorded, but its worker's acknowledgement (and summary) never
    /// reach the broker (its writes are held from the moment APNs accepts the broadcast), and the worker is killed
    /// with SIGKILL. The job comes back to the next worker, which sends nothing and publishes no second summary.
    @Test func aBroadcastRedeliveredAfterItsAnswerIsNotSentOrSummarisedAgain() throws {
        let relayBox = Mutex<HoldingRelay?>(nil)
        let (simulator, settings, channel) = try Self.broadcastSimulator(logger) { configuration in
            configuration.broadcastObserver = { _ in relayBox.withLock { $0?.holdClientBytes() } }
        }
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let broker = try TestServices.amqpURL()
        let relay = try HoldingRelay(to: broker.host, port: broker.port)
        relayBox.withLock { $0 = relay }
        let direct = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, settings)
        let throughRelay = direct.merging([
            "AMQP_URL": try #require(direct["AMQP_URL"]).replacingOccurrences(
                of: ":\(broker.port)/", with: ":\(relay.port)/"),
            "LOG_LEVEL": "info"
        ]) { $1 }
        let first = try ExecutablesTests.Child("apns-worker", ["run"], environment: throughRelay)
        defer { _ = first.stop(SIGKILL) }
        #expect(first.waitForLine(containing: "\"consuming\"") != nil)
        let id = TestServices.unique("once")
        let now = Int(Date().timeIntervalSince1970)
        let body =
            #"{"id": "\#(id)", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "3-1"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let redis = try RedisConnection(url: TestServices.redisURL())
        #expect(
            TestServices.waitUntil(timeout: 30) {
                (try? redis.command(["SISMEMBER", RedisKeys.node.job(id), channel]).integer) == 1
            }, "the broadcast's answer is in the idempotency record")
        #expect(first.stop(SIGKILL) == -SIGKILL)
        relay.cut()
        #expect(simulator.broadcastsByChannel() == [channel: 1])

        let second = try WorkerThread(direct, logger: logger)
        defer { second.stop() }
        let statistics = second.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 30) { statistics.jobsCompleted.load(ordering: .relaxed) == 1 },
            "the redelivered job was settled")
        #expect(statistics.duplicatesAvoided.load(ordering: .relaxed) == 1)
        #expect(simulator.broadcastsByChannel() == [channel: 1], "not broadcast a second time")
        // The first worker's summary never reached the broker, and the second publishes none: a summary published
        // with the acknowledgement would be on the queue by now.
        #expect(try replyReader.read(1, timeout: 1).isEmpty, "no summary after a redelivery of a job that broadcast")
    }

    /// A 410 is a dead device token only on the device route: a broadcast answered 410 fails (its summary says so)
    /// and publishes no dead-token event, removes nothing, parks nothing.
    @Test func aBroadcastAnswered410RemovesNothingAndPublishesNoDeadTokenEvent() throws {
        let (simulator, settings, channel) = try Self.broadcastSimulator(logger) { $0.behaviour.broadcastsGone = true }
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let failed = TestServices.unique("failed")
        let deadReader = try QueueReader(dead)
        let failedReader = try QueueReader(failed)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging([
                    "PUSH_DEAD_TOKENS_QUEUE": dead, "PUSH_FAILED_QUEUE": failed
                ]) { $1 }), logger: logger)
        defer { worker.stop() }
        let now = Int(Date().timeIntervalSince1970)
        let body =
            #"{"id": "\#(TestServices.unique("gone"))", "channel_id": "\#(channel)", "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "0-0"}}}"#
        try publisher.publish(to: jobs, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        let summary = try Self.json(
            String(decoding: try #require(try replyReader.read(1, timeout: 30).first).body, as: UTF8.self))
        #expect(
            summary["failed"] as? Int == 1 && summary["dead"] as? Int == 0
                && summary["failed_by_reason"] as? [String: Int] == ["Unregistered": 1], "\(summary)")
        // The events and the parked copy are published with the summary, before it: none came.
        #expect(try deadReader.read(1, timeout: 1).isEmpty, "no dead-token event")
        #expect(try failedReader.read(1, timeout: 1).isEmpty, "not parked")
        let statistics = worker.worker.statistics
        #expect(
            TestServices.waitUntil(timeout: 10) { statistics.broadcastCount("failed") == 1 }, "counted once settled")
        #expect(statistics.deadTokens.load(ordering: .relaxed) == 0)
    }

    /// A dead update token (410) is removed from its activity, with its dead-token event, as a dead device token is
    /// from its user.
    @Test func aDeadUpdateTokenLeavesItsActivityWithAnEvent() throws {
        let updateToken = String(repeating: "f4", count: 32)
        let live = String(repeating: "f5", count: 32)
        let died = Int64(Date().timeIntervalSince1970 * 1000)
        let (simulator, settings, _) = try Self.broadcastSimulator(logger) {
            $0.unregisteredTokens = [updateToken: died]
        }
        defer { simulator.shutdown() }
        let cache = TokenCache(redis: try RedisConnection(url: TestServices.redisURL()), logger: logger)
        let activity = TestServices.unique("match")
        let topic = "com.example.scores.push-type.liveactivity"
        for token in [updateToken, live] {
            try cache.register([
                TokenRegistration(
                    user: "fan", token: token, scope: TokenScope(environment: .production, topic: topic),
                    registeredAt: died - 60_000, activity: activity)
            ])
        }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let deadReader = try QueueReader(dead)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging([
                    "PUSH_DEAD_TOKENS_QUEUE": dead
                ]) { $1 }), logger: logger)
        defer { worker.stop() }
        let now = Int(Date().timeIntervalSince1970)
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(TestServices.unique("minute"))", "activity": "\#(activity)", "live_activity": {"event": "update", "timestamp": \#(now), "content_state": {"score": "1-1"}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        let summary = try Self.json(
            String(decoding: try #require(try replyReader.read(1, timeout: 30).first).body, as: UTF8.self))
        #expect(summary["dead"] as? Int == 1 && summary["delivered"] as? Int == 1, "\(summary)")
        let event = try Self.json(
            String(decoding: try #require(try deadReader.read(1, timeout: 10).first).body, as: UTF8.self))
        #expect(event["token"] as? String == updateToken && event["status"] as? Int == 410, "\(event)")
        // Removed once the event is safe with the broker, before the job is acknowledged.
        let left = try TestServices.waitUntil(timeout: 10) {
            try cache.resolveActivities([activity]).tokens[activity]?.map(\.token) == [live]
        }
        #expect(left, "the dead update token left its activity; the live one stays")
    }
}
