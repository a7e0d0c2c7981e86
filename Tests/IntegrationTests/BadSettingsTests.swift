import AMQP
import APNs
import APNsSimulator
import Foundation
import HTTP2
import Redis
import Telemetry
import Testing
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

/// A careless operator's settings, as `apns-worker run` meets them: a typo stops start-up naming the nearest key, a
/// broker or Redis that refuses the credentials, vhost or database exits 78 with the cause, one that is merely down
/// is waited for; readiness follows Redis as it is now.
@Suite struct BadSettingsTests {
    let logger = Logger(label: "bad-settings", level: .critical)

    /// The contract's variables for a worker that could run (a simulator to send to, a key, queues of its own).
    func environment(_ extra: [String: String] = [:]) throws -> (
        environment: [String: String], simulator: APNsSimulator
    ) {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        var environment = try TestServices.workerEnvironment(simulator: simulator, jobs: TestServices.unique("jobs"))
        environment["LOG_LEVEL"] = "info"
        return (environment.merging(extra) { _, new in new }, simulator)
    }

    @Test func aTypoGivenWithSetOrInAFileStopsStartUpNamingTheNearestKey() throws {
        let (environment, simulator) = try environment()
        defer { simulator.shutdown() }
        let flagged = try ExecutablesTests.Child(
            "apns-worker", ["run", "--set", "APNS_RATELIMIT=100"], environment: environment)
        let line = flagged.waitForLine(containing: "configuration error")
        #expect(
            line?.contains("APNS_RATELIMIT") == true && line?.contains("did you mean APNS_RATE_LIMIT?") == true,
            "\(line ?? "no line")")
        #expect(flagged.waitForExit() == 78)

        let file = try TestServices.temporaryFile("worker.env", contents: "WORKER_PREFECTH=10\n")
        let filed = try ExecutablesTests.Child("apns-worker", ["run", "--config", file], environment: environment)
        #expect(filed.waitForLine(containing: "did you mean WORKER_PREFETCH?") != nil)
        #expect(filed.waitForExit() == 78)
    }

    /// In the environment (which holds much else) a stray name of ours is a warning, and the worker runs.
    @Test func aTypoInTheEnvironmentIsWarnedAbout() throws {
        let (environment, simulator) = try environment(["APNS_RATELIMIT": "100"])
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        let warning = worker.waitForLine(containing: "unknown setting")
        #expect(
            warning?.contains("\"level\":\"warning\"") == true && warning?.contains("APNS_RATE_LIMIT") == true,
            "\(warning ?? "no line")")
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        let jobs = try #require(environment["PUSH_JOBS_QUEUE"])
        let replies = TestServices.unique("replies")
        let replyReader = try QueueReader(replies)
        try AMQPConnection(url: TestServices.amqpURL()).publish(
            to: jobs,
            body: Array(#"{"tokens": ["\#(String(repeating: "5e", count: 32))"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1)
        #expect(worker.stop() == 0)
        TestServices.reportFault(
            "a setting misspelt in the environment (warned about; typos in a file or --set exit 78)",
            notifications: 1, received: simulator.received())
    }

    /// The line a worker started with `extra` settings prints as it stops at start-up, which it must do with exit
    /// code 78 (a setting to fix); nil if it printed none within 30 s.
    func configurationError(with extra: [String: String]) throws -> String? {
        let (environment, simulator) = try environment(extra)
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        let line = worker.waitForLine(containing: "configuration error", timeout: 30)
        #expect(worker.waitForExit() == 78, "\(line ?? "no line")")
        return line
    }

    @Test(arguments: [
        ("a wrong password", "password", "ACCESS_REFUSED"),
        ("an unknown vhost", "vhost", "NOT_ALLOWED")
    ])
    func aBrokerThatRefusesTheURLExits78(_ what: String, _ part: String, _ reply: String) throws {
        let base = try TestServices.amqpURL()
        let url =
            part == "password"
            ? "amqp://guest:not-the-password@\(base.host):\(base.port)/%2f"
            : "amqp://guest:guest@\(base.host):\(base.port)/\(TestServices.unique("no-such-vhost"))"
        let line = try configurationError(with: ["AMQP_URL": url])
        #expect(line?.contains("AMQP_URL") == true && line?.contains(reply) == true, "\(what): \(line ?? "no line")")
        #expect(line?.contains("not-the-password") == false, "no password in the log")
    }

    /// A user the broker lets in but does not let declare the worker's queues (no configure permission): a setting
    /// to fix, exit 78 naming AMQP_URL and the refusal, not a reconnect loop.
    @Test func aUserWhoMayNotDeclareTheQueuesExits78() throws {
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        let user = TestServices.unique("no-configure")
        _ = try TestServices.run(rabbitmqctl, ["add_user", user, "secret"])
        defer { _ = try? TestServices.run(rabbitmqctl, ["delete_user", user]) }
        _ = try TestServices.run(rabbitmqctl, ["set_permissions", "-p", "/", user, "^$", ".*", ".*"])
        let base = try TestServices.amqpURL()
        let line = try configurationError(with: [
            "AMQP_URL": "amqp://\(user):secret@\(base.host):\(base.port)/%2f",
            "PUSH_JOBS_QUEUE": TestServices.unique("jobs")
        ])
        #expect(line?.contains("AMQP_URL") == true && line?.contains("ACCESS_REFUSED") == true, "\(line ?? "no line")")
    }

    /// A broker whose TLS certificate AMQP_CA_FILE does not vouch for stops start-up naming AMQP_CA_FILE (the worker
    /// reconnected for ever).
    @Test func aBrokerCertificateTheCAFileDoesNotVouchForExits78() throws {
        let otherCA = try TestServices.temporaryFile(
            "other-ca.pem", contents: try SelfSignedCertificate.generate(commonName: "unrelated CA").certificatePEM)
        let line = try configurationError(with: [
            "AMQP_URL": try TestServices.value("AMQPS_URL"), "AMQP_CA_FILE": otherCA
        ])
        #expect(line?.contains("AMQP_CA_FILE") == true, "\(line ?? "no line")")
    }

    @Test func aRedisDatabaseThatDoesNotExistExits78() throws {
        let line = try configurationError(with: [
            "REDIS_URL": try TestServices.redisURL().withDatabase(99).description(revealingPassword: true)
        ])
        #expect(line?.contains("REDIS_URL") == true && line?.contains("database 99") == true, "\(line ?? "no line")")
    }

    /// Down is not wrong: a Redis nobody listens for is waited for (the back-off grows), and SIGTERM stops the wait.
    @Test func aRedisThatIsMerelyDownIsWaitedFor() throws {
        let (environment, simulator) = try environment(["REDIS_URL": "redis://127.0.0.1:\(TestServices.freePort())/0"])
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(worker.waitForLine(containing: "\"failures_in_a_row\":\"1\"") != nil)
        #expect(
            worker.waitForLine(containing: "\"failures_in_a_row\":\"2\"") != nil, "still waiting, the count growing")
        #expect(worker.stop() == 0)
    }

    @Test func keyFileMistakesAreNamed() throws {
        let (base, simulator) = try environment()
        defer { simulator.shutdown() }
        let directory = try TestServices.certificateDirectory("key-dir")
        let asDirectory = try ExecutablesTests.Child(
            "apns-worker", ["run"], environment: base.merging(["APNS_KEY_FILE": directory]) { _, new in new })
        #expect(asDirectory.waitForLine(containing: "is a directory, not a file")?.contains("APNS_KEY_FILE") == true)
        #expect(asDirectory.waitForExit() == 78)

        // A byte-order mark (some Windows editors write one): a key file or a settings file is read past it; a
        // jobs file given to enqueue is refused naming it, not as "unexpected character 'ï'".
        let withMark = try TestServices.temporaryFile(
            "bom.p8", contents: "\u{FEFF}" + (try ES256Key.generatePrivateKeyPEM()))
        let marked = try ExecutablesTests.Child(
            "apns-worker", ["run"], environment: base.merging(["APNS_KEY_FILE": withMark]) { _, new in new })
        #expect(marked.waitForLine(containing: "\"consuming\"") != nil)
        #expect(marked.stop() == 0)
        let jobs = try TestServices.temporaryFile(
            "jobs.jsonl", contents: "\u{FEFF}" + #"{"users": ["u1"], "payload": {"aps": {}}}"# + "\n")
        let enqueued = try OperationsTests.apnsWorker(["enqueue", jobs, "--no-progress"], environment: base)
        #expect(
            enqueued.status == 65 && enqueued.errors.contains("byte-order mark") && !enqueued.errors.contains("ï"),
            "\(enqueued)")
    }

    @Test func twoCredentialsSayWhichIsUsed() throws {
        let directory = try TestServices.certificateDirectory("both")
        let (environment, simulator) = try environment([
            "APNS_CERT_FILE": directory + "/cert.pem",
            "APNS_CERT_KEY_FILE": directory + "/key.pem"
        ])
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        let line = worker.waitForLine(containing: "two APNs credentials")
        #expect(line?.contains("token authentication with APNS_KEY_FILE is used") == true, "\(line ?? "no line")")
        #expect(worker.stop() == 0)
    }

    /// /readyz is Redis as it is now: frozen (SIGSTOP), the worker is not ready within a few seconds; thawed, it is
    /// ready again.
    @Test func readinessFollowsAFrozenRedis() throws {
        let (port, redis) = try Self.privateRedis()
        defer { redis.stop() }
        let metricsPort = TestServices.freePort()
        let (environment, simulator) = try environment([
            "REDIS_URL": "redis://127.0.0.1:\(port)/0",
            "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(metricsPort)
        ])
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = worker.stop(SIGKILL) }
        func readiness() -> (status: Int, body: String)? { Self.readiness(metricsPort) }
        func ready() -> Bool { readiness()?.status == 200 }
        func notReady() -> Bool { Self.notReady(readiness()) }
        #expect(TestServices.waitUntil(ready), "ready once Redis answers")
        kill(redis.pid, SIGSTOP)
        // Within the readiness window (3 s) after the last answer, before Redis's 5 s call timeout would end the
        // session: readiness is the probe's answer, not the connection's fate.
        #expect(TestServices.waitUntil(timeout: 4.5, notReady), "not ready while Redis is frozen")
        #expect(notReady(), "and still not ready: \(String(describing: readiness()))")
        // A job published while Redis is frozen waits, and is delivered once it answers again.
        let jobs = try #require(environment["PUSH_JOBS_QUEUE"])
        let replies = TestServices.unique("replies")
        let replyReader = try QueueReader(replies)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        try publisher.publish(
            to: jobs,
            body: Array(#"{"tokens": ["\#(String(repeating: "5f", count: 32))"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        kill(redis.pid, SIGCONT)
        #expect(TestServices.waitUntil(timeout: 30, ready), "ready again once Redis answers")
        #expect(try replyReader.read(1, timeout: 30).count == 1)
        TestServices.reportFault(
            "Redis frozen (SIGSTOP): /readyz not ready within 3 s, a job waits and is delivered after",
            notifications: 1, received: simulator.received())
    }

    /// The cleanup consumer's /readyz is a round trip too: Redis frozen, not ready within a few seconds; thawed, ready.
    @Test func cleanupReadinessFollowsAFrozenRedis() throws {
        let (port, redis) = try Self.privateRedis()
        defer { redis.stop() }
        let metricsPort = TestServices.freePort()
        let cleanup = try ExecutablesTests.Child(
            "apns-worker", ["cleanup"],
            environment: [
                "REDIS_URL": "redis://127.0.0.1:\(port)/0", "METRICS_HOST": "127.0.0.1",
                "METRICS_PORT": String(metricsPort),
                "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"),
                "PUSH_DEAD_TOKENS_EXCHANGE": TestServices.unique("dead-x"),
                "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("registrations"),
                "PUSH_FAILED_QUEUE": TestServices.unique("failed")
            ])
        defer { _ = cleanup.stop(SIGKILL) }
        func ready() -> Bool { Self.readiness(metricsPort)?.status == 200 }
        func notReady() -> Bool { Self.notReady(Self.readiness(metricsPort)) }
        #expect(TestServices.waitUntil(ready), "ready once consuming")
        kill(redis.pid, SIGSTOP)
        #expect(TestServices.waitUntil(timeout: 4.5, notReady), "not ready while Redis is frozen")
        kill(redis.pid, SIGCONT)
        #expect(TestServices.waitUntil(timeout: 30, ready), "ready again once Redis answers")
    }

    /// A redis-server of the test's own, on a free port, without persistence: one the test may freeze.
    static func privateRedis() throws -> (port: Int, daemon: TestServices.Daemon) {
        let port = TestServices.freePort()
        let directory = NSTemporaryDirectory() + TestServices.unique("redis-frozen")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let redis = try TestServices.Daemon(
            "/usr/bin/redis-server",
            [
                "--port", String(port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", directory
            ])
        return (port, redis)
    }

    /// /readyz's answer; nil while nothing answers on the port (not listening yet).
    static func readiness(_ port: Int) -> (status: Int, body: String)? {
        try? TestServices.httpGet(port: port, "/readyz")
    }

    /// Not ready is an answer (503 "not ready"), not a program that stopped answering.
    static func notReady(_ answer: (status: Int, body: String)?) -> Bool {
        answer.map { $0.status == 503 && $0.body == "not ready\n" } ?? false
    }
}
