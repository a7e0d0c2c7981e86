import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import Telemetry
import Testing
import WorkerPipeline

/// APNS_RATE_LIMIT is shared through Redis by every worker: two workers together stay within it.
@Suite struct RateLimitTests {
    @Test func twoWorkersShareOneLimit() throws {
        let logger = Logger(label: "rate", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let keyFile = try TestServices.temporaryFile("key.p8", contents: try ES256Key.generatePrivateKeyPEM())
        let jobs = TestServices.unique("jobs")
        let replies = TestServices.unique("replies")
        let limit = 100
        let environment = [
            "AMQP_URL": try TestServices.value("AMQP_URL"),
            // A database of its own, so no other test's traffic shares these rate windows.
            "REDIS_URL": try TestServices.redisURL().withDatabase(9).description(revealingPassword: true),
            "APNS_PRODUCTION_URL": "https://127.0.0.1:\(simulator.port)", "APNS_CA_FILE": caFile,
            "APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "KEY0000001", "APNS_TEAM_ID": "TEAM000001",
            "APNS_TOPIC": "com.example.app", "PUSH_JOBS_QUEUE": jobs,
            "PUSH_DEAD_TOKENS_QUEUE": TestServices.unique("dead"), "PUSH_FAILED_QUEUE": TestServices.unique("failed"),
            "APNS_RATE_LIMIT": String(limit), "WORKER_PREFETCH": "5",
        ]
        let replyReader = try QueueReader(replies)
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        try publisher.declareQueue(jobs)
        for job in 0..<50 {
            let tokens = (0..<10).map { "\"" + String(format: "%064x", job * 10 + $0 + 1) + "\"" }.joined(separator: ",")
            try publisher.publish(to: jobs, body: Array(#"{"id": "rate-\#(job)", "tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8),
                                  properties: AMQPProperties(replyTo: replies))
        }
        let configuration = try WorkerConfiguration.load(from: environment)
        let workers = try (0..<2).map { _ in try Worker(configuration: configuration, logger: logger) }
        let stopped = DispatchSemaphore(value: 0)
        for worker in workers {
            Thread {
                worker.run()
                stopped.signal()
            }.start()
        }
        let summaries = try replyReader.read(50, timeout: 60)
        for worker in workers { worker.stop() }
        for _ in workers { stopped.wait() }

        #expect(summaries.count == 50)
        let received = simulator.received()
        #expect(received.count == 500)
        #expect(workers.allSatisfy { $0.statistics.snapshot().delivered > 0 }, "both workers took part")
        let perSecond = Dictionary(grouping: received, by: { Int($0.receivedAt) }).mapValues(\.count)
        let busiest = perSecond.values.max() ?? 0
        #expect(busiest <= limit + limit / 10, "per-second counts \(perSecond.sorted { $0.key < $1.key }.map(\.value))")
        let span = (received.map(\.receivedAt).max() ?? 0) - (received.map(\.receivedAt).min() ?? 0)
        // Five one-second windows: the first may open at the very end of its second, so at least 3 s pass.
        #expect(span >= 2.9, "500 notifications at 100/s need five windows, took \(span) s")
    }
}
