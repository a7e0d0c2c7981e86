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
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                // A database of its own, so no other test's traffic shares these rate slots.
                "REDIS_URL": try TestServices.redisURL().withDatabase(9).description(revealingPassword: true),
                "APNS_RATE_LIMIT": String(limit), "WORKER_PREFETCH": "5"
            ])
        for job in 0..<50 {
            let tokens = (0..<10).map { "\"" + String(format: "%064x", job * 10 + $0 + 1) + "\"" }.joined(
                separator: ",")
            try publisher.publish(
                to: jobs, body: Array(#"{"id": "rate-\#(job)", "tokens": [\#(tokens)], "payload": {"aps": {}}}"#.utf8),
                properties: AMQPProperties(replyTo: replies))
        }
        // Two apns-worker processes, as operators scale them, each with its metrics endpoint.
        let metricsPorts = [TestServices.freePort(), TestServices.freePort()]
        let workers = try metricsPorts.map { port in
            try ExecutablesTests.Child(
                "apns-worker", ["run"],
                environment: environment.merging([
                    "LOG_LEVEL": "info", "METRICS_HOST": "127.0.0.1", "METRICS_PORT": String(port)
                ]) { _, new in new })
        }
        for worker in workers { #expect(worker.waitForLine(containing: "\"consuming\"") != nil) }
        let summaries = try replyReader.read(50, timeout: 60)
        // What each worker delivered, by its own count: both took part (a connection count would not tell, as one
        // worker alone opens two).
        let delivered = try metricsPorts.map { port -> Int in
            let body = try TestServices.httpGet(port: port, "/metrics").body
            return try #require(
                body.firstMatch(of: /apns_worker_notifications_total\{outcome="delivered"\} (\d+)/).flatMap {
                    Int($0.1)
                })
        }
        for worker in workers { #expect(worker.stop(SIGTERM) == 0) }

        #expect(summaries.count == 50)
        let received = simulator.received()
        #expect(received.count == 500)
        #expect(
            delivered.allSatisfy { $0 > 0 } && delivered.reduce(0, +) == 500, "both workers took part: \(delivered)")
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
        print(
            String(
                format: "rate limit %d/s, two workers: %.1f/s over %.2f s, busiest one-second span %d", limit, rate,
                span, busiest))
    }

    /// A credential's own `rate_limit` (APNS_CREDENTIALS_FILE) holds its topics to that rate, while another
    /// credential's pushes go on unhindered beside them.
    @Test func aCredentialsOwnLimitHoldsOnlyItsTopics() throws {
        let logger = Logger(label: "rate", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let limited = try APNsCredentialsTests.TeamKey(
            team: "TEAM00000A", keyID: "RATE" + String(UUID().uuidString.prefix(6)))
        let free = try APNsCredentialsTests.TeamKey(team: "TEAM00000B", keyID: "KEY000000B")
        let limit = 100
        let file = try APNsCredentialsTests.credentialsFile([
            limited.entry(["com.slow.app"], rateLimit: limit),
            free.entry(["com.fast.app"])
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs, ["APNS_CREDENTIALS_FILE": file])
        for key in ["APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"] { environment[key] = nil }
        // One job of the limited credential larger than a send batch (256) first, then the other credential's small
        // jobs behind it in the lane: they must not wait for it.
        for job in 0..<7 {
            let topic = job == 0 ? "com.slow.app" : "com.fast.app"
            let tokens = (0..<(job == 0 ? 400 : 10)).map { String(format: "%064x", 0x5107_0000 + job * 1024 + $0) }
            try publisher.publish(
                to: jobs, body: APNsCredentialsTests.tokenJob("credential-rate-\(job)", topic: topic, tokens: tokens),
                properties: AMQPProperties(replyTo: replies))
        }
        let worker = try WorkerThread(environment, logger: logger)
        defer { worker.stop() }
        #expect(try replyReader.read(7, timeout: 60).count == 7)
        let received = simulator.received()
        let slow = received.filter { $0.topic == "com.slow.app" }.map(\.receivedAt).sorted()
        let fast = received.filter { $0.topic == "com.fast.app" }.map(\.receivedAt).sorted()
        #expect(slow.count == 400 && fast.count == 60)
        let span = slow.last! - slow.first!
        let rate = Double(slow.count - 1) / span
        #expect(rate <= Double(limit) * 1.1, "the limited credential: \(rate) per second over \(span) s")
        #expect(
            fast.last! < slow.first! + 1,
            "the other credential held back too: its last push \(fast.last! - slow.first!) s after the first limited one, whose job took \(span) s"
        )
        print(
            String(
                format:
                    "credential rate limit %d/s: %.1f/s over %.2f s; the other credential's 60 within %.2f s of the first limited push",
                limit, rate, span, fast.last! - slow.first!))
    }
}
