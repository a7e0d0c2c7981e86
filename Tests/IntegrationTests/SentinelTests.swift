import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The Redis with Sentinel that scripts/test starts for this suite (scripts/lib/sentinel.sh: a master, a replica and
/// three sentinels watching them as one master): where it is, and which node is the master now. A test kills the
/// master, so the suite runs alone, one test at a time.
enum Sentinel {
    static func nodes() throws -> String { try TestServices.value("SENTINEL_NODES") }
    static func masterName() throws -> String { try TestServices.value("SENTINEL_MASTER_NAME") }
    static func directory() throws -> String { try TestServices.value("SENTINEL_DIR") }

    static func deployment() throws -> RedisDeployment {
        .sentinel(RedisSentinels(sentinels: try RedisAddress.list(nodes()), masterName: try masterName()))
    }

    /// The programs' settings for it: the sentinels, the master's name, and REDIS_URL with the database only.
    static func environment() throws -> [String: String] {
        ["REDIS_SENTINELS": try nodes(), "REDIS_MASTER_NAME": try masterName(), "REDIS_URL": "redis:///0"]
    }

    /// One sentinel's connection.
    static func sentinel() throws -> RedisConnection {
        let first = try #require(try RedisAddress.list(nodes()).first)
        return try RedisConnection(url: RedisURL(host: first.host, port: first.port))
    }

    /// The master's port, as the sentinels say now.
    static func masterPort() throws -> Int {
        let reply = try sentinel().command(["SENTINEL", "get-master-addr-by-name", try masterName()])
        return try #require(reply.elements.last?.text.flatMap { Int($0) }, "the sentinels name a master: \(reply)")
    }

    /// The ports of the replicas the sentinels know and see up.
    static func replicaPorts() throws -> [Int] {
        try sentinel().command(["SENTINEL", "replicas", try masterName()]).elements.compactMap { replica in
            let fields = replica.elements.compactMap(\.text)
            let pairs = Dictionary(stride(from: 0, to: fields.count - 1, by: 2).map { (fields[$0], fields[$0 + 1]) }) {
                $1
            }
            guard let flags = pairs["flags"], !flags.contains("down") else { return nil }
            return pairs["port"].flatMap { Int($0) }
        }
    }

    /// The process id of the data node on `port`.
    static func pid(ofNodeOn port: Int) throws -> pid_t {
        let text = try String(contentsOfFile: try directory() + "/node-\(port).pid", encoding: .utf8)
        return try #require(pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)))
    }
}

@Suite(.serialized) struct SentinelTests {
    static let jobCount = 3_000
    static let prefetch = 200

    /// `tokens` and `stats` ask the sentinels where the master is, and what they write is on the master.
    @Test func everyProgramFindsTheMasterThroughTheSentinels() throws {
        let environment = try Sentinel.environment()
        let user = TestServices.unique("sentinel-user")
        let token = String(repeating: "5e", count: 32)
        let added = try OperationsTests.apnsWorker(["tokens", "add", user, token], environment: environment)
        #expect(added.status == 0, "\(added.errors)")
        let master = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: Sentinel.masterPort()))
        #expect(
            try master.command(["HGET", RedisKeys.node.tokens(user), token]).text == "production",
            "the token is on the master the sentinels name")
        let listed = try OperationsTests.apnsWorker(["tokens", "list", user, "--full-tokens"], environment: environment)
        #expect(listed.status == 0 && listed.output.contains(token), "\(listed.output)\(listed.errors)")
        let stats = try OperationsTests.apnsWorker(["stats"], environment: environment)
        #expect(stats.status == 0, "\(stats.errors)")
        let connection = try Sentinel.deployment().connect()
        #expect(
            try (connection as? RedisConnection)?.role() == "master",
            "a Sentinel deployment connects to one node, the master")
    }

    /// What waiting cannot cure stops a program at once (exit 78) with the key to fix.
    @Test func aMasterNameNoSentinelKnowsOrASecondRedisStopsStartUp() throws {
        var environment = try Sentinel.environment()
        environment["REDIS_MASTER_NAME"] = "no-such-master"
        let unknown = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: environment)
        #expect(unknown.status == 78, "\(unknown.errors)")
        #expect(
            unknown.errors.contains("REDIS_MASTER_NAME") && unknown.errors.contains("no-such-master"),
            "\(unknown.errors)")

        environment = try Sentinel.environment()
        environment["REDIS_URL"] = try TestServices.value("REDIS_URL")
        let twice = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: environment)
        #expect(twice.status == 78, "\(twice.errors)")
        #expect(twice.errors.contains("REDIS_URL") && twice.errors.contains("REDIS_SENTINELS"), "\(twice.errors)")
    }

    /// A node that became a replica answers writes with READONLY: the connection counts as lost, so that its owner
    /// connects again and asks the sentinels where the master is now.
    @Test func aReplicasReadOnlyAnswerIsALostConnection() throws {
        let port = try #require(try Sentinel.replicaPorts().first, "the setup has a replica")
        let replica = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: port))
        #expect(try replica.role() == "slave")
        do {
            _ = try replica.command(["SET", TestServices.unique("sentinel-write"), "1"])
            Issue.record("a write to a replica did not fail")
        } catch {
            #expect(error.kind == .connectionLost && error.message.contains("READONLY"), "\(error)")
        }
    }

    /// One-user jobs (the token cache, the rate limit and the idempotency record all in Redis) through a worker
    /// process that knows only the sentinels; the master is killed (SIGKILL, no polite failover) once a fifth is
    /// delivered. The sentinels promote the replica, the worker finds it without a restart, and every notification
    /// is delivered; duplicates are bounded by the jobs in flight. The killed node comes back as a replica.
    /// A split brain: the node a connection is on answers, but the sentinels name another as the master (they
    /// promoted a replica while it was cut off from them). The readiness probe, every second, finds it out: the
    /// session ends and reconnecting asks the sentinels again. On the node they name, the probe passes.
    @Test func aConnectionOnANodeTheSentinelsNoLongerNameIsFoundOutByTheProbe() throws {
        let deployment = try Sentinel.deployment()
        let master = try Sentinel.masterPort()
        let onMaster = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: master))
        try RedisProbe(onMaster, deployment: deployment).probe()
        let replica = try #require(try Sentinel.replicaPorts().first)
        let elsewhere = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: replica))
        do {
            try RedisProbe(elsewhere, deployment: deployment).probe()
            Issue.record("a connection on a node the sentinels do not name passed the probe")
        } catch let error as RedisError {
            #expect(error.kind == .connectionLost)
            #expect(error.message.contains("the sentinels name 127.0.0.1:\(master) as the master"), "\(error.message)")
        }
    }

    @Test func theMasterKilledMidRunLosesNothing() throws {
        let users = (0..<Self.jobCount).map { "sentinel-\($0)" }
        let tokens = (0..<Self.jobCount).map { String(format: "%064x", 0x5E_0000 + $0) }
        let master = try Sentinel.deployment().connect()
        for start in stride(from: 0, to: users.count, by: 1_000) {
            _ = try master.pipeline(
                (start..<start + 1_000).map {
                    ["HSET", RedisKeys.node.tokens(users[$0]), tokens[$0], "production"]
                })
        }
        // The cache is on the replica before the master dies (what a failover can lose is README's matter).
        #expect(try master.command(["WAIT", "1", "5000"]).integer == 1, "the replica has the cache")

        let logger = Logger(label: "sentinel", level: .critical)
        let deliveries = ClusterTests.Deliveries(target: tokens.count)
        var configuration = APNsSimulator.Configuration()
        configuration.observer = { deliveries.observe($0) }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("sentinel-jobs")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        defer { publisher.close() }
        _ = try publisher.declareQueue(jobs)
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "WORKER_PREFETCH": String(Self.prefetch), "APNS_RATE_LIMIT": "300", "LOG_FORMAT": "text",
                "LOG_LEVEL": "info"
            ]
        ).merging(try Sentinel.environment()) { $1 }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = worker.stop(SIGKILL) }
        try #require(worker.waitForLine(containing: "consuming") != nil, "the worker consumes")

        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for (index, user) in users.enumerated() {
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-\#(index)", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)

        try #require(deliveries.wait(for: Self.jobCount / 5, timeout: 60), "delivery under way")
        let oldMaster = try Sentinel.masterPort()
        let killedAt = Date()
        kill(try Sentinel.pid(ofNodeOn: oldMaster), SIGKILL)
        #expect(worker.waitForLine(containing: "reconnecting", timeout: 30) != nil, "the worker lost Redis")
        #expect(worker.waitForLine(containing: "consuming", timeout: 60) != nil, "and consumes again")
        #expect(
            deliveries.wait(for: Self.jobCount, timeout: 120), "\(deliveries.distinct) of \(Self.jobCount) delivered")
        let newMaster = try Sentinel.masterPort()
        #expect(newMaster != oldMaster, "the sentinels promoted the replica")
        #expect(worker.stop() == 0, "the worker stops cleanly")

        // The killed node comes back as the new master's replica, for whatever runs next: in the foreground, a child
        // left running (a daemonizing redis-server's parent exits before Process can see it go), stopped with the
        // rest of the setup through its pid file.
        let restart = Process()
        restart.executableURL = URL(fileURLWithPath: try Sentinel.directory() + "/start-node")
        restart.arguments = [String(oldMaster), "--replicaof", "127.0.0.1", String(newMaster), "--daemonize", "no"]
        restart.standardOutput = FileHandle.nullDevice
        restart.standardError = FileHandle.nullDevice
        try restart.run()
        // Up (and its pid file written) before the suite ends, so that the setup's stop finds it.
        let deadline = Date().addingTimeInterval(30)
        var back = false
        while !back && Date() < deadline {
            back = (try? RedisConnection(url: RedisURL(host: "127.0.0.1", port: oldMaster), timeout: 1).ping()) != nil
            if !back { usleep(100_000) }
        }
        #expect(back, "the killed node is back")

        let received = simulator.received().filter { $0.status == 200 }
        let duplicates = received.count - Set(received.map(\.deviceToken)).count
        #expect(duplicates <= Self.prefetch, "duplicates are bounded by the jobs in flight: \(duplicates)")
        let scenario = "sentinel: the Redis master killed (SIGKILL) mid-run, one-user jobs under APNS_RATE_LIMIT=300"
        TestServices.reportFault(scenario, notifications: Self.jobCount, received: simulator.received())
        let pause = deliveries.longestPause(after: killedAt)
        #expect(pause < 30, "delivery resumed: the longest pause was \(pause) s")
        print(
            String(
                format: "failover | %@ | %d | %d | %d | %.1f", scenario, Self.jobCount, deliveries.distinct,
                duplicates, pause))
    }
}
