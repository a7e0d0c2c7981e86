import AMQP
import APNs
import APNsSimulator
import Configuration
import Foundation
import HTTP2
import Redis
import TLS
import Telemetry
import Testing
import Threads
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

/// The real servers scripts/test starts. A missing one is a failure, never a skip.
enum TestServices {
    struct Missing: Error, CustomStringConvertible {
        let variable: String
        var description: String {
            "\(variable) is not set: run the tests through scripts/test, which starts the real servers"
        }
    }

    static func value(_ variable: String) throws -> String {
        guard let value = ProcessInfo.processInfo.environment[variable], !value.isEmpty else {
            throw Missing(variable: variable)
        }
        return value
    }

    static func amqpURL() throws -> AMQPURL { try AMQPURL(value("AMQP_URL")) }
    static func redisURL() throws -> RedisURL { try RedisURL(value("REDIS_URL")) }

    /// Redis databases a test holds alone (others: 8 to 15, each named where it is used; scripts/test starts Redis
    /// with 32). The fleet's invalidation window and the rate limit are one per Redis database, and a test that sends
    /// waves of 400 mismatches or runs under a rate limit of its own must not meet another test's there.
    enum IsolatedDatabase: Int {
        case wrongEnvironmentCampaign = 16
        case siblingTopicCampaign, genuineTokens, waveOverOneUserJobs, healthyOneUserJobs, diluted, rollingRestarts
        case bulkSuspect, hundredThousandUsers, migrationSource, statsWatch, prometheus, cancelledCampaign
    }

    /// The REDIS_URL of `database`, emptied, with a connection to it.
    static func isolatedRedis(_ database: IsolatedDatabase) throws -> (url: String, connection: RedisConnection) {
        let url = try redisURL().withDatabase(database.rawValue)
        let connection = try RedisConnection(url: url)
        _ = try connection.command(["FLUSHDB"])
        return (url.description(revealingPassword: true), connection)
    }

    /// What `script` printed, run by Debian's python3 (which has pika; another python3 on PATH may not) with
    /// `arguments`; a script that fails fails the test.
    static func python(_ script: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script] + arguments
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "python3: \(text)")
        return text
    }

    /// Names no other test (or earlier run) uses: queues, keys, and the ids of jobs whose delivery may come again (the
    /// fleet's records of settled jobs are keyed by id, and a redelivery of an id another test settled is skipped).
    static func unique(_ prefix: String) -> String { "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())" }

    /// A port nothing listens on right now (bound to 0, read, released).
    static func freePort() -> Int {
        let (descriptor, port) = listeningSocket()
        close(descriptor)
        return port
    }

    /// A socket listening on 127.0.0.1 at a port the kernel picks, never accepting: connections wait in its backlog.
    static func listeningSocket() -> (descriptor: Int32, port: Int) {
        // Loopback with a port of the kernel's choosing cannot fail short of running out of descriptors.
        try! ListeningSocket.open(host: "127.0.0.1", port: 0, backlog: 8)
    }

    /// `GET path` over plain HTTP/1.1 on 127.0.0.1 (or `version` 1.0, for servers that keep 1.1 connections open
    /// and chunk their answers); returns the status code and the body.
    static func httpGet(port: Int, _ path: String, version: String = "1.1") throws -> (status: Int, body: String) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw CommandFailed(description: "cannot connect to 127.0.0.1:\(port)") }
        let request = Array("GET \(path) HTTP/\(version)\r\nHost: localhost\r\n\r\n".utf8)
        _ = request.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count <= 0 { break }
            response += buffer[..<count]
        }
        let text = String(decoding: response, as: UTF8.self)
        let status = Int(text.split(separator: " ").dropFirst().first ?? "") ?? 0
        let body = text.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        return (status, body)
    }

    /// Another program's server, output discarded; `stop` kills and reaps it.
    final class Daemon {
        private let process = Process()
        var pid: Int32 { process.processIdentifier }

        /// `output`: a file that takes what the daemon prints on its standard output (discarded by default).
        init(_ path: String, _ arguments: [String], output: String? = nil) throws {
            process.executableURL = URL(fileURLWithPath: path)
            process.arguments = arguments
            process.standardInput = FileHandle.nullDevice
            if let output {
                guard FileManager.default.createFile(atPath: output, contents: nil),
                    let file = FileHandle(forWritingAtPath: output)
                else { throw CommandFailed(description: "cannot write \(output)") }
                process.standardOutput = file
            } else {
                process.standardOutput = FileHandle.nullDevice
            }
            process.standardError = FileHandle.nullDevice
            try process.run()
        }

        private var stopped = false

        /// Idempotent: a second call does nothing.
        func stop() {
            guard !stopped else { return }
            stopped = true
            kill(process.processIdentifier, SIGKILL)
            var status: Int32 = 0
            waitpid(process.processIdentifier, &status, 0)
        }
    }

    /// Runs a command to its end and returns what it printed; a non-zero exit is an error naming the output.
    struct CommandFailed: Error, CustomStringConvertible {
        let description: String
    }

    static func run(_ path: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        exited.wait()
        guard process.terminationStatus == 0 else {
            throw CommandFailed(description: "\(path) \(arguments.joined(separator: " ")): \(text)")
        }
        return text
    }

    /// A self-signed certificate and its key written as cert.pem and key.pem into a new directory.
    static func certificateDirectory(_ name: String) throws -> String {
        let directory = NSTemporaryDirectory() + unique(name)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let pair = try SelfSignedCertificate.generate()
        try pair.certificatePEM.write(toFile: directory + "/cert.pem", atomically: true, encoding: .utf8)
        try pair.privateKeyPEM.write(toFile: directory + "/key.pem", atomically: true, encoding: .utf8)
        return directory
    }

    /// A jobs queue and a reply queue of the test's own: the jobs queue declared with a publisher connected, and a
    /// reader on the reply queue (jobs published with `reply_to` = `replies` report there).
    static func jobQueues() throws -> (
        jobs: String, replies: String, replyReader: QueueReader, publisher: AMQPConnection
    ) {
        let jobs = unique("jobs")
        let replies = unique("replies")
        let replyReader = try QueueReader(replies)
        let publisher = try AMQPConnection(url: amqpURL())
        try publisher.declareQueue(jobs)
        return (jobs, replies, replyReader, publisher)
    }

    /// Checks that a fault scenario lost nothing and prints its line (`scripts/chaos` gathers them into a table):
    /// the notifications it asked for (one device token each), the pushes APNs (apns-sim) accepted, the distinct
    /// tokens among them, and so the duplicates and the losses. `parked` counts notifications settled otherwise on
    /// purpose (parked on the failed queue, or failed for good), which are not lost.
    static func reportFault(_ scenario: String, notifications: Int, received: [ReceivedNotification], parked: Int = 0) {
        let accepted = received.filter { $0.status == 200 }
        let distinct = Set(accepted.map(\.deviceToken)).count
        let lost = notifications - distinct - parked
        #expect(lost == 0, "\(scenario): \(lost) of \(notifications) notifications lost")
        print(
            "fault | \(scenario) | \(notifications) | \(accepted.count) | \(distinct) | \(accepted.count - distinct) | "
                + "\(parked) | \(lost)")
    }

    /// Polls `condition` (every 10 ms) until it holds or `timeout` seconds pass; returns whether it held. For
    /// state only visible by looking (a counter), never as a pause: the caller checks what it waited for.
    static func waitUntil(timeout: Double = 20, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if try condition() { return true }
            usleep(10_000)
        }
        return try condition()
    }

    /// Polls `condition` (every 10 ms) until it holds, for as long as `progress` keeps changing: returns false once
    /// `stall` seconds pass with neither. For long work that shows how far it is (notifications received), whose
    /// length depends on the machine: a sanitizer build or a busy machine is several times slower, and a fixed
    /// deadline would fail it while it was still moving; a stalled run still fails within `stall` seconds.
    static func waitWhileProgressing<Progress: Equatable>(
        stall: Double = 30, progress: () throws -> Progress,
        until condition: () throws -> Bool
    ) rethrows -> Bool {
        var last = try progress()
        var deadline = Date().addingTimeInterval(stall)
        while Date() < deadline {
            if try condition() { return true }
            usleep(10_000)
            let now = try progress()
            if now != last {
                last = now
                deadline = Date().addingTimeInterval(stall)
            }
        }
        return try condition()
    }

    /// Owner-only (0600), as key files should be: the worker warns about keys others can read.
    static func temporaryFile(_ name: String, contents: String) throws -> String {
        let path = NSTemporaryDirectory() + unique(name)
        try contents.write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        return path
    }
}

extension RedisURL {
    func withDatabase(_ database: Int) -> RedisURL {
        var copy = self
        copy.database = database
        return copy
    }

    func description(revealingPassword: Bool) -> String {
        let credentials = password.map { "\(user ?? ""):\($0)@" } ?? ""
        return "redis://\(credentials)\(host):\(port)/\(database)"
    }
}

/// A test's own view of a queue: declares it, reads it with real blocking waits (no sleeps).
final class QueueReader {
    let connection: AMQPConnection
    let queue: String

    init(_ queue: String, url: AMQPURL? = nil, arguments: [String: AMQPArgument] = [:]) throws {
        self.queue = queue
        connection = try AMQPConnection(url: url ?? TestServices.amqpURL())
        try connection.declareQueue(queue, arguments: arguments)
        try connection.consume(queue)
    }

    /// The next `count` messages, each acknowledged; fewer if `timeout` seconds pass without one.
    func read(_ count: Int, timeout: Double = 20) throws -> [AMQPDelivery] {
        var messages: [AMQPDelivery] = []
        let deadline = Date().addingTimeInterval(timeout)
        while messages.count < count {
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { break }
            guard let event = try connection.nextEvent(timeout: remaining) else { continue }
            if case .delivery(let delivery) = event {
                try connection.ack(delivery.deliveryTag)
                messages.append(delivery)
            }
        }
        return messages
    }
}

/// A Worker on its own thread, as apns-worker runs it. `stop()` drains, waits, and may be called more than once.
/// A worker whose `run()` throws fails the test that ran it: `stop()` records the error (the first call does), and
/// `error` tells a test that expects one what it was.
final class WorkerThread {
    let service: ReloadableWorker
    var worker: Worker { service.worker }
    private let stopped = DispatchSemaphore(value: 0)
    private let thrown = Locked<(any Error)?>(nil)
    private var isStopped = false

    /// A worker on `jobs` that parks on `failed` after `attempts` attempts, `delays` (APNS_RETRY_DELAYS) apart.
    static func retrying(
        simulator: APNsSimulator, jobs: String, failed: String, attempts: Int = 3, delays: String = "0.05",
        logger: Logger
    ) throws -> WorkerThread {
        try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                ["PUSH_FAILED_QUEUE": failed, "APNS_MAX_ATTEMPTS": String(attempts), "APNS_RETRY_DELAYS": delays]),
            logger: logger)
    }

    init(_ environment: [String: String], logger: Logger) throws {
        let configuration = try WorkerConfiguration.load(from: environment)
        service = try configuration.makeWorker(logger: logger) { configuration }
        let worker = self.service
        let stopped = self.stopped
        let thrown = self.thrown
        Thread {
            do { try worker.run() } catch { thrown.withLock { $0 = error } }
            stopped.signal()
        }.start()
    }

    /// What `run()` threw, once it has returned; nil while it runs or when it returned normally.
    var error: (any Error)? { thrown.withLock { $0 } }

    /// Stops the worker and waits for `run()` to return: an error it threw, or a worker that does not return within
    /// `timeout` seconds, is an issue of the calling test.
    func stop(timeout: Double = 120, sourceLocation: SourceLocation = #_sourceLocation) {
        guard !isStopped else { return }
        isStopped = true
        worker.stop()
        guard stopped.wait(timeout: .now() + timeout) == .success else {
            Issue.record("the worker did not stop within \(timeout) s", sourceLocation: sourceLocation)
            return
        }
        if let error { Issue.record("the worker's run() threw: \(error)", sourceLocation: sourceLocation) }
    }
}

extension TestServices {
    /// Token authentication with a fresh key, as key KEY0000001 of team TEAM000001.
    static func tokenAuthentication() throws -> APNsAuthentication {
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        return .token(try APNsTokenProvider(key: key, keyID: "KEY0000001", teamID: "TEAM000001"))
    }

    /// The contract's variables for a worker sending to `simulator` and consuming `jobs`, with a fresh key and
    /// queues of its own; `extra` overrides.
    static func workerEnvironment(
        simulator: APNsSimulator, jobs: String,
        _ extra: [String: String] = [:]
    ) throws -> [String: String] {
        [
            "AMQP_URL": try value("AMQP_URL"), "REDIS_URL": try value("REDIS_URL"),
            "APNS_PRODUCTION_URL": "https://127.0.0.1:\(simulator.port)",
            "APNS_SANDBOX_URL": "https://127.0.0.1:\(simulator.port)",
            "APNS_CA_FILE": try temporaryFile("ca.pem", contents: simulator.certificatePEM),
            "APNS_KEY_FILE": try temporaryFile("key.p8", contents: try ES256Key.generatePrivateKeyPEM()),
            "APNS_KEY_ID": "KEY0000001", "APNS_TEAM_ID": "TEAM000001", "APNS_TOPIC": "com.example.app",
            "PUSH_JOBS_QUEUE": jobs, "PUSH_BULK_QUEUE": unique("bulk"), "PUSH_DEAD_TOKENS_QUEUE": unique("dead"),
            "PUSH_FAILED_QUEUE": unique("failed"),
            // Many workers run side by side in the tests: none takes the default metrics port.
            "METRICS_PORT": "0"
        ].merging(extra) { _, new in new }
    }
}

/// SplitMix64: a small, fast random generator that gives the same sequence for the same seed on every machine, so
/// that a fuzzer's finding can be replayed from the seed it prints (FuzzTests, HostileServerTests).
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
