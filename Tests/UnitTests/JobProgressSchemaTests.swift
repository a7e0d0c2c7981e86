import Foundation
import RedisStore
import Testing
import WorkerPipeline

/// `schema/job-progress.schema.json` holds what `apns-worker jobs show --json` and `jobs list --json` print, checked by
/// the independent validator.
@Suite struct JobProgressSchemaTests {
    static func report(_ fields: [String: String], cancelled: Bool = false) -> JobProgressReport {
        JobProgressReport(jobID: "campaign-7", fields: fields, cancelled: cancelled)
    }

    /// A job cancelled after it ended stays done (the cancellation only keeps its id from being sent again); one
    /// that ended after it was cancelled, settling what was left as cancelled, is cancelled.
    @Test func aJobThatEndedBeforeItsCancellationStaysDone() {
        let ended = ["sent": "3", "delivered": "3", "ended": "1796000099000", "first_update": "1796000098000"]
        let after = JobProgressReport(jobID: "j", fields: ended, cancelled: true, cancelledAt: 1_796_000_100)
        let before = JobProgressReport(jobID: "j", fields: ended, cancelled: true, cancelledAt: 1_796_000_098.5)
        #expect(after.state == .done && before.state == .cancelled)
    }

    @Test func everyStateThatShowPrintsValidates() throws {
        let running = Self.report([
            "targets": "20000", "resolved": "20000", "sent": "5000", "delivered": "4990",
            "first_update": "1796000090000", "last_update": "1796000100000"
        ])
        let done = Self.report([
            "sent": "3", "delivered": "3", "ended": "1796000099000", "first_update": "1796000098000",
            "last_update": "1796000099000"
        ])
        let reports = [
            running, done, Self.report([:]),
            Self.report(
                [
                    "sent": "2", "first_update": "1796000099000",
                    "last_update": "1796000099000"
                ], cancelled: true)
        ]
        #expect(reports.map(\.state) == [.running, .done, .unknown, .cancelled])
        #expect(running.ratePerSecond == 500 && running.etaSeconds == 30, "5,000 in 10 s, 15,000 left")
        let documents =
            reports.map { (definition: "-", text: $0.json) }
            + [(definition: "job_list", text: "[" + reports.map(\.json).joined(separator: ",") + "]")]
        let verdicts = try JobSchemaTests.schemaVerdicts(documents, schema: "job-progress.schema.json")
        #expect(verdicts.allSatisfy { $0.accepts }, "\(verdicts) for \(documents.map(\.text))")
        // The schema holds the exact names: one more field, or one missing, is refused.
        let extra = running.json.dropLast() + ",\"total\":1}"
        let missing = running.json.replacingOccurrences(of: "\"cancelled\":0,", with: "")
        let refused = try JobSchemaTests.schemaVerdicts(
            [("-", String(extra)), ("-", missing)],
            schema: "job-progress.schema.json")
        #expect(refused.allSatisfy { !$0.accepts }, "\(refused)")
    }

    /// A job's id is its publisher's and `jobs show` prints it on a terminal: no escape sequence gets through.
    @Test func aJobsIdIsShownWithoutControlCharacters() {
        let report = JobProgressReport(jobID: "evil\u{1B}]2;owned\u{07}", fields: [:], cancelled: false)
        #expect(report.text.hasPrefix("job evil?]2;owned?: "), "\(report.text)")
        #expect(report.json.contains("evil\\u001b]2;owned\\u0007"), "JSON keeps the id, escaped: \(report.json)")
    }
}
