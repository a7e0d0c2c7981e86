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

@Suite struct URLParsingTests {
    @Test func amqpURLs() throws {
        let url = try AMQPURL("amqp://user:p%40ss@broker.local:5673/%2f")
        #expect(url == AMQPURL(host: "broker.local", port: 5673, user: "user", password: "p@ss", virtualHost: "/"))
        #expect(url.description == "amqp://user:***@broker.local:5673/%2f", "no password in descriptions")
        #expect(try AMQPURL("amqps://h").port == 5671)
        #expect(try AMQPURL("amqps://h").usesTLS)
        #expect(try AMQPURL("amqp://h/prod").virtualHost == "prod")
        #expect(throws: AMQPError.self) { try AMQPURL("http://h") }
        #expect(throws: AMQPError.self) { try AMQPURL("amqp://h/") }
        #expect(throws: AMQPError.self) { try AMQPURL("amqp://h:0") }
    }

    /// A cluster's nodes in AMQP_URL: each URL its own, commas between them, no password in any text.
    @Test func amqpNodeLists() throws {
        let nodes = try AMQPNodes("amqp://app:s3cret@rabbit-1:5672/prod, amqp://app:s3cret@rabbit-2:5672/prod,amqps://app:p%2Cw@rabbit-3/prod")
        #expect(nodes.urls.map(\.host) == ["rabbit-1", "rabbit-2", "rabbit-3"])
        #expect(nodes.urls.allSatisfy { $0.virtualHost == "prod" }, "each URL keeps its own vhost; none swallows the next")
        #expect(nodes.urls[2].password == "p,w" && nodes.urls[2].port == 5671, "a comma in a password is %2C")
        #expect(!nodes.description.contains("s3cret") && !nodes.description.contains("p,w") && !nodes.description.contains("p%2Cw"))
        do {
            _ = try AMQPNodes("amqp://app:s3cret@rabbit-1/prod,amqp://app:s3cret@rabbit-2:99999/prod")
            Issue.record("a bad port was accepted")
        } catch {
            #expect(error.message.hasPrefix("URL 2 of 2: port 99999"), "\(error.message)")
            #expect(!error.message.contains("s3cret"))
        }
        #expect(throws: AMQPError.self) { try AMQPNodes("amqp://h,") }
    }

    /// A password with a raw comma splits one URL into two "nodes": the error says how to write the comma, and shows
    /// no part of the password (not even the half before the comma, which would otherwise be read as a port).
    @Test(arguments: ["amqp://app:se,cret@rabbit-1:5672/prod", "amqp://app:12,34@rabbit-1:5672/prod"])
    func aRawCommaInAPasswordIsExplained(url: String) {
        do {
            _ = try AMQPNodes(url)
            Issue.record("a password with a raw comma was accepted")
        } catch {
            #expect(error.message.contains("a comma separates nodes") && error.message.contains("%2C"), "\(error.message)")
            #expect(!error.message.contains("port ") && !error.message.contains("cret") && !error.message.contains("34"),
                    "\(error.message)")
        }
    }

    /// The parser both URLs share: the parts split, credentials percent-decoded, an IPv6 literal's brackets dropped,
    /// errors by part.
    @Test func serviceURLParts() throws {
        let url = try ServiceURL("redis://ops%40team:pa%3As@[::1]:6380/2")
        #expect(url.scheme == "redis" && url.user == "ops@team" && url.password == "pa:s")
        #expect(url.host == "::1" && url.port == 6380 && url.path == "2")
        #expect(try ServiceURL("amqp://bob@h").user == "bob" && ServiceURL("amqp://bob@h").password == nil)
        #expect(try ServiceURL("redis://secret@h", loneCredential: .password).password == "secret")
        #expect(try ServiceURL("amqp://h").path == nil && ServiceURL("amqp://h/").path == "")
        #expect(throws: ServiceURLError.badPort("x")) { try ServiceURL("amqp://h:x") }
        #expect(ServiceURLError.badPort("70000").description == "port 70000 is not a number from 1 to 65535")
        do {
            _ = try ServiceURL("amqp://guest:s3cret-pass")
            Issue.record("a URL whose password stands where the port goes is refused")
        } catch {
            #expect(!error.description.contains("s3cret"), "the password is never echoed: \(error)")
        }
        #expect(throws: ServiceURLError.noHost) { try ServiceURL("amqp://u:p@:5672") }
        #expect(throws: ServiceURLError.badPercentEncoding("password")) { try ServiceURL("amqp://u:%zz@h") }
        #expect(throws: ServiceURLError.noScheme) { try ServiceURL("h:5672") }
        #expect(try RedisURL("redis://[::1]:6380/0").host == "::1", "Redis takes an IPv6 literal as AMQP does")
        #expect(try AMQPURL("amqp://[::1]:5673").host == "::1")
    }

    @Test func redisURLs() throws {
        #expect(try RedisURL("redis://127.0.0.1:6380/2") == RedisURL(host: "127.0.0.1", port: 6380, database: 2))
        let secret = try RedisURL("redis://:s3cret@cache:6379/0")
        #expect(secret.password == "s3cret")
        #expect(!secret.description.contains("s3cret"))
        let encoded = try RedisURL("redis://ops%40team:pa%3As%2Fs%25@cache:6379/1")
        #expect(encoded.user == "ops@team" && encoded.password == "pa:s/s%", "credentials are percent-decoded")
        #expect(try RedisURL("redis://:pa:ss@cache").password == "pa:ss", "a colon after the first belongs to the password")
        #expect(throws: RedisError.self) { try RedisURL("redis://:bad%zz@cache") }
        let secure = try RedisURL("rediss://:s3cret@cache:6380/2")
        #expect(secure.tls == RedisTLS() && secure.port == 6380 && secure.description == "rediss://:***@cache:6380/2",
                "rediss:// is TLS")
        #expect(try RedisURL("redis://cache").tls == nil)
        #expect(throws: RedisError.self) { try RedisURL("http://cache") }
        #expect(throws: RedisError.self) { try RedisURL("redis://cache/x") }
    }
}

@Suite struct WorkerConfigurationTests {
    let keyFile: String

    init() throws {
        keyFile = NSTemporaryDirectory() + "config-test-\(UUID().uuidString).p8"
        try ES256Key.generatePrivateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
    }

    var minimal: [String: String] { ["APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "ABC123DEFG", "APNS_TEAM_ID": "TEAM123456"] }

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
        let own = try WorkerConfiguration.load(from: minimal.merging(["PUSH_DEAD_TOKENS_QUEUE": "team-b.dead"]) { _, new in new })
        #expect(own.broker.queues.deadTokensExchange == "team-b.dead", "another queue, another exchange: no cross-talk")
        #expect(configuration.broker.queues.registrations == "push.registrations")
        #expect(configuration.cleanup.inactiveDays == 90 && configuration.cleanup.sweepInterval == 3600)
        #expect(configuration.metrics.port == 9464 && configuration.broker.prefetch == 500)
        #expect(configuration.broker.queues.bulk == "push.bulk" && configuration.broker.bulkPrefetch == 100)
        #expect(configuration.broker.queues.type == .classic && configuration.pipeline.maximumDeliveries == 5)
        let clustered = try WorkerConfiguration.load(from: minimal.merging(["PUSH_QUEUE_TYPE": "quorum",
                                                                            "WORKER_MAX_DELIVERIES": "2"]) { $1 })
        #expect(clustered.broker.queues.type == .quorum && clustered.pipeline.maximumDeliveries == 2)
        #expect(clustered.pipeline.exitOnJobID == nil, "the test-only fault is off unless asked for")
        let nodes = "amqp://guest:guest@rabbit-1:5672/%2f,amqp://guest:guest@rabbit-2:5672/%2f"
        let cluster = try WorkerConfiguration.load(from: minimal.merging(["AMQP_URL": nodes]) { $1 })
        #expect(cluster.broker.queues.type == .quorum, "several nodes: quorum queues unless PUSH_QUEUE_TYPE says")
        let chosen = try WorkerConfiguration.load(from: minimal.merging(["AMQP_URL": nodes, "PUSH_QUEUE_TYPE": "classic"]) { $1 })
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
        (["AMQP_HEARTBEAT": "-1"], "AMQP_HEARTBEAT"),
        (["SHUTDOWN_TIMEOUT": "later"], "SHUTDOWN_TIMEOUT"),
        (["METRICS_PORT": "70000"], "METRICS_PORT"),
        (["LOG_FORMAT": "xml"], "LOG_FORMAT"),
        (["PUSH_JOBS_QUEUE": String(repeating: "q", count: 256)], "PUSH_JOBS_QUEUE"),
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
        (["PUSH_QUEUE_TYPE": "Quorum"], "PUSH_QUEUE_TYPE"),
        (["WORKER_MAX_DELIVERIES": "0"], "WORKER_MAX_DELIVERIES"),
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

    /// A pool keeps APNS_CONNECTIONS open and grows up to APNS_MAX_CONNECTIONS: 8 unless set, raised to
    /// APNS_CONNECTIONS when that is larger, and given below it, an error that names both settings.
    @Test func theMostConnectionsOfAPoolAreNeverFewerThanItKeepsOpen() throws {
        #expect(try WorkerConfiguration.load(from: minimal).apns.maximumConnectionsPerEnvironment == 8)
        let raised = try WorkerConfiguration.load(from: minimal.merging(["APNS_CONNECTIONS": "12"]) { _, new in new })
        #expect(raised.apns.connectionsPerEnvironment == 12 && raised.apns.maximumConnectionsPerEnvironment == 12)
        let given = try WorkerConfiguration.load(from: minimal.merging(["APNS_CONNECTIONS": "3", "APNS_MAX_CONNECTIONS": "5"]) {
            _, new in new
        })
        #expect(given.apns.connectionsPerEnvironment == 3 && given.apns.maximumConnectionsPerEnvironment == 5)
        do {
            _ = try WorkerConfiguration.load(from: minimal.merging(["APNS_CONNECTIONS": "4", "APNS_MAX_CONNECTIONS": "2"]) {
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
        #expect(fromFile.broker.queues.jobs == defaults.broker.queues.jobs && fromFile.broker.queues.deadTokensExchange == defaults.broker.queues.deadTokensExchange)
        #expect(fromFile.broker.prefetch == defaults.broker.prefetch && fromFile.pipeline.retryDelays == defaults.pipeline.retryDelays)
        #expect(fromFile.cleanup.inactiveDays == defaults.cleanup.inactiveDays && fromFile.metrics.port == defaults.metrics.port)
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
        let configuration = try WorkerConfiguration.load(from: ["PUSH_DEAD_TOKENS_EXCHANGE": ""], requiringCredentials: false)
        #expect(configuration.credential.proof == nil && configuration.broker.queues.deadTokensExchange == "", "empty: no exchange")
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
        #expect(configuration.redis == .sentinel(RedisSentinels(
            sentinels: [RedisAddress(host: "10.0.0.11", port: 26379), RedisAddress(host: "10.0.0.12", port: 26379),
                        RedisAddress(host: "::1", port: 26380)], masterName: "apns", dataNodes: RedisURL())))
        let credentials = try WorkerConfiguration.load(from: minimal.merging(sentinels) { $1 }.merging([
            "REDIS_URL": "redis://:s3cret@/3", "REDIS_SENTINEL_PASSWORD": "watch"]) { $1 })
        guard case .sentinel(let deployment) = credentials.redis else { Issue.record("not Sentinel"); return }
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
            _ = try WorkerConfiguration.load(from: minimal.merging(sentinels) { $1 }.merging(
                ["REDIS_URL": "redis://:s3cret@cache:6379/0"]) { $1 })
            Issue.record("REDIS_URL naming a host beside REDIS_SENTINELS was accepted")
        } catch {
            #expect(error.key == "REDIS_URL" && error.problem.contains("beside REDIS_SENTINELS"), "\(error)")
            #expect(!error.description.contains("s3cret"))
        }
        for bad in ["s1", "s1:0", "s1:26379,", "s1:26379,s1:26379", "u:p@s1:26379"] {
            #expect(throws: ConfigurationError.self, "\(bad)") {
                try WorkerConfiguration.load(from: minimal.merging(["REDIS_SENTINELS": bad, "REDIS_MASTER_NAME": "m"]) { $1 })
            }
        }
    }

    /// Cluster: some nodes to learn the slot map from; REDIS_URL beside them gives only their password. Two places to
    /// find Redis, or a database other than 0, stop start-up with the key to fix.
    @Test func redisClusterNodes() throws {
        let nodes = ["REDIS_CLUSTER_NODES": "10.0.0.21:6379,10.0.0.22:6379"]
        let configuration = try WorkerConfiguration.load(from: minimal.merging(nodes) { $1 }.merging(
            ["REDIS_URL": "redis://:s3cret@"]) { $1 })
        guard case .cluster(let cluster) = configuration.redis else { Issue.record("not a cluster"); return }
        #expect(cluster.seeds == [RedisAddress(host: "10.0.0.21", port: 6379), RedisAddress(host: "10.0.0.22", port: 6379)])
        #expect(cluster.dataNodes.password == "s3cret" && !configuration.redis.description.contains("s3cret"))
        #expect(configuration.redis.isCluster)

        do {
            _ = try WorkerConfiguration.load(from: minimal.merging(nodes) { $1 }.merging(
                ["REDIS_SENTINELS": "s1:26379", "REDIS_MASTER_NAME": "apns"]) { $1 })
            Issue.record("REDIS_CLUSTER_NODES beside REDIS_SENTINELS was accepted")
        } catch {
            #expect(error.key == "REDIS_CLUSTER_NODES" && error.problem.contains("REDIS_SENTINELS"), "\(error)")
        }
        do {
            _ = try WorkerConfiguration.load(from: minimal.merging(nodes) { $1 }.merging(["REDIS_URL": "redis://cache:6379/0"]) { $1 })
            Issue.record("REDIS_URL naming a host beside REDIS_CLUSTER_NODES was accepted")
        } catch {
            #expect(error.key == "REDIS_URL" && error.problem.contains("beside REDIS_CLUSTER_NODES"), "\(error)")
        }
        #expect(throws: ConfigurationError.self, "a cluster has database 0 only") {
            try WorkerConfiguration.load(from: minimal.merging(nodes) { $1 }.merging(["REDIS_URL": "redis:///2"]) { $1 })
        }
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.load(from: minimal.merging(["REDIS_CLUSTER_NODES": "n1"]) { $1 })
        }
    }

    /// TLS files belong to a rediss:// URL: beside redis:// they would be ignored, so they stop start-up.
    @Test func redisTLSFiles() throws {
        let ca = keyFile   // any readable file: a CA file is read when a connection is made
        let configuration = try WorkerConfiguration.load(from: minimal.merging(
            ["REDIS_URL": "rediss://cache:6380/0", "REDIS_CA_FILE": ca]) { $1 })
        #expect(configuration.redis == .node(RedisURL(host: "cache", port: 6380, tls: RedisTLS(caFile: ca))))
        do {
            _ = try WorkerConfiguration.load(from: minimal.merging(["REDIS_URL": "redis://cache:6379/0", "REDIS_CA_FILE": ca]) { $1 })
            Issue.record("REDIS_CA_FILE beside redis:// was accepted")
        } catch {
            #expect(error.key == "REDIS_CA_FILE" && error.problem.contains("not rediss://"), "\(error)")
        }
        let clustered = try WorkerConfiguration.load(from: minimal.merging(
            ["REDIS_CLUSTER_NODES": "n1:6379", "REDIS_URL": "rediss://:pw@", "REDIS_CA_FILE": ca]) { $1 })
        guard case .cluster(let nodes) = clustered.redis else { Issue.record("not a cluster"); return }
        #expect(nodes.dataNodes.tls?.caFile == ca, "TLS to every cluster node")
        #expect(throws: ConfigurationError.self, "a key without its certificate") {
            try WorkerConfiguration.load(from: minimal.merging(
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
        let soon = try WorkerConfiguration.load(from: certificateOnly.merging(["APNS_CERT_FILE": try certificate(days: 10)]) { $1 })
        let expiry = try #require(soon.credential.certificateExpiry)
        #expect(abs(expiry.timeIntervalSinceNow - 10 * 86_400) < 120, "the certificate's notAfter: \(expiry)")
        let warnings = CredentialSettings.certificateExpiryWarnings(try soon.credential.makeCredentials())
        #expect(warnings.count == 1 && warnings[0].message.contains("expires in 9 days"), "\(warnings)")
        let fresh = try WorkerConfiguration.load(from: certificateOnly.merging(["APNS_CERT_FILE": try certificate(days: 365)]) { $1 })
        #expect(CredentialSettings.certificateExpiryWarnings(try fresh.credential.makeCredentials()).isEmpty)
    }

    @Test func secretsStayOutOfErrors() {
        do {
            _ = try WorkerConfiguration.load(from: minimal.merging(["AMQP_URL": "amqp://u:topsecret@h:notaport"]) { _, new in new })
            Issue.record("a URL with a port that is not a number was accepted")
        } catch {
            #expect(error.key == "AMQP_URL" && !error.description.contains("topsecret"), "\(error)")
        }
    }
}

@Suite struct ConfigurationSourcesTests {
    @Test func readsKeyValueLinesWithCommentsExportsAndQuotes() throws {
        let values = try ConfigurationSources.parseFile("""
            # a comment

            AMQP_URL=amqp://u:p@h:5672/%2f
            export APNS_TOPIC = "com.example.app"
            LOG_LEVEL='debug'
            EMPTY=
            """, name: "test.env")
        #expect(values == ["AMQP_URL": "amqp://u:p@h:5672/%2f", "APNS_TOPIC": "com.example.app", "LOG_LEVEL": "debug",
                           "EMPTY": ""])
    }

    @Test func aBadLineIsNamedWithItsNumber() {
        #expect(throws: ConfigurationError(key: "--config", "f.env line 2: expected KEY=VALUE")) {
            try ConfigurationSources.parseFile("A=1\njust words\n", name: "f.env")
        }
        #expect(throws: ConfigurationError.self) { try ConfigurationSources.readFile("/nonexistent/file.env") }
    }

    /// A file saved on Windows: every line is read, no value keeps a carriage return, a bad line has its number.
    @Test func linesEndingInCRLFAreReadLikeLF() throws {
        let values = try ConfigurationSources.parseFile("# written on Windows\r\nLOG_LEVEL=debug\r\nAPNS_TOPIC=com.example.app\r\n",
                                                        name: "windows.env")
        #expect(values == ["LOG_LEVEL": "debug", "APNS_TOPIC": "com.example.app"])
        #expect(throws: ConfigurationError(key: "--config", "windows.env line 2: expected KEY=VALUE")) {
            try ConfigurationSources.parseFile("A=1\r\njust words\r\n", name: "windows.env")
        }
    }

    @Test func flagsBeatTheEnvironmentWhichBeatsTheFile() {
        let merged = ConfigurationSources.merge(file: ["A": "file", "B": "file", "C": "file"],
                                                environment: ["B": "environment", "C": "environment"],
                                                flags: ["C": "flag"])
        #expect(merged == ["A": "file", "B": "environment", "C": "flag"])
    }
}

/// Unknown setting names: a typo in a file or `--set` stops start-up with the nearest known key; the environment's
/// strays are warned about.
@Suite struct SettingKeysTests {
    @Test(arguments: [("APNS_RATELIMIT", "APNS_RATE_LIMIT"), ("WORKER_PREFECTH", "WORKER_PREFETCH"),
                      ("apns_topic", "APNS_TOPIC"), ("REDIS_ULR", "REDIS_URL")])
    func aTypoIsAnErrorNamingTheNearestKey(typo: String, meant: String) {
        do {
            try SettingKeys.checkKnown([typo], source: "given with --set")
            Issue.record("\(typo) accepted")
        } catch {
            #expect(error.key == typo && error.problem.contains("did you mean \(meant)?"), "\(error)")
        }
    }

    @Test func aNameNothingResemblesPointsToTheReference() {
        #expect(throws: ConfigurationError.self) { try SettingKeys.checkKnown(["COMPLETELY_DIFFERENT"], source: "x") }
        #expect(SettingKeys.suggestion(for: "COMPLETELY_DIFFERENT").contains("config/apns-worker.env"))
    }

    @Test func onlyOurPrefixesAreWarnedAboutInTheEnvironment() {
        let warnings = SettingKeys.unknownInEnvironment(["APNS_RATELIMIT": "1", "PATH": "/bin", "HOME": "/root",
                                                         "AMQP_URL": "amqp://x", "PUSH_JOBS_QUEUEE": "q"])
        #expect(warnings.count == 2)
        #expect(warnings.contains { $0.hasPrefix("APNS_RATELIMIT") && $0.contains("APNS_RATE_LIMIT") })
        #expect(warnings.contains { $0.hasPrefix("PUSH_JOBS_QUEUEE") })
    }

    /// docs/operations.md's Environment table names settings that exist: a renamed or removed key cannot linger there.
    @Test func theOperationsGuideNamesOnlySettingsOfTheTable() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let guide = try String(contentsOfFile: root + "/docs/operations.md", encoding: .utf8)
        let section = try #require(guide.components(separatedBy: "## Environment").dropFirst().first?
            .components(separatedBy: "\n\n").dropFirst().first, "docs/operations.md has an Environment table")
        let named = section.split(separator: "\n").filter { $0.hasPrefix("| ") && !$0.hasPrefix("| variable") }
            .flatMap { row in row.split(separator: "|")[0].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
        let known = Set(SettingTable.entries.map(\.name))
        #expect(named.count >= 20, "the table was read: \(named)")
        #expect(named.filter { !known.contains($0) } == [], "docs/operations.md names settings no program reads")
    }

    /// config/apns-worker.env documents the table: every key of the table and no other, and where the file sets a
    /// value (a line not commented out), it is the table's default; every default of the table is set there.
    @Test func theReferenceFileDocumentsExactlyTheTable() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let text = try String(contentsOfFile: root + "/config/apns-worker.env", encoding: .utf8)
        var documented: Set<String> = []
        var defaults: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let commented = line.hasPrefix("#")
            let setting = line.drop { $0 == "#" || $0 == " " }
            guard let equals = setting.firstIndex(of: "="), case let key = String(setting[..<equals]), !key.isEmpty,
                  key.allSatisfy({ $0.isUppercase || $0.isNumber || $0 == "_" }) else { continue }
            documented.insert(key)
            if !commented { defaults[key] = String(setting[setting.index(after: equals)...]) }
        }
        let table = Dictionary(uniqueKeysWithValues: SettingTable.entries.map { ($0.name, $0) })
        #expect(documented == Set(table.keys), """
            undocumented: \(Set(table.keys).subtracting(documented).sorted()), \
            not in the table: \(documented.subtracting(table.keys).sorted())
            """)
        for (key, value) in defaults.sorted(by: { $0.key < $1.key }) {
            #expect(table[key]?.defaultText == value, "\(key)=\(value) in the file, \(table[key]?.defaultText ?? "no default") in the table")
        }
        for entry in SettingTable.entries where entry.defaultText != nil {
            #expect(defaults[entry.name] != nil, "\(entry.name)'s default \(entry.defaultText!) is not set in the file")
        }
    }

    /// Each key declared once, and the unknown-key check knows exactly the table's keys.
    @Test func theTableDeclaresEachKeyOnce() {
        let names = SettingTable.entries.map(\.name)
        #expect(names.count == Set(names).count, "declared twice: \(names.filter { name in names.count { $0 == name } > 1 })")
        #expect(SettingKeys.all == Set(names))
        #expect(names.count >= 41)
    }

    /// A program's --help lists the settings it reads, with the kind of value and the default, and no others.
    @Test func helpListsTheSettingsAProgramReads() {
        let tokens = SettingTable.help(for: .tokens)
        #expect(tokens.contains("REDIS_URL") && tokens.contains("APNS_TOPIC") && tokens.contains("LOG_LEVEL"), "\(tokens)")
        #expect(!tokens.contains("AMQP_URL") && !tokens.contains("WORKER_PREFETCH"), "\(tokens)")
        let worker = SettingTable.help(for: .worker)
        #expect(worker.contains("APNS_CONNECTIONS") && worker.contains("whole number 1..64; default 2"), "\(worker)")
        #expect(worker.split(separator: "\n").allSatisfy { $0.count <= 118 }, "\(worker)")
        let programs: [Programs] = [.worker, .cleanup, .enqueue, .tokens, .stats, .deadTokensTail]
        for program in programs {
            let listed = Set(SettingTable.help(for: program).split(separator: "\n").compactMap { line in
                line.hasPrefix("  ") && !line.hasPrefix("   ") ? line.split(separator: " ").first.map(String.init) : nil
            })
            #expect(listed == Set(SettingTable.entries.filter { $0.readers.contains(program) }.map(\.name)))
        }
        #expect(SettingTable.entries.allSatisfy { !$0.readers.isEmpty }, "every setting is read by some program")
    }

    /// Foundation reads a settings or key file past a byte-order mark; JSON read as bytes names it.
    @Test func aByteOrderMarkIsNamedInJSON() {
        do {
            _ = try JSONReader.parse([0xEF, 0xBB, 0xBF] + Array(#"{"users": ["u"]}"#.utf8))
            Issue.record("a BOM was accepted")
        } catch {
            #expect(error.description.contains("byte-order mark") && !error.description.contains("ï"), "\(error)")
        }
    }

    @Test func aDirectoryGivenAsAKeyFileIsNamed() {
        do {
            _ = try WorkerConfiguration.load(from: ["APNS_KEY_FILE": NSTemporaryDirectory(), "APNS_KEY_ID": "ABC123DEFG",
                                                    "APNS_TEAM_ID": "DEF123GHIJ"])
            Issue.record("a directory was accepted as a key file")
        } catch {
            #expect(error.key == "APNS_KEY_FILE" && error.problem.contains("is a directory, not a file"), "\(error)")
        }
    }
}

/// APNS_CREDENTIALS_FILE: its shape, what each entry serves, and the errors that name the entry.
@Suite struct CredentialsFileTests {
    let keyFile: String
    let directory: String

    init() throws {
        directory = NSTemporaryDirectory() + "credentials-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        keyFile = directory + "/AuthKey.p8"
        try ES256Key.generatePrivateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
    }

    func load(_ json: String, single: Bool = false) throws(ConfigurationError) -> APNsCredentials {
        let path = directory + "/credentials-\(UUID().uuidString).json"
        try? json.write(toFile: path, atomically: true, encoding: .utf8)
        var environment = ["APNS_CREDENTIALS_FILE": path, "APNS_TOPIC": "com.default.app"]
        if single {
            environment.merge(["APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "DEFAULT001", "APNS_TEAM_ID": "TEAMDEFAUL"]) { $1 }
        }
        return try WorkerConfiguration.load(from: environment).credential.makeCredentials()
    }

    func entry(team: String, key: String, topics: String, extra: String = "") -> String {
        #"{"team_id": "\#(team)", "key_id": "\#(key)", "key_file": "AuthKey.p8", "topics": \#(topics)\#(extra)}"#
    }

    /// A topic picks the entry listing its bundle ID, with or without a push type's suffix; every other topic goes
    /// to the single-key default, or to none without one. A relative key path is read beside the file.
    @Test func aTopicPicksTheEntryOfItsBundle() throws {
        let json = #"{"credentials": [\#(entry(team: "TEAM00000A", key: "KEY000000A", topics: #"["com.a.app", "com.a.driver"]"#, extra: #", "rate_limit": 50"#)), \#(entry(team: "TEAM00000B", key: "KEY000000B", topics: #"["com.b.app"]"#))]}"#
        let credentials = try load(json, single: true)
        #expect(credentials.credential(forTopic: "com.a.app")?.name == "TEAM00000A/KEY000000A")
        #expect(credentials.credential(forTopic: "com.a.driver.voip")?.name == "TEAM00000A/KEY000000A")
        #expect(credentials.credential(forTopic: "com.b.app.push-type.liveactivity")?.name == "TEAM00000B/KEY000000B")
        #expect(credentials.credential(forTopic: "com.a.application")?.name == "TEAMDEFAUL/DEFAULT001")
        #expect(credentials.credential(forTopic: "com.a.app")?.rateLimit == 50)
        #expect(credentials.credential(forTopic: "com.b.app")?.rateLimit == 0)
        let withoutDefault = try load(json)
        #expect(withoutDefault.credential(forTopic: "com.other.app") == nil)
        #expect(withoutDefault.credential(forTopic: "com.b.app") != nil)
    }

    @Test(arguments: [
        (#"{"credentials": [ "#, "not JSON"),
        (#"{"keys": []}"#, #"wants {"credentials": [ ... ]}"#),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": []}]}"#,
         "entry 1 (team TEAM00000A, key KEY000000A): \"topics\" wants a non-empty list"),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topic": ["com.a"]}]}"#,
         "entry 1 (team TEAM00000A, key KEY000000A): unknown field \"topic\""),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"], "rate_limit": -1}]}"#,
         "\"rate_limit\" wants a whole number"),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"], "rate_limit": true}]}"#,
         "\"rate_limit\" wants a whole number"),
        (#"{"credentials": [{"topics": ["com.a"]}]}"#, "entry 1: names no credential"),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "missing.p8", "topics": ["com.a"]}]}"#,
         "entry 1 (team TEAM00000A, key KEY000000A)"),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY0A", "key_file": "AuthKey.p8", "topics": ["com.a"]}]}"#,
         "entry 1 (team TEAM00000A, key KEY0A)"),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"]}, {"cert_file": "missing.pem", "topics": ["com.a"]}]}"#,
         "entry 2 (certificate "),
        (#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a", "com.b"]}, {"team_id": "TEAM00000B", "key_id": "KEY000000B", "key_file": "AuthKey.p8", "topics": ["com.b"]}]}"#,
         "entry 2 (TEAM00000B/KEY000000B) lists com.b, which TEAM00000A/KEY000000A serves already"),
        (#"{"credentials": []}"#, "lists no credential"),
    ])
    func aBadFileIsRefusedNamingTheEntry(json: String, expected: String) {
        do {
            _ = try load(json)
            Issue.record("accepted: \(json)")
        } catch {
            #expect(error.key == "APNS_CREDENTIALS_FILE" && error.problem.contains(expected), "\(error)")
        }
    }

    /// A problem quotes what the file holds briefly: a topics list holding a large object does not fill the log.
    @Test func aProblemQuotesWhatTheFileHoldsBriefly() {
        let large = "{" + (0..<2_000).map { "\"field\($0)\": \($0)" }.joined(separator: ", ") + "}"
        do {
            _ = try load(#"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": [\#(large)]}]}"#)
            Issue.record("a topic that is an object was accepted")
        } catch {
            #expect(error.problem.contains("not a bundle ID") && error.problem.count < 400, "\(error.problem.count) characters")
        }
    }

    /// A certificate entry is loaded as a connection would load it: an expired one, or a key that is not the
    /// certificate's, is refused naming the entry; a good one is named by its common name.
    @Test func aCertificateEntryIsCheckedAtLoad() throws {
        func pair(_ name: String, days: Int) throws -> (certificate: String, key: String) {
            let generated = try SelfSignedCertificate.generate(commonName: name, days: days)
            let certificate = directory + "/\(UUID().uuidString).pem", key = directory + "/\(UUID().uuidString).key"
            try generated.certificatePEM.write(toFile: certificate, atomically: true, encoding: .utf8)
            try generated.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            return (certificate, key)
        }
        let good = try pair("Apple Push Services: com.c.app", days: 100)
        let other = try pair("com.d.app", days: 100)
        let expired = try pair("com.e.app", days: -1)
        func entry(_ certificate: String, _ key: String) -> String {
            #"{"credentials": [{"cert_file": "\#(certificate)", "cert_key_file": "\#(key)", "topics": ["com.c.app"]}]}"#
        }
        #expect(try load(entry(good.certificate, good.key)).credential(forTopic: "com.c.app")?.name
                == "certificate:Apple Push Services: com.c.app")
        for (json, expected) in [(entry(good.certificate, other.key), "entry 1 (certificate \(good.certificate))"),
                                 (entry(expired.certificate, expired.key), "the certificate expired on")] {
            do {
                _ = try load(json)
                Issue.record("accepted: \(json)")
            } catch {
                #expect(error.key == "APNS_CREDENTIALS_FILE" && error.problem.contains(expected), "\(error)")
            }
        }
    }

    /// A reload that reads the same credential again keeps it (its connections and provider token carry on); a
    /// changed key file is a new credential and the old one is retired.
    @Test func aReloadKeepsWhatDidNotChange() throws {
        let json = #"{"credentials": [\#(entry(team: "TEAM00000A", key: "KEY000000A", topics: #"["com.a.app"]"#)), {"team_id": "TEAM00000B", "key_id": "KEY000000B", "key_file": "B.p8", "topics": ["com.b.app"]}]}"#
        try ES256Key.generatePrivateKeyPEM().write(toFile: directory + "/B.p8", atomically: true, encoding: .utf8)
        let client = APNsClient(configuration: APNsClientConfiguration(), credentials: try load(json),
                                logger: Logger(label: "test", level: .critical))
        defer { client.shutdown() }
        let before = client.credential(forTopic: "com.a.app")
        let same = client.replaceCredentials(try load(json))
        #expect(same.added.isEmpty && same.retired.isEmpty)
        #expect(client.credential(forTopic: "com.a.app") === before)
        try ES256Key.generatePrivateKeyPEM().write(toFile: directory + "/B.p8", atomically: true, encoding: .utf8)
        let changed = client.replaceCredentials(try load(json))
        #expect(changed.added == ["TEAM00000B/KEY000000B"] && changed.retired == ["TEAM00000B/KEY000000B"])
        #expect(client.credential(forTopic: "com.a.app") === before)
    }
}
