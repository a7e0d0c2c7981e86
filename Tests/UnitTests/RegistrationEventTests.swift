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
    /// A reading time in ms, in December 2026.
    static let now: Int64 = 1_796_184_000_000

    /// A Live Activity's update token comes with its activity's id and the Live Activity topic.
    @Test func anActivitysUpdateToken() throws {
        let body =
            #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "match-42"}"#
        #expect(try RegistrationEvent.decode(Array(body.utf8), now: Self.now).registration.activity == "match-42")
        let wrongTopic =
            #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app", "activity": "match-42"}"#
        #expect(throws: JobError.self) { try RegistrationEvent.decode(Array(wrongTopic.utf8), now: Self.now) }
        for activity in ["a b}{*", "match{42}", "", String(repeating: "a", count: 257), "matčh"] {
            let bad =
                #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "\#(activity)"}"#
            #expect(throws: JobError.badActivityID, "\(activity)") {
                try RegistrationEvent.decode(Array(bad.utf8), now: Self.now)
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
        let event = try RegistrationEvent.decode(Array(body.utf8), now: Self.now)
        #expect(event.action == .register)
        #expect(
            event.registration
                == TokenRegistration(
                    user: "u1", token: Self.token,
                    scope: TokenScope(environment: .sandbox, topic: "com.example.app.voip"),
                    registeredAt: 1_732_900_000_000,
                    deviceJSON: #"{"model": "iPhone15,2", "os": "17.1"}"#))
        #expect(try RegistrationEvent.decode(event.json, now: Self.now) == event, "what it writes, it reads back")
    }

    /// A time in seconds would make the registration decades old (the inactivity sweep would remove the token), one
    /// in microseconds a registration nothing later could supersede: both are refused naming the likely unit.
    @Test func aTimestampInAnotherUnitIsRefused() throws {
        func decode(_ timestamp: String) throws(JobError) -> RegistrationEvent {
            try RegistrationEvent.decode(
                Array(#"{"user": "u1", "token": "\#(Self.token)", "timestamp": \#(timestamp)}"#.utf8), now: Self.now)
        }
        #expect(try decode("1796183000000").registration.registeredAt == 1_796_183_000_000)
        #expect(try decode("1796190000000").registration.registeredAt == 1_796_190_000_000, "a device clock ahead")
        for (timestamp, words) in [
            ("1796184000", "seconds?"), ("1796184000000000", "microseconds?"), ("-5", "got -5"), ("0", "got 0")
        ] {
            do {
                _ = try decode(timestamp)
                Issue.record("accepted \(timestamp)")
            } catch {
                #expect(error.description.contains("timestamp") && error.description.contains(words), "\(error)")
            }
        }
    }

    /// Dead-token events come from APNs's 410 and 400 answers, with APNs's time in ms: anything else would remove a
    /// token on a guess, and is refused.
    @Test func aDeadTokenEventIsAnAPNsAnswerForADeadToken() throws {
        func decode(_ rest: String) throws(JobError) -> DeadTokenEvent {
            try DeadTokenEvent.decode(Array(#"{"token": "\#(Self.token)", \#(rest)}"#.utf8))
        }
        #expect(try decode(#""status": 410, "timestamp": 1796184000000"#).timestamp == 1_796_184_000_000)
        #expect(try decode(#""status": 400, "reason": "BadDeviceToken""#).timestamp == nil)
        #expect(try decode(#""topic": "com.example.app.voip""#).topic == "com.example.app.voip")
        for rest in [
            #""status": 200"#, #""status": 500"#, #""timestamp": -5"#, #""timestamp": 1796184000"#,
            #""timestamp": 1796184000000000"#,
            #""topic": "../x y""#
        ] {
            #expect(throws: JobError.self, "\(rest)") { try decode(rest) }
        }
    }

    /// An error repeats a field's text (in the log and the parked event's reason): a token sent in the wrong field
    /// is not repeated whole.
    @Test func aTokenInTheWrongFieldIsNotRepeatedWhole() {
        for field in ["environment", "action"] {
            do {
                _ = try RegistrationEvent.decode(
                    Array(#"{"user": "u1", "token": "\#(Self.token)", "\#(field)": "\#(Self.token)"}"#.utf8),
                    now: Self.now)
                Issue.record("accepted a token as \(field)")
            } catch {
                #expect(!error.description.contains(Self.token), "\(error)")
                #expect(error.description.contains(String(Self.token.prefix(32)) + "…(64 characters)"), "\(error)")
            }
        }
        #expect(JobError.echo("sandbox") == "sandbox")
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
