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

/// The three-node RabbitMQ cluster scripts/test starts for this suite (scripts/lib/cluster.sh): its nodes' URLs,
/// names and rabbitmqctl. Tests stop and start nodes, so the suite runs alone, one test at a time.
enum Cluster {
    static func urls() throws -> [String] {
        try TestServices.value("CLUSTER_AMQP_URL").split(separator: ",").map(String.init)
    }

    static func url(_ node: Int) throws -> AMQPURL { try AMQPURL(urls()[node - 1]) }

    static func names() throws -> [String] {
        try TestServices.value("CLUSTER_NODE_NAMES").split(separator: ",").map(String.init)
    }

    static func ctl(_ node: Int, _ arguments: [String]) throws -> String {
        try TestServices.run(try TestServices.value("CLUSTER_CTL"), [String(node)] + arguments)
    }

    /// The node (1...3) whose URL has this port, as a log line names it (`amqp.url=amqp://guest:***@host:PORT/...`).
    static func node(inLogLine line: String) throws -> Int {
        let ports = try urls().map { try AMQPURL($0).port }
        for (index, port) in ports.enumerated() where line.contains(":\(port)/") { return index + 1 }
        throw TestServices.CommandFailed(description: "no cluster node in: \(line)")
    }

    /// The node leading a quorum queue, asked of a running node.
    static func leader(of queue: String, askingNode asked: Int) throws -> Int {
        let listing = try ctl(asked, ["list_queues", "name", "leader", "--quiet", "--no-table-headers"])
        let line = try #require(listing.split(separator: "\n").first { $0.hasPrefix(queue + "\t") }, "\(listing)")
        let leader = String(line.split(separator: "\t").last ?? "")
        return try #require(try names().firstIndex(of: leader), "leader \(leader)") + 1
    }

    /// Messages in a queue, ready and unacknowledged, asked of a running node.
    static func messages(in queue: String, askingNode asked: Int) throws -> Int? {
        let listing = try ctl(asked, ["list_queues", "name", "messages", "--quiet", "--no-table-headers"])
        return listing.split(separator: "\n").first { $0.hasPrefix(queue + "\t") }
            .flatMap { Int($0.split(separator: "\t").last ?? "") }
    }

    /// Messages, ready and unacknowledged, in every queue whose name starts with one of `prefixes` (a lane's queue
    /// and its retry tiers share its name as a prefix), asked of a running node.
    static func messages(inQueuesStartingWith prefixes: [String], askingNode asked: Int) throws -> Int {
        let listing = try ctl(asked, ["list_queues", "name", "messages", "--quiet", "--no-table-headers"])
        var total = 0
        var matched = Set<String>()
        for line in listing.split(separator: "\n") {
            let fields = line.split(separator: "\t")
            guard fields.count == 2, let prefix = prefixes.first(where: { fields[0].hasPrefix($0) }) else { continue }
            total += try #require(Int(fields[1]), "a count in: \(line)")
            matched.insert(prefix)
        }
        try #require(matched == Set(prefixes), "every prefix names a queue: \(Set(prefixes).subtracting(matched))")
        return total
    }

    static func stop(_ node: Int) throws { _ = try ctl(node, ["stop_app"]) }

    /// Whether every node runs and none sees a partition, as each node itself reports it (a node that healed may
    /// still be recorded as partitioned by another).
    static func isWhole() -> Bool {
        (1...3).allSatisfy { node in
            guard let text = try? ctl(node, ["cluster_status", "--formatter", "json"]),
                let status = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            else { return false }
            let running = (status["running_nodes"] as? [String])?.count ?? 0
            let partitions = (status["partitions"] as? [String: Any])?.count ?? 1
            return running == 3 && partitions == 0
        }
    }

    /// Makes the cluster whole again after `node` was frozen longer than net_ticktime and thawed. RabbitMQ's
    /// autoheal restarts the losing side, usually within seconds of the thaw; where it has not after
    /// `autohealTimeout` (a partial partition can leave each side recording one), the recovery RabbitMQ's partitions
    /// guide gives operators: restart the untrusted node's application, then every other node's one at a time, which
    /// clears the partition each recorded (quorum queues keep a majority throughout). False if the cluster is still
    /// not whole after that.
    static func heal(after node: Int, autohealTimeout: Double = 30) -> Bool {
        if TestServices.waitUntil(timeout: autohealTimeout, isWhole) { return true }
        for restarted in [node] + (1...3).filter({ $0 != node }) {
            _ = try? ctl(restarted, ["stop_app"])
            _ = try? ctl(restarted, ["start_app"])
            _ = try? ctl(restarted, ["await_startup"])
        }
        return TestServices.waitUntil(timeout: 90, isWhole)
    }

    /// The node's Erlang VM, as the node itself names it (`os:getpid()`): SIGSTOP freezes the node whole, its sockets
    /// open and nothing answered. Asked of the node rather than looked up among processes, where a rabbitmqctl run
    /// for the node carries the same name in its environment.
    static func pid(_ node: Int) throws -> pid_t {
        let answer = try ctl(node, ["eval", "os:getpid()."])
        let digits = answer.filter(\.isNumber)
        return try #require(pid_t(digits), "os:getpid() on node \(node): \(answer)")
    }

    /// Whether a process is stopped (SIGSTOP): its state in /proc/PID/stat is T.
    static func isStopped(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let end = stat.lastIndex(of: ")")
        else { return false }
        return stat[stat.index(after: end)...].trimmingCharacters(in: .whitespaces).hasPrefix("T")
    }

    /// Starts a stopped node and waits until it runs again.
    static func start(_ node: Int) throws {
        _ = try ctl(node, ["start_app"])
        _ = try ctl(node, ["await_startup"])
    }

    /// A node other than these.
    static func other(than nodes: Int...) -> Int { (1...3).first { !nodes.contains($0) }! }
}

/// What a three-node cluster with quorum queues costs when a node dies: nothing lost, duplicates bounded by what was
/// in flight, and how long delivery stopped. Runs as its own phase of scripts/test.
@Suite(.serialized) struct ClusterTests {
    /// When each distinct token was first accepted, and every acceptance.
    final class Deliveries: Sendable {
        private let state = Locked<(times: [Date], tokens: Set<String>)>(([], []))
        let target: Int
        private let reached = Locked<[Int: DispatchSemaphore]>([:])

        init(target: Int) { self.target = target }

        func observe(_ notification: ReceivedNotification) {
            guard notification.status == 200 else { return }
            let count = state.withLock { state in
                state.times.append(Date())
                state.tokens.insert(notification.deviceToken)
                return state.tokens.count
            }
            reached.withLock { waiting in
                for (threshold, semaphore) in waiting where count >= threshold {
                    semaphore.signal()
                    waiting[threshold] = nil
                }
            }
        }

        var distinct: Int { state.withLock { $0.tokens.count } }

        /// Waits until `count` distinct tokens were accepted.
        func wait(for count: Int, timeout: Double) -> Bool {
            let semaphore = DispatchSemaphore(value: 0)
            let already = reached.withLock { waiting in
                if distinct >= count { return true }
                waiting[count] = semaphore
                return false
            }
            return already || semaphore.wait(timeout: .now() + timeout) == .success
        }

        /// The longest time without an acceptance after `since`: how long delivery stopped.
        func longestPause(after since: Date) -> Double {
            let times = state.withLock { $0.times }.sorted()
            var previous = times.last { $0 <= since } ?? since
            var longest = 0.0
            for time in times where time > since {
                longest = max(longest, time.timeIntervalSince(previous))
                previous = time
            }
            return longest
        }
    }

    static let jobCount = 3_000
    static let prefetch = 200

    enum Stopped { case workersNode, jobsQueueLeader }

    /// Jobs of one token each on a quorum queue declared through node 1 (which so leads it); a worker process with
    /// the three URLs, on node 1 when the node it uses is the one stopped, on another node when only the leader is;
    /// a rate limit so that the run lasts long enough to stop node 1 in the middle. Stops node 1, waits for every
    /// notification, starts node 1 again.
    func failover(_ stopped: Stopped) throws {
        let logger = Logger(label: "cluster", level: .critical)
        let tokens = (0..<Self.jobCount).map { String(format: "%064x", 0xC0_0000 + $0) }
        let deliveries = Deliveries(target: tokens.count)
        var configuration = APNsSimulator.Configuration()
        configuration.observer = { deliveries.observe($0) }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }

        let jobs = TestServices.unique("cluster-jobs")
        let publisher = try AMQPConnection(url: Cluster.url(1))
        defer { publisher.close() }
        _ = try publisher.declareQueue(jobs, arguments: ["x-queue-type": .string("quorum")])
        try #require(try Cluster.leader(of: jobs, askingNode: 2) == 1, "declared through node 1, led by node 1")

        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "AMQP_URL": try Cluster.urls().joined(separator: ","), "PUSH_QUEUE_TYPE": "quorum",
                "WORKER_PREFETCH": String(Self.prefetch), "APNS_RATE_LIMIT": "300", "LOG_FORMAT": "text",
                "LOG_LEVEL": "info", "AMQP_HEARTBEAT": "5"
            ])
        environment["PUSH_DEAD_TOKENS_QUEUE"] = TestServices.unique("cluster-dead")
        // A worker starts on a random node: started again until it is where the scenario wants it. The queue is
        // still empty, so a worker stopped here costs no job a delivery.
        let placed: (Int) -> Bool = stopped == .workersNode ? { $0 == 1 } : { $0 != 1 }
        var worker: ExecutablesTests.Child?
        var workerNode = 0
        for _ in 0..<40 where worker == nil || !placed(workerNode) {
            if let earlier = worker { _ = earlier.stop(SIGKILL) }
            let child = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
            let consuming = try #require(child.waitForLine(containing: "consuming"), "the worker consumes")
            workerNode = try Cluster.node(inLogLine: consuming)
            worker = child
        }
        let running = try #require(worker)
        defer { _ = running.stop(SIGKILL) }
        try #require(placed(workerNode), "the worker is on node \(workerNode)")

        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for token in tokens {
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-\#(token.suffix(6))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        publisher.close()

        try #require(deliveries.wait(for: Self.jobCount / 5, timeout: 60), "delivery under way")
        try #require(try Cluster.leader(of: jobs, askingNode: 2) == 1, "node 1 still leads the jobs queue")
        let survivor = Cluster.other(than: 1, workerNode)
        let stoppedAt = Date()
        try Cluster.stop(1)
        let restarted = Locked(false)
        defer { if !restarted.withLock({ $0 }) { try? Cluster.start(1) } }
        if stopped == .workersNode {
            let moved = try #require(running.waitForLine(containing: "consuming", timeout: 60), "consuming again")
            #expect(try Cluster.node(inLogLine: moved) != 1, "moved to a running node: \(moved)")
        }
        #expect(
            deliveries.wait(for: Self.jobCount, timeout: 120),
            "\(deliveries.distinct) of \(Self.jobCount) delivered")
        #expect(running.stop() == 0, "the worker stops cleanly")
        // Every job was acknowledged: none is left ready or unacknowledged in the jobs queue, and nothing went to a
        // retry tier, the failed queue or the dead-token queue (quorum counts refresh every 200 ms).
        let emptied = try TestServices.waitUntil(timeout: 30) {
            try Cluster.messages(in: jobs, askingNode: survivor) == 0
        }
        #expect(
            emptied,
            "the jobs queue is empty: \(String(describing: try? Cluster.messages(in: jobs, askingNode: survivor)))")
        let others =
            [
                environment["PUSH_BULK_QUEUE"], environment["PUSH_FAILED_QUEUE"],
                environment["PUSH_DEAD_TOKENS_QUEUE"]
            ].compactMap { $0 } + [jobs + ".retry."]
        let left = try Cluster.messages(inQueuesStartingWith: others, askingNode: survivor)
        #expect(left == 0, "the worker's other queues are empty: \(left) messages")
        try Cluster.start(1)
        restarted.withLock { $0 = true }

        let received = simulator.received().filter { $0.status == 200 }
        let duplicates = received.count - Set(received.map(\.deviceToken)).count
        #expect(duplicates <= Self.prefetch, "duplicates are bounded by the jobs in flight: \(duplicates)")
        let scenario =
            stopped == .workersNode
            ? "cluster: node 1 stopped mid-run, the node the worker uses and the jobs queue's leader"
            : "cluster: node 1 stopped mid-run, the jobs queue's leader (the worker on node \(workerNode))"
        TestServices.reportFault(scenario, notifications: Self.jobCount, received: simulator.received())
        let pause = deliveries.longestPause(after: stoppedAt)
        #expect(pause < 15, "delivery resumed: the longest pause was \(pause) s")
        print(
            String(
                format: "failover | %@ | %d | %d | %d | %.1f", scenario, Self.jobCount, deliveries.distinct,
                duplicates, pause))
    }

    @Test func theNodeTheWorkerUsesStopsMidRun() throws { try failover(.workersNode) }

    /// The node the worker consumes from frozen (SIGSTOP: its sockets open, nothing answered; the lanes' queues led
    /// by another node): work published after the freeze reaches APNs within 10 s. The worker's readiness round trip
    /// gives up after one heartbeat interval (5 s by default), it connects to a node that answers (the silent one
    /// last) and consumes at once, declaring nothing it declared before.
    @Test func workPublishedAfterTheWorkersNodeFreezesReachesAPNsWithinTenSeconds() throws {
        let logger = Logger(label: "cluster", level: .critical)
        let acceptances = DependencyLossTests.Acceptances()
        var configuration = APNsSimulator.Configuration()
        configuration.observer = { acceptances.observe($0) }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("frozen-jobs")
        let bulk = TestServices.unique("frozen-bulk")
        let publisher = try AMQPConnection(url: Cluster.url(1))
        defer { publisher.close() }
        for queue in [jobs, bulk] {
            _ = try publisher.declareQueue(queue, arguments: ["x-queue-type": .string("quorum")])
        }
        try publisher.enablePublisherConfirms()
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "AMQP_URL": try Cluster.urls().joined(separator: ","), "PUSH_QUEUE_TYPE": "quorum",
                "PUSH_BULK_QUEUE": bulk,
                "LOG_FORMAT": "text", "LOG_LEVEL": "info"
            ])
        // Started again until it consumes from another node than node 1, which leads both lanes' queues.
        var worker: ExecutablesTests.Child?
        var workerNode = 1
        for _ in 0..<40 where workerNode == 1 {
            if let earlier = worker { _ = earlier.stop(SIGKILL) }
            let child = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
            workerNode = try Cluster.node(inLogLine: try #require(child.waitForLine(containing: "consuming")))
            worker = child
        }
        let running = try #require(worker)
        defer { _ = running.stop(SIGKILL) }
        try #require(workerNode != 1, "the worker consumes from node \(workerNode)")
        func publish(_ range: Range<Int>) throws -> [String] {
            let tokens = range.map { String(format: "%064x", 0xF0_0000 + $0) }
            var last: UInt64 = 0
            for token in tokens {
                last = try publisher.publish(
                    to: jobs, body: Array(#"{"tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
            }
            #expect(try publisher.waitForConfirms(through: last).isEmpty)
            return tokens
        }
        let before = try publish(0..<20)
        try #require(
            TestServices.waitUntil(timeout: 30) { acceptances.first.count >= before.count }, "delivery under way")

        let frozen = try Cluster.pid(workerNode)
        kill(frozen, SIGSTOP)
        let frozenAt = Date()
        #expect(
            TestServices.waitUntil(timeout: 5) { Cluster.isStopped(frozen) },
            "node \(workerNode) (pid \(frozen)) frozen")
        defer {
            kill(frozen, SIGCONT)
            #expect(Cluster.heal(after: workerNode), "the thawed node rejoined the cluster")
        }
        let after = try publish(20..<70)
        let delivered = TestServices.waitUntil(timeout: 60) { after.allSatisfy { acceptances.first[$0] != nil } }
        #expect(delivered, "every job published after the freeze delivered")
        let first = acceptances.first
        let latest = after.compactMap { first[$0] }.max().map { $0.timeIntervalSince(frozenAt) } ?? .infinity
        #expect(latest <= 10, "the last job published after the freeze reached APNs \(latest) s after it")
        let moved = running.waitForLine(containing: "consuming", timeout: 5)
        #expect(moved.map { (try? Cluster.node(inLogLine: $0)) != workerNode } == true, "consuming on another node")
        print(
            String(
                format: "failover | cluster: the node the worker consumes from frozen (SIGSTOP), the queues led by "
                    + "another | %d jobs published after the freeze | all delivered within %.1f s of it", after.count,
                latest))
    }

    @Test func theNodeLeadingTheJobsQueueStopsMidRun() throws { try failover(.jobsQueueLeader) }

    /// `apns-worker enqueue` of 10,000 jobs from a pipe; the node it publishes to is stopped halfway (with jobs
    /// published and not confirmed yet): it moves to another node and publishes those again. Every job is in the
    /// queue, some twice (at least once), none lost.
    @Test func enqueueAcrossANodeStopLosesNothing() throws {
        let jobs = TestServices.unique("cluster-enqueue")
        let total = 10_000
        let enqueue = try ExecutablesTests.Child(
            "apns-worker", ["enqueue", "--no-progress", "-"],
            environment: [
                "AMQP_URL": try Cluster.urls().joined(separator: ","), "PUSH_QUEUE_TYPE": "quorum",
                "PUSH_JOBS_QUEUE": jobs, "LOG_LEVEL": "debug", "LOG_FORMAT": "text", "AMQP_HEARTBEAT": "5"
            ], input: true)
        defer { _ = enqueue.stop(SIGKILL) }
        let publishing = try #require(enqueue.waitForLine(containing: "publishing"), "enqueue connects")
        let node = try Cluster.node(inLogLine: publishing)
        func line(_ index: Int) -> String {
            #"{"id": "\#(jobs)-\#(index)", "tokens": ["\#(String(format: "%064x", index))"], "payload": {"aps": {}}}"#
                + "\n"
        }
        // 4,500: the last 500 are published and not confirmed yet (confirms are awaited every 1,000 jobs).
        enqueue.write((0..<4_500).map(line).joined())
        let survivor = Cluster.other(than: node)
        let arrived = try TestServices.waitUntil(timeout: 30) {
            (try Cluster.messages(in: jobs, askingNode: survivor) ?? 0) >= 4_000
        }
        try #require(arrived, "the first jobs are in the queue")
        let stoppedAt = Date()
        try Cluster.stop(node)
        defer { try? Cluster.start(node) }
        enqueue.write((4_500..<total).map(line).joined())
        enqueue.closeInput()
        let moved = try #require(enqueue.waitForLine(containing: "publishing again", timeout: 60), "enqueue moves")
        let resumedAfter = Date().timeIntervalSince(stoppedAt)
        let unconfirmed =
            moved.split(separator: " ").first { $0.hasPrefix("jobs.unconfirmed=") }
            .flatMap { Int($0.dropFirst("jobs.unconfirmed=".count)) } ?? 0
        #expect(
            unconfirmed > 0, "jobs published and not confirmed when the node stopped were published again: \(moved)")
        #expect(try Cluster.node(inLogLine: moved) != node)
        let published = try #require(enqueue.waitForLine(containing: "published", timeout: 120))
        #expect(published.contains("published \(total) jobs"), "\(published)")
        #expect(enqueue.waitForExit() == 0)

        // The queue holds every job, the copies enqueue made after the failover marked as such; a worker sends each
        // notification once (the copies of jobs it settled are acknowledged without sending).
        try Cluster.start(node)
        let logger = Logger(label: "cluster-enqueue", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let queued = try #require(try Cluster.messages(in: jobs, askingNode: survivor))
        #expect(queued >= total, "every job is in the queue, some twice: \(queued)")
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "AMQP_URL": try Cluster.urls().joined(separator: ","), "PUSH_QUEUE_TYPE": "quorum"
                ]), logger: logger)
        defer { worker.stop() }
        let drained = TestServices.waitUntil(timeout: 120) {
            (try? Cluster.messages(in: jobs, askingNode: survivor)) == 0 && simulator.received().count >= total
        }
        #expect(drained, "the worker drained the queue: \(simulator.received().count) pushes")
        worker.stop()
        let received = simulator.received().map(\.deviceToken)
        let distinct = Set(received).count
        #expect(distinct == total, "every job's notification was sent: \(distinct) of \(total)")
        #expect(received.count == total, "each exactly once: \(received.count - distinct) sent twice")
        let skipped = worker.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed)
        // Seconds from the stop command to publishing on another node (the command itself takes about a second).
        print(
            String(
                format: "failover | cluster: enqueue of %d jobs, its node stopped halfway | %d | %d | %d | %.1f",
                total, total, queued, received.count - distinct, resumedAfter))
        print(
            "failover | cluster: enqueue's copies after the failover: \(queued - total) in the queue, "
                + "\(skipped) acknowledged without sending, \(received.count - distinct) sent twice")
    }

    /// `cleanup` and `dead-tokens tail` on the node that is stopped move to another node; the next dead-token event
    /// still removes its token from the cache and reaches the tail.
    @Test func cleanupAndTailMoveToAnotherNode() throws {
        let user = TestServices.unique("erin")
        let token = String(repeating: "e7", count: 32)
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.command(["HSET", RedisKeys.node.tokens(user), token, "production"])
        try #require(try redis.command(["HEXISTS", RedisKeys.node.tokens(user), token]).integer == 1)
        let deadTokens = TestServices.unique("cluster-dead")
        let environment = [
            "AMQP_URL": try Cluster.urls().joined(separator: ","), "PUSH_QUEUE_TYPE": "quorum",
            "REDIS_URL": try TestServices.value("REDIS_URL"), "PUSH_DEAD_TOKENS_QUEUE": deadTokens,
            "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("cluster-registrations"),
            "PUSH_FAILED_QUEUE": TestServices.unique("cluster-failed"), "METRICS_PORT": "0",
            "LOG_FORMAT": "text", "LOG_LEVEL": "info", "AMQP_HEARTBEAT": "5"
        ]
        let cleanup = try ExecutablesTests.Child("apns-worker", ["cleanup"], environment: environment)
        defer { _ = cleanup.stop() }
        let node = try Cluster.node(inLogLine: try #require(cleanup.waitForLine(containing: "cleanup consuming")))
        // The tail starts on a random node: started again until it shares cleanup's, so that both move.
        var tail: ExecutablesTests.Child?
        for _ in 0..<40 where tail == nil {
            let child = try ExecutablesTests.Child(
                "apns-worker", ["dead-tokens", "tail", "--count", "1", "--timeout", "120"],
                environment: environment)
            let watching = try #require(child.waitForLine(containing: "amqp.url="), "the tail watches")
            if try Cluster.node(inLogLine: watching) == node { tail = child } else { _ = child.stop(SIGKILL) }
        }
        let watcher = try #require(tail, "a tail on node \(node)")
        defer { _ = watcher.stop(SIGKILL) }

        try Cluster.stop(node)
        defer { try? Cluster.start(node) }
        let consuming = try #require(cleanup.waitForLine(containing: "cleanup consuming", timeout: 60))
        #expect(try Cluster.node(inLogLine: consuming) != node, "cleanup moved: \(consuming)")
        let watching = try #require(watcher.waitForLine(containing: "watching amqp", timeout: 60))
        #expect(try Cluster.node(inLogLine: watching) != node, "the tail moved: \(watching)")

        let publisher = try AMQPConnection(url: Cluster.url(Cluster.other(than: node)))
        defer { publisher.close() }
        let event =
            #"{"token": "\#(token)", "user": "\#(user)", "topic": "com.example.app", "environment": "production", "status": 410, "reason": "Unregistered", "timestamp": \#(Int64(Date().timeIntervalSince1970 * 1000)), "job_id": "cluster"}"#
        try publisher.publish(to: deadTokens, exchange: deadTokens, body: Array(event.utf8))
        let shown = try #require(
            watcher.waitForLine(containing: "Unregistered", timeout: 60), "the tail shows the event")
        #expect(shown.contains("\"user\":\"\(user)\""))
        let removed = try TestServices.waitUntil(timeout: 30) {
            try redis.command(["HEXISTS", RedisKeys.node.tokens(user), token]).integer == 0
        }
        #expect(removed, "cleanup applied the event after moving")
        print(
            "failover | cluster: cleanup and dead-tokens tail on the stopped node, then a dead-token event | 1 | "
                + "\(removed ? 1 : 0) | 0 | -")
        try Cluster.start(node)
    }

    /// A job that makes the worker exit is delivered again and again (to each worker that takes it): after
    /// WORKER_MAX_DELIVERIES deliveries, counted by the quorum queue, the next worker parks it on the failed queue
    /// with the reason, and the other jobs are all delivered.
    @Test func aPoisonJobIsParkedAfterItsDeliveries() throws {
        try PoisonJobTests.poisonJobIsParked(amqpURL: try Cluster.urls().joined(separator: ","), queueType: "quorum")
    }
}
