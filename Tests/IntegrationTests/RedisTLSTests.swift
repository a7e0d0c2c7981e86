import AMQP
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing

/// rediss:// against the Redis that scripts/lib/services.sh starts with TLS only (the test CA, a server certificate
/// for localhost and 127.0.0.1, client certificates required).
@Suite struct RedisTLSTests {
    static func settings() throws -> [String: String] {
        [
            "REDIS_URL": try TestServices.value("TLS_REDIS_URL"),
            "REDIS_CA_FILE": try TestServices.value("TLS_REDIS_CA"),
            "REDIS_CERT_FILE": try TestServices.value("TLS_REDIS_CERT"),
            "REDIS_CERT_KEY_FILE": try TestServices.value("TLS_REDIS_KEY")
        ]
    }

    static func connection() throws -> RedisConnection {
        var url = try RedisURL(try TestServices.value("TLS_REDIS_URL"))
        url.tls = RedisTLS(
            caFile: try TestServices.value("TLS_REDIS_CA"), certificateFile: try TestServices.value("TLS_REDIS_CERT"),
            keyFile: try TestServices.value("TLS_REDIS_KEY"))
        return try RedisConnection(url: url)
    }

    /// The cache read and written over TLS, by `tokens` and by the client directly; large pipelines cross many TLS
    /// records.
    @Test func tokensAndPipelinesWorkOverTLS() throws {
        let user = TestServices.unique("tls-user")
        let token = String(repeating: "7e", count: 32)
        let added = try OperationsTests.apnsWorker(["tokens", "add", user, token], environment: try Self.settings())
        #expect(added.status == 0, "\(added.errors)")
        let redis = try Self.connection()
        #expect(try redis.command(["HGET", RedisKeys.node.tokens(user), token]).text == "production")
        let key = TestServices.unique("tls-big")
        let value = String(repeating: "x", count: 100_000)
        let replies = try redis.pipeline((0..<200).map { ["HSET", key, "field-\($0)", value] } + [["HLEN", key]])
        #expect(replies.last == .integer(200))
        let all = try redis.command(["HGETALL", key])
        #expect(all.elements.count == 400 && all.elements[1].text?.count == 100_000, "20 MB back in one reply")
        _ = try redis.command(["DEL", key])
    }

    /// A Redis Cluster that speaks TLS only (scripts/lib/redis-cluster.sh): the slot map, routing and a pipeline over
    /// every master, through `rediss://` connections.
    @Test func aClusterOverTLS() throws {
        let environment = [
            "REDIS_CLUSTER_NODES": try TestServices.value("CLUSTER_REDIS_TLS_NODES"), "REDIS_URL": "rediss://",
            "REDIS_CA_FILE": try TestServices.value("TLS_REDIS_CA")
        ]
        let user = TestServices.unique("tls-cluster")
        let token = String(repeating: "7c", count: 32)
        let added = try OperationsTests.apnsWorker(["tokens", "add", user, token], environment: environment)
        #expect(added.status == 0, "\(added.errors)")
        let listed = try OperationsTests.apnsWorker(["tokens", "list", user, "--full-tokens"], environment: environment)
        #expect(listed.output.contains(token), "\(listed.output)\(listed.errors)")

        let cluster = try RedisCluster(
            RedisClusterNodes(
                seeds: try RedisAddress.list(try TestServices.value("CLUSTER_REDIS_TLS_NODES")),
                dataNodes: RedisURL(tls: RedisTLS(caFile: try TestServices.value("TLS_REDIS_CA")))))
        #expect(cluster.masterAddresses.count == 3)
        let users = (0..<60).map { TestServices.unique("tls-spread-\($0)") }
        _ = try cluster.pipeline(users.map { ["HSET", RedisKeys.cluster.tokens($0), token, "production"] })
        let resolved = try TokenCache(redis: cluster, logger: Logger(label: "tls", level: .critical)).resolve(users)
        #expect(
            users.allSatisfy { resolved.tokens[$0]?.map(\.token) == [token] }, "every user, over TLS to every master")
        #expect(
            Set(users.compactMap { cluster.master(ofSlot: RedisCluster.slot(of: RedisKeys.cluster.tokens($0))) }).count
                == 3)
    }

    /// What TLS refuses is a setting to fix: exit 78 naming it, never a hang or a retry loop.
    @Test func aServerTheCADoesNotVouchForOrAMissingClientCertificateStopsStartUp() throws {
        var settings = try Self.settings()
        settings["REDIS_CA_FILE"] = nil
        let untrusted = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: settings)
        #expect(
            untrusted.status == 78 && untrusted.errors.contains("REDIS_CA_FILE")
                && untrusted.errors.contains("certificate verify failed"), "\(untrusted.errors)")

        settings = try Self.settings()
        settings["REDIS_CERT_FILE"] = nil
        settings["REDIS_CERT_KEY_FILE"] = nil
        let anonymous = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: settings)
        #expect(anonymous.status == 78 && anonymous.errors.contains("REDIS_CERT_FILE"), "\(anonymous.errors)")

        // A certificate or key file that is no PEM is named by its own setting.
        let garbage = try TestServices.temporaryFile("not-pem", contents: "not a certificate\n")
        for key in ["REDIS_CERT_FILE", "REDIS_CERT_KEY_FILE"] {
            settings = try Self.settings()
            settings[key] = garbage
            let unreadable = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: settings)
            #expect(
                unreadable.status == 78 && unreadable.errors.contains("\(key):") && unreadable.errors.contains(garbage),
                "\(key): \(unreadable.errors)")
        }

        settings = try Self.settings()
        settings["REDIS_URL"] = settings["REDIS_URL"]!.replacingOccurrences(of: "rediss://", with: "redis://")
        let plain = try OperationsTests.apnsWorker(["tokens", "list", "someone"], environment: settings)
        #expect(plain.status == 78 && plain.errors.contains("not rediss://"), "\(plain.errors)")
    }

    /// A worker whose token cache, rate limit and idempotency record are behind TLS delivers its jobs.
    @Test func aWorkerDeliversWithRedisOverTLS() throws {
        let redis = try Self.connection()
        let users = (0..<50).map { TestServices.unique("tls-\($0)") }
        let tokens = users.indices.map { String(format: "%064x", 0x7E5_0000 + $0) }
        _ = try redis.pipeline(zip(users, tokens).map { ["HSET", RedisKeys.node.tokens($0), $1, "production"] })
        let logger = Logger(label: "tls", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_RATE_LIMIT": "1000"
                ]
            ).merging(try Self.settings()) { $1 }, logger: logger)
        defer { worker.stop() }
        for (index, user) in users.enumerated() {
            try publisher.publish(
                to: jobs,
                body: Array(#"{"id": "\#(jobs)-\#(index)", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        let summaries = try replyReader.read(users.count, timeout: 60)
        #expect(summaries.count == users.count)
        #expect(Set(simulator.received().filter { $0.status == 200 }.map(\.deviceToken)) == Set(tokens))
    }
}
