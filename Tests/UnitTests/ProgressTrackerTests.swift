import APNs
import Foundation
import Testing

@testable import WorkerPipeline

@Suite struct ProgressTrackerTests {
    /// A job of `tokens` direct tokens under way, its deadline (UNIX seconds) `deadline` if any (`OutgoingQueueTests`
    /// too).
    static func jobUnderWay(_ id: String, tokens: Int, deadline: Int64? = nil) throws -> JobProgress {
        let list = (0..<tokens).map { "\"" + String(format: "%064x", 0xAB_0000 + $0) + "\"" }.joined(separator: ",")
        let deadlineMember = deadline.map { #","deadline":\#($0)"# } ?? ""
        let body = #"{"id":"\#(id)","tokens":[\#(list)]\#(deadlineMember),"payload":{"aps":{}}}"#
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: "com.example.app", fallbackID: "-")
        let delivery = JobDelivery(tag: 1, redelivered: false, body: Array(body.utf8), properties: MessageProperties())
        let targets = job.tokens.map { DeviceTarget(token: $0, environment: .production, user: nil) }
        return JobProgress(job: job, delivery: delivery, generation: 1, targets: targets, hasStableID: true)
    }

    static func counts(_ deltas: [JobProgressDelta], _ id: String) -> [JobProgressDelta.Counter: Int] {
        deltas.first { $0.jobID == id }?.counts ?? [:]
    }

    /// A large job's answers reach the fleet's record as they come, each report saying what came since the last, and
    /// the report of its last answer what is left: the reports add up to the job's outcomes, once each.
    @Test func aLargeJobsAnswersAreReportedAsTheyComeAndAddUpOnce() throws {
        let progress = try Self.jobUnderWay("large-1", tokens: 1_000)
        var tracker = ProgressTracker()
        tracker.resolved(progress)
        var start = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(Self.counts(tracker.take(at: start), "large-1")[.resolved] == 1_000)

        for index in 0..<300 { progress.recordDelivered(index) }
        progress.recordDead(300, APNsResponse(status: 410, reason: .unregistered, timestamp: 1_796_184_000_042))
        progress.recordFailed(301, reason: "BadTopic")
        start += 1
        #expect(tracker.isDue(at: start), "a job in flight is reported while it runs")
        let first = Self.counts(tracker.take(at: start), "large-1")
        #expect(first[.delivered] == 300 && first[.dead] == 1 && first[.failed] == 1, "\(first)")

        start += 1
        #expect(tracker.take(at: start).isEmpty, "nothing new, nothing reported")

        for index in 302..<1_000 { progress.recordDelivered(index) }
        tracker.answered(progress)
        let last = Self.counts(tracker.take(at: start + 1), "large-1")
        #expect(last[.delivered] == 698 && (last[.dead] ?? 0) == 0 && (last[.failed] ?? 0) == 0, "\(last)")
        #expect(!tracker.isDue(at: start + 2), "an answered job is no longer followed")
    }

    /// A job below the size whose progress is kept is neither followed nor reported.
    @Test func aSmallJobIsNotFollowed() throws {
        let progress = try Self.jobUnderWay("small-1", tokens: 999)
        var tracker = ProgressTracker()
        tracker.resolved(progress)
        progress.recordDelivered(0)
        #expect(!tracker.isDue(at: Date()))
        #expect(tracker.take(at: Date()).isEmpty)
    }
}
