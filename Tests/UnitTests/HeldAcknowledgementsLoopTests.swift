import Foundation
import Testing
import WorkerPipeline

/// Acknowledgements the broker holds back (to fold them into one frame) go out when due, from the session loop's own
/// turns: a worker with nothing more to do does not leave finished jobs unacknowledged.
@Suite struct HeldAcknowledgementsLoopTests {
    typealias Spec = WorkerTests

    @Test func heldAcknowledgementsGoOutWhenDueWhileTheWorkerRuns() {
        let fleet = InMemoryFleet()
        fleet.change { $0.acknowledgementHold = 0.3 }
        let running = Spec.Running(fleet)
        let tag = fleet.deliver(Spec.job("held", tokens: [Spec.token(1)]))
        #expect(fleet.wait { $0.heldAcknowledgements.contains { $0.tag == tag } }, "finished, held back")
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "acknowledged once due, the worker still running")
        running.stop()
        #expect(fleet.read(\.acknowledged) == [tag])
        // The held acknowledgement went on its own: the worker's metrics count the frame its session sent.
        #expect(running.worker.metricsText.contains(#"apns_worker_acknowledgement_frames_total{kind="multiple"} 0"#))
        #expect(running.worker.metricsText.contains(#"apns_worker_acknowledgement_frames_total{kind="single"} 1"#))
    }
}
