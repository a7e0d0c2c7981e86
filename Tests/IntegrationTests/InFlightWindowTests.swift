import AMQP
import APNsSimulator
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// A lane hands APNs what its connections can carry and a batch, not WORKER_MAX_IN_FLIGHT, when APNs allows few
/// streams: the rest waits in the worker.
@Suite struct InFlightWindowTests {
    let logger = Logger(label: "in-flight-window", level: .critical)

    @Test func aLaneHandsOverWhatItsConnectionsCarryAndABatch() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.3
        let simulator = try APNsSimulator(
            configuration: .init(maximumConcurrentStreams: 5, behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        defer { publisher.close() }
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_CONNECTIONS": "1", "APNS_MAX_CONNECTIONS": "2", "WORKER_MAX_IN_FLIGHT": "5000",
                    "SHUTDOWN_TIMEOUT": "1"
                ]),
            logger: logger)
        defer { workerThread.stop() }
        // The job goes out once the worker is up and knows APNs's stream limit (its connection, opened at start, has
        // the server's SETTINGS; before, it counts 100 streams a connection). Published before the worker started,
        // the job could be sent whole before the wait below began: 600 sent and none in flight, in one full run.
        let sender = workerThread.worker.sender
        #expect(
            TestServices.waitUntil(timeout: 60) { sender.streamCapacity(.urgent).map { $0 <= 10 } == true },
            "stream capacity: \(sender.streamCapacity(.urgent).map(String.init) ?? "unknown")")
        let tokens = (0..<600).map { "\"" + String(format: "%064x", 0xF1000 + $0) + "\"" }.joined(separator: ",")
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "window", "tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8))
        // Two connections of five streams: 10, and a batch of 256 waiting for them; the job's other notifications
        // wait in the worker (with 5,000 allowed, all 600 would be handed over).
        let statistics = workerThread.worker.statistics
        // Once the worker sends, the lane holds 266 for ten seconds or more (ten answers each 0.3 s, 334 more to
        // hand over); the deadline is for a worker that starts late on a machine busy with the whole suite.
        #expect(
            TestServices.waitUntil(timeout: 60) { statistics.inFlight.counts.urgent == 266 },
            """
            in flight: \(statistics.inFlight.counts.urgent), sent: \(statistics.sent[.urgent]), \
            worker's error: \(workerThread.error.map { "\($0)" } ?? "none")
            """)
        #expect(statistics.inFlight.counts.urgent <= 266)
    }
}
