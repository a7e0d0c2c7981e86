import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
    import Threads
#endif

/// Connection-level duties of the APNs client: liveness, provider tokens, TLS.
@Suite struct APNsClientConnectionTests {
    let logger = Logger(label: "connection", level: .critical)
    let token = String(repeating: "5e", count: 32)

    func sendOne(_ client: APNsClient, token: String) -> APNsResult? {
        let result = Locked<APNsResult?>(nil)
        let done = DispatchSemaphore(value: 0)
        client.send([
            APNsNotification(
                deviceToken: token, topic: "com.example.app",
                payload: Array(#"{"aps":{}}"#.utf8))
        ]) { _, answer in
            result.withLock { $0 = answer }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 30) == .success, "answered within 30 s")
        return result.withLock { $0 }
    }

    /// Both environments answer with an apns-id; only development adds apns-unique-id (as Apple's do), and the
    /// client reads each from the answer's fields.
    @Test(arguments: [false, true])
    func answersCarryTheIdentifiersOfTheirEnvironment(development: Bool) throws {
        let simulator = try APNsSimulator(configuration: .init(isDevelopment: development), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let client = APNsClient(
            configuration: APNsClientConfiguration(
                production: .init(host: "127.0.0.1", port: simulator.port),
                caFile: caFile),
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        let response = try #require(sendOne(client, token: token)?.response)
        #expect(response.status == 200)
        #expect(response.apnsID.map(APNsNotification.isCanonicalUUID) == true, "\(response.apnsID ?? "no apns-id")")
        #expect(response.apnsID == simulator.received().first?.apnsID)
        if development {
            #expect(response.apnsUniqueID.map(APNsNotification.isCanonicalUUID) == true)
            #expect(response.apnsUniqueID != response.apnsID)
        } else {
            #expect(response.apnsUniqueID == nil)
        }
    }

    /// A client that reads no delivered notification's apns-id keeps none (the worker's: an answer of the production
    /// environment then keeps no field); apns-unique-id is kept, and so is the apns-id of an answer that is not a
    /// delivery.
    @Test(arguments: [false, true])
    func aClientThatReadsNoDeliveredAPNsIDKeepsOnlyWhatItReads(development: Bool) throws {
        let failing = String(repeating: "ab", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.failFirstPushes = [failing: 1]
        let simulator = try APNsSimulator(
            configuration: .init(behaviour: behaviour, isDevelopment: development), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        var configuration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: simulator.port), caFile: caFile)
        configuration.keepsDeliveredAPNsID = false
        let client = APNsClient(
            configuration: configuration, authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        let delivered = try #require(sendOne(client, token: token)?.response)
        #expect(delivered.status == 200)
        #expect(delivered.apnsID == nil)
        #expect((delivered.apnsUniqueID != nil) == development, "\(delivered.apnsUniqueID ?? "no apns-unique-id")")
        let refused = try #require(sendOne(client, token: failing)?.response)
        #expect(refused.status != 200)
        #expect(refused.apnsID.map(APNsNotification.isCanonicalUUID) == true, "\(refused.apnsID ?? "no apns-id")")
    }

    @Test func idleConnectionsArePingedAndStayOpen() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let acknowledged = DispatchSemaphore(value: 0)
        var configuration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: simulator.port),
            caFile: caFile, pingInterval: 0.3, pingTimeout: 5)
        configuration.observer = { _, event in if case .pingAcknowledged = event { acknowledged.signal() } }
        let client = APNsClient(
            configuration: configuration,
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(acknowledged.wait(timeout: .now() + 10) == .success, "an idle connection got a PING and its ACK")
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(simulator.connectionsSeen() == 1, "the pinged connection was kept, not replaced")
    }

    @Test func aConnectionWhosePingGoesUnansweredIsReplaced() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.ignoresPings = true
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let closed = DispatchSemaphore(value: 0)
        let reasons = Locked<[String]>([])
        var configuration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: simulator.port),
            caFile: caFile, pingInterval: 0.2, pingTimeout: 0.4)
        configuration.observer = { _, event in
            if case .closed(_, let reason) = event {
                reasons.withLock { $0.append(reason) }
                closed.signal()
            }
        }
        let client = APNsClient(
            configuration: configuration,
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(closed.wait(timeout: .now() + 10) == .success)
        #expect(reasons.withLock { $0.first?.contains("PING unanswered") } == true, "\(reasons.withLock { $0 })")
        #expect(sendOne(client, token: token)?.outcome == .delivered, "a new connection took over")
    }

    /// A connection that falls silent while it owes answers (a link black-holed: no reset, nothing arrives) is pinged
    /// at once and replaced when the PING goes unanswered; its unanswered requests are answered as lost at once (not
    /// at their deadline), for the pipeline's delay queues to send again, and they go out on the new connection.
    @Test func aConnectionSilentWithRequestsInFlightIsReplacedAndTheirRequestsAnsweredAsLost() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.ignoresPings = true
        behaviour.latency = 600
        let simulatorBox = Locked<APNsSimulator?>(nil)
        var configuration = APNsSimulator.Configuration(behaviour: behaviour)
        let seen = Locked(0)
        configuration.observer = { _ in
            // The first five are held (the black hole); what comes after, on the new connection, is answered.
            if seen.withLock({
                $0 += 1
                return $0
            }) == 5, let simulator = simulatorBox.withLock({ $0 }) {
                var answering = APNsSimulator.Behaviour()
                answering.ignoresPings = true
                simulator.setBehaviour(answering)
            }
        }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        simulatorBox.withLock { $0 = simulator }
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let reasons = Locked<[String]>([])
        var clientConfiguration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: simulator.port),
            caFile: caFile, connectionsPerEnvironment: 1, pingTimeout: 0.5)
        clientConfiguration.observer = { _, event in
            if case .closed(_, let reason) = event { reasons.withLock { $0.append(reason) } }
        }
        let client = APNsClient(
            configuration: clientConfiguration,
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        let tokens = (1...5).map { String(format: "%064x", 0xB1AC_0000 + $0) }
        func sendAll() -> [APNsResult] {
            let results = Locked<[Int: APNsResult]>([:])
            let done = DispatchSemaphore(value: 0)
            client.send(
                tokens.map {
                    APNsNotification(deviceToken: $0, topic: "com.example.app", payload: Array(#"{"aps":{}}"#.utf8))
                }
            ) { index, result in
                if results.withLock({
                    $0[index] = result
                    return $0.count
                }) == tokens.count {
                    done.signal()
                }
            }
            #expect(done.wait(timeout: .now() + 10) == .success, "every request answered before its deadline (30 s)")
            return results.withLock { Array($0.values) }
        }
        let lost = sendAll()
        #expect(lost.count == 5, "\(lost)")
        #expect(
            lost.allSatisfy { $0.outcome == .retryLater(delay: 1) && $0.error?.contains("lost") == true }, "\(lost)")
        // The connection's close is reported after its requests are answered.
        #expect(
            TestServices.waitUntil(timeout: 10) { reasons.withLock { $0.contains { $0.contains("PING unanswered") } } },
            "\(reasons.withLock { $0 })")
        let again = sendAll()
        #expect(again.count == 5 && again.allSatisfy { $0.outcome == .delivered }, "\(again)")
        #expect(simulator.connectionsSeen() == 2, "the silent connection was replaced")
        #expect(Set(simulator.received().filter { $0.status == 200 }.map(\.deviceToken)) == Set(tokens))
    }

    @Test func expiredProviderTokenIsRefreshedOnceAndSentAgain() throws {
        let keyPEM = try ES256Key.generatePrivateKeyPEM()
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: [
                "KEY0000001": .init(teamID: "TEAM000001", key: try ES256Key(pem: keyPEM))
            ]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        // The first token is minted two hours in the past (a stopped clock, a suspended VM); later reads are true.
        let firstRead = Atomic<Bool>(true)
        let provider = try APNsTokenProvider(
            key: try ES256Key(pem: keyPEM), keyID: "KEY0000001", teamID: "TEAM000001",
            clock: {
                let now = Date().timeIntervalSince1970
                return firstRead.exchange(false, ordering: .relaxed) ? now - 7200 : now
            })
        let client = APNsClient(
            configuration: .init(
                production: .init(host: "127.0.0.1", port: simulator.port),
                caFile: caFile),
            authentication: .token(provider), logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .delivered)
        #expect(simulator.received().map(\.status) == [403, 200])
        #expect(simulator.received().first?.reason == "ExpiredProviderToken")
    }

    /// A push refused as expired again after its token was replaced is answered with the refusal: sent once more,
    /// not in a loop. The clock here runs half an hour per read, so that Apple's 20-minute rule never holds a new
    /// token back: only the once-more rule bounds the sends.
    @Test func aPushRefusedAgainWithANewTokenIsAnsweredNotSentInALoop() throws {
        var behaviour = APNsSimulator.Behaviour()
        behaviour.expiredProviderTokenFor = [token]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let reads = Atomic<Int>(0)
        let provider = try APNsTokenProvider(
            key: try ES256Key(pem: try ES256Key.generatePrivateKeyPEM()), keyID: "KEY0000001", teamID: "TEAM000001",
            clock: { Date().timeIntervalSince1970 + 1_800 * Double(reads.add(1, ordering: .relaxed).newValue) })
        let client = APNsClient(
            configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port), caFile: caFile),
            authentication: .token(provider), logger: logger)
        defer { client.shutdown() }
        #expect(sendOne(client, token: token)?.outcome == .refreshTokenAndRetry)
        #expect(simulator.received().map(\.status) == [403, 403], "sent once more with a new token")
    }

    /// 403 UnrelatedKeyIdInToken says the connection is bound to another key: the client sends again on a fresh
    /// connection (the refused one closes after its streams), and answers with that connection's answer. A server
    /// that keeps saying so is answered with the 403 within `replacementInterval`, not with a loop of connections.
    @Test func aConnectionBoundToAnotherKeyIsReplaced() throws {
        let pair = try SelfSignedCertificate.generate(commonName: "127.0.0.1")
        let refusing = Atomic<Int>(1)  // connections (by id) up to this one answer 403
        let connectionsSeen = Locked<Set<Int>>([])
        let server = try HTTP2Server(
            configuration: .init(certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM),
            logger: logger
        ) { request, writer in
            connectionsSeen.withLock { _ = $0.insert(request.connectionID) }
            if request.connectionID <= refusing.load(ordering: .relaxed) {
                writer.respond(status: 403, body: Array(#"{"reason":"UnrelatedKeyIdInToken"}"#.utf8))
            } else {
                writer.respond(status: 200, headers: [HTTP2Field(name: "apns-id", value: UUID().uuidString)])
            }
        }
        defer { server.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: pair.certificatePEM)
        let client = APNsClient(
            configuration: APNsClientConfiguration(
                production: .init(host: "127.0.0.1", port: server.port),
                caFile: caFile),
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        let first = sendOne(client, token: token)
        #expect(first?.response?.status == 200, "sent again on a new connection: \(String(describing: first))")
        #expect(connectionsSeen.withLock { $0 } == [1, 2])
        refusing.store(Int.max, ordering: .relaxed)
        let second = sendOne(client, token: token)
        let third = sendOne(client, token: token)
        #expect(second?.response?.reason == .unrelatedKeyIdInToken && third?.response?.reason == .unrelatedKeyIdInToken)
        #expect(connectionsSeen.withLock { $0.count } == 2, "no new connection within the interval")
    }

    @Test func invalidProviderTokenIsFinalNotALoop() throws {
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: [
                "KEY0000001": .init(
                    teamID: "TEAM000001",
                    key: try ES256Key(pem: try ES256Key.generatePrivateKeyPEM()))
            ]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let wrongKey = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let client = APNsClient(
            configuration: .init(
                production: .init(host: "127.0.0.1", port: simulator.port),
                caFile: caFile),
            authentication: .token(
                try APNsTokenProvider(
                    key: wrongKey, keyID: "KEY0000001",
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
        let authentication = try TestServices.tokenAuthentication()
        let strict = APNsClient(
            configuration: .init(
                production: .init(host: "127.0.0.1", port: simulator.port),
                requestTimeout: 1.5),
            authentication: authentication, logger: logger)
        defer { strict.shutdown() }
        #expect(sendOne(strict, token: token)?.outcome != .delivered, "a self-signed server is refused by default")
        let insecure = APNsClient(
            configuration: .init(
                production: .init(host: "127.0.0.1", port: simulator.port),
                verifyPeer: false),
            authentication: authentication, logger: logger)
        defer { insecure.shutdown() }
        #expect(sendOne(insecure, token: token)?.outcome == .delivered)
    }

    @Test func aServerWithoutHTTP2IsRefused() throws {
        let directory = try TestServices.certificateDirectory("tls-only")
        let port = TestServices.freePort()
        let server = try TestServices.Daemon(
            "/usr/bin/openssl",
            [  // TLS without ALPN h2
                "s_server", "-accept", "127.0.0.1:\(port)", "-cert", directory + "/cert.pem", "-key",
                directory + "/key.pem", "-quiet"
            ])
        defer { server.stop() }
        let reasons = Locked<[String]>([])
        let failedOnALPN = DispatchSemaphore(value: 0)
        var configuration = APNsClientConfiguration(
            production: .init(host: "127.0.0.1", port: port),
            caFile: directory + "/cert.pem", requestTimeout: 10)
        configuration.observer = { _, event in
            if case .connectFailed(let reason) = event {
                reasons.withLock { $0.append(reason) }
                if reason.contains("ALPN h2") { failedOnALPN.signal() }
            }
        }
        let client = APNsClient(
            configuration: configuration,
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { client.shutdown() }
        client.send([APNsNotification(deviceToken: token, topic: "t", payload: Array("{}".utf8))]) { _, _ in }
        #expect(failedOnALPN.wait(timeout: .now() + 15) == .success, "\(reasons.withLock { $0 })")
    }

    @Test func certificateAuthenticationPresentsTheClientCertificate() throws {
        let clientPair = try SelfSignedCertificate.generate(
            commonName: "Apple Push Services: com.example.app", hosts: ["client"])
        let simulator = try APNsSimulator(
            configuration: .init(clientCertificateCA: clientPair.certificatePEM), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let certificateFile = try TestServices.temporaryFile("client.pem", contents: clientPair.certificatePEM)
        let keyFile = try TestServices.temporaryFile("client-key.pem", contents: clientPair.privateKeyPEM)
        let withCertificate = APNsClient(
            configuration: .init(production: .init(host: "127.0.0.1", port: simulator.port), caFile: caFile),
            authentication: .certificate(certificateFile: certificateFile, privateKeyFile: keyFile), logger: logger)
        defer { withCertificate.shutdown() }
        #expect(sendOne(withCertificate, token: token)?.outcome == .delivered)

        let withoutCertificate = APNsClient(
            configuration: .init(
                production: .init(host: "127.0.0.1", port: simulator.port), caFile: caFile,
                requestTimeout: 1.5),
            authentication: try TestServices.tokenAuthentication(), logger: logger)
        defer { withoutCertificate.shutdown() }
        #expect(sendOne(withoutCertificate, token: token)?.outcome != .delivered)
        #expect(simulator.received().count == 1)
    }

    /// The simulator holds APNs's per-connection token rules: one team per connection, and a new token on a
    /// connection no more often than every 20 minutes.
    @Test func simulatorEnforcesPerConnectionTokenRules() throws {
        let teamOneKey = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let teamTwoKey = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: [
                "KEY0000001": .init(teamID: "TEAM000001", key: teamOneKey),
                "KEY0000002": .init(teamID: "TEAM000002", key: teamTwoKey)
            ]), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let client = try HTTP2Client(
            configuration: .init(
                host: "127.0.0.1", port: simulator.port,
                tls: .init(caFile: caFile), connectionCount: 1),
            logger: logger)
        defer { client.shutdown() }
        let now = Int64(Date().timeIntervalSince1970)
        let first = try APNsTokenProvider(key: teamOneKey, keyID: "KEY0000001", teamID: "TEAM000001").makeToken(
            issuedAt: now)
        let renewed = try APNsTokenProvider(key: teamOneKey, keyID: "KEY0000001", teamID: "TEAM000001").makeToken(
            issuedAt: now - 1)
        let otherTeam = try APNsTokenProvider(key: teamTwoKey, keyID: "KEY0000002", teamID: "TEAM000002").makeToken(
            issuedAt: now)
        func status(_ jwt: String) throws -> Int {
            var headers = HTTP2HeaderBlock.request(
                method: "POST", authority: client.authority, path: "/3/device/\(token)")
            headers.add("authorization", "bearer " + jwt)
            headers.add("apns-topic", "com.example.app")
            let answer = Locked<Result<HTTP2Response, HTTP2StreamError>?>(nil)
            let done = DispatchSemaphore(value: 0)
            client.send(HTTP2Request(headers: headers, body: Array("{}".utf8))) { result in
                answer.withLock { $0 = result }
                done.signal()
            }
            try #require(done.wait(timeout: .now() + 30) == .success, "answered within 30 s")
            return try #require(answer.withLock { $0 }).get().status
        }
        #expect(try status(first) == 200)
        #expect(try status(first) == 200, "the same token again is no update")
        #expect(try status(renewed) == 429, "a new token within 20 minutes: TooManyProviderTokenUpdates")
        #expect(try status(otherTeam) == 403, "another team on the same connection")
        #expect(simulator.received().compactMap(\.reason) == ["TooManyProviderTokenUpdates", "UnrelatedKeyIdInToken"])
    }
}
