import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// `apns-worker jobs cancel`: what a cancelled job has not handed to APNs is not sent, and it settles as usual.
@Suite struct WorkerCancellationTests {
    typealias Spec = WorkerTests

    static func summary(_ fleet: InMemoryFleet) -> [String: Any]? {
        fleet.read { state in
            state.published.first { $0.destination == .reply("replies") }
                .flatMap { try? JSONSerialization.jsonObject(with: Data($0.body)) as? [String: Any] }
        }
    }

    /// Cancels `jobID` fleet-wide; returns whether a worker read the cancellations since (within the wait's timeout).
    static func cancel(_ jobID: String, in fleet: InMemoryFleet) -> Bool {
        let reads = fleet.read(\.cancellationReads)
        fleet.change { $0.cancelled.append(CancelledJob(jobID: jobID, at: Date().timeIntervalSince1970)) }
        return fleet.wait { $0.cancellationReads > reads + 1 }
    }

    /// Cancelled with 20 of its 200 notifications in flight: the other 180 are never sent, the 20 are answered, and
    /// the job is acknowledged with a summary that counts 180 cancelled.
    @Test func aJobCancelledMidwaySendsNothingMore() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 20))
        let tag = fleet.deliver(
            Spec.job("campaign", tokens: (1...200).map(Spec.token)),
            properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.sent.count == 20 }, "the window is full")
        #expect(Self.cancel("campaign", in: fleet), "the worker read the cancellations again")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read { $0.sent.count } == 20, "nothing sent after the cancellation")
        let summary = try #require(Self.summary(fleet))
        #expect(
            summary["notifications"] as? Int == 200 && summary["delivered"] as? Int == 20
                && summary["cancelled"] as? Int == 180, "\(summary)")
        #expect(fleet.read { $0.published.map(\.destination) } == [.reply("replies")], "nothing parked or retried")
    }

    /// A job cancelled before it arrives sends nothing; a job of another id beside it is sent whole.
    @Test func aJobCancelledBeforeItArrivesSendsNothing() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cancelled = [CancelledJob(jobID: "early", at: Date().timeIntervalSince1970)] }
        let running = Spec.Running(fleet, settings: Spec.settings())
        let cancelled = fleet.deliver(
            Spec.job("early", tokens: (1...5).map(Spec.token)),
            properties: MessageProperties(replyTo: "replies"))
        let other = fleet.deliver(Spec.job("other", tokens: [Spec.token(9)]))
        #expect(fleet.wait { $0.acknowledged.contains(cancelled) && $0.acknowledged.contains(other) })
        running.stop()
        #expect(fleet.read { $0.sent.map(\.token) } == [Spec.token(9)])
        #expect(Self.summary(fleet)?["cancelled"] as? Int == 5)
    }
}
