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
        #expect(watch.isCancelled(jobID: "campaign-1", named: true))
        // Nothing cancelled since: past the retention, a new job with that id is sent, as by a worker started then.
        let later = start.addingTimeInterval(Double(CancelledJob.retention) + 3600)
        _ = try watch.refresh(from: Store(jobs: []), now: later)
        #expect(!watch.isCancelled(jobID: "campaign-1", named: true))
    }
}
