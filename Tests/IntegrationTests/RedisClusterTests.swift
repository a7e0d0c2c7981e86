import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// The three-master Redis Cluster that scripts/test starts (scripts/lib/redis-cluster.sh): where it is, and moving a
/// slot between its masters the way `redis-cli --cluster reshard` does.
enum RedisClusterSetup {
    static func nodes() throws -> String { try TestServices.value("CLUSTER_REDIS_NODES") }

    static func client() throws -> RedisCluster {
        try RedisCluster(RedisClusterNodes(seeds: try RedisAddress.list(nodes())))
    }

    /// The programs' settings for it.
    static func environment() throws -> [String: String] {
        ["REDIS_CLUSTER_NODES": try nodes(), "REDIS_URL": "redis://"]
    }

    static func connection(_ address: RedisAddress) throws -> RedisConnection {
        try RedisConnection(url: RedisURL(host: address.host, port: address.port))
    }

    /// `count` users (unique to this run) whose keys hash into `slots`.
    static func users(_ prefix: String, count: Int, in slots: ClosedRange<Int>) -> [String] {
        let base = TestServices.unique(prefix)
        var users: [String] = []
        var index = 0
        while users.count < count {
            let user = "\(base)-\(index)"
            if slots.contains(RedisCluster.slot(of: user)) { users.append(user) }
            index += 1
        }
        return users
    }

    /// Moves slots between masters the way `redis-cli --cluster reshard` does, over connections it keeps (a move
    /// is a dozen commands on three nodes).
    final class SlotMover {
        private var connections: [RedisAddress: RedisConnection] = [:]
        private var ids: [RedisAddress: String] = [:]
        let masters: [RedisAddress]

        init() throws { masters = try RedisAddress.list(RedisClusterSetup.nodes()) }

        func connection(_ address: RedisAddress) throws -> RedisConnection {
            if let open = connections[address] { return open }
            let opened = try RedisClusterSetup.connection(address)
            connections[address] = opened
            return opened
        }

        func id(_ address: RedisAddress) throws -> String {
            if let known = ids[address] { return known }
            let id = try #require(try connection(address).command(["CLUSTER", "MYID"]).text)
            ids[address] = id
            return id
        }

        /// Starts moving `slot` from `source` to `target` (IMPORTING there, MIGRATING at the source) and migrates
        /// the first `keys` of its keys (all: nil).
        func begin(_ slot: Int, from source: RedisAddress, to target: RedisAddress, keys: Int? = nil) throws {
            RedisClusterSetup.expectOK(
                try connection(target).command(["CLUSTER", "SETSLOT", String(slot), "IMPORTING", try id(source)]))
            RedisClusterSetup.expectOK(
                try connection(source).command(["CLUSTER", "SETSLOT", String(slot), "MIGRATING", try id(target)]))
            try migrate(slot, from: source, to: target, keys: keys)
        }

        /// Migrates keys of `slot` still at `source` to `target`.
        func migrate(_ slot: Int, from source: RedisAddress, to target: RedisAddress, keys: Int? = nil) throws {
            let from = try connection(source)
            let names = try from.command(["CLUSTER", "GETKEYSINSLOT", String(slot), "100000"]).elements.compactMap(
                \.text)
            let moving = keys.map { Array(names.prefix($0)) } ?? names
            guard !moving.isEmpty else { return }
            RedisClusterSetup.expectOK(
                try from.command(["MIGRATE", target.host, String(target.port), "", "0", "5000", "KEYS"] + moving))
        }

        /// Ends a move: every master learns that `target` serves `slot`.
        func finish(_ slot: Int, to target: RedisAddress) throws {
            RedisClusterSetup.expectOK(
                try connection(target).command(["CLUSTER", "SETSLOT", String(slot), "NODE", try id(target)]))
            for master in masters where master != target {
                RedisClusterSetup.expectOK(
                    try connection(master).command(["CLUSTER", "SETSLOT", String(slot), "NODE", try id(target)]))
            }
        }

        /// The whole move of `slot`, keys and all.
        func move(_ slot: Int, from source: RedisAddress, to target: RedisAddress) throws {
            try begin(slot, from: source, to: target, keys: 1)
            try migrate(slot, from: source, to: target)
            try finish(slot, to: target)
        }
    }

    static func expectOK(_ reply: RedisReply, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(reply == .status("OK"), "\(reply)", sourceLocation: sourceLocation)
    }
}

/// The worker, cleanup and `tokens` on a three-master Redis Cluster: one user's keys in one slot, the cache spread over
/// every master, a pipeline split by node, MOVED and ASK followed while slots move under a running worker. Serialized:
/// a test moves slots, and the sweep covers the whole cluster.
@Suite(.serialized) struct RedisClusterTests {
    let logger = Logger(label: "redis-cluster", level: .critical)

    /// Registrations, resolution, a token moving between accounts and removals, through the cluster client: the cache
    /// lands on every master and a batch of users resolves in one call.
    @Test func theCacheSpreadsOverEveryMasterWithOneUsersKeysTogether() throws {
        let cluster = try RedisClusterSetup.client()
        let cache = TokenCache(redis: cluster, logger: logger)
        let users = (0..<300).map { TestServices.unique("spread-\($0)") }
        let tokens = users.indices.map { String(format: "%064x", 0xC1_0000 + $0) }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let applied = try cache.register(
            zip(users, tokens).map {
                TokenRegistration(user: $0, token: $1, scope: TokenScope(environment: .production), registeredAt: now)
            })
        #expect(applied.allSatisfy { $0 == .applied })
        let resolved = try cache.resolve(users)
        #expect(
            users.indices.allSatisfy { resolved.tokens[users[$0]]?.map(\.token) == [tokens[$0]] },
            "every user resolved in one call across the masters")
        #expect(cluster.masterAddresses.count == 3)
        for master in cluster.masterAddresses {
            let node = try RedisClusterSetup.connection(master)
            let replies = try node.pipeline(
                users.flatMap {
                    [["EXISTS", RedisKeys.cluster.tokens($0)], ["EXISTS", RedisKeys.cluster.registered($0)]]
                })
            let held = stride(from: 0, to: replies.count, by: 2).filter { replies[$0] == .integer(1) }
            #expect(!held.isEmpty, "master \(master) holds some of the users")
            #expect(
                held.allSatisfy { replies[$0 + 1] == .integer(1) },
                "and each such user's registered key beside the tokens")
        }

        // A device changes accounts: it leaves the first user, and its owner key names the second.
        let newOwner = TestServices.unique("spread-new-owner")
        #expect(
            try cache.register([
                TokenRegistration(
                    user: newOwner, token: tokens[0],
                    scope: TokenScope(environment: .production), registeredAt: now + 1)
            ])
                == [.applied])
        #expect(try cache.resolve([users[0]]).tokens[users[0]] == [])
        #expect(try cluster.command(["GET", RedisKeys.cluster.owner(tokens[0])]).text == newOwner)
        // An older registration for the first user changes nothing.
        #expect(
            try cache.register([
                TokenRegistration(
                    user: users[0], token: tokens[0],
                    scope: TokenScope(environment: .production), registeredAt: now)
            ])
                == [.unchanged])
        #expect(try cache.resolve([newOwner]).tokens[newOwner]?.map(\.token) == [tokens[0]])

        // Removals: by user, and for a token sent directly, through its owner; the owner keys go with them.
        let removed = try cache.remove([
            TokenRemoval(user: users[1], token: tokens[1]),
            TokenRemoval(user: "", token: tokens[0])
        ])
        #expect(removed == [.applied, .applied])
        let afterRemoval = try cache.resolve([users[1], newOwner])
        #expect([users[1], newOwner].allSatisfy { afterRemoval.tokens[$0]?.isEmpty == true })
        #expect(
            try cluster.pipeline([
                ["EXISTS", RedisKeys.cluster.owner(tokens[0])],
                ["EXISTS", RedisKeys.cluster.owner(tokens[1])]
            ]) == [.integer(0), .integer(0)])
        // A multi-key DEL over several masters is split by slot and its counts summed.
        #expect(try cluster.command(["DEL"] + users[2..<12].map { RedisKeys.cluster.tokens($0) }) == .integer(10))
    }

    /// A slot in the middle of a move answers ASK for the keys already moved; once moved, the old node answers MOVED.
    /// A pipeline over both follows each, and the map is learned again.
    @Test func askAndMovedAreFollowed() throws {
        let cluster = try RedisClusterSetup.client()
        let cache = TokenCache(redis: cluster, logger: logger)
        let slot = RedisCluster.slot(of: TestServices.unique("ask"))
        let users = RedisClusterSetup.users("ask", count: 6, in: slot...slot)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        _ = try cache.register(
            users.enumerated().map {
                TokenRegistration(
                    user: $1, token: String(format: "%064x", 0xA5_0000 + $0),
                    scope: TokenScope(environment: .production), registeredAt: now)
            })
        let source = try #require(cluster.master(ofSlot: slot))
        let target = try #require(cluster.masterAddresses.first { $0 != source })

        let mover = try RedisClusterSetup.SlotMover()
        try mover.begin(slot, from: source, to: target, keys: 6)  // some users' keys moved, not all
        let midway = try cache.resolve(users)
        #expect(users.allSatisfy { midway.tokens[$0]?.count == 1 }, "every user found midway: \(midway.tokens)")
        #expect(cluster.redirectionsFollowed > 0, "ASK followed")

        try mover.migrate(slot, from: source, to: target)
        try mover.finish(slot, to: target)
        let asked = cluster.redirectionsFollowed
        let after = try cache.resolve(users)
        #expect(users.allSatisfy { after.tokens[$0]?.count == 1 }, "every user found after the move")
        #expect(cluster.redirectionsFollowed > asked, "MOVED followed")
        #expect(cluster.master(ofSlot: slot) == target, "the map was learned again")
        let settled = cluster.redirectionsFollowed
        _ = try cache.resolve(users)
        #expect(cluster.redirectionsFollowed == settled, "no redirection once the map is known")

        try mover.move(slot, from: target, to: source)
    }

    /// The worker on the cluster: fan-out jobs over users on every master, a dead token removed and its event
    /// published, the rate limit and the fleet statistics in the cluster, while slots holding a quarter of the users
    /// move to another master. Nothing is lost.
    @Test func aWorkerDeliversWhileSlotsMove() throws {
        let slots = 0...63  // all the first master's (redis-cli --cluster create gives it 0-5460)
        let movingUsers = RedisClusterSetup.users("moving", count: 200, in: slots)
        let otherUsers = (0..<600).map { TestServices.unique("staying-\($0)") }
        let users = movingUsers + otherUsers
        let tokens = users.indices.map { String(format: "%064x", 0xC2_0000 + $0) }
        let deadToken = tokens[7]
        let cluster = try RedisClusterSetup.client()
        _ = try cluster.pipeline(zip(users, tokens).map { ["HSET", RedisKeys.cluster.tokens($0), $1, "production"] })

        let deliveries = ClusterTests.Deliveries(target: tokens.count - 1)
        var configuration = APNsSimulator.Configuration(unregisteredTokens: [deadToken: 1_732_900_000_123])
        configuration.observer = { deliveries.observe($0) }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let dead = TestServices.unique("dead")
        let deadReader = try QueueReader(dead)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    // Four seconds of delivery: the moves land mid-run.
                    "PUSH_DEAD_TOKENS_QUEUE": dead, "APNS_RATE_LIMIT": "200"
                ]
            ).merging(try RedisClusterSetup.environment()) { $1 }, logger: logger)
        defer { worker.stop() }

        // One job per 20 users, taken a stride apart so that most jobs touch moving and staying users alike.
        let jobCount = users.count / 20
        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for job in 0..<jobCount {
            let members = stride(from: job, to: users.count, by: jobCount).map { "\"\(users[$0])\"" }
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-\#(job)", "users": [\#(members.joined(separator: ","))], "payload": {"aps": {}}}"#
                        .utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)

        // Move the slots (and their keys) while the jobs go through: the first few under way, the rest after.
        try #require(deliveries.wait(for: 40, timeout: 60), "delivery under way")
        let source = try #require(cluster.master(ofSlot: slots.lowerBound))
        let target = try #require(cluster.masterAddresses.first { $0 != source })
        let movedSlots = Set(movingUsers.map(RedisCluster.slot(of:))).sorted()
        let movingFrom = Date()
        let mover = try RedisClusterSetup.SlotMover()
        for slot in movedSlots { try mover.move(slot, from: source, to: target) }
        // The worker's map was out of date for the rest of the jobs: it followed MOVED (and ASK, for a slot caught
        // half moved) to deliver them.
        let deliveredWhenMoved = deliveries.distinct
        #expect(
            deliveredWhenMoved < tokens.count - 1,
            "the slots moved while jobs were still going through (\(deliveredWhenMoved) delivered by then)")

        #expect(
            deliveries.wait(for: tokens.count - 1, timeout: 120),
            "\(deliveries.distinct) of \(tokens.count - 1) delivered (and one dead)")
        let summaries = try replyReader.read(jobCount, timeout: 60)
        #expect(summaries.count == jobCount, "a summary per job")
        let events = try deadReader.read(1)
        #expect(events.count == 1, "the dead token's event")
        worker.stop()

        #expect(
            try cluster.command(["HEXISTS", RedisKeys.cluster.tokens(users[7]), deadToken]).integer == 0,
            "the dead token left its user's entry")
        #expect(try cluster.command(["HLEN", RedisKeys.cluster.tokens(users[8])]).integer == 1)
        let now = try RedisClusterSetup.client()
        #expect(movedSlots.allSatisfy { now.master(ofSlot: $0) == target }, "the slots moved")
        let statistics = try SharedStatistics(redis: cluster).read(minutes: 2)
        #expect(
            (statistics.totals["delivered"] ?? 0) >= tokens.count - 1,
            "the fleet statistics are in the cluster: \(statistics.totals)")
        #expect(!statistics.workers.isEmpty)
        let received = simulator.received()
        let duplicates =
            received.filter { $0.status == 200 }.count
            - Set(received.filter { $0.status == 200 }.map(\.deviceToken)).count
        #expect(duplicates == 0, "nothing sent twice")
        let scenario = "redis cluster: the slots of a quarter of the users moved to another master mid-run"
        TestServices.reportFault(
            scenario, notifications: tokens.count - 1, received: received.filter { $0.deviceToken != deadToken })
        print(
            String(
                format: "failover | %@ | %d | %d | %d | %.1f", scenario, tokens.count - 1, deliveries.distinct,
                duplicates,
                deliveries.longestPause(after: movingFrom)))

        // Back where they were, for whatever runs next.
        for slot in movedSlots { try mover.move(slot, from: target, to: source) }
    }

    /// Registrations, logouts and dead-token events through `cleanup`, and the sweep over every master.
    @Test func cleanupAppliesEventsAndSweepsEveryMaster() throws {
        let cluster = try RedisClusterSetup.client()
        try OperationsTests.checkTokenLifecycle(redis: cluster, settings: try RedisClusterSetup.environment())

        let cache = TokenCache(redis: cluster, logger: logger)
        let users = (0..<60).map { TestServices.unique("swept-\($0)") }
        let longAgo = Int64(Date().timeIntervalSince1970 * 1000) - 100 * 86_400_000
        _ = try cache.register(
            users.enumerated().map {
                TokenRegistration(
                    user: $1, token: String(format: "%064x", 0x5E_E000 + $0),
                    scope: TokenScope(environment: .production), registeredAt: longAgo)
            })
        let mastersHolding = Set(users.map { cluster.master(ofSlot: RedisCluster.slot(of: $0)) })
        #expect(mastersHolding.count == 3, "the swept users are on every master")
        let swept = try cache.sweep(registeredBefore: longAgo + 1)
        #expect(swept == users.count)
        let resolved = try cache.resolve(users)
        #expect(users.allSatisfy { resolved.tokens[$0]?.isEmpty == true })
        #expect(
            try cluster.command(["EXISTS", RedisKeys.cluster.owner(String(format: "%064x", 0x5E_E000))]).integer == 0)
    }

    @Test func tokensImportWritesTheClustersKeys() throws {
        let cluster = try RedisClusterSetup.client()
        try OperationsTests.checkTokensImport(redis: cluster, settings: try RedisClusterSetup.environment())

        // `tokens keys` says where a user's keys live.
        let user = TestServices.unique("where-{is}")
        let shown = try OperationsTests.apnsWorker(
            ["tokens", "keys", user], environment: try RedisClusterSetup.environment())
        let slot = RedisCluster.slot(of: RedisKeys.cluster.tokens(user))
        let master = try #require(cluster.master(ofSlot: slot))
        #expect(
            shown.status == 0 && shown.output.contains("\(RedisKeys.cluster.tokens(user))  slot \(slot) on \(master)")
                && shown.output.contains(RedisKeys.cluster.registered(user)), "\(shown.output)\(shown.errors)")
    }

    /// `tokens migrate` copies a single node's cache into the cluster: tokens, registration times, devices, owners and
    /// time zones in the cluster's key form; a newer registration already in the cluster is kept; a token the source
    /// holds in upper case arrives in lower case, its owner key too; a second run writes nothing.
    @Test func tokensMigrateCopiesASingleNodesCache() throws {
        let (sourceURL, source) = try TestServices.isolatedRedis(.migrationSource)
        let first = TestServices.unique("migrated-{a}")
        let second = TestServices.unique("migrated-b")
        let base = String(UInt64.random(in: 1...UInt64.max), radix: 16)
        func token(_ byte: String) -> String { String((String(repeating: byte, count: 32) + base).suffix(64)) }
        _ = try source.pipeline([
            [
                "HSET", RedisKeys.node.tokens(first), token("d1"), "production", token("d2"),
                "sandbox:com.example.app.voip"
            ],
            ["HSET", RedisKeys.node.registered(first), token("d1"), "1000", token("d2"), "2000"],
            ["HSET", RedisKeys.node.devices(first), token("d1"), #"{"model": "iPhone15,2"}"#],
            ["SET", RedisKeys.node.owner(token("d1")), first],
            ["SET", RedisKeys.node.timeZone(first), "Europe/Paris"],
            ["HSET", RedisKeys.node.tokens(second), token("d3").uppercased(), "production"]
        ])
        let cluster = try RedisClusterSetup.client()
        let cache = TokenCache(redis: cluster, logger: logger)
        // The device moved to another account after the copy was taken: the cluster's newer registration stays.
        let mover = TestServices.unique("migrated-mover")
        _ = try cache.register([
            TokenRegistration(
                user: mover, token: token("d2"),
                scope: TokenScope(environment: .production), registeredAt: 5000)
        ])

        let migrated = try OperationsTests.apnsWorker(
            ["tokens", "migrate", "--from", sourceURL],
            environment: try RedisClusterSetup.environment())
        #expect(migrated.status == 0, "\(migrated.errors)")
        #expect(
            migrated.output.contains("migrated 2 users")
                && migrated.output.contains("3 tokens read, 2 written, 1 kept"),
            "\(migrated.output)")
        let entries = try cache.entries(forUser: first)
        #expect(entries.map(\.token) == [token("d1")], "d2 belongs to the mover now")
        #expect(entries.first?.registeredAt == 1000 && entries.first?.deviceJSON == #"{"model": "iPhone15,2"}"#)
        #expect(try cache.entries(forUser: second).map(\.token) == [token("d3")])
        #expect(try cache.entries(forUser: second).first?.registeredAt == nil, "an unknown age stays unknown")
        #expect(try cluster.command(["GET", RedisKeys.cluster.owner(token("d3"))]).text == second, "in lower case")
        #expect(try cluster.command(["GET", RedisKeys.cluster.owner(token("d1"))]).text == first)
        #expect(try cluster.command(["EXISTS", RedisKeys.cluster.tokens(first)]).integer == 1, "the cluster's key form")
        #expect(
            try cluster.command(["GET", RedisKeys.cluster.timeZone(first)]).text == "Europe/Paris",
            "the user's time zone")

        let again = try OperationsTests.apnsWorker(
            ["tokens", "migrate", "--from", sourceURL],
            environment: try RedisClusterSetup.environment())
        #expect(again.status == 0 && again.output.contains("3 tokens read, 0 written, 3 kept"), "\(again.output)")
        #expect(
            try OperationsTests.apnsWorker(
                ["tokens", "migrate", "--from", "http://x"],
                environment: try RedisClusterSetup.environment()
            ).status == 2)
    }

    /// The rate limit's slots and the guard's window on the cluster; delivery counts and the idempotency record
    /// spread over it (keys of jobs and messages carry no hash tag).
    @Test func sharedCountersWorkOnTheCluster() throws {
        let cluster = try RedisClusterSetup.client()
        let limiter = SharedRateLimit(redis: cluster, limit: 100, urgentShare: 0)
        guard case .granted(let urgent, let bulk, _) = try limiter.reserve(urgent: 1_000, bulk: 0) else {
            Issue.record("the rate limit script was refused on the cluster")
            return
        }
        #expect(urgent + bulk <= 10, "a tenth of the limit per slot: \(urgent)")
        let window = try SharedInvalidationWindow(redis: cluster).add(InvalidationCounts(mismatches: 1, judged: 2))
        guard case .answered(let fleetWide) = window else {
            Issue.record("the guard's window was not answered on the cluster: \(window)")
            return
        }
        #expect(
            fleetWide.lastMinute.mismatches >= 1 && fleetWide.lastMinute.judged >= 2
                && fleetWide.lastHour.mismatches >= 1 && fleetWide.lastHour.judged >= 2,
            "both windows hold what was added: \(fleetWide)")

        let record = SentRecord(redis: cluster)
        let messages = (0..<30).map { TestServices.unique("poison-\($0)") }
        _ = try record.countRedeliveries(of: messages)
        let counted = try record.countRedeliveries(of: messages)
        #expect(messages.allSatisfy { counted.counts[$0] == 2 }, "\(counted)")
        let masters = Set(
            messages.map { cluster.master(ofSlot: RedisCluster.slot(of: RedisKeys.cluster.deliveries($0))) })
        #expect(masters.count > 1, "delivery counts spread over the masters")
        try record.gaveBack([messages[0]])
        #expect(try record.givenBack(messages) == [messages[0]: 1])
        for message in messages { try record.forget(message) }
        #expect(try record.countRedeliveries(of: [messages[0]]).counts[messages[0]] == 1, "forgotten, across slots")
    }
}
