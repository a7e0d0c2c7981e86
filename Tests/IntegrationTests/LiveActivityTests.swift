import AMQP
import APNs
import APNsSimulator
import Configuration
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing
import WorkerPipeline

/// Live Activities against apns-sim: broadcast channels managed with `apns-worker channels` (Apple's channel
/// management API), broadcasts, and activities started, updated and ended through jobs.
@Suite struct LiveActivityTests {
    let logger = Logger(label: "live-activity", level: .critical)

    /// `apns-worker channels ARGUMENTS` with `environment`: its exit code and what it printed (standard output, then
    /// standard error).
    static func channels(_ arguments: [String], _ environment: [String: String]) throws -> (code: Int32, output: String) {
        let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: directory + "/apns-worker")
        process.arguments = ["channels"] + arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        // Standard error is read on the side, so that neither pipe fills while the other is read.
        let errorText = Locked("")
        let errorsRead = DispatchSemaphore(value: 0)
        Thread {
            let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            errorText.withLock { $0 = text }
            errorsRead.signal()
        }.start()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        errorsRead.wait()
        #expect(exited.wait(timeout: .now() + 60) == .success, "channels \(arguments) exited")
        return (process.terminationStatus, text + errorText.withLock { $0 })
    }

    static func json(_ text: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], "\(text)")
    }

    /// A simulator checking team A's provider tokens, and the settings that point the programs at it.
    static func simulatorWithKey(_ logger: Logger) throws -> (APNsSimulator, [String: String]) {
        let pem = try ES256Key.generatePrivateKeyPEM()
        let key = try TestServices.temporaryFile("channels.p8", contents: pem)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        let simulator = try APNsSimulator(configuration: .init(trustedKeys: ["KEY000000A": .init(teamID: "TEAM00000A",
                                                                                            key: try ES256Key(pem: pem))]),
                                          logger: logger)
        let url = "https://127.0.0.1:\(simulator.port)"
        return (simulator, [
            "APNS_CHANNELS_PRODUCTION_URL": url, "APNS_CHANNELS_SANDBOX_URL": url,
            "APNS_PRODUCTION_URL": url, "APNS_SANDBOX_URL": url,
            "APNS_CA_FILE": try TestServices.temporaryFile("ca.pem", contents: simulator.certificatePEM),
            "APNS_KEY_FILE": key, "APNS_KEY_ID": "KEY000000A", "APNS_TEAM_ID": "TEAM00000A", "APNS_TOPIC": "com.example.scores",
        ])
    }

    func broadcast(_ client: APNsClient, channel: String, bundle: String = "com.example.scores",
                   expiration: Int64 = 0) -> APNsResult? {
        let result = Locked<APNsResult?>(nil)
        let done = DispatchSemaphore(value: 0)
        let payload = #"{"aps":{"timestamp":\#(Int(Date().timeIntervalSince1970)),"event":"update","content-state":{"score":"1-0"}}}"#
        client.send(APNsBroadcast(bundle: bundle, channelID: channel, expiration: expiration, payload: Array(payload.utf8)),
                    environment: .production) { answer in
            result.withLock { $0 = answer }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 30) == .success)
        return result.withLock { $0 }
    }

    /// The channel's life cycle through the command line: created (its id printed), listed, shown, broadcast on,
    /// deleted; after that, showing it exits 65 with Apple's reason and a broadcast to it fails with the same.
    @Test func aChannelIsCreatedListedShownBroadcastOnAndDeleted() throws {
        let (simulator, environment) = try Self.simulatorWithKey(logger)
        defer { simulator.shutdown() }
        let created = try Self.channels(["create", "--storage", "most-recent", "--json"], environment)
        #expect(created.code == 0, "\(created.output)")
        let channel = try #require(try Self.json(created.output)["channel_id"] as? String)
        #expect(Data(base64Encoded: channel) != nil, "a base64 id like Apple's: \(channel)")
        let plain = try Self.channels(["create"], environment)
        #expect(plain.code == 0 && Data(base64Encoded: plain.output.trimmingCharacters(in: .whitespacesAndNewlines)) != nil)

        let listed = try Self.channels(["list", "--json"], environment)
        let ids = try #require(try Self.json(listed.output)["channels"] as? [String])
        #expect(Set(ids) == [channel, plain.output.trimmingCharacters(in: .whitespacesAndNewlines)])
        let shown = try Self.channels(["show", channel, "--json"], environment)
        #expect(try Self.json(shown.output)["storage"] as? String == "most-recent")
        let otherApp = try Self.channels(["show", channel, "--topic", "com.example.other"], environment)
        #expect(otherApp.code == 65 && otherApp.output.contains("ChannelNotRegistered"), "\(otherApp.output)")

        let configuration = try WorkerConfiguration.load(from: environment)
        let client = APNsClient(configuration: configuration.apns, credentials: try configuration.credential.makeCredentials(),
                                logger: logger)
        defer { client.shutdown() }
        #expect(broadcast(client, channel: channel, expiration: Int64(Date().timeIntervalSince1970) + 3600)?.outcome == .delivered)
        let deleted = try Self.channels(["delete", channel], environment)
        #expect(deleted.code == 0 && deleted.output.contains("deleted \(channel)"))
        let gone = try Self.channels(["show", channel], environment)
        #expect(gone.code == 65 && gone.output.contains("ChannelNotRegistered"), "\(gone.output)")
        let late = broadcast(client, channel: channel)
        #expect(late?.outcome == .permanentFailure && late?.response?.reason == .channelNotRegistered, "\(String(describing: late))")
        #expect(simulator.broadcastsByChannel() == [channel: 1], "one broadcast accepted on the channel")
    }

    /// What the channel management API and broadcasts refuse, as Apple documents it.
    @Test func channelRequestsAreCheckedAsAppleDoes() throws {
        let (simulator, environment) = try Self.simulatorWithKey(logger)
        defer { simulator.shutdown() }
        let created = try Self.channels(["create"], environment)  // storage: none
        let channel = created.output.trimmingCharacters(in: .whitespacesAndNewlines)
        let configuration = try WorkerConfiguration.load(from: environment)
        let client = APNsClient(configuration: configuration.apns, credentials: try configuration.credential.makeCredentials(),
                                logger: logger)
        defer { client.shutdown() }
        let expiring = broadcast(client, channel: channel, expiration: Int64(Date().timeIntervalSince1970) + 60)
        #expect(expiring?.response?.reason == .badExpirationDate, "a no-storage channel takes expiration 0 only")
        #expect(broadcast(client, channel: channel)?.outcome == .delivered)
        let unknown = try Self.channels(["show", "dW5rbm93bg=="], environment)
        #expect(unknown.code == 65 && unknown.output.contains("ChannelNotRegistered"))
        let usage = try Self.channels(["show"], environment)
        #expect(usage.code == 2)
        let badStorage = try Self.channels(["create", "--storage", "forever"], environment)
        #expect(badStorage.code == 2 && badStorage.output.contains("none or most-recent"))
    }
}
