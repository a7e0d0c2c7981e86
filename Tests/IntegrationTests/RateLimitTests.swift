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
        let times = received.map(\.receivedAt).sorted()
        let span = times.last! - times.first!
        // The rate over the run holds within 10%: 500 at 100/s take at least 4.4 s from first to last.
        let rate = Double(times.count - 1) / span
        #expect(rate <= Double(limit) * 1.1, "\(rate) per second over \(span) s")
        // And no one-second span is much busier: slots of a tenth of a second keep bursts near the limit (the
        // margin covers the delay between reserving a permit and the push reaching the simulator on a busy machine).
        var busiest = 0
        var start = 0
        for end in times.indices {
            while times[end] - times[start] >= 1 { start += 1 }
            busiest = max(busiest, end - start + 1)
        }
        #expect(busiest <= limit + limit / 5, "busiest one-second span: \(busiest)")
        print(String(format: "rate limit %d/s, two workers: %.1f/s over %.2f s, busiest one-second span %d", limit, rate, span, busiest))
    }
}
