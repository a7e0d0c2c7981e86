import AMQP
import APNs
import APNsSimulator
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Connections open before they are needed (`apns-worker run` against apns-sim, which counts the connections it
/// accepts): production for every credential at start, and every credential and environment the fleet sent with in
/// the last hour (noted in Redis as workers report), so that the first push of each goes on a connection already
/// open.
@Suite struct FirstPushTests {
    typealias TeamKey = APNsCredentialsTests.TeamKey

    /// Teams and keys of their own (10 characters each): what other tests' workers noted in Redis names none of them.
    static func uniqueKey() throws -> TeamKey {
        let suffix = UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(9).uppercased()
        return try TeamKey(team: "T" + suffix, keyID: "K" + suffix)
    }

    /// A worker sending with team A's and team B's keys (one connection a pool), ready and consuming.
    static func startWorker(
        _ simulator: APNsSimulator, _ file: String,
        jobs: String
    ) throws -> ExecutablesTests.Child {
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "APNS_CREDENTIALS_FILE": file, "LOG_LEVEL": "info", "APNS_CONNECTIONS": "1"
            ])
        for key in ["APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"] { environment[key] = nil }
        let worker = try ExecutablesTests.Child("apns-worker", ["run"], environment: environment)
        #expect(worker.waitForLine(containing: "\"consuming\"") != nil)
        return worker
    }

    /// Teams A (com.a.app) and B (com.b.app), apns-sim trusting both keys, and their credentials file.
    static func twoTeams() throws -> (teamB: TeamKey, simulator: APNsSimulator, file: String) {
        let teamA = try uniqueKey()
        let teamB = try uniqueKey()
        let simulator = try APNsSimulator(
            configuration: .init(trustedKeys: [
                teamA.keyID: teamA.trusted,
                teamB.keyID: teamB.trusted
            ]),
            logger: .init(label: "first-push", level: .critical))
        let file = try APNsCredentialsTests.credentialsFile([teamA.entry(["com.a.app"]), teamB.entry(["com.b.app"])])
        return (teamB, simulator, file)
    }

    static func job(_ id: String, topic: String, environment: String, token: Int) -> [UInt8] {
        let tokens = "[\"" + String(format: "%064x", token) + "\"]"
        return Array(
            #"{"id": "\#(id)", "topic": "\#(topic)", "tokens": \#(tokens), "environment": "\#(environment)", "#
                .utf8) + Array(#""payload": {"aps": {}}}"#.utf8)
    }

    @Test func everyCredentialsProductionConnectionOpensAtStart() throws {
        let (teamB, simulator, file) = try Self.twoTeams()
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let worker = try Self.startWorker(simulator, file, jobs: jobs)
        defer { _ = worker.stop(SIGKILL) }
        #expect(
            TestServices.waitUntil { simulator.connectionsOpened() == 2 }, "each credential's production connection")
        try publisher.publish(
            to: jobs, body: Self.job("first-b", topic: "com.b.app", environment: "production", token: 1),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1, timeout: 30).count == 1)
        #expect(simulator.received().map(\.credential) == [teamB.name])
        #expect(simulator.connectionsOpened() == 2, "team B's first push went on the connection open since the start")
        #expect(worker.stop(SIGTERM) == 0)
    }

    @Test func aStartingWorkerOpensTheEnvironmentsTheFleetSentWithLately() throws {
        let (teamB, simulator, file) = try Self.twoTeams()
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let first = try Self.startWorker(simulator, file, jobs: jobs)
        defer { _ = first.stop(SIGKILL) }
        try publisher.publish(
            to: jobs, body: Self.job("sandbox-1", topic: "com.b.app", environment: "sandbox", token: 1),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1, timeout: 30).count == 1)
        // Stopping reports what the worker sent with: team B's sandbox.
        #expect(first.stop(SIGTERM) == 0)
        let before = simulator.connectionsOpened()
        #expect(before == 3, "production for both teams at start, then team B's sandbox for its push")

        let second = try Self.startWorker(simulator, file, jobs: jobs)
        defer { _ = second.stop(SIGKILL) }
        #expect(
            TestServices.waitUntil { simulator.connectionsOpened() == before + 3 },
            "both teams' production and team B's sandbox opened at start: \(simulator.connectionsOpened() - before)")
        try publisher.publish(
            to: jobs, body: Self.job("sandbox-2", topic: "com.b.app", environment: "sandbox", token: 2),
            properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1, timeout: 30).count == 1)
        #expect(simulator.received().map(\.credential) == [teamB.name, teamB.name])
        #expect(simulator.connectionsOpened() == before + 3, "the sandbox push went on the connection opened at start")
        #expect(second.stop(SIGTERM) == 0)
    }
}
