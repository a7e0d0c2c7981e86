import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import Telemetry
import Testing
import WorkerPipeline
#if canImport(Glibc)
import Glibc
#endif

/// APNS_RATE_LIMIT is shared through Redis by every worker: two worker processes together stay within it.
@Suite struct RateLimitTests {
    @Test func twoWorkersShareOneLimit() throws {
        let logger = Logger(label: "rate", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let limit = 100
        let environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            // A database of its own, so no other test's traffic shares these rate slots.
            "REDIS_URL": try TestServices.redisURL().withDatabase(9).description(revealingPassword: true),
            "APNS_RATE_LIMIT": String(limit), "WORKER_PREFETCH": "5",
        ])
        for job in 0..<50 {
            let tokens = (0..<10).map { "\"" + String(format: "%064x", job * 10 + $0 + 1) + "\"" }.joined(separator: ",")
            try publisher.publish(to: jobs, body: Array(#"{"id": "rate-\#(job)", "tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8),
                                  properties: AMQPProperties(replyTo: replies))
        }
        // Two apns-worker processes, as operators scale them.
        let workers = try (0..<2).map { _ in
            try ExecutablesTests.Child("apns-worker", ["run"], environment: environment.merging(["LOG_LEVEL": "info"]) { _, new in new })
        }
        for worker in workers { #expect(worker.waitForLine(containing: "\"consuming\"") != nil) }
        let summaries = try replyReader.read(50, timeout: 60)
        for worker in workers { #expect(worker.stop(SIGTERM) == 0) }

        #expect(summaries.count == 50)
        let received = simulator.received()
        #expect(received.count == 500)
        #expect(Set(received.map(\.connectionID)).count >= 2, "both workers took part")
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
        #expect(busiest <= limit + limit / 2, "busiest one-second span: \(busiest)")
        print(String(format: "rate limit %d/s, two workers: %.1f/s over %.2f s, busiest one-second span %d", limit, rate, span, busiest))
    }
}
