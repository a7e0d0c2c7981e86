import AMQP
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// The mass-invalidation guard as backends meet it: one job per user, and jobs that mix mismatches with other
/// answers. Against real RabbitMQ, Redis (a database of its own per test: the fleet's window is one per database)
/// and apns-sim.
@Suite struct MassInvalidationTests {
    let logger = Logger(label: "mass-invalidation", level: .critical)

    struct Run {
        var summaries: [[String: Any]]
        var events: Int
        var redis: RedisConnection
        var owners: [String: String]

        func cached(_ token: String) throws -> Bool {
            try redis.command(["HEXISTS", RedisKeys.node.tokens(owners[token]!), token]).integer == 1
        }
    }

    /// Caches each token under a user of its own, publishes one job per entry of `jobs` (the tokens of its users) in
    /// order, and waits for every summary.
    func run(
        _ database: TestServices.IsolatedDatabase, behaviour: APNsSimulator.Behaviour,
        jobs: [[String]]
    ) throws -> Run {
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (redisURL, redis) = try TestServices.isolatedRedis(database)
        let owners = Dictionary(uniqueKeysWithValues: jobs.joined().map { ($0, TestServices.unique("u")) })
        _ = try redis.pipeline(owners.map { ["HSET", RedisKeys.node.tokens($1), $0, "production"] })
        let (queue, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let deadReader = try QueueReader(dead)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: queue,
                [
                    "PUSH_DEAD_TOKENS_QUEUE": dead, "REDIS_URL": redisURL, "APNS_MAX_ATTEMPTS": "1"
                ]), logger: logger)
        defer { worker.stop() }
        for (index, tokens) in jobs.enumerated() {
            let users = tokens.map { "\"\(owners[$0]!)\"" }.joined(separator: ",")
            let body = #"{"id": "job-\#(index)", "users": [\#(users)], "payload": {"aps": {}}}"#
            try publisher.publish(to: queue, body: Array(body.utf8), properties: AMQPProperties(replyTo: replies))
        }
        let summaries = try replyReader.read(jobs.count, timeout: 60).map(TokenKindsTests.summary)
        #expect(summaries.count == jobs.count, "every job settled")
        // Events are confirmed before a job's summary goes out: all are on the queue by now.
        let events = try deadReader.read(jobs.count + 1, timeout: 1).count
        return Run(summaries: summaries, events: events, redis: redis, owners: owners)
    }

    /// The fleet's window in Redis: the last minute's answers, and the last hour's in minute buckets, so that a wave
    /// too slow to fill a minute (10 minutes ago) still counts, and one older than the hour no longer does.
    @Test func theWindowAddsTheLastHoursMinutes() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let prefix = TestServices.unique("guard")
        let window = SharedInvalidationWindow(redis: redis, keyPrefix: prefix)
        let minute = (Int(try #require(redis.command(["TIME"]).elements.first?.text) ?? "0") ?? 0) / 60
        for (ago, count) in [(10, 15), (61, 100)] {
            _ = try redis.command([
                "HSET", "\(prefix):minute:\(minute - ago)", "mismatches", String(count), "judged", String(count)
            ])
        }
        guard case .answered(let totals) = try window.add(InvalidationCounts(mismatches: 1, judged: 1)) else {
            Issue.record("the window was not answered")
            return
        }
        #expect(totals.lastMinute == InvalidationCounts(mismatches: 1, judged: 1))
        #expect(totals.lastHour == InvalidationCounts(mismatches: 16, judged: 16), "\(totals)")
        // The current minute's bucket (the next one's, had the minute just turned).
        let lifetime =
            try [minute, minute + 1].map {
                try redis.command(["TTL", "\(prefix):minute:\($0)"]).integer ?? 0
            }.max() ?? 0
        #expect(lifetime > 3600, "a minute's bucket outlives the hour: \(lifetime) s")
    }

    @Test func aWaveOverOneUserJobsRemovesLessThanTheThreshold() throws {
        let tokens = TokenKindsTests.tokens("badbad01", 200)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.badTokens = Set(tokens)
        let run = try run(.waveOverOneUserJobs, behaviour: behaviour, jobs: tokens.map { [$0] })
        let removed = try tokens.filter { try !run.cached($0) }.count
        #expect(removed <= 19, "at most the threshold's worth less one: \(removed) of 200 removed")
        #expect(run.events == removed, "an event for each token removed, none for those kept")
        let heldBack = run.summaries.compactMap { $0["held_back"] as? Int }.reduce(0, +)
        #expect(heldBack == 200 - removed, "every other answer held back")
        let state = try run.redis.command(["KEYS", RedisKeys.node.guardPrefix + ":*"]).elements.count
        #expect(state >= 1, "the fleet's window is in Redis")
    }

    @Test func aGenuineBadTokenNowAndThenIsStillRemoved() throws {
        let good = TokenKindsTests.tokens("600d0001", 196)
        let bad = TokenKindsTests.tokens("badbad02", 4)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.badTokens = Set(bad)
        // One in fifty: a bad token after every 49 good ones.
        let jobs: [[String]] = (0..<200).map { (index: Int) -> [String] in
            index % 50 == 49 ? [bad[index / 50]] : [good[index - index / 50]]
        }
        let run = try run(.healthyOneUserJobs, behaviour: behaviour, jobs: jobs)
        #expect(try bad.allSatisfy { try !run.cached($0) }, "each genuine bad token removed")
        #expect(try good.allSatisfy { try run.cached($0) })
        #expect(run.events == 4)
    }

    /// Throttled and delivered answers say nothing against the mismatches beside them.
    @Test func otherAnswersDoNotDiluteAJobsMismatches() throws {
        let mismatched = TokenKindsTests.tokens("badbad03", 80)
        let throttled = TokenKindsTests.tokens("7400003a", 60)
        let live = TokenKindsTests.tokens("600d0003", 20)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.badTokens = Set(mismatched)
        behaviour.throttledTokens = Set(throttled)
        let run = try run(
            .diluted, behaviour: behaviour,
            jobs: [Array(mismatched[0..<60]) + throttled, Array(mismatched[60..<80]) + live])
        #expect(try mismatched.allSatisfy { try run.cached($0) }, "no mismatched token removed")
        #expect(run.events == 0)
        #expect(run.summaries.compactMap { $0["held_back"] as? Int }.sorted() == [20, 60])
    }
}
