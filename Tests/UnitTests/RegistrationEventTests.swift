import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

@Suite struct RegistrationEventTests {
    static let token = String(repeating: "ab", count: 32)

    /// A Live Activity's update token comes with its activity's id and the Live Activity topic.
    @Test func anActivitysUpdateToken() throws {
        let body =
            #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "match-42"}"#
        #expect(try RegistrationEvent.decode(Array(body.utf8), now: 5).registration.activity == "match-42")
        let wrongTopic =
            #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app", "activity": "match-42"}"#
        #expect(throws: JobError.self) { try RegistrationEvent.decode(Array(wrongTopic.utf8), now: 5) }
        for activity in ["a b}{*", "match{42}", "", String(repeating: "a", count: 257), "matčh"] {
            let bad =
                #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "\#(activity)"}"#
            #expect(throws: JobError.badActivityID, "\(activity)") {
                try RegistrationEvent.decode(Array(bad.utf8), now: 5)
            }
        }
        #expect(
            LiveActivityID.isValid("6B0F6AC2-7A1C-4B8E-9A51-2F3C1D0E9B77") && LiveActivityID.isValid("match_42:half.2"))
        let job = try PushJob.decode(
            Array(#"{"topic": "com.example.app", "activity": "match-42", "payload": {"aps": {}}}"#.utf8),
            defaultTopic: nil, fallbackID: "x")
        #expect(job.activity == "match-42" && job.users.isEmpty && job.tokens.isEmpty)
    }

    @Test func aFullEventIsRead() throws {
        let body =
            #"{"user": "u1", "token": "\#(Self.token)", "environment": "sandbox", "timestamp": 1732900000000, "#
            + #""topic": "com.example.app.voip", "device": {"model": "iPhone15,2", "os": "17.1"}, "action": "register"}"#
        let event = try RegistrationEvent.decode(Array(body.utf8), now: 5)
        #expect(event.action == .register)
        #expect(
            event.registration
                == TokenRegistration(
                    user: "u1", token: Self.token,
                    scope: TokenScope(environment: .sandbox, topic: "com.example.app.voip"),
                    registeredAt: 1_732_900_000_000,
                    deviceJSON: #"{"model": "iPhone15,2", "os": "17.1"}"#))
        #expect(try RegistrationEvent.decode(event.json, now: 5) == event, "what it writes, it reads back")
    }

    @Test func defaultsFillTheRest() throws {
        let event = try RegistrationEvent.decode(Array(#"{"user": "u1", "token": "\#(Self.token)"}"#.utf8), now: 42)
        #expect(
            event.action == .register && event.registration.scope == TokenScope(environment: .production),
            "no topic: a device token of the default app")
        #expect(event.registration.registeredAt == 42, "no timestamp: the time it was read")
        #expect(event.registration.deviceJSON == nil)
    }

    @Test(arguments: [
        (#"{"token": "TOKEN"}"#, "missing field \"user\""),
        (#"{"user": "u1"}"#, "missing field \"token\""),
        (#"{"user": "u1", "token": "xyz"}"#, "token: device token is not"),
        (#"{"user": "", "token": "TOKEN"}"#, "user must be 1 to 256 bytes"),
        (#"{"user": "u1", "token": "TOKEN", "environment": "staging"}"#, "environment \"staging\""),
        (#"{"user": "u1", "token": "TOKEN", "action": "delete"}"#, "\"action\" must be"),
        (#"{"user": "u1", "token": "TOKEN", "device": "iPhone"}"#, "\"device\" must be an object"),
        (#"{"user": "u1", "token": "TOKEN", "timestamp": -1}"#, "timestamp"),
        (#"{"user": "u1", "token": "TOKEN", "timestamp": "yesterday"}"#, "\"timestamp\" must be a whole number"),
        (#"{"user": "u1", "token": "TOKEN", "topic": "com.example app"}"#, "\"topic\" must be an APNs topic"),
        (#"{"user": "u1", "token": "TOKEN", "topic": ""}"#, "\"topic\" must be an APNs topic"),
        (#"{"user": "u1", "token": "TOKEN", "topic": 7}"#, "\"topic\" must be a string"),
        (#"[1, 2]"#, "must be a JSON object"),
        (#"{"user": "#, "not JSON")
    ])
    func badEventsSayWhatIsWrong(body: String, expected: String) {
        let text = body.replacingOccurrences(of: "TOKEN", with: Self.token)
        do {
            _ = try RegistrationEvent.decode(Array(text.utf8), now: 1)
            Issue.record("accepted \(text)")
        } catch {
            #expect(error.description.contains(expected), "\(error)")
        }
    }

    @Test func deadTokenEventsReadBackAndRedact() throws {
        let event = DeadTokenEvent(
            token: Self.token, user: nil, topic: "com.example.app", environment: .sandbox,
            status: 410, reason: "Unregistered", timestamp: 1_732_900_000_001, jobID: "j-1")
        #expect(try DeadTokenEvent.decode(event.json) == event)
        let redacted = String(decoding: event.redactedJSON, as: UTF8.self)
        #expect(!redacted.contains(Self.token) && redacted.contains("abababab…(64)"))
        #expect(throws: JobError.self) { try DeadTokenEvent.decode(Array(#"{"token": "zz"}"#.utf8)) }
    }
}
