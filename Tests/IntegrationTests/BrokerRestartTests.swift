import AMQP
import APNs
import APNsSimulator
import Foundation
import Synchronization
import Telemetry
import Testing
import WorkerPipeline

/// Restarts the shared broker, so scripts/test runs this suite alone, after the others (see scripts/test).
@Suite struct BrokerRestartTests {
    @Test func aBrokerRestartMidRunLosesNothing() throws {
        let logger = Logger(label: "restart", level: .critical)
        let jobCount = 500
        let tokens = (0..<jobCount).map { String(format: "%064x", $0 + 1) }
        let delivered = Mutex(Set<String>())
        let someDone = DispatchSemaphore(value: 0)
        let allDone = DispatchSemaphore(value: 0)
        var configuration = APNsSimulator.Configuration()
        configuration.behaviour.latency = 0.01
        configuration.observer = { notification in
            guard notification.status == 200 else { return }
            let count = delivered.withLock { $0.insert(notification.deviceToken); return $0.count }
            if count == 100 { someDone.signal() }
            if count == jobCount { allDone.signal() }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        defer { simulator.shutdown() }
        let jobs = TestServices.unique("jobs")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        try publisher.enablePublisherConfirms()
        var last: UInt64 = 0
        for token in tokens {
            last = try publisher.publish(to: jobs, body: Array(#"{"id": "restart-\#(token.suffix(6))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        publisher.close()

        let workerThread = try WorkerThread(try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            "WORKER_PREFETCH": "50",
        ]), logger: logger)
        defer { workerThread.stop() }

        #expect(someDone.wait(timeout: .now() + 60) == .success)
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        _ = try TestServices.run(rabbitmqctl, ["stop_app"])
        _ = try TestServices.run(rabbitmqctl, ["start_app"])
        #expect(allDone.wait(timeout: .now() + 90) == .success, "\(delivered.withLock { $0.count }) of \(jobCount) delivered")

        // Every job was acknowledged in the end: the durable queue kept them across the restart, none is left.
        var listing = ""
        for _ in 0..<30 {
            listing = try TestServices.run(rabbitmqctl, ["list_queues", "name", "messages", "--quiet"])
            if listing.contains("\(jobs)\t0") { break }
        }
        #expect(listing.contains("\(jobs)\t0"), "\(listing)")
    }
}
