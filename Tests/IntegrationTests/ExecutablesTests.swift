import AMQP
import APNs
import APNsSimulator
import Foundation
import HTTP2
import Redis
import RedisStore
import Synchronization
import Telemetry
import Testing
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

/// The built executables as operators run them: apns-sim and apns-worker as processes, configured only by the
/// contract's flags and environment variables, against the real broker and Redis.
@Suite struct ExecutablesTests {
    /// A child process whose output is read line by line with blocking reads.
    final class Child {
        let process = Process()
        private let output = Pipe()
        private var buffer: [UInt8] = []
        private let exited = DispatchSemaphore(value: 0)

        /// With `input`, the child reads its standard input from `write(_:)` until `closeInput()`.
        let input: Pipe?

        init(
            _ executable: String, _ arguments: [String], environment: [String: String] = [:], unset: [String] = [],
            input: Bool = false
        ) throws {
            self.input = input ? Pipe() : nil
            let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
            let path = directory + "/" + executable
            guard FileManager.default.isExecutableFile(atPath: path) else {
                throw TestServices.Missing(variable: "\(path) (build the package first)")
            }
            process.executableURL = URL(fileURLWithPath: path)
            process.arguments = arguments
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
                .filter { !unset.contains($0.key) }
            process.standardOutput = output
            process.standardError = output
            if let input = self.input { process.standardInput = input }
            // Foundation reaps the child itself, so its exit is learned here rather than from waitpid.
            process.terminationHandler = { [exited] _ in exited.signal() }
            try process.run()
        }

        /// Reads output until a line contains `text`; returns that line (nil at end of output). After `timeout`
        /// seconds without it the child is killed, which ends its output: a broken run fails instead of hanging.
        func waitForLine(containing text: String, timeout: Double = 60) -> String? {
            let found = Atomic<Bool>(false)
            let pid = process.processIdentifier
            DispatchQueue.global().asyncAfter(deadline: .now() + timeout) {
                if !found.load(ordering: .acquiring) { kill(pid, SIGKILL) }
            }
            defer { found.store(true, ordering: .releasing) }
            while true {
                if let newline = buffer.firstIndex(of: 10) {
                    let line = String(decoding: buffer[..<newline], as: UTF8.self)
                    buffer.removeSubrange(...newline)
                    if line.contains(text) { return line }
                    continue
                }
                let chunk = output.fileHandleForReading.availableData
                if chunk.isEmpty { return nil }
                buffer.append(contentsOf: chunk)
            }
        }

        func write(_ text: String) { input?.fileHandleForWriting.write(Data(text.utf8)) }

        func closeInput() { try? input?.fileHandleForWriting.close() }

        /// Sends `signal` and waits for the exit: the exit code, or minus the signal that ended it.
        func stop(_ signal: Int32 = SIGTERM) -> Int32 {
            if process.isRunning { kill(process.processIdentifier, signal) }
            return waitForExit()
        }

        func waitForExit() -> Int32 {
            guard exited.wait(timeout: .now() + 60) == .success else { return Int32.min }
            exited.signal()  // later callers see the exit too
            return process.terminationReason == .uncaughtSignal ? -process.terminationStatus : process.terminationStatus
        }
    }

    @Test func workerAndSimulatorProcessesCarryJobsEndToEnd() throws {
        let directory = NSTemporaryDirectory() + TestServices.unique("executables")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let keyFile = directory + "/AuthKey.p8"
        try ES256Key.generatePrivateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: keyFile)
        let deadToken = String(repeating: "de", count: 32)
        let liveToken = String(repeating: "a0", count: 32)

        let simulator = try Child(
            "apns-sim",
            [
                "--port", "0", "--write-cert", directory + "/sim.pem",
                "--unregistered", "\(deadToken)@1732900000999",
                "--trust-key", "KEY0000001:TEAM000001:\(keyFile)"
            ])
        let listening = try #require(simulator.waitForLine(containing: "listening on"))
        let port = try #require(listening.split(separator: ":").last.map(String.init))
        defer { _ = simulator.stop() }

        let user = TestServices.unique("carol")
        let redis = try RedisConnection(url: TestServices.redisURL())
        _ = try redis.command(["HSET", RedisKeys.node.tokens(user), liveToken, "production", deadToken, "production"])

        let jobs = TestServices.unique("jobs")
        let dead = TestServices.unique("dead")
        let failed = TestServices.unique("failed")
        let deadReader = try QueueReader(dead)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)

        let metricsPort = TestServices.freePort()
        let worker = try Child(
            "apns-worker", ["run"],
            environment: [
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(metricsPort),
                "APNS_PRODUCTION_URL": "https://127.0.0.1:\(port)", "APNS_CA_FILE": directory + "/sim.pem",
                "APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "KEY0000001", "APNS_TEAM_ID": "TEAM000001",
                "APNS_TOPIC": "com.example.app", "PUSH_JOBS_QUEUE": jobs, "PUSH_DEAD_TOKENS_QUEUE": dead,
                "PUSH_FAILED_QUEUE": failed, "LOG_LEVEL": "info"
            ])
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "proc-1", "users": ["\#(user)"], "payload": {"aps": {"alert": "Hi"}}}"#.utf8)
        )

        let events = try deadReader.read(1)
        let event = try JSONSerialization.jsonObject(with: Data(try #require(events.first).body)) as! [String: Any]
        #expect(event["token"] as? String == deadToken)
        #expect(event["user"] as? String == user)
        #expect((event["timestamp"] as? NSNumber)?.int64Value == 1_732_900_000_999)
        #expect(event["job_id"] as? String == "proc-1")

        // The operator's view of the same run.
        let metrics = try TestServices.httpGet(port: metricsPort, "/metrics")
        #expect(metrics.status == 200)
        #expect(metrics.body.contains("apns_worker_notifications_total{outcome=\"delivered\"} 1"), "\(metrics.body)")
        #expect(metrics.body.contains("apns_worker_notifications_total{outcome=\"dead_token\"} 1"))
        let openConnections = metrics.body.firstMatch(of: /apns_worker_apns_connections (\d+)/).flatMap { Int($0.1) }
        #expect((openConnections ?? 0) >= 1, "APNs connections are counted")
        #expect(metrics.body.contains("apns_worker_ready 1"))
        #expect(
            metrics.body.contains("apns_worker_apns_responses_total{status=\"200\",reason=\"\"} 1"), "\(metrics.body)")
        #expect(metrics.body.contains("apns_worker_apns_responses_total{status=\"410\",reason=\"Unregistered\"} 1"))
        #expect(metrics.body.contains("apns_worker_apns_latency_seconds_count 2"), "both answers timed")
        #expect(metrics.body.contains("apns_worker_apns_latency_seconds_bucket{le=\"+Inf\"} 2"))
        #expect(metrics.body.contains("apns_worker_apns_in_flight 0"))
        #expect(try TestServices.httpGet(port: metricsPort, "/healthz").status == 200)
        #expect(try TestServices.httpGet(port: metricsPort, "/readyz").status == 200)
        #expect(try TestServices.httpGet(port: metricsPort, "/nothing").status == 404)

        #expect(worker.stop(SIGTERM) == 0, "SIGTERM drains and exits 0")
        #expect(simulator.stop(SIGTERM) == 0)
        let summary = simulator.waitForLine(containing: "apns-sim received")
        #expect(summary?.contains("200=1") == true, "\(summary ?? "no summary")")
        #expect(summary?.contains("410=1") == true, "\(summary ?? "no summary")")
    }

    /// A client certificate that expires within 30 days: a warning in the worker's log at start, and its expiry in
    /// /metrics (apns_worker_certificate_expiry_timestamp_seconds{topic}).
    @Test func aCertificateNearItsExpiryIsWarnedAboutAndInTheMetrics() throws {
        let pair = try SelfSignedCertificate.generate(commonName: "push", days: 10)
        let certificate = try TestServices.temporaryFile("cert.pem", contents: pair.certificatePEM + pair.privateKeyPEM)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: certificate)
        // A second certificate, in the credentials file, for another app.
        let other = try SelfSignedCertificate.generate(commonName: "com.other.app", days: 20)
        let otherFile = try TestServices.temporaryFile(
            "other.pem", contents: other.certificatePEM + other.privateKeyPEM)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: otherFile)
        let credentials = try TestServices.temporaryFile(
            "credentials.json",
            contents:
                #"{"credentials": [{"cert_file": "\#(otherFile)", "topics": ["com.other.app", "com.other.driver"]}]}"#)
        let metricsPort = TestServices.freePort()
        let worker = try Child(
            "apns-worker", ["run"],
            environment: [
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(metricsPort), "APNS_CERT_FILE": certificate,
                "APNS_CREDENTIALS_FILE": credentials,
                // Nothing listens there: the worker runs, its APNs connections back off.
                "APNS_PRODUCTION_URL": "https://127.0.0.1:9", "APNS_SANDBOX_URL": "https://127.0.0.1:9",
                "APNS_TOPIC": "com.example.app", "PUSH_JOBS_QUEUE": TestServices.unique("jobs"), "LOG_LEVEL": "info"
            ])
        defer { _ = worker.stop() }
        let firstWarning = worker.waitForLine(containing: "certificate expires in")
        let secondWarning = worker.waitForLine(containing: "certificate expires in")
        #expect(
            firstWarning?.contains("expires in 19 days") == true
                && firstWarning?.contains("com.other.app,com.other.driver") == true,
            "\(firstWarning ?? "no warning")")
        #expect(
            secondWarning?.contains("expires in 9 days") == true && secondWarning?.contains("com.example.app") == true,
            "\(secondWarning ?? "no warning")")
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        let metrics = try TestServices.httpGet(port: metricsPort, "/metrics").body
        func expiry(_ topic: String) -> Double? {
            metrics.split(separator: "\n").first {
                $0.hasPrefix("apns_worker_certificate_expiry_timestamp_seconds{topic=\"\(topic)\"} ")
            }
            .flatMap { Double($0.split(separator: " ").last ?? "") }
        }
        for (topic, days) in [("com.example.app", 10.0), ("com.other.app", 20), ("com.other.driver", 20)] {
            #expect(
                expiry(topic).map { abs($0 - Date().timeIntervalSince1970 - days * 86_400) < 120 } == true,
                "\(topic): \(metrics)")
        }
    }

    @Test func aFlagOverridesTheEnvironmentAndTheConfigFile() throws {
        let file = try TestServices.temporaryFile(
            "worker.env", contents: "APNS_KEY_ID=FROMFILE01\nAPNS_TEAM_ID=TEAM000001\n")
        let worker = try Child(
            "apns-worker", ["run", "--config", file, "--set", "APNS_KEY_ID=short"],
            environment: [
                "APNS_KEY_FILE": try TestServices.temporaryFile(
                    "key.p8", contents: try ES256Key.generatePrivateKeyPEM()),
                "APNS_KEY_ID": "FROMENV001"
            ])
        let line = worker.waitForLine(containing: "configuration error")
        #expect(line?.contains("APNS_KEY_ID") == true, "the flag's bad value is the one reported: \(line ?? "")")
        #expect(worker.waitForExit() == 78)
    }

    @Test func badConfigurationStopsStartupWithTheKeyNamed() throws {
        let worker = try Child(
            "apns-worker", [],
            environment: [
                "APNS_KEY_FILE": "/nonexistent.p8", "APNS_KEY_ID": "KEY0000001",
                "APNS_TEAM_ID": "TEAM000001"
            ])
        let line = worker.waitForLine(containing: "APNS_KEY_FILE")
        #expect(line?.contains("configuration error") == true)
        #expect(worker.waitForExit() == 78)
    }

    /// Scaling by running more processes on one host, with only the contract's variables: both workers consume, and
    /// each one's /metrics answers at the address its log names (the default port, or a free one when another
    /// worker has it). A port someone set that is taken stops start-up (78).
    @Test func twoWorkersOnOneHostWithDefaultSettingsBothRun() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: Logger(label: "sim", level: .critical))
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        var environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, ["LOG_LEVEL": "info"])
        environment.removeValue(forKey: "METRICS_PORT")  // the default, as the contract leaves it
        var workers: [Child] = []
        defer { for worker in workers { _ = worker.stop(SIGKILL) } }
        var addresses: [Int] = []
        for _ in 0..<2 {
            // The child inherits the test process's environment: make sure METRICS_PORT is not set there either.
            let worker = try Child("apns-worker", ["run"], environment: environment, unset: ["METRICS_PORT"])
            workers.append(worker)
            let line = try #require(worker.waitForLine(containing: "metrics and health endpoint"))
            let port = try #require(line.firstMatch(of: /"http.address":"[^"]*:(\d+)"/).flatMap { Int($0.1) })
            addresses.append(port)
            #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        }
        #expect(Set(addresses).count == 2, "each its own port: \(addresses)")
        for port in addresses {
            let metrics = try TestServices.httpGet(port: port, "/metrics")
            #expect(metrics.status == 200 && metrics.body.contains("apns_worker_ready"), "\(port)")
        }
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        let replies = TestServices.unique("replies")
        let replyReader = try QueueReader(replies)
        for job in 0..<20 {
            try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"tokens": ["\#(String(format: "%064x", 0x2B_0000 + job))"], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(try replyReader.read(20).count == 20)
        for worker in workers { #expect(worker.stop() == 0) }

        let taken = addresses[0]
        let blocker = try ListeningSocket.open(host: "127.0.0.1", port: taken)
        defer { close(blocker.descriptor) }
        let explicit = try Child(
            "apns-worker", ["run"],
            environment: environment.merging([
                "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(taken)
            ]) { _, new in new })
        let refusal = explicit.waitForLine(containing: "configuration error")
        #expect(refusal?.contains("METRICS_PORT") == true, "\(refusal ?? "no line")")
        #expect(explicit.waitForExit() == 78)

        // An address this machine does not have (TEST-NET-1) is the host's fault, and named so.
        let nowhere = try Child(
            "apns-worker", ["run"],
            environment: environment.merging(["METRICS_HOST": "192.0.2.1", "METRICS_PORT": "9"]) { _, new in new })
        let unusable = nowhere.waitForLine(containing: "configuration error")
        #expect(unusable?.contains("METRICS_HOST: cannot listen on 192.0.2.1:9") == true, "\(unusable ?? "no line")")
        #expect(nowhere.waitForExit() == 78)
    }
}
