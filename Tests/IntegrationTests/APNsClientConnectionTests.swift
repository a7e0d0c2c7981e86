import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Connection-level duties of the APNs client: liveness, provider tokens, TLS.
@Suite struct APNsClientConnectionTests {
    let logger = Logger(label: "connection", level: .critical)
    let token = String(repeating: "5e", count: 32)

    func sendOne(_ client: APNsClient, token: String) -> APNsResult? {
        let result = Mutex<APNsResult?>(nil)
        let done = DispatchSemaphore(value: 0)
        client.send([(.production, APNsNotification(deviceToken: token, topic: "com.example.app",
                                                    payload: Array(#"{"aps":{}}"#.utf8)))]) { _, answer in
            result.withLock { $0 = answer }
            done.signal()
        }
        _ = done.wait(timeout: .now() + 30)
        return result.withLock { $0 }
    }

    @Test func idleConnectionsArePingedAndStayOpen() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let acknowledged = DispatchSemaphore(value: 0)
        var configuration = APNsClientConfiguration(production: .init(host: "127.0.0.1", port: simulator.port),
                                                    caFile: caFile, pingInterval: 0.3, pingTimeout: 5)
        configuration.observer = { _, event in if case .pingAcknowledged = event { acknowledged.signal() } }
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let client = APNsClient(configuration: configuration,
                                authentication: .token(try APNsTokenProvider(key: key, keyID: "KEY0000001", teamID: "TEAM000001")),
                                logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(acknowledged.wait(timeout: .now() + 10) == .success, "an idle connection got a PING and its ACK")
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(simulator.connectionsSeen() == 1, "the pinged connection was kept, not replaced")
    }

    @Test func expiredProviderTokenIsRefreshedOnceAndSentAgain() throws {
        let keyPEM = try ES256Key.generatePrivateKeyPEM()
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: ["KEY0000001": .init(teamID: "TEAM000001", key: try ES256Key(pem: keyPEM))]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        // The first token is minted two hours in the past (a stopped clock, a suspended VM); later reads are true.
        let firstRead = Atomic<Bool>(true)
        let provider = try APNsTokenProvider(key: try ES256Key(pem: keyPEM), keyID: "KEY0000001", teamID: "TEAM000001",
                                             clock: {
            let now = Date().timeIntervalSince1970
            return firstRead.exchange(false, ordering: .relaxed) ? now - 7200 : now
        })
        let client = APNsClient(configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port),
                                                     caFile: caFile),
                                authentication: .token(provider), logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(simulator.received().map(\.status) == [403, 200])
        #expect(simulator.received().first?.reason == "ExpiredProviderToken")
    }

    @Test func invalidProviderTokenIsFinalNotALoop() throws {
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: ["KEY0000001": .init(teamID: "TEAM000001",
                                                                   key: try ES256Key(pem: try ES256Key.generatePrivateKeyPEM()))]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let wrongKey = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let client = APNsClient(configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port),
                                                     caFile: caFile),
                                authentication: .token(try APNsTokenProvider(key: wrongKey, keyID: "KEY0000001",
                                                                             teamID: "TEAM000001")),
                                logger: logger)
        defer { client.shutdown() }
        let result = sendOne(client, token: token)
        #expect(result?.outcome == .permanentFailure)
        #expect(result?.response?.reason == .invalidProviderToken)
        #expect(simulator.received().count == 1)
    }

    @Test func verificationCanBeTurnedOffOnlyExplicitly() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let authentication = APNsAuthentication.token(try APNsTokenProvider(key: key, keyID: "KEY0000001", teamID: "TEAM000001"))
        let strict = APNsClient(configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port),
                                                     requestTimeout: 1.5),
                                authentication: authentication, logger: logger)
        defer { strict.shutdown() }
        #expect(sendOne(strict, token: token)?.outcome != .delivered, "a self-signed server is refused by default")
        let insecure = APNsClient(configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port),
                                                       verifyPeer: false),
                                  authentication: authentication, logger: logger)
        defer { insecure.shutdown() }
        #expect(sendOne(insecure, token: token)?.outcome == .delivered)
    }

    @Test func aServerWithoutHTTP2IsRefused() throws {
        let directory = NSTemporaryDirectory() + TestServices.unique("tls-only")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let pair = try SelfSignedCertificate.generate()
        try pair.certificatePEM.write(toFile: directory + "/cert.pem", atomically: true, encoding: .utf8)
        try pair.privateKeyPEM.write(toFile: directory + "/key.pem", atomically: true, encoding: .utf8)
        let port = TestServices.freePort()
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        server.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", directory + "/cert.pem",
                            "-key", directory + "/key.pem", "-quiet"]  // TLS without ALPN h2
        server.standardInput = FileHandle.nullDevice
        server.standardOutput = FileHandle.nullDevice
        server.standardError = FileHandle.nullDevice
        try server.run()
        defer {
            kill(server.processIdentifier, SIGKILL)
            var status: Int32 = 0
            waitpid(server.processIdentifier, &status, 0)
        }
        let reasons = Mutex<[String]>([])
        let failedOnALPN = DispatchSemaphore(value: 0)
        var configuration = APNsClientConfiguration(production: .init(host: "127.0.0.1", port: port),
                                                    caFile: directory + "/cert.pem", requestTimeout: 10)
        configuration.observer = { _, event in
            if case .connectFailed(let reason) = event {
                reasons.withLock { $0.append(reason) }
                if reason.contains("ALPN h2") { failedOnALPN.signal() }
            }
        }
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let client = APNsClient(configuration: configuration,
                                authentication: .token(try APNsTokenProvider(key: key, keyID: "KEY0000001", teamID: "TEAM000001")),
                                logger: logger)
        defer { client.shutdown() }
        client.send([(.production, APNsNotification(deviceToken: token, topic: "t", payload: Array("{}".utf8)))]) { _, _ in }
        #expect(failedOnALPN.wait(timeout: .now() + 15) == .success, "\(reasons.withLock { $0 })")
    }
}
