import AMQP
import APNs
import APNsSimulator
import Foundation
import Synchronization
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// SIGTERM finishes the jobs under way; a second signal exits at once and leaves them to the broker.
@Suite struct ShutdownTests {
    let logger = Logger(label: "shutdown", level: .critical)

    /// The semaphore is signalled once, when APNs has received `signalAfter` pushes.
    func setUp(latency: Double, signalAfter: Int = 1) throws -> (
        APNsSimulator, [String: String], String, QueueReader, DispatchSemaphore
    ) {
        let pushesReceived = DispatchSemaphore(value: 0)
        let seen = Atomic<Int>(0)
        var configuration = APNsSimulator.Configuration()
        configuration.behaviour.latency = latency
        configuration.observer = { _ in
            if seen.add(1, ordering: .relaxed).newValue == signalAfter { pushesReceived.signal() }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for job in 0..<20 {
            last = try publisher.publish(
                to: jobs,
                body: Array(
                    #"{"id": "\#(jobs)-\#(job)", "tokens": ["\#(String(format: "%064x", job + 1))"], "payload": {"aps": {}}}"#
                        .utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "LOG_LEVEL": "info"
            ])
        return (simulator, environment, jobs, replyReader, pushesReceived)
    }

    /// SIGTERM comes once all 20 pushes are on their way to APNs (each answered after 0.5 s), so all 20 jobs are under
    /// way. (Deliveries still unread when the signal comes are left to the broker, which requeues them: the second test.)
    @Test func sigtermFinishesTheJobsUnderWay() throws {
        let (simulator, environment, jobs, replyReader, allPushesSent) = try setUp(latency: 0.5, signalAfter: 20)
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(allPushesSent.wait(timeout: .now() + 30) == .success)
        #expect(worker.stop(SIGTERM) == 0, "drained and exited 0")
        #expect(try replyReader.read(20, timeout: 5).count == 20, "every job under way finished before the exit")
        #expect(try AMQPConnection(url: TestServices.amqpURL()).declareQueue(jobs) == 0)
    }

    @Test func aSecondSignalExitsAtOnceAndTheBrokerKeepsTheJobs() throws {
        let (simulator, environment, jobs, _, firstPush) = try setUp(latency: 30)
        defer { simulator.shutdown() }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(firstPush.wait(timeout: .now() + 30) == .success)
        kill(worker.process.processIdentifier, SIGTERM)
        #expect(worker.waitForLine(containing: "finishing jobs under way") != nil)
        let started = Date()
        #expect(worker.stop(SIGTERM) == 1, "the second signal exits with 1")
        #expect(Date().timeIntervalSince(started) < 10, "at once, not after the 30 s the answers would take")
        #expect(
            try AMQPConnection(url: TestServices.amqpURL()).declareQueue(jobs) == 20,
            "all 20 jobs are back in the queue")
    }

    /// With a one-second heartbeat the broker drops a connection after about two silent seconds; an idle worker
    /// keeps beating, so its connection outlives a longer idle spell.
    @Test func anIdleWorkerKeepsItsHeartbeat() throws {
        let (simulator, environment, jobs, replyReader, _) = try setUp(latency: 0)
        defer { simulator.shutdown() }
        // Drain the 20 queued jobs first; then the worker sits idle.
        let worker = try ExecutablesTests.Child(
            "apns-worker", ["run"], environment: environment.merging(["AMQP_HEARTBEAT": "1"]) { _, new in new })
        defer { _ = worker.stop(SIGTERM) }
        #expect(try replyReader.read(20).count == 20)
        // The broker's view of the worker's connections, now idle: each must still be running, with more bytes
        // received from the worker, once longer than the broker tolerates silence (two heartbeats) has passed.
        let before = try brokerConnections(of: worker.process.processIdentifier)
        try #require(
            !before.isEmpty && before.values.allSatisfy { $0.timeout == 1 }, "the worker's connections: \(before)")
        let idleSince = Date()
        var after = before
        let keptAlive = try TestServices.waitUntil(timeout: 20) {
            after = try brokerConnections(of: worker.process.processIdentifier)
            return Date().timeIntervalSince(idleSince) > 3
                && before.allSatisfy { port, earlier in
                    after[port].map { $0.state == "running" && $0.received > earlier.received } ?? false
                }
        }
        #expect(
            keptAlive,
            "an idle worker's connections outlive the broker's 2 s of tolerated silence: \(before) then \(after)")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "after-idle", "tokens": ["\#(String(repeating: "3d", count: 32))"], "payload": {"aps": {}}}"#
                    .utf8),
            properties: AMQPProperties(replyTo: replyReader.queue))
        #expect(
            try replyReader.read(1).first.map { String(decoding: $0.body, as: UTF8.self).contains("after-idle") }
                == true)
        #expect(worker.waitForLine(containing: "reconnecting", timeout: 1) == nil, "no reconnection was needed")
    }

    /// The broker's connections from process `pid`, by the process's local port: heartbeat timeout, state, and
    /// bytes received from it so far.
    func brokerConnections(of pid: Int32) throws -> [Int: (timeout: Int, state: String, received: Int)] {
        let ports = Self.localTCPPorts(of: pid)
        let listing = try TestServices.run(
            try TestServices.value("RABBITMQCTL"),
            ["list_connections", "peer_port", "timeout", "state", "recv_oct", "--quiet"])
        var connections: [Int: (timeout: Int, state: String, received: Int)] = [:]
        for line in listing.split(separator: "\n") {
            let fields = line.split(separator: "\t").map(String.init)
            guard fields.count == 4, let port = Int(fields[0]), ports.contains(port),
                let timeout = Int(fields[1]), let received = Int(fields[3])
            else { continue }
            connections[port] = (timeout, fields[2], received)
        }
        return connections
    }

    /// The local ports of the TCP sockets process `pid` holds: its descriptors' socket inodes, found in the
    /// kernel's TCP tables.
    static func localTCPPorts(of pid: Int32) -> Set<Int> {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        let inodes = Set(
            descriptors.compactMap { descriptor -> String? in
                guard
                    let target = try? FileManager.default.destinationOfSymbolicLink(
                        atPath: "/proc/\(pid)/fd/\(descriptor)"),
                    target.hasPrefix("socket:[")
                else { return nil }
                return String(target.dropFirst("socket:[".count).dropLast())
            })
        var ports: Set<Int> = []
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            // Read to the end: String(contentsOfFile:) stops after the first page of a /proc file.
            let text = String(
                decoding: FileHandle(forReadingAtPath: table)?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
            for row in text.split(separator: "\n").dropFirst() {
                // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
                let columns = row.split(separator: " ")
                guard columns.count > 9, inodes.contains(String(columns[9])),
                    let port = columns[1].split(separator: ":").last.flatMap({ Int($0, radix: 16) })
                else { continue }
                ports.insert(port)
            }
        }
        return ports
    }
}
