import APNs
import Foundation
import JSON
import Testing
import WorkerPipeline

@Suite struct PrevalidationTests {
    @Test func prevalidationSendsASilentBackgroundPush() throws {
        let job = try PushJob.decode(
            Array(
                #"{"id": "campaign-1", "users": ["u1"], "prevalidate": true, "push_type": "alert", "payload": {"aps": {"alert": "Big sale"}}}"#
                    .utf8),
            defaultTopic: "com.example.app", fallbackID: "f")
        #expect(job.pushType == .background)
        #expect(job.priority == .considerPower)
        #expect(job.expiration == 0)
        #expect(job.topic == "com.example.app")
        #expect(
            String(decoding: job.payload, as: UTF8.self) == #"{"aps":{"content-available":1}}"#,
            "the campaign's real payload is not sent")
    }

    @Test func retryBodiesRoundTripAndKeepTheOriginalJob() throws {
        let original = Array(
            #"{"id": "r", "users": ["u\"1"], "tokens": ["aa"], "collapse_id": "c", "expiration": 5, "deadline": 1798761600, "payload": {"aps": {"alert": "x"}}}"#
                .utf8)
        let targets = [
            DeviceTarget(token: "bb", environment: .sandbox, user: "u\"1"),
            DeviceTarget(token: "cc", environment: .production, user: nil)
        ]
        let first = try PushJob.decode(original, defaultTopic: "t", fallbackID: "f")
        #expect(first.attempt == 1)
        let job = try PushJob.decode(
            first.retryBody(targets: targets, original: original), defaultTopic: nil, fallbackID: "f")
        #expect(job.attempt == 2)
        let again = try PushJob.decode(
            job.retryBody(targets: targets, original: original), defaultTopic: nil, fallbackID: "f")
        #expect(again.attempt == 3)
        #expect(again.retryTargets == targets)
        #expect(again.payload == job.payload)
        #expect(again.collapseID == "c" && again.expiration == 5 && again.topic == "t" && again.id == "r")
        #expect(again.deadline == 1_798_761_600, "a retry keeps the job's deadline")
        #expect(again.originalBody == original, "what is parked after the last attempt is what the sender enqueued")
        // A retry of a retry carries the same original, not the first retry's body.
        let third = try PushJob.decode(
            again.retryBody(targets: [targets[0]], original: Array("{}".utf8)), defaultTopic: nil,
            fallbackID: "f")
        #expect(third.originalBody == original && third.attempt == 4)
    }

    /// A retry body is the worker's own: it may be larger and two levels deeper than a job, as it holds the job.
    @Test func retryBodiesMayExceedTheJobLimitsByTheJobTheyHold() throws {
        var limits = PushJob.Limits()
        limits.maximumMessageSize = 200
        limits.maximumDepth = 4
        let original = Array(
            #"{"id": "r", "tokens": ["aa"], "topic": "t", "payload": {"aps": {"alert": {"title": "x"}}}}"#.utf8)
        let job = try PushJob.decode(original, defaultTopic: nil, fallbackID: "f", limits: limits)
        let retry = job.retryBody(
            targets: [DeviceTarget(token: "aa", environment: .production, user: nil)], original: original)
        #expect(retry.count > 200)
        #expect(try PushJob.decode(retry, defaultTopic: nil, fallbackID: "f", limits: limits).originalBody == original)
        let deep = Array(#"{"tokens": ["aa"], "topic": "t", "payload": {"aps": {"alert": {"title": {"x": 1}}}}}"#.utf8)
        #expect(throws: JobError.self, "a job is held to the depth limit") {
            try PushJob.decode(deep, defaultTopic: nil, fallbackID: "f", limits: limits)
        }
    }
}
