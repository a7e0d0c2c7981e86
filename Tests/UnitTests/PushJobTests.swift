import APNs
import Foundation
import JSON
import Testing
import WorkerPipeline

@Suite struct PushJobTests {
    func decode(_ text: String, defaultTopic: String? = nil) throws(JobError) -> PushJob {
        try PushJob.decode(Array(text.utf8), defaultTopic: defaultTopic, fallbackID: "fallback")
    }

    @Test func decodesTheContractExample() throws {
        let token = String(repeating: "a1", count: 32)
        let job = try decode(
            """
            {"id": "job-42", "topic": "com.example.app", "users": ["u1", "u2"], "tokens": ["\(token)"],
             "environment": "sandbox", "push_type": "alert", "priority": 10, "expiration": 0,
             "collapse_id": "order-7", "payload": {"aps": {"alert": "Hello"}, "n": 1.50}}
            """)
        #expect(job.id == "job-42")
        #expect(job.topic == "com.example.app")
        #expect(job.users == ["u1", "u2"])
        #expect(job.tokens == [token])
        #expect(job.environment == .sandbox)
        #expect(job.priority == .immediately)
        #expect(job.expiration == 0)
        #expect(job.collapseID == "order-7")
        #expect(
            String(decoding: job.payload, as: UTF8.self) == #"{"aps": {"alert": "Hello"}, "n": 1.50}"#,
            "the payload is forwarded byte for byte")
    }

    @Test func appliesDefaults() throws {
        let job = try decode(#"{"users": ["u1"], "payload": {"aps": {}}}"#, defaultTopic: "com.example.app")
        #expect(job.id == "fallback")
        #expect(job.topic == "com.example.app")
        #expect(job.environment == .production)
        #expect(job.pushType == .alert)
        #expect(job.priority == .immediately)
        let background = try decode(
            #"{"users": ["u1"], "push_type": "background", "payload": {"aps": {"content-available": 1}}}"#,
            defaultTopic: "com.example.app")
        #expect(background.priority == .considerPower)
        let voip = try decode(
            #"{"users": ["u1"], "push_type": "voip", "payload": {}}"#, defaultTopic: "com.example.app")
        #expect(voip.topic == "com.example.app.voip")
    }

    /// `"id": ""` names no id: jobs written that way would share one idempotency record and one cancellation.
    @Test(arguments: [
        #"{"id": "", "users": ["u1"], "payload": {"aps": {}}}"#,
        #"{"id": "", "users": ["u1"], "prevalidate": false, "payload": {"aps": {}}}"#
    ])
    func anEmptyIDIsNone(_ job: String) throws {
        let decoded = try decode(job, defaultTopic: "com.example.app")
        #expect(decoded.id == "fallback")
        #expect(!decoded.idFromBody)
    }

    /// A retry names the id its job named, and no other: a job without one was named after its delivery tag, which
    /// other jobs' deliveries repeat, and their retries shared an idempotency record and a settled name.
    @Test func aRetryNamesOnlyAnIDItsJobNamed() throws {
        let token = String(repeating: "a2", count: 32)
        let target = DeviceTarget(token: token, environment: .production, user: nil)
        for (job, expected) in [
            (#"{"tokens": ["\#(token)"], "payload": {"aps": {}}}"#, "fallback-of-the-retry"),
            (#"{"id": "named", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#, "named")
        ] {
            let first = try PushJob.decode(Array(job.utf8), defaultTopic: "com.example.app", fallbackID: "delivery-5")
            let retry = try PushJob.decode(
                first.retryBody(targets: [target], original: Array(job.utf8)), defaultTopic: nil,
                fallbackID: "fallback-of-the-retry")
            #expect(retry.attempt == 2 && retry.id == expected)
        }
    }

    @Test(arguments: JobCorpus.refused)
    func badJobsAreNamed(body: String, expected: String) {
        do {
            _ = try decode(body)
            Issue.record("decoded a bad job: \(body)")
        } catch {
            #expect(error.description.contains(expected), "\(error.description)")
        }
    }

    @Test func oversizedAndNonUTF8BodiesAreRefused() {
        var bytes = Array(#"{"users": ["u"], "topic": "t", "payload": {"x": ""#.utf8)
        bytes += Array(repeating: UInt8(ascii: "a"), count: 5000)
        bytes += Array(#""}}"#.utf8)
        #expect(throws: JobError.self) { try PushJob.decode(bytes, defaultTopic: nil, fallbackID: "f") }
        do { _ = try PushJob.decode(bytes, defaultTopic: nil, fallbackID: "f") } catch {
            #expect(error.description.contains("over the 4096-byte limit for push_type alert"))
        }
        #expect(throws: JobError.notUTF8) { try PushJob.decode([0x7B, 0xFF, 0x7D], defaultTopic: nil, fallbackID: "f") }
        // Told apart once the reader refuses the body, wherever the bytes that are not UTF-8 sit.
        for place in [
            #"{"users": ["u"], "topic": "t", "payload": {"x": "a\#u{1}b"}}"#,
            #"{"users": ["u"], "topic": "t", "payload": {"a\#u{1}b": 1}}"#, #"{"users": ["\#u{1}"]}"#
        ] {
            let bytes = Array(place.utf8).map { $0 == 1 ? 0xFF : $0 }
            #expect(throws: JobError.notUTF8, "\(place)") {
                try PushJob.decode(bytes, defaultTopic: "t", fallbackID: "f")
            }
        }
        var limits = PushJob.Limits()
        limits.maximumMessageSize = 10
        #expect(throws: JobError.tooLarge(size: 12, limit: 10)) {
            try PushJob.decode(Array(#"{"a":"bcde"}"#.utf8), defaultTopic: nil, fallbackID: "f", limits: limits)
        }
    }

    /// The retry state is the worker's own: an attempt it could not have written (one more than Int.max traps) is
    /// refused naming `retry`.
    @Test func aRetryAttemptBeyondAnyTheWorkerWritesIsRefused() throws {
        let token = String(repeating: "ab", count: 32)
        func retry(_ attempt: String) throws(JobError) -> PushJob {
            try decode(
                #"{"users": [], "topic": "com.example.app", "payload": {}, "retry": {"attempt": \#(attempt), "#
                    + #""targets": [{"token": "\#(token)", "environment": "production"}]}}"#)
        }
        #expect(try retry("3").attempt == 3)
        for attempt in ["9223372036854775807", "1000001", "1"] {
            #expect(throws: JobError.self, "\(attempt)") { try retry(attempt) }
        }
    }

    /// A deadline or send_at in milliseconds is refused stating the cutoff it passed.
    @Test func timesInMillisecondsAreRefusedStatingTheCutoff() {
        for member in [#""deadline": 1796184000000"#, #""send_at": 1796184000000"#] {
            do {
                _ = try decode(#"{"users": ["u"], "topic": "com.example.app", "payload": {}, \#(member)}"#)
                Issue.record("accepted \(member)")
            } catch {
                #expect(error.description.contains("beyond 99999999999 (the year 5138)"), "\(error)")
            }
        }
    }

    @Test func deepNestingIsRefused() {
        let deep = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        let body = #"{"users": ["u"], "topic": "t", "payload": {"x": \#(deep)}}"#
        do {
            _ = try decode(body)
            Issue.record("accepted 100 levels")
        } catch {
            #expect(error.description.contains("nesting deeper than 32 levels"), "\(error)")
        }
    }
}
