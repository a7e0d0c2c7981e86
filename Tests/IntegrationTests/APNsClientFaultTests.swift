import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing
import Threads

/// The APNs client against apns-sim's scripted faults: what is resent, what is final, and that nothing is lost.
@Suite struct APNsClientFaultTests {
    let logger = Logger(label: "faults", level: .critical)
    let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

    struct Harness {
        let simulator: APNsSimulator
        let client: APNsClient
    }

    func harness(
        _ behaviour: APNsSimulator.Behaviour, connections: Int = 1, maximumStreams: UInt32 = 100,
        unregistered: [String: Int64] = [:], requestTimeout: Double = 10,
        observer: (@Sendable (APNsEnvironment, HTTP2ClientEvent) -> Void)? = nil
    ) throws -> Harness {
        let simulator = try APNsSimulator(
            configuration: .init(
                unregisteredTokens: unregistered,
                maximumConcurrentStreams: maximumStreams,
                behaviour: behaviour), logger: logger)
        let caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        var configuration = APNsClientConfiguration(
            production: APNsEndpoint(host: "127.0.0.1", port: simulator.port), caFile: caFile,
            connectionsPerEnvironment: connections, requestTimeout: requestTimeout)
        configuration.observer = observer
        let client = APNsClient(
            configuration: configuration,
            authentication: try TestServices.tokenAuthentication(),
            logger: logger)
        return Harness(simulator: simulator, client: client)
    }

    func tokens(_ count: Int) -> [String] { (0..<count).map { String(format: "%064x", $0 + 1) } }

    /// Every notification's result, in order; an issue is recorded (and the test stops) if they are not all back
    /// within a minute.
    func send(_ client: APNsClient, _ tokens: [String]) throws -> [APNsResult] {
        let results = Locked<[Int: APNsResult]>([:])
        let done = DispatchSemaphore(value: 0)
        let notifications = tokens.map { APNsNotification(deviceToken: $0, topic: "com.example.app", payload: payload) }
        client.send(notifications) { index, result in
            if results.withLock({
                $0[index] = result
                return $0.count == notifications.count
            }) {
                done.signal()
            }
        }
        try #require(
            done.wait(timeout: .now() + 60) == .success,
            "\(results.withLock { $0.count }) of \(tokens.count) answered within 60 s")
        return results.withLock { results in (0..<tokens.count).compactMap { results[$0] } }
    }

    @Test func goAwayAfterNStreamsLosesNothingAndDuplicatesNothing() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.goAwayAfterStreams = 50
        let reasons = Locked<[String]>([])
        let h = try harness(behaviour) { _, event in
            if case .goAway(_, _, _, let debugData) = event { reasons.withLock { $0.append(debugData) } }
        }
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let results = try send(h.client, tokens(500))
        #expect(results.count == 500)
        #expect(
            results.allSatisfy { $0.outcome == .delivered }, "\(results.filter { $0.outcome != .delivered }.prefix(2))")
        let received = h.simulator.received()
        #expect(received.count == 500, "streams above the GOAWAY's last-stream-id were resent, not duplicated")
        #expect(Set(received.map(\.deviceToken)).count == 500)
        #expect(h.simulator.connectionsSeen() >= 10, "a new connection replaced each one that went away")
        #expect(
            reasons.withLock { $0.first } == #"{"reason":"Shutdown"}"#, "the GOAWAY's JSON reason reaches the client")
        TestServices.reportFault("APNs GOAWAY storm (every 50 streams)", notifications: 500, received: received)
    }

    /// A stream lost with its connection may have been delivered: it is answered as lost, for the pipeline's delay
    /// queues to send again (they count every send, APNS_MAX_ATTEMPTS in all), and never sent again by the client.
    /// The connection is replaced and the rest are delivered.
    @Test func droppedConnectionsAreReplacedAndTheirLostStreamsAnsweredOnce() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.dropConnectionAfterStreams = 100
        let h = try harness(behaviour)
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let all = tokens(300)
        let results = try send(h.client, all)
        #expect(results.count == 300)
        let lost = results.indices.filter { results[$0].outcome != .delivered }
        #expect(!lost.isEmpty, "the drops cost some streams")
        #expect(
            lost.allSatisfy {
                results[$0].outcome == .retryLater(delay: 1) && results[$0].error?.contains("connection lost") == true
            }, "\(lost.prefix(3).map { results[$0] })")
        let received = h.simulator.received().map(\.deviceToken)
        #expect(Set(received).count == received.count, "nothing sent twice")
        #expect(Set(received).isSuperset(of: results.indices.filter { !lost.contains($0) }.map { all[$0] }))
        #expect(h.simulator.connectionsSeen() >= 2, "the dropped connection was replaced")
    }

    @Test func refusedStreamsAreSentAgain() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.refuseEveryNthStream = 4
        let h = try harness(behaviour)
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let results = try send(h.client, tokens(200))
        #expect(results.count == 200 && results.allSatisfy { $0.outcome == .delivered })
        TestServices.reportFault(
            "APNs resets every 4th stream (REFUSED_STREAM)", notifications: 200,
            received: h.simulator.received())
    }

    @Test func answersAreClassifiedAsAppleSays() throws {
        let all = tokens(5)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.badTokens = [all[1]]
        behaviour.throttledTokens = [all[2]]
        let h = try harness(behaviour, unregistered: [all[3]: 1_732_900_000_555])
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let results = try send(h.client, all)
        #expect(results[0].outcome == .delivered)
        #expect(results[1].outcome == .deadToken)
        #expect(results[1].response?.reason == .badDeviceToken)
        #expect(results[2].outcome == .retryLater(delay: 60))
        #expect(results[3].outcome == .deadToken)
        #expect(results[3].response?.timestamp == 1_732_900_000_555)
        #expect(results[4].outcome == .delivered)
        #expect(results[0].response?.apnsID.map(APNsNotification.isCanonicalUUID) == true)
    }

    @Test func serverErrorsAreRetryLater() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.unavailableRate = 1
        let h = try harness(behaviour)
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let results = try send(h.client, tokens(3))
        #expect(
            results.count == 3
                && results.allSatisfy { $0.outcome == .retryLater(delay: 15) && $0.response?.status == 503 })
    }

    @Test func streamLimitFallingToOneSlowsButDoesNotStop() throws {
        let all = tokens(300)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.dropsStreamLimitAfterRejection = true
        behaviour.badTokens = [all[0], all[150]]
        let h = try harness(behaviour)
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let results = try send(h.client, all)
        #expect(results.count == 300)
        #expect(results.filter { $0.outcome == .delivered }.count == 298)
        #expect(results.filter { $0.outcome == .deadToken }.count == 2)
        TestServices.reportFault(
            "MAX_CONCURRENT_STREAMS falls to 1 after rejections (2 dead tokens of 300)",
            notifications: 298, received: h.simulator.received())
    }

    @Test func aSlowServerMeetsTheRequestDeadline() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 5
        let h = try harness(behaviour, requestTimeout: 1)
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let started = Date()
        let results = try send(h.client, tokens(2))
        #expect(results.count == 2)
        #expect(
            results.allSatisfy {
                if case .retryLater = $0.outcome { $0.error?.contains("deadline") == true } else { false }
            })
        #expect(Date().timeIntervalSince(started) < 5, "answered by the deadline, not by the server")
    }

    @Test func notificationsBreakingAppleRulesAreNeverSent() throws {
        let h = try harness(.init())
        defer {
            h.client.shutdown()
            h.simulator.shutdown()
        }
        let done = DispatchSemaphore(value: 0)
        let result = Locked<APNsResult?>(nil)
        let oversized = APNsNotification(
            deviceToken: tokens(1)[0], topic: "com.example.app",
            payload: Array(repeating: 32, count: 4097))
        h.client.send([oversized]) { _, answer in
            result.withLock { $0 = answer }
            done.signal()
        }
        try #require(done.wait(timeout: .now() + 10) == .success, "answered without a request")
        #expect(result.withLock { $0?.outcome } == .permanentFailure)
        #expect(result.withLock { $0?.error?.contains("4096-byte limit") } == true)
        #expect(h.simulator.received().isEmpty)
    }
}
