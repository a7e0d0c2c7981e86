import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing
import Threads

@Suite struct APNsClientBackOffTests {
    /// An endpoint that drops every connection before answering must not be hammered: reconnections back off.
    @Test func anEndpointThatDropsEveryConnectionIsNotHammered() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.dropConnectionAfterStreams = 0
        let logger = Logger(label: "backoff", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let failures = Locked<[Date]>([])
        let enough = DispatchSemaphore(value: 0)
        var configuration = HTTP2Client.Configuration(
            host: "127.0.0.1", port: simulator.port, tls: .init(caFile: caFile),
            requestTimeout: 30, maximumAttempts: 10, reconnectBaseDelay: 0.2)
        configuration.observer = { event in
            if case .connectFailed = event,
                failures.withLock({
                    $0.append(Date())
                    return $0.count
                }) == 4
            {
                enough.signal()
            }
        }
        let client = try HTTP2Client(configuration: configuration, logger: logger)
        defer { client.shutdown() }
        var headers = HTTP2HeaderBlock.request(
            method: "POST", authority: client.authority,
            path: "/3/device/" + String(repeating: "ab", count: 32))
        headers.add("apns-topic", "t")
        client.send(HTTP2Request(headers: headers, body: Array("{}".utf8))) { _ in }
        #expect(enough.wait(timeout: .now() + 20) == .success)
        let times = failures.withLock { $0 }
        let gaps = zip(times.dropFirst(), times).map { $0.timeIntervalSince($1) }
        // Full jitter over 0.2, 0.4, 0.8 s: each gap is at least half its ceiling, and they grow.
        #expect(gaps.count == 3)
        #expect(gaps[0] >= 0.09 && gaps[1] >= 0.19 && gaps[2] >= 0.39, "\(gaps)")
    }
}
