import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// A job's summary (reply_to) goes out at most once.
@Suite struct WorkerSummaryTests {
    typealias Spec = WorkerTests

    /// A job whose dead-token event the broker did not take is held, its summary already out: neither publishing it
    /// again nor a redelivery (its worker stopped meanwhile) sends a second summary.
    @Test func aHeldJobsSummaryIsNotPublishedAgain() throws {
        let fleet = InMemoryFleet()
        let dead = Spec.token(1)
        fleet.change { $0.missingQueues = [.deadTokens] }
        var settings = Spec.settings()
        settings.core.shutdownTimeout = 0.2
        let answer: @Sendable (APNsNotification) -> APNsResponse = { _ in
            APNsResponse(status: 410, reason: .unregistered)
        }
        let first = Spec.Running(fleet, settings: settings, answer: answer)
        let body = Spec.job("held", tokens: [dead])
        let tag = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.settled["held"]?.summarySent == true }, "held, with its summary recorded as sent")
        first.stop()
        #expect(!fleet.read(\.acknowledged).contains(tag), "held jobs stay unacknowledged")
        fleet.change { $0.missingQueues = [] }
        let second = Spec.Running(fleet, settings: settings, answer: answer)
        let again = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(again) })
        second.stop()
        let destinations = fleet.read { $0.published.map(\.destination) }
        #expect(destinations == [.reply("replies"), .deadTokens], "one summary, then the event: \(destinations)")
        #expect(fleet.read(\.sent).count == 1, "the token was not sent to again")
    }

    /// A job id is the summary's correlation id when the job had none, and AMQP's correlation id is a short string of
    /// at most 255 bytes: a longer id (ids have no limit) is cut with a hash of the whole, so that two stay two.
    /// Whole, the summary could not be published, and the session that tried ended over and over.
    @Test func aLongJobIDMakesACorrelationIDThatFitsAShortString() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet)
        let ids = ["é" + String(repeating: "x", count: 298), "é" + String(repeating: "x", count: 297) + "y", "short"]
        for (index, id) in ids.enumerated() {
            let tag = fleet.deliver(
                Spec.job(id, tokens: [Spec.token(index + 1)]), properties: MessageProperties(replyTo: "replies"))
            #expect(fleet.wait { $0.acknowledged.contains(tag) })
        }
        running.stop()
        let correlations = fleet.read { $0.published.compactMap(\.properties.correlationID) }
        #expect(correlations.count == 3 && correlations.allSatisfy { $0.utf8.count <= 255 }, "\(correlations)")
        #expect(Set(correlations).count == 3, "two long ids stay two")
        #expect(correlations.last == "short", "a short id as it is")
        #expect(correlations.first.map { $0.hasPrefix("é" + String(repeating: "x", count: 230)) } == true)
    }
}
