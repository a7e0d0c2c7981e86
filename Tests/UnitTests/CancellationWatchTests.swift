import Foundation
import Testing

@testable import WorkerPipeline

/// What a worker remembers of the fleet's cancellations: the store keeps one for `CancelledJob.retention`, and so
/// does every worker, whether or not anything was cancelled since.
@Suite struct CancellationWatchTests {
    struct Store: JobCancellations {
        var jobs: [CancelledJob]
        func cancelled(since: Double?) throws -> StoreAnswer<[CancelledJob]> {
            .answered(jobs.filter { since == nil || $0.at >= since! })
        }
    }

    @Test func aCancellationIsForgottenWhenTheStoreForgetsIt() throws {
        let start = Date(timeIntervalSince1970: 1_796_184_000)
        var watch = CancellationWatch()
        let store = Store(jobs: [CancelledJob(jobID: "campaign-1", at: start.timeIntervalSince1970)])
        _ = try watch.refresh(from: store, now: start)
        #expect(watch.isCancelled(jobID: "campaign-1", named: true, messageID: nil))
        // Nothing cancelled since: past the retention, a new job with that id is sent, as by a worker started then.
        let later = start.addingTimeInterval(Double(CancelledJob.retention) + 3600)
        _ = try watch.refresh(from: Store(jobs: []), now: later)
        #expect(!watch.isCancelled(jobID: "campaign-1", named: true, messageID: nil))
    }

    /// `jobs cancel` takes a job's id or its message-id: a job whose body names an id of its own is cancelled through
    /// its message-id too, and a job that names nothing is cancelled by no id.
    @Test func aJobIsCancelledThroughItsIdOrItsMessageID() throws {
        var watch = CancellationWatch()
        _ = try watch.refresh(
            from: Store(jobs: [CancelledJob(jobID: "message-7", at: 1_796_184_000)]),
            now: Date(timeIntervalSince1970: 1_796_184_001))
        #expect(watch.isCancelled(jobID: "order-7", named: true, messageID: "message-7"))
        #expect(watch.isCancelled(jobID: "message-7", named: true, messageID: "message-7"))
        #expect(!watch.isCancelled(jobID: "order-7", named: true, messageID: "message-8"))
        #expect(!watch.isCancelled(jobID: "message-7", named: false, messageID: nil), "a fallback id names nothing")
    }
}
