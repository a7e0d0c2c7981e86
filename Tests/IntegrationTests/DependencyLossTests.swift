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

/// A dependency lost under a running worker that stays alive: what it holds is neither lost nor sent twice.
@Suite struct DependencyLossTests {
    let logger = Logger(
        label: "dependency-loss", level: ProcessInfo.processInfo.environment["XLOG"] == nil ? .critical : .info)

    /// Redis frozen (SIGSTOP: connections open, nothing answered) for 8 s while jobs of 50 tokens each flow at full
    /// speed: every notification is delivered once. The worker's calls to Redis time out meanwhile and its session
    /// ends; the answers it held then (handed over for the idempotency record, of jobs under way) are written before
    /// the redeliveries of their jobs are looked up, so nothing answered goes out twice.
    @Test func redisFrozenUnderARunningWorkerSendsNothingTwice() throws {
        let (port, redis) = try BadSettingsTests.privateRedis()
        defer { redis.stop() }
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.02
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        let jobCount = 400
        let tokensPerJob = 50
        let prefix = TestServices.unique("frozen")
        var last: UInt64 = 0
        for job in 0..<jobCount {
            let tokens = (0..<tokensPerJob).map { "\"" + String(format: "%064x", job * tokensPerJob + $0 + 1) + "\"" }
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(prefix)-\#(job)", "tokens": [\#(tokens.joined(separator: ","))], "payload": {"aps": {}}}"#
                        .utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "REDIS_URL": "redis://127.0.0.1:\(port)/0", "WORKER_PREFETCH": "50"
            ])
        let worker = try WorkerThread(environment, logger: logger)
        defer { worker.stop() }
        let notifications = jobCount * tokensPerJob
        #expect(
            TestServices.waitUntil(timeout: 60) { simulator.received().count >= notifications / 4 },
            "a quarter delivered")
        kill(redis.pid, SIGSTOP)
        let frozenAt = simulator.received().count
        Thread.sleep(forTimeInterval: 8)  // the outage itself: how long Redis stays frozen, not a wait for anything
        kill(redis.pid, SIGCONT)
        let delivered = TestServices.waitUntil(timeout: 120) {
            Set(simulator.received().lazy.filter { $0.status == 200 }.map(\.deviceToken)).count >= notifications
        }
        #expect(delivered, "every notification delivered after the thaw")
        let received = simulator.received().filter { $0.status == 200 }
        let duplicates = received.count - Set(received.map(\.deviceToken)).count
        #expect(duplicates == 0, "\(duplicates) pushes sent twice (\(frozenAt) sent before the freeze)")
        TestServices.reportFault(
            "Redis frozen 8 s under a running worker (400 jobs x 50 tokens, ids, full speed)",
            notifications: notifications, received: simulator.received())
    }

    /// When each token was first accepted by APNs (apns-sim), and how many acceptances there were.
    final class Acceptances: Sendable {
        private let state = Locked<(first: [String: Date], total: Int)>(([:], 0))

        func observe(_ notification: ReceivedNotification) {
            guard notification.status == 200 else { return }
            state.withLock { state in
                state.total += 1
                if state.first[notification.deviceToken] == nil { state.first[notification.deviceToken] = Date() }
            }
        }

        var first: [String: Date] { state.withLock { $0.first } }
        var duplicates: Int { state.withLock { $0.total - $0.first.count } }
    }

    /// One master of a three-master Redis Cluster frozen for 10 s (no replica, `cluster-require-full-coverage no`)
    /// while one-user jobs flow at 100 a second: the jobs of users on the two other masters keep being delivered
    /// during the outage; the frozen master's users' jobs wait (in the delay queue) and go out after it; the session
    /// never ends, so no job is taken for a suspect. The frozen master also holds the shared rate limit's slots.
    @Test func aFrozenClusterMasterCostsOnlyItsOwnUsers() throws {
        let cluster = try PrivateRedisCluster()
        defer { cluster.stop() }
        let client = try RedisCluster(RedisClusterNodes(seeds: cluster.masters))
        let keys = RedisKeys(cluster: true)
        let frozen = try #require(client.master(ofSlot: RedisCluster.slot(of: keys.ratePrefix + ":0")))
        let jobCount = 1_400
        let freezeAt = 200
        let thawAt = 1_200
        let users = (0..<jobCount).map { TestServices.unique("clustered-\($0)") }
        let tokens = (0..<jobCount).map { String(format: "%064x", 0xC1_0000 + $0) }
        _ = try client.pipeline(zip(users, tokens).map { ["HSET", keys.tokens($0), $1, "production"] })
        let onFrozen = Set(
            users.indices.filter { client.master(ofSlot: RedisCluster.slot(of: keys.tokens(users[$0]))) == frozen })

        let acceptances = Acceptances()
        var configuration = APNsSimulator.Configuration()
        configuration.observer = { acceptances.observe($0) }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            cluster.environment.merging([
                "APNS_RATE_LIMIT": "2000"
            ]) { $1 })
        let worker = try WorkerThread(environment, logger: logger)
        defer { worker.stop() }

        var frozenFrom = Date.distantFuture
        var thawedAt = Date.distantFuture
        let started = Date()
        for index in 0..<jobCount {
            if index == freezeAt {
                try cluster.freeze(frozen)
                frozenFrom = Date()
            }
            if index == thawAt {
                try cluster.thaw(frozen)
                thawedAt = Date()
            }
            try publisher.publish(
                to: jobs,
                body: Array(#"{"id": "\#(users[index])", "users": ["\#(users[index])"], "payload": {"aps": {}}}"#.utf8))
            // The load's pace, 100 jobs a second: a schedule to keep, not a wait for anything.
            let due = started.addingTimeInterval(Double(index + 1) / 100)
            if due > Date() { Thread.sleep(until: due) }
        }
        let delivered = TestServices.waitUntil(timeout: 90) { acceptances.first.count >= jobCount }
        let first = acceptances.first
        #expect(delivered, "every job delivered after the thaw: \(first.count) of \(jobCount)")
        let healthyDuring = (freezeAt..<thawAt).filter { !onFrozen.contains($0) }
        let deliveredDuring = healthyDuring.filter { (first[tokens[$0]] ?? .distantFuture) < thawedAt }
        #expect(
            deliveredDuring.count * 2 >= healthyDuring.count,
            "\(deliveredDuring.count) of \(healthyDuring.count) healthy users' jobs published during the outage delivered before it ended"
        )
        let waited = (freezeAt..<thawAt).filter { onFrozen.contains($0) }
        let resumed = waited.compactMap { first[tokens[$0]] }.min().map { $0.timeIntervalSince(thawedAt) } ?? -1
        let suspects = worker.worker.statistics.suspectJobs.load(ordering: .relaxed)
        #expect(suspects == 0, "no job ran alone as a suspect")
        #expect(acceptances.duplicates == 0, "nothing sent twice")
        print(
            "failover | redis cluster: one master of three frozen \(String(format: "%.1f", thawedAt.timeIntervalSince(frozenFrom))) s, "
                + "one-user jobs at 100/s | healthy users' jobs published during the outage delivered before its end: "
                + "\(deliveredDuring.count) of \(healthyDuring.count) | the frozen master's users' jobs: \(waited.count) waited, first "
                + "delivered \(String(format: "%.1f", resumed)) s after the thaw | suspects \(suspects) | duplicates \(acceptances.duplicates)"
        )
    }
}
