import AMQP
import APNs
import APNsSimulator
import Foundation
import HTTP2
import Telemetry
import Testing
import WorkerPipeline

#if canImport(Glibc)
    import Glibc
#endif

/// Several teams' keys and a certificate in one worker (APNS_CREDENTIALS_FILE), against apns-sim checking each
/// provider token's team and key (`iss`, `kid`) and each client certificate in the TLS handshake; reloads on SIGHUP.
@Suite struct APNsCredentialsTests {
    let logger = Logger(label: "credentials", level: .critical)

    /// A signing key of `team`, written as a .p8 file, and what apns-sim trusts it as.
    struct TeamKey {
        var team: String
        var keyID: String
        var file: String
        var trusted: APNsSimulator.TrustedKey

        init(team: String, keyID: String) throws {
            let pem = try ES256Key.generatePrivateKeyPEM()
            self.team = team
            self.keyID = keyID
            file = try TestServices.temporaryFile("\(keyID).p8", contents: pem)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file)
            trusted = .init(teamID: team, key: try ES256Key(pem: pem))
        }

        var name: String { "\(team)/\(keyID)" }

        func entry(_ topics: [String], rateLimit: Int? = nil) -> String {
            let topicList = topics.map { "\"\($0)\"" }.joined(separator: ",")
            return #"{"team_id": "\#(team)", "key_id": "\#(keyID)", "key_file": "\#(file)", "topics": [\#(topicList)]"#
                + (rateLimit.map { #", "rate_limit": \#($0)"# } ?? "") + "}"
        }
    }

    static func credentialsFile(_ entries: [String]) throws -> String {
        try TestServices.temporaryFile(
            "credentials.json", contents: #"{"credentials": ["# + entries.joined(separator: ",\n") + "]}")
    }

    static func tokenJob(_ id: String, topic: String, tokens: [String], pushType: String? = nil) -> [UInt8] {
        let list = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        let type = pushType.map { #", "push_type": "\#($0)""# } ?? ""
        return Array(
            #"{"id": "\#(id)", "topic": "\#(topic)", "tokens": [\#(list)]\#(type), "payload": {"aps": {}}}"#.utf8)
    }

    /// Every credential the worker has, each reaching apns-sim for exactly its topics: team A's key for its two apps,
    /// team B's for its app and that app's VoIP topic, a certificate (by TLS) for its own app; a topic no entry
    /// lists, with no default credential, is parked with the reason and sends nothing.
    @Test func eachTopicGoesOutWithItsOwnCredential() throws {
        let teamA = try TeamKey(team: "TEAM00000A", keyID: "KEY000000A")
        let teamB = try TeamKey(team: "TEAM00000B", keyID: "KEY000000B")
        let certificate = try SelfSignedCertificate.generate(commonName: "com.other.app", days: 365)
        let certificateFile = try TestServices.temporaryFile("other.pem", contents: certificate.certificatePEM)
        let certificateKey = try TestServices.temporaryFile("other.key", contents: certificate.privateKeyPEM)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: certificateKey)
        let simulator = try APNsSimulator(
            configuration: .init(
                trustedKeys: [teamA.keyID: teamA.trusted, teamB.keyID: teamB.trusted],
                clientCertificateCA: certificate.certificatePEM), logger: logger)
        defer { simulator.shutdown() }
        let file = try Self.credentialsFile([
            teamA.entry(["com.example.app", "com.example.driver"]), teamB.entry(["com.team-b.app"]),
            #"{"cert_file": "\#(certificateFile)", "cert_key_file": "\#(certificateKey)", "topics": ["com.other.app"]}"#
        ])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_CREDENTIALS_FILE": file, "PUSH_FAILED_QUEUE": failed
            ])
        for key in ["APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"] { environment[key] = nil }
        let worker = try WorkerThread(environment, logger: logger)
        defer { worker.stop() }

        let expected: [(topic: String, pushType: String?, credential: String)] = [
            ("com.example.app", nil, teamA.name), ("com.example.driver", nil, teamA.name),
            ("com.team-b.app", nil, teamB.name), ("com.team-b.app", "voip", teamB.name),
            ("com.other.app", nil, "certificate:com.other.app")
        ]
        var tokenCredential: [String: String] = [:]
        for (job, route) in expected.enumerated() {
            let tokens = (0..<3).map { String(format: "%064x", 0xc0de_0000 + job * 16 + $0) }
            for token in tokens { tokenCredential[token] = route.credential }
            try publisher.publish(
                to: jobs,
                body: Self.tokenJob(
                    TestServices.unique("job"), topic: route.topic, tokens: tokens,
                    pushType: route.pushType),
                properties: AMQPProperties(replyTo: replies))
        }
        let unknown = Self.tokenJob(
            TestServices.unique("unknown"), topic: "com.unknown.app",
            tokens: [String(format: "%064x", 0xdead_0001)])
        try publisher.publish(to: jobs, body: unknown, properties: AMQPProperties(replyTo: replies))

        let summaries = try replyReader.read(expected.count, timeout: 30)
        #expect(summaries.count == expected.count)
        let parked = try #require(try failedReader.read(1).first)
        #expect(parked.body == unknown, "parked unchanged")
        let reason = parked.properties.headers[Worker.reasonHeader] ?? ""
        #expect(reason.contains("no APNs credential serves topic com.unknown.app"), "\(reason)")

        let received = simulator.received()
        #expect(
            received.count == tokenCredential.count, "\(received.map { ($0.topic ?? "", $0.status, $0.reason ?? "") })")
        for notification in received {
            #expect(notification.status == 200, "\(notification.topic ?? ""): \(notification.reason ?? "")")
            #expect(
                notification.credential == tokenCredential[notification.deviceToken],
                "\(notification.topic ?? "") went with \(notification.credential ?? "nothing")")
        }
        #expect(!received.contains { $0.deviceToken == String(format: "%064x", 0xdead_0001) })
        // Connections are per credential: no connection carried two credentials' pushes.
        let credentialsPerConnection = Dictionary(grouping: received, by: \.connectionID).mapValues {
            Set($0.map(\.credential))
        }
        #expect(credentialsPerConnection.values.allSatisfy { $0.count == 1 }, "\(credentialsPerConnection)")
    }

    /// `apns-worker run` with a credentials file; SIGHUP after team A's key is replaced in the file: team A's
    /// pushes move to new connections with the new key while jobs flow, team B's connection carries on, and every
    /// job is delivered exactly once. Then a broken file and SIGHUP: the reload fails with a logged reason and
    /// nothing changes.
    @Test func sighupMovesATeamToItsNewKeyWithNothingLost() throws {
        let oldKey = try TeamKey(team: "TEAM00000A", keyID: "KEY000000A")
        let newKey = try TeamKey(team: "TEAM00000A", keyID: "KEY000000C")
        let teamB = try TeamKey(team: "TEAM00000B", keyID: "KEY000000B")
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 1  // old connections have streams in flight when the reload comes
        let simulator = try APNsSimulator(
            configuration: .init(
                trustedKeys: [oldKey.keyID: oldKey.trusted, newKey.keyID: newKey.trusted, teamB.keyID: teamB.trusted],
                behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let file = try Self.credentialsFile([oldKey.entry(["com.example.app"]), teamB.entry(["com.team-b.app"])])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_CREDENTIALS_FILE": file, "LOG_LEVEL": "info", "APNS_CONNECTIONS": "1"
            ])
        for key in ["APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"] { environment[key] = nil }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = worker.stop(SIGKILL) }
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)

        var published = 0
        func publish(_ count: Int) throws {
            for _ in 0..<count {
                let topic = published % 2 == 0 ? "com.example.app" : "com.team-b.app"
                try publisher.publish(
                    to: jobs,
                    body: Self.tokenJob(
                        "reload-\(published)", topic: topic,
                        tokens: [String(format: "%064x", 0xa000_0000 + published)]),
                    properties: AMQPProperties(replyTo: replies))
                published += 1
            }
        }
        try publish(200)
        #expect(TestServices.waitUntil(timeout: 30) { simulator.received().count >= 40 })
        try FileManager.default.removeItem(atPath: file)
        try (#"{"credentials": ["# + newKey.entry(["com.example.app"]) + "," + teamB.entry(["com.team-b.app"]) + "]}")
            .write(toFile: file, atomically: true, encoding: .utf8)
        kill(worker.process.processIdentifier, SIGHUP)
        let reloaded = try #require(worker.waitForLine(containing: "APNs credentials reloaded"))
        #expect(
            reloaded.contains("\"apns.credentials_added\":\"\(newKey.name)\"")
                && reloaded.contains("\"apns.credentials_retired\":\"\(oldKey.name)\""), "\(reloaded)")
        try publish(200)
        let summaries = try replyReader.read(400, timeout: 60)
        #expect(summaries.count == 400)

        // A broken file: the reload fails, says why, and the worker carries on with the new key.
        try "{\"credentials\": [".write(toFile: file, atomically: true, encoding: .utf8)
        kill(worker.process.processIdentifier, SIGHUP)
        let refused = try #require(worker.waitForLine(containing: "reload failed"))
        #expect(refused.contains("APNS_CREDENTIALS_FILE") && refused.contains("not JSON"), "\(refused)")
        try publish(20)
        #expect(try replyReader.read(20, timeout: 30).count == 20)
        #expect(worker.stop(SIGTERM) == 0)
        let lastTwenty = simulator.received().suffix(20)
        let beforeBrokenReload = simulator.received().dropLast(20)
        #expect(
            lastTwenty.allSatisfy { $0.credential == newKey.name || $0.credential == teamB.name },
            "still the credentials of the last good reading")
        let goodConnections = beforeBrokenReload.filter { $0.credential == newKey.name || $0.credential == teamB.name }
            .map(\.connectionID)
        #expect(Set(lastTwenty.map(\.connectionID)).isSubset(of: goodConnections), "and the same connections")

        let received = simulator.received()
        #expect(
            received.count == 420 && received.allSatisfy { $0.status == 200 },
            "\(received.count) pushes, \(received.filter { $0.status != 200 }.map { $0.reason ?? "" })")
        #expect(Set(received.map(\.deviceToken)).count == 420, "each job's push exactly once")
        let teamA = received.filter { $0.topic == "com.example.app" }
        let beforeReload = teamA.filter { $0.credential == oldKey.name }
        let afterReload = teamA.filter { $0.credential == newKey.name }
        #expect(!beforeReload.isEmpty && !afterReload.isEmpty && beforeReload.count + afterReload.count == teamA.count)
        #expect(teamA.suffix(10).allSatisfy { $0.credential == newKey.name }, "the last jobs went with the new key")
        #expect(
            Set(beforeReload.map(\.connectionID)).isDisjoint(with: afterReload.map(\.connectionID)),
            "the new key on new connections")
        let teamBConnections = Set(received.filter { $0.topic == "com.team-b.app" }.map(\.connectionID))
        #expect(teamBConnections.count == 1, "team B's connection carried on: \(teamBConnections)")
    }

    /// A credential removed by SIGHUP while its topic's jobs are queued and half sent (a 2,000-token job under way,
    /// 30 one-token jobs behind it): every notification either went out once, or its job is parked on
    /// PUSH_FAILED_QUEUE with the reason and what is left of it to send; none is acknowledged unsent.
    @Test func aCredentialRemovedByReloadParksTheWorkAlreadyTaken() throws {
        let teamA = try TeamKey(team: "TEAM00000A", keyID: "KEY000000A")
        let teamB = try TeamKey(team: "TEAM00000B", keyID: "KEY000000B")
        var behaviour = APNsSimulator.Behaviour()
        behaviour.latency = 0.2  // 20 streams answered five times a second: the big job is under way at the reload
        let simulator = try APNsSimulator(
            configuration: .init(
                trustedKeys: [teamA.keyID: teamA.trusted, teamB.keyID: teamB.trusted], maximumConcurrentStreams: 20,
                behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let file = try Self.credentialsFile([teamA.entry(["com.a.app"]), teamB.entry(["com.b.app"])])
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        let failedReader = try QueueReader(failed)
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_CREDENTIALS_FILE": file, "LOG_LEVEL": "info", "APNS_CONNECTIONS": "1",
                "PUSH_FAILED_QUEUE": failed,
                // What the worker has handed to the APNs client goes out with the credential it was signed for (the
                // retired pool finishes its streams); the rest waits in the worker, where the reload meets it.
                "WORKER_MAX_IN_FLIGHT": "100"
            ])
        for key in ["APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"] { environment[key] = nil }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        defer { _ = worker.stop(SIGKILL) }
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        let prefix = TestServices.unique("b")
        let big = (0..<2_000).map { String(format: "%064x", 0xb000_0000 + $0) }
        let small = (0..<30).map { String(format: "%064x", 0xb100_0000 + $0) }
        try publisher.publish(
            to: jobs, body: Self.tokenJob("\(prefix)-big", topic: "com.b.app", tokens: big),
            properties: AMQPProperties(replyTo: replies))
        for (index, token) in small.enumerated() {
            try publisher.publish(
                to: jobs, body: Self.tokenJob("\(prefix)-\(index)", topic: "com.b.app", tokens: [token]),
                properties: AMQPProperties(replyTo: replies))
        }
        #expect(TestServices.waitUntil(timeout: 30) { simulator.received().count >= 300 }, "the big job under way")
        try (#"{"credentials": ["# + teamA.entry(["com.a.app"]) + "]}").write(
            toFile: file, atomically: true, encoding: .utf8)
        kill(worker.process.processIdentifier, SIGHUP)
        #expect(worker.waitForLine(containing: "APNs credentials reloaded") != nil)
        // Every job settles (a summary each, parked ones too).
        #expect(try replyReader.read(31, timeout: 60).count == 31)

        let received = simulator.received()
        let sent = Set(received.filter { $0.status == 200 }.map(\.deviceToken))
        #expect(received.count == sent.count, "none sent twice: \(received.count) pushes, \(sent.count) tokens")
        var parked: [String: String] = [:]  // token: the reason of the job that holds it
        var drained = false
        while !drained {
            let messages = try failedReader.read(1, timeout: 2)
            drained = messages.isEmpty
            for message in messages {
                let reason = message.properties.headers[Worker.reasonHeader] ?? ""
                for token in try Self.tokensLeft(in: message.body) { parked[token] = reason }
            }
        }
        #expect(!parked.isEmpty, "the work left when the credential went is parked")
        #expect(
            parked.values.allSatisfy { $0.contains("no APNs credential serves topic com.b.app") },
            "\(Set(parked.values))")
        let sentAndParked = sent.intersection(parked.keys).count
        #expect(sentAndParked == 0, "\(sentAndParked) notifications went out and are parked to go again")
        let neither = Set(big + small).subtracting(sent).subtracting(parked.keys).count
        #expect(neither == 0, "\(neither) notifications neither sent nor parked")
    }

    /// The tokens a parked job has left to send: its retry state's targets (what was left when it was parked) or, for
    /// a job parked before it started, its own tokens.
    static func tokensLeft(in body: [UInt8]) throws -> [String] {
        let job = try #require(try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
        if let retry = job["retry"] as? [String: Any] {
            return (retry["targets"] as? [[String: Any]] ?? []).compactMap { $0["token"] as? String }
        }
        return job["tokens"] as? [String] ?? []
    }

    /// A credentials file that cannot be used stops start-up (78) with a line naming the entry and the problem.
    @Test func aBrokenCredentialsFileStopsStartupNamingTheEntry() throws {
        let good = try TeamKey(team: "TEAM00000A", keyID: "KEY000000A")
        let garbage = try TestServices.temporaryFile("garbage.p8", contents: "not a key\n")
        let cases: [(entries: [String], expected: String)] = [
            (
                [
                    good.entry(["com.example.app"]),
                    #"{"team_id": "TEAM00000B", "key_id": "KEY000000B", "key_file": "\#(garbage)", "topics": ["com.b.app"]}"#
                ],
                "entry 2 (team TEAM00000B, key KEY000000B)"
            ),
            ([good.entry(["com.example.app"]), good.entry(["com.example.app"])], "lists com.example.app, which"),
            (
                [#"{"team_id": "TEAM00000A", "key_file": "\#(good.file)", "topics": ["com.example.app"]}"#],
                "entry 1: \"key_id\" is required"
            )
        ]
        for (entries, expected) in cases {
            let worker = try ExecutablesTests.Child(
                "apns-worker", ["run"],
                environment: [
                    "APNS_CREDENTIALS_FILE": try Self.credentialsFile(entries),
                    "PUSH_JOBS_QUEUE": TestServices.unique("jobs")
                ],
                unset: ["APNS_KEY_FILE", "APNS_CERT_FILE"])
            let line = worker.waitForLine(containing: "configuration error")
            #expect(
                line?.contains("APNS_CREDENTIALS_FILE") == true && line?.contains(expected) == true,
                "\(line ?? "no line"): wanted \(expected)")
            #expect(worker.waitForExit() == 78)
        }
    }
}
