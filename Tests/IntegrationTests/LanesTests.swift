import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// Urgent work (PUSH_JOBS_QUEUE) never waits behind a campaign (PUSH_BULK_QUEUE), under the rate limit too;
/// deadlines; retries stay in their lane.
@Suite struct LanesTests {
    let logger = Logger(label: "lanes", level: .critical)

    static func token(_ number: Int) -> String { String(format: "%064x", number) }

    /// `count` jobs of `perJob` direct tokens each, from `first` on, published to `queue`; returns the tokens.
    static func publishBacklog(
        _ publisher: AMQPConnection, to queue: String, jobs count: Int, perJob: Int,
        first: Int
    ) throws -> Set<String> {
        var tokens = Set<String>()
        for job in 0..<count {
            let batch = (0..<perJob).map { token(first + job * perJob + $0) }
            tokens.formUnion(batch)
            let list = batch.map { "\"\($0)\"" }.joined(separator: ",")
            try publisher.publish(
                to: queue,
                body: Array(#"{"id": "\#(queue)-\#(job)", "tokens": [\#(list)], "payload": {"aps": {}}}"#.utf8))
        }
        return tokens
    }

    /// Publishes a bulk backlog of `backlogJobs` jobs of `perJob` tokens, starts a worker on both lanes (`settings`
    /// added), publishes `urgentJobs` single-token urgent jobs once `underWay` bulk notifications were answered, and
    /// returns how many bulk notifications APNs received between their arrival and the last of them, and how many
    /// were left then. Checks that both lanes are delivered whole in the end, each job taken from its lane once.
    func bulkPassingUrgentWork(
        backlogJobs: Int, perJob: Int, urgentJobs: Int, underWay: Int,
        settings: [String: String]
    ) throws -> (between: Int, left: Int) {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        let bulk = TestServices.unique("bulk")
        try publisher.declareQueue(bulk)
        let backlog = try Self.publishBacklog(publisher, to: bulk, jobs: backlogJobs, perJob: perJob, first: 0xB0000)
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                settings.merging(["PUSH_BULK_QUEUE": bulk]) { $1 }),
            logger: logger)
        defer { workerThread.stop() }
        try #require(
            TestServices.waitUntil(timeout: 60) { simulator.received().count >= underWay }, "the bulk lane is under way"
        )
        let bulkAhead = simulator.received().count
        let urgent = try Self.publishBacklog(publisher, to: jobs, jobs: urgentJobs, perJob: 1, first: 0xE0000)

        try #require(
            TestServices.waitUntil(timeout: 60) { urgent.isSubset(of: Set(simulator.received().map(\.deviceToken))) },
            "every urgent notification delivered")
        let received = simulator.received()
        let lastUrgent = try #require(received.lastIndex { urgent.contains($0.deviceToken) })
        let between = received[bulkAhead..<lastUrgent].filter { backlog.contains($0.deviceToken) }.count
        #expect(TestServices.waitUntil(timeout: 120) { simulator.received().count >= backlog.count + urgent.count })
        #expect(Set(simulator.received().map(\.deviceToken)) == backlog.union(urgent), "the bulk lane drains too")
        #expect(workerThread.worker.statistics.jobsTaken.counts == LaneCounts(urgent: urgentJobs, bulk: backlogJobs))
        return (between, backlog.count - bulkAhead)
    }

    /// 20,000 bulk notifications under way before five urgent jobs arrive: on one queue, or in one outgoing queue of
    /// the worker's, the urgent ones would come after what was read before them.
    @Test func urgentJobsBehindABulkBacklogAreDeliveredBeforeItDrains() throws {
        let passing = try bulkPassingUrgentWork(
            backlogJobs: 200, perJob: 100, urgentJobs: 5, underWay: 500,
            settings: ["WORKER_MAX_IN_FLIGHT": "200"])
        // The backlog was far from drained when the urgent jobs came: the figure below can tell the lanes apart.
        #expect(passing.left > 10_000, "\(passing.left) bulk notifications left when the urgent jobs came")
        #expect(
            passing.between < 2_000,
            "urgent jobs went ahead: \(passing.between) bulk notifications passed them, of \(passing.left) left")
    }

    /// A 100,000-user campaign job (about 800 KB of JSON) is decoded and resolved beside the broker thread, 250 users
    /// at a time: urgent jobs published while it runs go ahead of most of it, and the job is settled once, whole.
    @Test func urgentJobsPassAHundredThousandUserBulkJob() throws {
        // What the simulator received, counted as it comes (a 100,000-entry record copied on every poll would be the
        // test's own bottleneck): how many so far, and how many when each urgent token arrived.
        struct Arrivals {
            var count = 0
            var urgentAt: [String: Int] = [:]
        }
        let urgentTokens = Set((0..<20).map { Self.token(0xE0000 + $0) })
        let arrivals = Locked(Arrivals())
        var configuration = APNsSimulator.Configuration(recordsNotifications: false)
        configuration.observer = { notification in
            arrivals.withLock { state in
                state.count += 1
                if urgentTokens.contains(notification.deviceToken) {
                    state.urgentAt[notification.deviceToken] = state.count
                }
            }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let (redisURL, redis) = try TestServices.isolatedRedis(.hundredThousandUsers)
        let users = (0..<100_000).map { "b\($0)" }
        for start in stride(from: 0, to: users.count, by: 10_000) {
            _ = try redis.pipeline(
                (start..<start + 10_000).map {
                    ["HSET", RedisKeys.node.tokens(users[$0]), Self.token(0xC00000 + $0), "production"]
                })
        }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let bulk = TestServices.unique("bulk")
        try publisher.declareQueue(bulk)
        let list = users.map { "\"\($0)\"" }.joined(separator: ",")
        let campaign = TestServices.unique("campaign")
        try publisher.publish(
            to: bulk, body: Array(#"{"id": "\#(campaign)", "users": [\#(list)], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_BULK_QUEUE": bulk, "REDIS_URL": redisURL
                ]), logger: logger)
        defer { worker.stop() }
        try #require(
            TestServices.waitUntil(timeout: 60) { arrivals.withLock { $0.count } >= 5_000 }, "the campaign is under way"
        )
        let campaignAhead = arrivals.withLock { $0.count }
        let urgent = try Self.publishBacklog(publisher, to: jobs, jobs: 20, perJob: 1, first: 0xE0000)
        try #require(urgent == urgentTokens)
        try #require(
            TestServices.waitUntil(timeout: 60) { arrivals.withLock { $0.urgentAt.count } == urgent.count },
            "every urgent notification delivered")
        let lastUrgent = arrivals.withLock { $0.urgentAt.values.max() ?? 0 }
        let between = lastUrgent - campaignAhead - urgent.count
        #expect(
            100_000 - campaignAhead > 50_000,
            "\(100_000 - campaignAhead) campaign notifications left when the urgent jobs came")
        #expect(between < 10_000, "urgent jobs went ahead: \(between) campaign notifications passed them")
        // The rest of the campaign takes what the machine takes (minutes under a sanitizer): waited for while it moves.
        #expect(
            TestServices.waitWhileProgressing(progress: { arrivals.withLock { $0.count } }) {
                arrivals.withLock { $0.count } >= 100_020
            }, "the campaign is delivered")
        let summaries = try replyReader.read(1, timeout: 30)
        let summary = try JSONSerialization.jsonObject(with: Data(try #require(summaries.first).body)) as! [String: Any]
        #expect(
            summary["job_id"] as? String == campaign && summary["delivered"] as? Int == 100_000,
            "one summary for the whole job, each token once: \(summary)")
        #expect(arrivals.withLock { $0.count } == 100_020, "each token once")
    }

    /// With the rate limit spent by a bulk backlog, urgent work still goes first (its share, then every slot's
    /// permits before bulk work). At 100/s the 400 bulk notifications take 4 s.
    @Test func underARateLimitUrgentJobsGoBeforeTheBulkBacklog() throws {
        // A Redis database of its own: the rate limit is shared by every worker on the same Redis.
        let redisURL = try TestServices.redisURL().withDatabase(8)
        let passing = try bulkPassingUrgentWork(
            backlogJobs: 20, perJob: 20, urgentJobs: 10, underWay: 30,
            settings: [
                "APNS_RATE_LIMIT": "100", "APNS_RATE_LIMIT_URGENT_SHARE": "0.2",
                "REDIS_URL": redisURL.description(revealingPassword: true)
            ])
        #expect(passing.left > 200, "\(passing.left) bulk notifications left when the urgent jobs came")
        #expect(passing.between < 100, "\(passing.between) bulk notifications went before the last urgent one")
    }

    /// The shared limit itself, against Redis: bulk work takes what is left, urgent work can always take its share
    /// beyond that, and the next slot starts with that debt.
    @Test func urgentWorkAlwaysHasItsShareOfTheRateLimitAndBulkWorkPaysItBack() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        // 1,000/s: 100 permits per tenth-of-a-second slot; a share of 0.2 lets urgent work borrow 20.
        var outcome: [RateReservation] = []
        let clean = try TestServices.waitUntil(timeout: 10) {
            let limiter = SharedRateLimit(
                redis: redis, limit: 1_000, urgentShare: 0.2, keyPrefix: TestServices.unique("rate"))
            // Begin early in a slot, so that the first three reservations share it; the fourth is in the next one.
            guard case .granted(_, _, let left)? = try? limiter.reserve(urgent: 0, bulk: 0), left > 0.07 else {
                return false
            }
            outcome = try [
                limiter.reserve(urgent: 0, bulk: 1_000), limiter.reserve(urgent: 50, bulk: 0),
                limiter.reserve(urgent: 50, bulk: 50)
            ]
            guard case .granted(_, _, let stillLeft) = outcome[2], stillLeft > 0.005 else { return false }
            let slotEnds = Date().addingTimeInterval(stillLeft)
            usleep(UInt32(stillLeft * 1e6) + 2_000)  // the slot's end: what comes after it is the behaviour tested
            let next = try limiter.reserve(urgent: 0, bulk: 1_000)
            // The very next slot (a stalled machine may have slept past it): its debt is the previous slot's.
            guard case .granted(_, _, let nextLeft) = next, nextLeft > 0.05,
                Date().timeIntervalSince(slotEnds) < 0.09
            else { return false }
            outcome.append(next)
            return true
        }
        try #require(clean, "no run fitted the slots")
        #expect(
            outcome == [
                .granted(urgent: 0, bulk: 100, nextWindowIn: outcome[0].left),
                .granted(urgent: 20, bulk: 0, nextWindowIn: outcome[1].left),
                .granted(urgent: 0, bulk: 0, nextWindowIn: outcome[2].left),
                .granted(urgent: 0, bulk: 80, nextWindowIn: outcome[3].left)
            ],
            "bulk took the slot, urgent its share on top, nothing more for either, and the next slot paid it back")
        // In one reservation, urgent work is served before bulk work.
        let limiter = SharedRateLimit(
            redis: redis, limit: 1_000, urgentShare: 0, keyPrefix: TestServices.unique("rate"))
        let both = try limiter.reserve(urgent: 100, bulk: 100)
        #expect(both.grants == (100, 0), "urgent first: \(both)")
    }

    /// The limiter names its slots by Redis's clock, not the local one: a local clock 37 s off costs the first
    /// reservation a second round trip (Redis answers with its time), and every slot written is Redis's.
    @Test func slotsFollowRedisClockWhateverTheLocalClockSays() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let prefix = TestServices.unique("rate-skew")
        let limiter = SharedRateLimit(
            redis: redis, limit: 1_000, urgentShare: 0, keyPrefix: prefix,
            localNow: { Date().timeIntervalSince1970 - 37 })
        for _ in 0..<3 {
            guard case .granted(_, let bulk, _) = try limiter.reserve(urgent: 0, bulk: 1) else {
                Issue.record("refused")
                return
            }
            #expect(bulk <= 1)
        }
        let written = try redis.command(["KEYS", prefix + ":*"]).elements.compactMap(\.text)
        let redisSecond = try #require(try redis.command(["TIME"]).elements.first?.text.flatMap { Int($0) })
        #expect(!written.isEmpty, "a slot was written")
        #expect(
            written.allSatisfy { key in
                Int(key.dropFirst(prefix.count + 1).split(separator: ".")[0]).map { abs($0 - redisSecond) <= 2 } == true
            }, "slots are Redis's seconds (\(redisSecond)), not the skewed local clock's: \(written)")
    }

    @Test func aJobWhoseDeadlinePassedWhileItWaitedIsExpiredCountedAndSummarisedNotSent() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let late = (0..<3).map { Self.token(0xD0000 + $0) }
        let onTime = Self.token(0xD1000)
        let now = Int64(Date().timeIntervalSince1970)
        let (lateJob, onTimeJob) = (TestServices.unique("late"), TestServices.unique("on-time"))
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(lateJob)", "tokens": [\#(late.map { "\"\($0)\"" }.joined(separator: ","))], "deadline": \#(now - 1), "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(onTimeJob)", "tokens": ["\#(onTime)"], "deadline": \#(now + 3600), "payload": {"aps": {}}}"#
                    .utf8
            ),
            properties: AMQPProperties(replyTo: replies))
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { workerThread.stop() }

        var summaries: [String: [String: Any]] = [:]
        for message in try replyReader.read(2) {
            let summary = try #require(try JSONSerialization.jsonObject(with: Data(message.body)) as? [String: Any])
            summaries[summary["job_id"] as? String ?? ""] = summary
        }
        let expired = try #require(summaries[lateJob], "the expired job is summarised")
        #expect(
            expired["expired"] as? Int == 3 && expired["delivered"] as? Int == 0 && expired["failed"] as? Int == 0,
            "\(expired)")
        #expect(summaries[onTimeJob]?["delivered"] as? Int == 1 && summaries[onTimeJob]?["expired"] as? Int == 0)
        #expect(simulator.received().map(\.deviceToken) == [onTime], "nothing of the expired job reached APNs")
        let statistics = workerThread.worker.statistics
        // The summaries are published before the jobs are acknowledged and counted.
        #expect(TestServices.waitUntil { statistics.jobsCompleted.load(ordering: .relaxed) == 2 }, "both acknowledged")
        #expect(statistics.jobsParked.load(ordering: .relaxed) == 0, "not parked")
        #expect(
            statistics.prometheusText(ready: true).contains(#"apns_worker_notifications_total{outcome="expired"} 3"#))
    }

    /// A notification handed to APNs before its job's deadline that then waits behind busy streams until after it
    /// is dropped there, never sent: counted and summarised as expired, as one whose deadline came before it was
    /// handed over.
    @Test func aNotificationWhoseDeadlineComesWhileItWaitsForAStreamIsExpiredNotSent() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.3
        let simulator = try APNsSimulator(
            configuration: .init(maximumConcurrentStreams: 1, behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs, ["APNS_CONNECTIONS": "1", "APNS_MAX_CONNECTIONS": "1"]),
            logger: logger)
        defer { workerThread.stop() }
        // The worker knows APNs allows one stream: it hands over that and a batch, so both jobs go at once.
        let sender = workerThread.worker.sender
        #expect(
            TestServices.waitUntil(timeout: 60) { sender.streamCapacity(.urgent) == 1 },
            "stream capacity: \(sender.streamCapacity(.urgent).map(String.init) ?? "unknown")")
        let ahead = (0..<12).map { Self.token(0xD4000 + $0) }
        let late = Self.token(0xD4100)
        let (aheadJob, lateJob) = (TestServices.unique("ahead"), TestServices.unique("behind"))
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(aheadJob)", "tokens": [\#(ahead.map { "\"\($0)\"" }.joined(separator: ","))], "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        // One to two seconds away: the first job's twelve answers take 3.6 s on the one stream.
        let deadline = Int64(Date().timeIntervalSince1970) + 2
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "\#(lateJob)", "tokens": ["\#(late)"], "deadline": \#(deadline), "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replies))
        var summaries: [String: [String: Any]] = [:]
        for message in try replyReader.read(2) {
            let summary = try #require(try JSONSerialization.jsonObject(with: Data(message.body)) as? [String: Any])
            summaries[summary["job_id"] as? String ?? ""] = summary
        }
        let expired = try #require(summaries[lateJob], "the late job is summarised")
        #expect(expired["expired"] as? Int == 1 && expired["delivered"] as? Int == 0, "\(expired)")
        #expect(summaries[aheadJob]?["delivered"] as? Int == 12, "\(summaries[aheadJob] ?? [:])")
        #expect(!simulator.received().map(\.deviceToken).contains(late), "the late notification never reached APNs")
        let statistics = workerThread.worker.statistics
        #expect(TestServices.waitUntil { statistics.jobsCompleted.load(ordering: .relaxed) == 2 }, "both acknowledged")
        #expect(
            statistics.prometheusText(ready: true).contains(#"apns_worker_notifications_total{outcome="expired"} 1"#))
    }

    /// A retry that could only come after the deadline is not scheduled: that notification expires at once.
    @Test func aRetryThatWouldMissTheDeadlineExpiresInstead() throws {
        let flaky = Self.token(0xD2000)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = [flaky: 1]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let deadline = Int64(Date().timeIntervalSince1970) + 20
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "flaky", "tokens": ["\#(flaky)"], "deadline": \#(deadline), "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_RETRY_DELAYS": "60"
                ]), logger: logger)
        defer { workerThread.stop() }
        let reply = try #require(try replyReader.read(1).first)
        let summary = try #require(try JSONSerialization.jsonObject(with: Data(reply.body)) as? [String: Any])
        #expect(summary["expired"] as? Int == 1 && summary["retrying"] as? Int == 0, "\(summary)")
        #expect(workerThread.worker.statistics.retries.load(ordering: .relaxed) == 0, "no retry was published")
        #expect(simulator.received().count == 1, "one attempt, the failed one")
    }

    @Test func retriesStayInTheirLane() throws {
        let urgentToken = Self.token(0xD3000)
        let bulkToken = Self.token(0xD3001)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = [urgentToken: 1, bulkToken: 1]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        let bulk = TestServices.unique("bulk")
        try publisher.declareQueue(bulk)
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "u", "tokens": ["\#(urgentToken)"], "payload": {"aps": {}}}"#.utf8))
        try publisher.publish(
            to: bulk, body: Array(#"{"id": "b", "tokens": ["\#(bulkToken)"], "payload": {"aps": {}}}"#.utf8))
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "PUSH_BULK_QUEUE": bulk, "APNS_RETRY_DELAYS": "0.1"
                ]), logger: logger)
        defer { workerThread.stop() }
        #expect(
            TestServices.waitUntil(timeout: 30) { simulator.received().filter { $0.status == 200 }.count == 2 },
            "both delivered on their second attempt")
        #expect(
            workerThread.worker.statistics.jobsTaken.counts == LaneCounts(urgent: 2, bulk: 2),
            "each retry came back through its own lane's delay queue")
    }
}

extension RateReservation {
    var left: Double {
        if case .granted(_, _, let left) = self { left } else { 0 }
    }

    var grants: (urgent: Int, bulk: Int) {
        if case .granted(let urgent, let bulk, _) = self { (urgent, bulk) } else { (0, 0) }
    }
}
