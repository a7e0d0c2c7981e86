import AMQP
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// A job's `local_window`: each user is reached only inside those hours of the user's own day (the time zone the user
/// registered, else the job's `default_timezone`); the rest waits in the broker and goes out as each window opens.
@Suite struct LocalWindowTests {
    let logger = Logger(label: "window", level: .critical)

    /// Four users: Tokyo (UTC+9), whose window is made to open at the first whole minute at least a minute from now;
    /// Brisbane (UTC+10) and a user without a zone under `default_timezone` Brisbane, an hour later in their day and
    /// so inside it now; New York, fourteen hours earlier and outside it for hours. The Brisbane users are reached at
    /// once, the Tokyo user within a second of the opening, the New York user not at all meanwhile, and `jobs show`
    /// counts that user as waiting for the window. (Neither Tokyo nor Brisbane has daylight-saving time, and New York
    /// is 13 or 14 hours behind Tokyo all year.)
    @Test func eachUserIsReachedAsTheirWindowOpens() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let redisURL = try TestServices.redisURL().description(revealingPassword: true)
        let redis = try RedisConnection(url: TestServices.redisURL())
        let cache = TokenCache(redis: redis, logger: logger)
        let tokyo = TestServices.unique("tokyo")
        let brisbane = TestServices.unique("brisbane")
        let newYork = TestServices.unique("new-york")
        let zoneless = TestServices.unique("zoneless")
        let token = { (index: Int) in String(format: "%064x", 0x7F_0000 + index) }

        // Tokyo's zone through `tokens add --timezone`, the others' through registration events.
        let add = try ExecutablesTests.Child(
            "apns-worker", ["tokens", "add", tokyo, token(0), "--timezone", "Asia/Tokyo"],
            environment: ["REDIS_URL": redisURL])
        let added = add.waitForLine(containing: "added", timeout: 30) ?? ""
        #expect(add.waitForExit() == 0 && added.contains("Asia/Tokyo"), "tokens add: \(added)")
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let events = try [
            (brisbane, 1, "\"Australia/Brisbane\""), (newYork, 2, "\"America/New_York\""),
            (zoneless, 3, "null")
        ].map { user, index, zone in
            try RegistrationEvent.decode(
                Array(#"{"user": "\#(user)", "token": "\#(token(index))", "timezone": \#(zone)}"#.utf8),
                now: now
            ).registration
        }
        #expect(try cache.register(events).allSatisfy { $0 == .applied })
        #expect(try redis.command(["GET", RedisKeys.node.timeZone(newYork)]).text == "America/New_York")

        // The window opens in Tokyo at the first whole minute a minute or more from now, and lasts three hours.
        let opening = (Int64(Date().timeIntervalSince1970) + 60 + 59) / 60 * 60
        let tokyoZone = try #require(TimeZone(identifier: "Asia/Tokyo"))
        let startMinute = Int((opening + Int64(tokyoZone.secondsFromGMT())) / 60 % 1440)
        let clock = { (minute: Int) in String(format: "%02d:%02d", minute / 60 % 24, minute % 60) }
        let (start, end) = (clock(startMinute), clock((startMinute + 180) % 1440))
        let jobID = TestServices.unique("windowed")
        let users = [tokyo, brisbane, newYork, zoneless].map { "\"\($0)\"" }.joined(separator: ",")
        try publisher.publish(
            to: jobs,
            body: Array(
                #"""
                {"id": "\#(jobID)", "users": [\#(users)], "local_window": {"start": "\#(start)", "end": "\#(end)"},
                 "default_timezone": "Australia/Brisbane", "payload": {"aps": {"alert": "good morning"}}}
                """#.utf8), properties: AMQPProperties(replyTo: replies))
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { worker.stop() }

        let first = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 30).first))
        #expect(first["delivered"] as? Int == 2 && first["waiting_for_window"] as? Int == 2, "\(first)")
        #expect(Set(simulator.received().map(\.deviceToken)) == [token(1), token(3)], "Brisbane's users, at once")
        // The worker reports progress about once a second.
        var shown: [String: Any] = [:]
        let counted = try TestServices.waitUntil(timeout: 10) {
            shown = try JobCancelTests.show(jobID, redisURL: redisURL)
            return shown["waiting_for_window"] as? Int == 2
        }
        #expect(counted && shown["state"] as? String == "running" && shown["delivered"] as? Int == 2, "\(shown)")

        let second = try JobCancelTests.summary(try #require(try replyReader.read(1, timeout: 150).first))
        #expect(second["delivered"] as? Int == 1 && second["waiting_for_window"] as? Int == 0, "\(second)")
        let tokyoPush = try #require(simulator.received().first { $0.deviceToken == token(0) })
        #expect(
            tokyoPush.receivedAt >= Double(opening) && tokyoPush.receivedAt <= Double(opening) + 1,
            "Tokyo's push \(tokyoPush.receivedAt - Double(opening)) s from its window's opening")
        #expect(!simulator.received().contains { $0.deviceToken == token(2) }, "New York's window is hours away")
        let left = try TestServices.waitUntil(timeout: 10) {
            shown = try JobCancelTests.show(jobID, redisURL: redisURL)
            return shown["waiting_for_window"] as? Int == 1
        }
        #expect(left && shown["delivered"] as? Int == 3 && shown["state"] as? String == "running", "\(shown)")
        print(
            String(
                format: "local window | Tokyo's push %.3f s after its window opened; Brisbane at once; New York waits",
                tokyoPush.receivedAt - Double(opening)))
    }
}
