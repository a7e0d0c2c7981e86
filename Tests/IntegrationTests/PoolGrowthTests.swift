import APNs
import APNsSender
import APNsSimulator
import Foundation
import HTTP2
import Telemetry
import Testing
import Threads

/// A pool of HTTP/2 connections grows while every stream of its connections is busy and requests wait, never past its
/// maximum, and lets the extra connections go once they fall idle; against apns-sim allowing two streams a connection
/// and holding each answer, so that streams stay busy.
@Suite struct PoolGrowthTests {
    let logger = Logger(label: "pool-growth", level: .critical)

    func slowSimulator(streams: UInt32 = 2, latency: Double = 0.3) throws -> APNsSimulator {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = latency
        return try APNsSimulator(
            configuration: .init(maximumConcurrentStreams: streams, behaviour: behaviour),
            logger: logger)
    }

    func pool(
        _ simulator: APNsSimulator, connections: Int, maximum: Int, idleLifetime: Double = 60,
        events: Locked<[HTTP2ClientEvent]>
    ) throws -> HTTP2Client {
        let caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        var configuration = HTTP2Client.Configuration(
            host: "127.0.0.1", port: simulator.port, tls: .init(caFile: caFile),
            connectionCount: connections, maximumConnectionCount: maximum)
        configuration.idleConnectionLifetime = idleLifetime
        configuration.observer = { event in events.withLock { $0.append(event) } }
        return try HTTP2Client(configuration: configuration, logger: logger)
    }

    func statuses(_ client: HTTP2Client, _ count: Int) -> [Int] {
        let answers = Locked<[Int: Int]>([:])
        let done = DispatchSemaphore(value: 0)
        let requests = (0..<count).map { index in
            var headers = HTTP2HeaderBlock.request(
                method: "POST", authority: client.authority,
                path: "/3/device/" + String(format: "%064x", index))
            headers.add("apns-topic", "com.example.app")
            headers.add("apns-push-type", "alert")
            return HTTP2Request(headers: headers, body: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
        }
        client.send(requests) { index, result in
            let complete = answers.withLock { answers in
                answers[index] = (try? result.get().status) ?? -1
                return answers.count == count
            }
            if complete { done.signal() }
        }
        #expect(done.wait(timeout: .now() + 30) == .success, "\(answers.withLock { $0.count }) of \(count) answered")
        return answers.withLock { answers in (0..<count).compactMap { answers[$0] } }
    }

    func opened(_ events: Locked<[HTTP2ClientEvent]>) -> Int {
        events.withLock { $0.filter { if case .opened = $0 { true } else { false } }.count }
    }

    func closed(_ events: Locked<[HTTP2ClientEvent]>) -> Int {
        events.withLock { $0.filter { if case .closed = $0 { true } else { false } }.count }
    }

    /// A pool of one connection growing up to three against a slow apns-sim, after one answer (so that the server's
    /// stream limit is known before `body` sends), shut down afterwards.
    func withGrowingPool(
        latency: Double = 0.3, idleLifetime: Double = 60,
        _ body: (APNsSimulator, HTTP2Client, Locked<[HTTP2ClientEvent]>) throws -> Void
    ) throws {
        let simulator = try slowSimulator(latency: latency)
        defer { simulator.shutdown() }
        let events = Locked<[HTTP2ClientEvent]>([])
        let client = try pool(simulator, connections: 1, maximum: 3, idleLifetime: idleLifetime, events: events)
        defer { client.shutdown() }
        #expect(statuses(client, 1) == [200])
        try body(simulator, client, events)
    }

    @Test func aPoolWhoseStreamsAreAllBusyOpensMoreConnectionsUpToItsMaximum() throws {
        try withGrowingPool { simulator, client, events in
            #expect(statuses(client, 24) == Array(repeating: 200, count: 24))
            #expect(simulator.connectionsSeen() == 3, "the pool grew to its maximum, and no further")
            #expect(Set(simulator.received().map(\.connectionID)).count == 3, "every connection carried notifications")
            #expect(opened(events) == 3)
        }
    }

    @Test func aPoolWhoseStreamsSufficeKeepsItsConnections() throws {
        try withGrowingPool { simulator, client, events in
            #expect(statuses(client, 2) == [200, 200], "two requests fill the connection's two streams")
            #expect(simulator.connectionsSeen() == 1)
            #expect(opened(events) == 1)
        }
    }

    @Test func extraConnectionsCloseOnceIdleAndTheFirstOnesStay() throws {
        try withGrowingPool(latency: 0.2, idleLifetime: 0.5) { simulator, client, events in
            let first = try #require(simulator.received().first?.connectionID)
            #expect(statuses(client, 24) == Array(repeating: 200, count: 24))
            #expect(opened(events) == 3)
            #expect(
                TestServices.waitUntil { closed(events) == 2 },
                "both extra connections closed: \(events.withLock { $0 })")
            let failures = events.withLock { $0.filter { if case .connectFailed = $0 { true } else { false } } }
            #expect(failures.isEmpty, "an idle connection's close is no failure: \(failures)")
            let before = simulator.received().count
            #expect(statuses(client, 1) == [200])
            #expect(
                simulator.received().dropFirst(before).map(\.connectionID) == [first], "the first connection stayed")
            #expect(opened(events) == 3, "nothing reopened")
        }
    }

    /// `/metrics` shows each pool's connections and the streams carrying a request.
    @Test func theMetricsShowEachPoolsConnectionsAndStreamsInUse() throws {
        let simulator = try slowSimulator(streams: 5, latency: 20)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        let authentication = try TestServices.tokenAuthentication()
        let configuration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: simulator.port),
            caFile: caFile, connectionsPerEnvironment: 1,
            maximumConnectionsPerEnvironment: 2)
        let credential = APNsCredential(
            name: authentication.name, authentication: authentication, bundles: [],
            material: [])
        let sender = APNsNotificationSender(
            configuration: configuration,
            credentials: try APNsCredentials(entries: [], fallback: credential),
            logger: logger)
        defer { sender.shutdown() }
        sender.start { _ in }
        let series = #"{credential="\#(authentication.name)",environment="production",lane="urgent"}"#
        #expect(TestServices.waitUntil { sender.metricsText.contains("apns_worker_apns_connections_open\(series) 1") })
        let notifications = (0..<12).map {
            APNsNotification(
                deviceToken: String(format: "%064x", $0), topic: "com.example.app",
                payload: Array(#"{"aps":{}}"#.utf8))
        }
        _ = sender.send(notifications, lane: .urgent) { _, _ in }
        // Two connections of five streams each, all held by answers twenty seconds away.
        #expect(
            TestServices.waitUntil(timeout: 15) {
                sender.metricsText.contains("apns_worker_apns_streams_in_use\(series) 10")
                    && sender.metricsText.contains("apns_worker_apns_connections_open\(series) 2")
            }, "\(sender.metricsText)")
    }
}
