import AMQP
import APNs
import Configuration
import Foundation
import HTTP2
import JSON
import Redis
import ServiceURLs
import Telemetry
import Testing
import WorkerPipeline

@Suite struct WorkerConfigurationTests {
    let keyFile: String

    init() throws {
        keyFile = NSTemporaryDirectory() + "config-test-\(UUID().uuidString).p8"
        try ES256Key.generatePrivateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
    }

    var minimal: [String: String] {
        ["APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "ABC123DEFG", "APNS_TEAM_ID": "TEAM123456"]
    }

    @Test func contractDefaults() throws {
        let configuration = try WorkerConfiguration.load(from: minimal)
        #expect(configuration.broker.nodes == AMQPNodes(AMQPURL()))
        #expect(configuration.redis == .node(RedisURL()))
        #expect(configuration.apns.production == .production)
        #expect(configuration.apns.sandbox == .sandbox)
        #expect(configuration.broker.queues.jobs == "push.jobs")
        #expect(configuration.broker.queues.deadTokens == "push.dead-tokens")
        #expect(configuration.broker.queues.failed == "push.failed")
        #expect(configuration.rateLimit == 0)
        #expect(configuration.apns.verifyPeer)
        #expect(configuration.broker.queues.deadTokensExchange == "push.dead-tokens", "named like the queue")
        let own = try WorkerConfiguration.load(
            from: minimal.merging(["PUSH_DEAD_TOKENS_QUEUE": "team-b.dead"]) { _, new in new })
        #expect(own.broker.queues.deadTokensExchange == "team-b.dead", "another queue, another exchange: no cross-talk")
        #expect(configuration.broker.queues.registrations == "push.registrations")
        #expect(configuration.cleanup.inactiveDays == 90 && configuration.cleanup.sweepInterval == 3600)
        #expect(configuration.metrics.port == 9464 && configuration.broker.prefetch == 500)
        #expect(configuration.broker.queues.bulk == "push.bulk" && configuration.broker.bulkPrefetch == 100)
        #expect(configuration.broker.queues.type == .classic && configuration.pipeline.maximumDeliveries == 5)
        let clustered = try WorkerConfiguration.load(
            from: minimal.merging([
                "PUSH_QUEUE_TYPE": "quorum",
                "WORKER_MAX_DELIVERIES": "2"
            ]) { $1 })
        #expect(clustered.broker.queues.type == .quorum && clustered.pipeline.maximumDeliveries == 2)
        #expect(clustered.pipeline.exitOnJobID == nil, "the test-only fault is off unless asked for")
        let nodes = "amqp://guest:guest@rabbit-1:5672/%2f,amqp://guest:guest@rabbit-2:5672/%2f"
        let cluster = try WorkerConfiguration.load(from: minimal.merging(["AMQP_URL": nodes]) { $1 })
        #expect(cluster.broker.queues.type == .quorum, "several nodes: quorum queues unless PUSH_QUEUE_TYPE says")
        let chosen = try WorkerConfiguration.load(
            from: minimal.merging(["AMQP_URL": nodes, "PUSH_QUEUE_TYPE": "classic"]) { $1 })
        #expect(chosen.broker.queues.type == .classic)
        #expect(configuration.rateLimitUrgentShare == 0.2)
        #expect(configuration.pipeline.core.prefetch == 600, "a turn reads up to both lanes' prefetch")
        guard case .token(let provider) = try configuration.credential.makeAuthentication() else {
            Issue.record("expected token authentication")
            return
        }
        #expect(provider.keyID == "ABC123DEFG")
    }

    @Test(arguments: [
        (["AMQP_URL": "http://x"], "AMQP_URL"),
        (["REDIS_URL": "redis://h:notaport"], "REDIS_URL"),
        (["APNS_PRODUCTION_URL": "http://x"], "APNS_PRODUCTION_URL"),
        (["APNS_RATE_LIMIT": "-5"], "APNS_RATE_LIMIT"),
        (["APNS_RATE_LIMIT": "fast"], "APNS_RATE_LIMIT"),
        (["WORKER_PREFETCH": "0"], "WORKER_PREFETCH"),
        (["APNS_CA_FILE": "/nonexistent/ca.pem"], "APNS_CA_FILE"),
        (["APNS_KEY_ID": "short"], "APNS_KEY_ID"),
        (["LOG_LEVEL": "loud"], "LOG_LEVEL"),
        (["APNS_INSECURE_SKIP_VERIFY": "maybe"], "APNS_INSECURE_SKIP_VERIFY"),
        (["APNS_CONNECTIONS": "0"], "APNS_CONNECTIONS"),
        (["APNS_MAX_CONNECTIONS": "0"], "APNS_MAX_CONNECTIONS"),
        (["APNS_MAX_CONNECTIONS": "many"], "APNS_MAX_CONNECTIONS"),
        (["APNS_RETRY_DELAYS": "1,soon"], "APNS_RETRY_DELAYS"),
        (["APNS_RETRY_DELAYS": "60,,1"], "APNS_RETRY_DELAYS"),
        (["APNS_RETRY_DELAYS": "1,15,"], "APNS_RETRY_DELAYS"),
        (["APNS_REQUEST_TIMEOUT": "86401"], "APNS_REQUEST_TIMEOUT"),
        (["APNS_REQUEST_TIMEOUT": "inf"], "APNS_REQUEST_TIMEOUT"),
        (["AMQP_HEARTBEAT": "-1"], "AMQP_HEARTBEAT"),
        (["SHUTDOWN_TIMEOUT": "later"], "SHUTDOWN_TIMEOUT"),
        (["METRICS_PORT": "70000"], "METRICS_PORT"),
        (["LOG_FORMAT": "xml"], "LOG_FORMAT"),
        (["PUSH_JOBS_QUEUE": String(repeating: "q", count: 256)], "PUSH_JOBS_QUEUE"),
        (["PUSH_JOBS_QUEUE": "amq.jobs"], "PUSH_JOBS_QUEUE"),
        (["PUSH_DEAD_TOKENS_EXCHANGE": String(repeating: "x", count: 256)], "PUSH_DEAD_TOKENS_EXCHANGE"),
        (["PUSH_REGISTRATIONS_QUEUE": String(repeating: "r", count: 256)], "PUSH_REGISTRATIONS_QUEUE"),
        (["CLEANUP_INACTIVE_DAYS": "0"], "CLEANUP_INACTIVE_DAYS"),
        (["CLEANUP_SWEEP_INTERVAL": "-1"], "CLEANUP_SWEEP_INTERVAL"),
        // One queue for both lanes would make every job land in either lane by chance.
        (["PUSH_JOBS_QUEUE": "jobs", "PUSH_BULK_QUEUE": "jobs"], "PUSH_BULK_QUEUE"),
        (["PUSH_BULK_QUEUE": "push.jobs"], "PUSH_BULK_QUEUE"),
        (["WORKER_BULK_PREFETCH": "0"], "WORKER_BULK_PREFETCH"),
        (["APNS_RATE_LIMIT_URGENT_SHARE": "1.5"], "APNS_RATE_LIMIT_URGENT_SHARE"),
        (["APNS_RATE_LIMIT_URGENT_SHARE": "20%"], "APNS_RATE_LIMIT_URGENT_SHARE"),
        (["PUSH_QUEUE_TYPE": "mirrored"], "PUSH_QUEUE_TYPE"),
        (["APNS_INSECURE_SKIP_VERIFY": "yes"], "APNS_INSECURE_SKIP_VERIFY"),
        (["WORKER_MAX_DELIVERIES": "0"], "WORKER_MAX_DELIVERIES")
    ])
    func badSettingsNameTheirKey(overrides: [String: String], key: String) {
        let environment = minimal.merging(overrides) { _, new in new }
        do {
            let configuration = try WorkerConfiguration.load(from: environment)
            _ = try configuration.credential.makeAuthentication()
            Issue.record("accepted \(overrides)")
        } catch {
            #expect(error.key == key, "\(error)")
        }
    }

    /// Words from a closed list are taken whatever their case, as LOG_LEVEL always was: DEBUG, JSON, Quorum, TRUE.
    @Test func listedWordsAreTakenWhateverTheirCase() throws {
        let configuration = try WorkerConfiguration.load(
            from: minimal.merging([
                "LOG_LEVEL": "DEBUG", "LOG_FORMAT": "JSON", "PUSH_QUEUE_TYPE": "Quorum",
                "APNS_INSECURE_SKIP_VERIFY": "TRUE"
            ]) { $1 })
        #expect(configuration.logLevel == .debug && configuration.logFormat == .json)
        #expect(configuration.broker.queues.type == .quorum && !configuration.apns.verifyPeer)
    }

    /// A CA file that exists but holds no certificate OpenSSL can load stops start-up naming its setting, whichever it
    /// is: it would fail every connection it is for, and the worker would wait on them for ever.
    @Test(arguments: ["APNS_CA_FILE", "AMQP_CA_FILE", "REDIS_CA_FILE"])
    func aCAFileOfNoCertificatesIsRefused(key: String) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("not-a-ca-\(UUID().uuidString).pem")
            .path
        try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        var environment = minimal.merging([key: path]) { _, new in new }
        if key == "REDIS_CA_FILE" { environment["REDIS_URL"] = "rediss://127.0.0.1:6380/0" }
        if key == "AMQP_CA_FILE" { environment["AMQP_URL"] = "amqps://guest:guest@127.0.0.1:5671/%2f" }
        do {
            _ = try WorkerConfiguration.load(from: environment)
            Issue.record("accepted \(key)=\(path)")
        } catch {
            #expect(error.key == key && "\(error)".contains("cannot load CA file"), "\(error)")
        }
    }

    /// A number of seconds out of range is refused with both bounds named, and a list names the item that is wrong.
    @Test func secondsOutOfRangeAreRefusedNamingTheBounds() {
        for (key, value, words) in [
            ("CLEANUP_SWEEP_INTERVAL", "172800", "above 0 and at most 86400"),
            ("APNS_RETRY_DELAYS", "0,15", "\"0\" in \"0,15\" is not a number of seconds from 0.001 to 86400"),
            ("APNS_RETRY_DELAYS", "60,,1", "\"\" in \"60,,1\"")
        ] {
            do {
                _ = try WorkerConfiguration.load(from: minimal.merging([key: value]) { _, new in new })
                Issue.record("accepted \(key)=\(value)")
            } catch {
                #expect(error.key == key && error.problem.contains(words), "\(error)")
            }
        }
    }

    /// A pool keeps APNS_CONNECTIONS open and grows up to APNS_MAX_CONNECTIONS: 8 unless set, raised to
    /// APNS_CONNECTIONS when that is larger, and given below it, an error that names both settings.
    @Test func theMostConnectionsOfAPoolAreNeverFewerThanItKeepsOpen() throws {
        #expect(try WorkerConfiguration.load(from: minimal).apns.maximumConnectionsPerEnvironment == 8)
        let raised = try WorkerConfiguration.load(from: minimal.merging(["APNS_CONNECTIONS": "12"]) { _, new in new })
        #expect(raised.apns.connectionsPerEnvironment == 12 && raised.apns.maximumConnectionsPerEnvironment == 12)
        let given = try WorkerConfiguration.load(
            from: minimal.merging(["APNS_CONNECTIONS": "3", "APNS_MAX_CONNECTIONS": "5"]) {
                _, new in new
            })
        #expect(given.apns.connectionsPerEnvironment == 3 && given.apns.maximumConnectionsPerEnvironment == 5)
        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(["APNS_CONNECTIONS": "4", "APNS_MAX_CONNECTIONS": "2"]) {
                    _, new in new
                })
            Issue.record("accepted APNS_MAX_CONNECTIONS below APNS_CONNECTIONS")
        } catch {
            #expect(error.key == "APNS_MAX_CONNECTIONS")
            #expect(error.description.contains("APNS_CONNECTIONS (4)"), "\(error)")
        }
    }

    @Test func missingCredentialsAreNamed() {
        #expect(throws: ConfigurationError.self) { try WorkerConfiguration.load(from: [:]) }
        #expect(throws: ConfigurationError(key: "APNS_TEAM_ID", "required with APNS_KEY_FILE")) {
            try WorkerConfiguration.load(from: ["APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "ABC123DEFG"])
        }
    }

    /// config/apns-worker.env is a working file: it loads, and what it sets are the defaults.
    @Test func theReferenceFileLoadsWithTheDefaults() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let file = try ConfigurationSources.readFile(root + "/config/apns-worker.env")
        #expect(file.count >= 25, "every key is listed: \(file.keys.sorted())")
        let fromFile = try WorkerConfiguration.load(from: file, requiringCredentials: false)
        let defaults = try WorkerConfiguration.load(from: [:], requiringCredentials: false)
        #expect(
            fromFile.broker.queues.jobs == defaults.broker.queues.jobs
                && fromFile.broker.queues.deadTokensExchange == defaults.broker.queues.deadTokensExchange)
        #expect(
            fromFile.broker.prefetch == defaults.broker.prefetch
                && fromFile.pipeline.retryDelays == defaults.pipeline.retryDelays)
        #expect(
            fromFile.cleanup.inactiveDays == defaults.cleanup.inactiveDays
                && fromFile.metrics.port == defaults.metrics.port)
        #expect(fromFile.apns.connectionsPerEnvironment == defaults.apns.connectionsPerEnvironment)
    }

    /// A key others can read is reported, with the fix; an owner-only key is not.
    @Test func aKeyReadableByOthersIsReported() throws {
        let configuration = try WorkerConfiguration.load(from: minimal)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: keyFile)
        let problem = try #require(configuration.credential.privateKeyPermissionProblems().first)
        #expect(problem.contains("every user") && problem.contains("chmod 600"), "\(problem)")
        try FileManager.default.setAttributes([.posixPermissions: 0o640], ofItemAtPath: keyFile)
        #expect(configuration.credential.privateKeyPermissionProblems().first?.contains("its group") == true)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: keyFile)
        #expect(configuration.credential.privateKeyPermissionProblems().first == nil)
    }

    /// The command-line tools send nothing to APNs: they load without credentials, and still check the rest.
    @Test func toolsLoadWithoutCredentials() throws {
        let configuration = try WorkerConfiguration.load(
            from: ["PUSH_DEAD_TOKENS_EXCHANGE": ""], requiringCredentials: false)
        #expect(
            configuration.credential.proof == nil && configuration.broker.queues.deadTokensExchange == "",
            "empty: no exchange")
        #expect(throws: ConfigurationError(key: "APNS_KEY_ID", "required with APNS_KEY_FILE")) {
            try WorkerConfiguration.load(from: ["APNS_KEY_FILE": keyFile], requiringCredentials: false)
        }
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.load(from: ["REDIS_URL": "nope"], requiringCredentials: false)
        }
    }

    /// Sentinel: the sentinels and the master's name; REDIS_URL beside them gives only the data nodes' credentials
    /// and database. Two places to find Redis, or sentinels without a name, stop start-up with the key to fix.
    @Test func redisSentinels() throws {
        let sentinels = ["REDIS_SENTINELS": "10.0.0.11:26379, 10.0.0.12:26379,[::1]:26380", "REDIS_MASTER_NAME": "apns"]
        let configuration = try WorkerConfiguration.load(from: minimal.merging(sentinels) { $1 })
        #expect(
            configuration.redis
                == .sentinel(
                    RedisSentinels(
                        sentinels: [
                            RedisAddress(host: "10.0.0.11", port: 26379), RedisAddress(host: "10.0.0.12", port: 26379),
                            RedisAddress(host: "::1", port: 26380)
                        ], masterName: "apns", dataNodes: RedisURL())))
        let credentials = try WorkerConfiguration.load(
            from: minimal.merging(sentinels) { $1 }.merging([
                "REDIS_URL": "redis://:s3cret@/3", "REDIS_SENTINEL_PASSWORD": "watch"
            ]) { $1 })
        guard case .sentinel(let deployment) = credentials.redis else {
            Issue.record("not Sentinel")
            return
        }
        #expect(deployment.dataNodes.password == "s3cret" && deployment.dataNodes.database == 3)
        #expect(deployment.sentinelPassword == "watch")
        #expect(!credentials.redis.description.contains("s3cret") && !credentials.redis.description.contains("watch"))

        #expect(throws: ConfigurationError(key: "REDIS_MASTER_NAME", "required with REDIS_SENTINELS")) {
            try WorkerConfiguration.load(from: minimal.merging(["REDIS_SENTINELS": "s1:26379"]) { $1 })
        }
        #expect(throws: ConfigurationError(key: "REDIS_MASTER_NAME", "given without REDIS_SENTINELS")) {
            try WorkerConfiguration.load(from: minimal.merging(["REDIS_MASTER_NAME": "apns"]) { $1 })
        }
        #expect(throws: ConfigurationError(key: "REDIS_SENTINEL_PASSWORD", "given without REDIS_SENTINELS")) {
            try WorkerConfiguration.load(from: minimal.merging(["REDIS_SENTINEL_PASSWORD": "watch"]) { $1 })
        }
        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(sentinels) { $1 }.merging(
                    ["REDIS_URL": "redis://:s3cret@cache:6379/0"]) { $1 })
            Issue.record("REDIS_URL naming a host beside REDIS_SENTINELS was accepted")
        } catch {
            #expect(error.key == "REDIS_URL" && error.problem.contains("beside REDIS_SENTINELS"), "\(error)")
            #expect(!error.description.contains("s3cret"))
        }
        for bad in ["s1", "s1:0", "s1:26379,", "s1:26379,s1:26379", "u:p@s1:26379"] {
            #expect(throws: ConfigurationError.self, "\(bad)") {
                try WorkerConfiguration.load(
                    from: minimal.merging(["REDIS_SENTINELS": bad, "REDIS_MASTER_NAME": "m"]) { $1 })
            }
        }
    }

    /// Cluster: some nodes to learn the slot map from; REDIS_URL beside them gives only their password. Two places to
    /// find Redis, or a database other than 0, stop start-up with the key to fix.
    @Test func redisClusterNodes() throws {
        let nodes = ["REDIS_CLUSTER_NODES": "10.0.0.21:6379,10.0.0.22:6379"]
        let configuration = try WorkerConfiguration.load(
            from: minimal.merging(nodes) { $1 }.merging(
                ["REDIS_URL": "redis://:s3cret@"]) { $1 })
        guard case .cluster(let cluster) = configuration.redis else {
            Issue.record("not a cluster")
            return
        }
        #expect(
            cluster.seeds == [RedisAddress(host: "10.0.0.21", port: 6379), RedisAddress(host: "10.0.0.22", port: 6379)])
        #expect(cluster.dataNodes.password == "s3cret" && !configuration.redis.description.contains("s3cret"))
        #expect(configuration.redis.isCluster)

        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(nodes) { $1 }.merging(
                    ["REDIS_SENTINELS": "s1:26379", "REDIS_MASTER_NAME": "apns"]) { $1 })
            Issue.record("REDIS_CLUSTER_NODES beside REDIS_SENTINELS was accepted")
        } catch {
            #expect(error.key == "REDIS_CLUSTER_NODES" && error.problem.contains("REDIS_SENTINELS"), "\(error)")
        }
        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(nodes) { $1 }.merging(["REDIS_URL": "redis://cache:6379/0"]) { $1 })
            Issue.record("REDIS_URL naming a host beside REDIS_CLUSTER_NODES was accepted")
        } catch {
            #expect(error.key == "REDIS_URL" && error.problem.contains("beside REDIS_CLUSTER_NODES"), "\(error)")
        }
        #expect(throws: ConfigurationError.self, "a cluster has database 0 only") {
            try WorkerConfiguration.load(
                from: minimal.merging(nodes) { $1 }.merging(["REDIS_URL": "redis:///2"]) { $1 })
        }
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.load(from: minimal.merging(["REDIS_CLUSTER_NODES": "n1"]) { $1 })
        }
    }

    /// TLS files belong to a rediss:// URL: beside redis:// they would be ignored, so they stop start-up.
    @Test func redisTLSFiles() throws {
        let ca = NSTemporaryDirectory() + "config-test-ca-\(UUID().uuidString).pem"
        try Data(try SelfSignedCertificate.generate(commonName: "cache").certificatePEM.utf8).write(
            to: URL(fileURLWithPath: ca))
        defer { try? FileManager.default.removeItem(atPath: ca) }
        let configuration = try WorkerConfiguration.load(
            from: minimal.merging(
                ["REDIS_URL": "rediss://cache:6380/0", "REDIS_CA_FILE": ca]) { $1 })
        #expect(configuration.redis == .node(RedisURL(host: "cache", port: 6380, tls: RedisTLS(caFile: ca))))
        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(["REDIS_URL": "redis://cache:6379/0", "REDIS_CA_FILE": ca]) { $1 })
            Issue.record("REDIS_CA_FILE beside redis:// was accepted")
        } catch {
            #expect(error.key == "REDIS_CA_FILE" && error.problem.contains("not rediss://"), "\(error)")
        }
        let clustered = try WorkerConfiguration.load(
            from: minimal.merging(
                ["REDIS_CLUSTER_NODES": "n1:6379", "REDIS_URL": "rediss://:pw@", "REDIS_CA_FILE": ca]) { $1 })
        guard case .cluster(let nodes) = clustered.redis else {
            Issue.record("not a cluster")
            return
        }
        #expect(nodes.dataNodes.tls?.caFile == ca, "TLS to every cluster node")
        #expect(throws: ConfigurationError.self, "a key without its certificate") {
            try WorkerConfiguration.load(
                from: minimal.merging(
                    ["REDIS_URL": "rediss://cache:6380/0", "REDIS_CERT_KEY_FILE": ca]) { $1 })
        }
    }

    /// A client certificate's expiry: an expired one stops start-up naming APNS_CERT_FILE; one that expires within 30
    /// days is warned about; a fresh one is not.
    @Test func certificateExpiry() throws {
        func certificate(days: Int) throws -> String {
            let pair = try SelfSignedCertificate.generate(commonName: "push", days: days)
            let path = NSTemporaryDirectory() + "cert-\(UUID().uuidString).pem"
            try (pair.certificatePEM + pair.privateKeyPEM).write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
        var certificateOnly = minimal
        certificateOnly["APNS_KEY_FILE"] = nil
        certificateOnly["APNS_KEY_ID"] = nil
        certificateOnly["APNS_TEAM_ID"] = nil
        let expired = try certificate(days: -1)
        do {
            _ = try WorkerConfiguration.load(from: certificateOnly.merging(["APNS_CERT_FILE": expired]) { $1 })
            Issue.record("an expired certificate was accepted")
        } catch {
            #expect(error.key == "APNS_CERT_FILE" && error.problem.contains("expired on"), "\(error)")
        }
        let soon = try WorkerConfiguration.load(
            from: certificateOnly.merging(["APNS_CERT_FILE": try certificate(days: 10)]) { $1 })
        let expiry = try #require(soon.credential.certificateExpiry)
        #expect(abs(expiry.timeIntervalSinceNow - 10 * 86_400) < 120, "the certificate's notAfter: \(expiry)")
        let warnings = CredentialSettings.certificateExpiryWarnings(try soon.credential.makeCredentials())
        #expect(warnings.count == 1 && warnings[0].message.contains("expires in 9 days"), "\(warnings)")
        let fresh = try WorkerConfiguration.load(
            from: certificateOnly.merging(["APNS_CERT_FILE": try certificate(days: 365)]) { $1 })
        #expect(CredentialSettings.certificateExpiryWarnings(try fresh.credential.makeCredentials()).isEmpty)
    }

    @Test func secretsStayOutOfErrors() {
        do {
            _ = try WorkerConfiguration.load(
                from: minimal.merging(["AMQP_URL": "amqp://u:topsecret@h:notaport"]) { _, new in new })
            Issue.record("a URL with a port that is not a number was accepted")
        } catch {
            #expect(error.key == "AMQP_URL" && !error.description.contains("topsecret"), "\(error)")
        }
    }
}
