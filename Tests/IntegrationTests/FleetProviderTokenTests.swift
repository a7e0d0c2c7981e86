import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
    import Threads
#endif

/// One provider token per key for the whole fleet (`apns:jwt:<team id>/<key id>` in Redis): three workers sending
/// with one key use one token, and an ExpiredProviderToken answer replaces it once for all of them.
@Suite struct FleetProviderTokenTests {
    /// Three apns-worker processes, one key, jobs flowing for 60 s; halfway, apns-sim declares the token in use expired
    /// (as it does once a token passed its hour). Every connection carried one token before, one replacement after, and
    /// the three workers together signed two tokens.
    @Test func threeWorkersShareOneTokenAndReplaceItOnce() throws {
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        let keyID = "FL" + String((0..<8).map { _ in alphabet.randomElement()! })
        let key = try APNsCredentialsTests.TeamKey(team: "TEAMFLEET1", keyID: keyID)
        let logger = Logger(label: "fleet-token", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(trustedKeys: [keyID: key.trusted]), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        publisher.close()
        let ports = (0..<3).map { _ in TestServices.freePort() }
        let environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_KEY_FILE": key.file, "APNS_KEY_ID": keyID, "APNS_TEAM_ID": key.team, "METRICS_HOST": "127.0.0.1",
                "LOG_LEVEL": "info"
            ])
        let workers = try ports.map { port in
            try ExecutablesTests.Child(
                "apns-worker", ["run"], environment: environment.merging(["METRICS_PORT": String(port)]) { $1 })
        }
        defer { for worker in workers { _ = worker.stop(SIGKILL) } }
        for worker in workers { try #require(worker.waitForLine(containing: "\"consuming\"") != nil) }

        // Jobs at a steady 50 per second for 60 s, from a thread of their own; the token expires halfway.
        let published = Locked(0)
        let started = Date()
        let publishing = Thread {
            guard let connection = try? AMQPConnection(url: TestServices.amqpURL()) else { return }
            defer { connection.close() }
            var index = 0
            while Date().timeIntervalSince(started) < 60 {
                let token = String(format: "%064x", 0xF1EE_0000 + index)
                guard
                    (try? connection.publish(
                        to: jobs, body: Array(#"{"tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))) != nil
                else { return }
                index += 1
                published.withLock { $0 = index }
                // Pacing the load, not waiting for anything.
                Thread.sleep(until: started.addingTimeInterval(Double(index) * 0.02))
            }
        }
        publishing.start()
        try #require(TestServices.waitUntil(timeout: 40) { Date().timeIntervalSince(started) >= 30 }, "halfway")
        let expiredAt = Date().timeIntervalSince1970
        let expired = simulator.expireProviderTokensInUse()
        #expect(expired.count == 1, "one token in use halfway: \(expired.sorted())")
        try #require(
            TestServices.waitUntil(timeout: 45) { Date().timeIntervalSince(started) >= 60.5 }, "the load ran 60 s")
        let total = published.withLock { $0 }
        #expect(total > 2_500, "\(total) jobs published")
        let delivered = TestServices.waitUntil(timeout: 30) {
            Set(simulator.received().filter { $0.status == 200 }.map(\.deviceToken)).count == total
        }
        #expect(delivered, "every job delivered")

        let accepted = simulator.received().filter { $0.status == 200 }
        let before = accepted.filter { $0.receivedAt < expiredAt }
        let after = accepted.filter { $0.receivedAt >= expiredAt }
        #expect(Set(before.compactMap(\.tokenIssuedAt)) == expired, "one token before, on every connection")
        let replacements = Set(after.compactMap(\.tokenIssuedAt)).subtracting(expired)
        #expect(replacements.count == 1, "one replacement fleet-wide: \(replacements.sorted())")
        #expect(Set(accepted.map(\.connectionID)).count >= 3, "the three workers sent")
        for (connection, pushes) in Dictionary(grouping: before, by: \.connectionID) {
            #expect(Set(pushes.compactMap(\.tokenIssuedAt)).count == 1, "connection \(connection): one token before")
        }
        let refusals = simulator.received().filter { $0.reason == "TooManyProviderTokenUpdates" }
        #expect(refusals.isEmpty, "no connection saw a token change too many")
        let minted = try ports.map { port -> Int in
            let body = try TestServices.httpGet(port: port, "/metrics").body
            return try #require(
                body.firstMatch(of: /apns_worker_provider_tokens_minted_total (\d+)/).flatMap { Int($0.1) })
        }
        #expect(minted.reduce(0, +) == 2, "tokens signed by each worker: \(minted)")
        print(
            "fleet token | 3 workers, one key, 60 s, \(total) jobs: tokens signed \(minted), "
                + "\(simulator.received().filter { $0.reason == "ExpiredProviderToken" }.count) ExpiredProviderToken answers"
        )
    }

    /// APNs refusing every token as expired (a clock it disagrees with): the worker replaces the refused token once,
    /// sends the push once more, then leaves it to the delay queues; it never signs tokens in a loop, nor dates one
    /// ahead of its clock. (Each refusal replaced the token again: thousands of requests and tokens a second, and the
    /// fleet's token dated hours ahead.)
    @Test func aTokenRefusedAgainIsNotReplacedInALoop() throws {
        let token = String(repeating: "e7", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.expiredProviderTokenFor = [token]
        let logger = Logger(label: "refused-token", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        let worker = try WorkerThread.retrying(simulator: simulator, jobs: jobs, failed: failed, logger: logger)
        defer { worker.stop() }
        let job = #"{"id": "refused", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(job.utf8))
        let parked = try failedReader.read(1, timeout: 30)
        #expect(parked.first?.properties.headers["x-apns-worker-reason"]?.contains("ExpiredProviderToken") == true)
        let sends = simulator.received().filter { $0.deviceToken == token }.count
        // Three attempts, the first sent once more with a new token.
        #expect((3...4).contains(sends), "\(sends) pushes")
        let redis = try RedisConnection(url: TestServices.redisURL())
        let record = try redis.command(["GET", "apns:jwt:TEAM000001/KEY0000001"])
        let issuedAt = try #require(
            (try? JSONSerialization.jsonObject(with: Data((record.text ?? "").utf8)) as? [String: Any])?["iat"]
                as? Int)
        #expect(Double(issuedAt) <= Date().timeIntervalSince1970 + 1, "no token dated ahead")
    }
}
