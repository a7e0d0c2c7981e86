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
        let body = #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "match-42"}"#
        #expect(try RegistrationEvent.decode(Array(body.utf8), now: 5).registration.activity == "match-42")
        let wrongTopic = #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app", "activity": "match-42"}"#
        #expect(throws: JobError.self) { try RegistrationEvent.decode(Array(wrongTopic.utf8), now: 5) }
        for activity in ["a b}{*", "match{42}", "", String(repeating: "a", count: 257), "matčh"] {
            let bad = #"{"user": "u1", "token": "\#(Self.token)", "topic": "com.example.app.push-type.liveactivity", "activity": "\#(activity)"}"#
            #expect(throws: JobError.badActivityID, "\(activity)") { try RegistrationEvent.decode(Array(bad.utf8), now: 5) }
        }
        #expect(LiveActivityID.isValid("6B0F6AC2-7A1C-4B8E-9A51-2F3C1D0E9B77") && LiveActivityID.isValid("match_42:half.2"))
        let job = try PushJob.decode(Array(#"{"topic": "com.example.app", "activity": "match-42", "payload": {"aps": {}}}"#.utf8),
                                     defaultTopic: nil, fallbackID: "x")
        #expect(job.activity == "match-42" && job.users.isEmpty && job.tokens.isEmpty)
    }

    @Test func aFullEventIsRead() throws {
        let body = #"{"user": "u1", "token": "\#(Self.token)", "environment": "sandbox", "timestamp": 1732900000000, "#
            + #""topic": "com.example.app.voip", "device": {"model": "iPhone15,2", "os": "17.1"}, "action": "register"}"#
        let event = try RegistrationEvent.decode(Array(body.utf8), now: 5)
        #expect(event.action == .register)
        #expect(event.registration == TokenRegistration(user: "u1", token: Self.token,
                                                        scope: TokenScope(environment: .sandbox, topic: "com.example.app.voip"),
                                                        registeredAt: 1_732_900_000_000,
                                                        deviceJSON: #"{"model": "iPhone15,2", "os": "17.1"}"#))
        #expect(try RegistrationEvent.decode(event.json, now: 5) == event, "what it writes, it reads back")
    }

    @Test func defaultsFillTheRest() throws {
        let event = try RegistrationEvent.decode(Array(#"{"user": "u1", "token": "\#(Self.token)"}"#.utf8), now: 42)
        #expect(event.action == .register && event.registration.scope == TokenScope(environment: .production),
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
        (#"{"user": "#, "not JSON"),
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
        let event = DeadTokenEvent(token: Self.token, user: nil, topic: "com.example.app", environment: .sandbox,
                                   status: 410, reason: "Unregistered", timestamp: 1_732_900_000_001, jobID: "j-1")
        #expect(try DeadTokenEvent.decode(event.json) == event)
        let redacted = String(decoding: event.redactedJSON, as: UTF8.self)
        #expect(!redacted.contains(Self.token) && redacted.contains("abababab…(64)"))
        #expect(throws: JobError.self) { try DeadTokenEvent.decode(Array(#"{"token": "zz"}"#.utf8)) }
    }
}

@Suite struct JobReaderTests {
    func reader(_ text: String, lineLimit: Int = 1 << 20) throws -> JobReader {
        try JobReader(path: try TemporaryText.file(text), lineLimit: lineLimit)
    }

    /// Jobs as (line, body); an over-limit line as (line, "OVER LIMIT").
    func all(_ text: String, lineLimit: Int = 1 << 20) throws -> [(line: Int, body: String)] {
        var reader = try reader(text, lineLimit: lineLimit)
        var jobs: [(Int, String)] = []
        while let entry = try reader.next() {
            switch entry {
            case .job(let line, let body): jobs.append((line, String(decoding: body, as: UTF8.self)))
            case .overLimit(let line): jobs.append((line, "OVER LIMIT"))
            }
        }
        return jobs
    }

    @Test func aLineOverTheLimitIsRefusedAndTheNextLinesRead() throws {
        let long = String(repeating: "x", count: 100)
        let jobs = try all("{\"a\": 1}\n\(long)\n{\"b\": 2}\n\(long)", lineLimit: 40)
        #expect(jobs.map(\.line) == [1, 2, 3, 4])
        #expect(jobs.map(\.body) == ["{\"a\": 1}", "OVER LIMIT", "{\"b\": 2}", "OVER LIMIT"])
        #expect(try all(String(repeating: "y", count: 40) + "\n", lineLimit: 40).map(\.body) == [String(repeating: "y", count: 40)],
                "a line of exactly the limit is taken")
    }

    /// A line that never ends (`/dev/zero`): refused once past the limit, then the reading stops with bounded memory.
    @Test func aLineWithoutEndStopsTheReading() throws {
        var reader = try JobReader(path: "/dev/zero", lineLimit: 1 << 20)
        #expect(try reader.next() == .overLimit(line: 1))
        #expect(throws: JobReaderError.self) { try reader.next() }
        #expect(reader.bytesRead > JobReader.maximumSkipped && reader.bytesRead <= JobReader.maximumSkipped + (2 << 20))
    }

    /// Many short lines arriving in one read are each found once: a million of them take a moment, not minutes.
    @Test func manyLinesInOneReadAreEachTakenOnce() throws {
        let text = String(repeating: "{}\n", count: 200_000)
        #expect(try all(text).count == 200_000)
    }

    @Test func jsonLinesKeepTheirLineNumbers() throws {
        let jobs = try all("{\"a\": 1}\n\n   \n{\"b\": 2}\r\nnot json\n{\"c\": 3}")
        #expect(jobs.map(\.line) == [1, 4, 5, 6], "blank lines skipped, numbers kept")
        #expect(jobs[1].body == "{\"b\": 2}\r", "bodies unchanged (the checks judge them)")
        #expect(jobs[3].body == "{\"c\": 3}", "a last line without a newline counts")
    }

    @Test func aPrettyPrintedFileIsOneJob() throws {
        let jobs = try all("{\n  \"users\": [\"u1\"],\n  \"payload\": {}\n}\n")
        #expect(jobs.count == 1 && jobs[0].line == 1)
        #expect(jobs[0].body.contains("\"payload\": {}"))
    }

    @Test func aMissingFileIsNamed() {
        #expect(throws: JobReaderError.self) { try JobReader(path: "/nonexistent/jobs.jsonl") }
    }

    @Test func theSizeIsKnownForProgress() throws {
        var reader = try reader("{\"a\": 1}\n")
        #expect(reader.totalBytes == 9)
        _ = try reader.next()
        #expect(reader.bytesRead == 9)
    }
}

@Suite struct HistogramTests {
    @Test func countsFallIntoCumulativeBuckets() {
        let histogram = Histogram(bounds: [0.001, 0.01, 0.1])
        for nanoseconds: UInt64 in [500_000, 1_000_000, 5_000_000, 50_000_000, 2_000_000_000] {
            histogram.observe(nanoseconds: nanoseconds)
        }
        #expect(histogram.cumulativeCounts == [2, 3, 4, 5], "a bound is inclusive (le), the last is +Inf")
        var metrics = PrometheusText()
        metrics.histogram("latency_seconds", "Test.", histogram)
        let text = metrics.text
        #expect(text.contains("# TYPE latency_seconds histogram"))
        #expect(text.contains("latency_seconds_bucket{le=\"0.01\"} 3"))
        #expect(text.contains("latency_seconds_bucket{le=\"+Inf\"} 5"))
        #expect(text.contains("latency_seconds_count 5"))
        #expect(text.contains("latency_seconds_sum 2.0565"))
        var labelled = PrometheusText()
        labelled.histograms("lane_seconds", "Test.", [([("lane", "urgent")], histogram)])
        #expect(labelled.text.contains("lane_seconds_bucket{lane=\"urgent\",le=\"0.001\"} 2\n"))
        #expect(labelled.text.contains("lane_seconds_bucket{lane=\"urgent\",le=\"+Inf\"} 5\n"))
        #expect(labelled.text.contains("lane_seconds_count{lane=\"urgent\"} 5\n"))
        #expect(labelled.text.contains("lane_seconds_sum{lane=\"urgent\"} 2.0565"))
    }

    @Test func labelValuesAreEscapedAsTheFormatWants() {
        var metrics = PrometheusText()
        metrics.family("answers_total", "counter", "Test.", [([("reason", "a\"b\\c\nd")], 2), ([], 1)])
        #expect(metrics.text == "# HELP answers_total Test.\n# TYPE answers_total counter\n"
                + "answers_total{reason=\"a\\\"b\\\\c\\nd\"} 2\nanswers_total 1\n")
    }
}

enum TemporaryText {
    static func file(_ text: String) throws -> String {
        let path = NSTemporaryDirectory() + "jobs-\(UUID().uuidString).jsonl"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}

@Suite struct HeaderBlockTests {
    @Test func fieldsKeepTheirOrderValuesAndIndexing() {
        var shared = HTTP2HeaderBlock(capacity: 0)
        shared.add("apns-topic", "com.example.app")
        var block = HTTP2HeaderBlock.request(method: "POST", authority: "api.push.apple.com", path: "/3/device/ab")
        block.append(contentsOf: shared)
        block.add(":path", "/3/device/cd", indexed: false)
        #expect(block.count == 6)
        #expect(block.fields.map(\.name) == [":method", ":scheme", ":authority", ":path", "apns-topic", ":path"])
        #expect(block.value("apns-topic") == "com.example.app")
        #expect(block.value(":path") == "/3/device/ab", "the first of a name")
        #expect(block.value("apns-id") == nil && block.value("apns-topi") == nil, "names match whole")
        #expect(block.fields.last?.value == "/3/device/cd")
        #expect(block.fields.map(\.indexed) == [true, true, true, false, true, false], "unique values (paths) are never indexed")
    }
}

/// Messages of the modules below Configuration speak their own words; where an operator needs the setting's name,
/// the configuration layer names it.
@Suite struct MessagesOutsideConfigurationTests {
    @Test func pipelineMessagesNameNoSetting() {
        let texts = [JobError.missingTopic.description, WorkerStatistics().prometheusText(ready: true)]
        for text in texts {
            let named = SettingKeys.all.filter { text.contains($0) }
            #expect(named.isEmpty, "\(named.sorted()) in \(text.prefix(200))")
        }
    }

    /// Events that go straight to their queue leave a watcher nothing to bind to: it refuses before connecting, in
    /// the broker's words, and the configuration layer names the setting to change.
    @Test func theDeadTokenWatcherRefusesNoExchangeAndConfigurationNamesIt() throws {
        let configuration = try WorkerConfiguration.load(from: ["PUSH_DEAD_TOKENS_EXCHANGE": ""], requiringCredentials: false)
        do {
            _ = try DeadTokenWatcher(configuration: configuration)
            Issue.record("a watcher started with no exchange")
        } catch {
            #expect(!"\(error)".contains("PUSH_") && "\(error)".contains("push.dead-tokens"), "\(error)")
            let named = try #require(ConfigurationError(naming: error))
            #expect(named == ConfigurationError(key: "PUSH_DEAD_TOKENS_EXCHANGE", "empty: events go straight to "
                                                + "push.dead-tokens, so there is nothing to watch without taking them"))
        }
    }
}

/// `apns-worker enqueue --user ... --alert ...`: the job the flags describe, and what a flag's value cannot be.
@Suite struct JobFlagsTests {
    var alert: JobFlags {
        var flags = JobFlags()
        flags.users = ["alice"]
        flags.alert = "Your order shipped"
        return flags
    }

    @Test func aDeadlineInSecondsIsTheJobsDeadline() throws {
        var flags = alert
        flags.deadline = "4102444800"
        let job = try PushJob.decode(try flags.body(), defaultTopic: "com.example.app", fallbackID: "flags")
        #expect(job.deadline == 4_102_444_800 && job.users == ["alice"])
    }

    /// Milliseconds are what many clocks give: the error names the flag, the unit it wants and the value in it.
    @Test func aDeadlineInMillisecondsNamesTheFlagAndItsUnit() {
        var flags = alert
        flags.deadline = "4102444800000"
        do {
            _ = try flags.body()
            Issue.record("a deadline in milliseconds was accepted")
        } catch {
            #expect(error.description.hasPrefix("--deadline wants UNIX seconds"), "\(error)")
            #expect(error.description.contains("milliseconds") && error.description.hasSuffix("--deadline 4102444800"),
                    "\(error)")
        }
        flags.deadline = "-1"
        #expect(throws: JobFlags.Problem.self) { try flags.body() }
    }
}
