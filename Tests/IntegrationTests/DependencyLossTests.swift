import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline
#if canImport(Glibc)
import Glibc
#endif

/// A dependency lost under a running worker that stays alive: what it holds is neither lost nor sent twice.
@Suite struct DependencyLossTests {
    let logger = Logger(label: "dependency-loss", level: ProcessInfo.processInfo.environment["XLOG"] == nil ? .critical : .info)

    /// Redis frozen (SIGSTOP: connections open, nothing answered) for 8 s while one-token jobs flow: every job is
    /// delivered once, and no push goes out twice, although the worker's calls to Redis time out meanwhile.
    @Test func redisFrozenUnderARunningWorkerSendsNothingTwice() throws {
        let (port, redis) = try BadSettingsTests.privateRedis()
        defer { redis.stop() }
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = Double(ProcessInfo.processInfo.environment["XLAT"] ?? "0.02")!
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        let jobCount = Int(ProcessInfo.processInfo.environment["XJOBS"] ?? "2000")!
        let prefix = TestServices.unique("frozen")
        var last: UInt64 = 0
        for job in 0..<jobCount {
            let token = String(format: "%064x", job + 1)
            last = try publisher.publish(to: jobs, body: Array(#"{"id": "\#(prefix)-\#(job)", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8))
        }
        #expect(try publisher.waitForConfirms(through: last).isEmpty)
        let environment = try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, [
            "REDIS_URL": "redis://127.0.0.1:\(port)/0", "APNS_RATE_LIMIT": ProcessInfo.processInfo.environment["XRATE"] ?? "200", "WORKER_PREFETCH": "200", "LOG_LEVEL": "info",
        ])
        let worker = try WorkerThread(environment, logger: logger)
        defer { worker.stop() }
        #expect(TestServices.waitUntil(timeout: 30) { simulator.received().count >= jobCount / 4 }, "a quarter delivered")
        kill(redis.pid, SIGSTOP)
        let frozenAt = simulator.received().count
        Thread.sleep(forTimeInterval: 8)  // the outage itself: how long Redis stays frozen, not a wait for anything
        kill(redis.pid, SIGCONT)
        let delivered = TestServices.waitUntil(timeout: 90) {
            Set(simulator.received().lazy.filter { $0.status == 200 }.map(\.deviceToken)).count >= jobCount
        }
        #expect(delivered, "every job delivered after the thaw")
        let received = simulator.received().filter { $0.status == 200 }
        let duplicates = received.count - Set(received.map(\.deviceToken)).count
        #expect(duplicates == 0, "\(duplicates) pushes sent twice (\(frozenAt) delivered before the freeze)")
        TestServices.reportFault("Redis frozen 8 s under a running worker (2,000 one-token jobs with ids)",
                                 notifications: jobCount, received: simulator.received())
    }
}
