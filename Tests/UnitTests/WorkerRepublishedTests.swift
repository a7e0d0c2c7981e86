import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// Copies of jobs a publisher made after a broker failover (`Worker.republishedHeader`) send nothing twice.
@Suite struct WorkerRepublishedTests {
    typealias Spec = WorkerTests
    static let copy = MessageProperties(replyTo: "replies", messageID: "dup", headers: [Worker.republishedHeader: "1"])

    @Test func aCopyOfASettledJobIsAcknowledgedWithoutSending() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet)
        let body = Spec.job("dup", tokens: [Spec.token(1), Spec.token(2)])
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "dup"))
        #expect(fleet.wait { $0.acknowledged.contains(original) })
        let copy = fleet.deliver(body, properties: Self.copy)
        #expect(fleet.wait { $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).count == 2, "each notification once")
        #expect(fleet.read { $0.published.count } == 1, "one summary")
        #expect(running.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1)
    }

    /// A scheduled job and its publisher's copy, back from the delay queues together at send_at, read in one batch:
    /// one starts, the other is acknowledged unsent (each claims the start, and a batch holding one start twice
    /// claims it once). The copy first: a copy after its job in a batch waits for the job to settle anyway.
    @Test func aScheduledJobAndItsCopyInOneBatchAreSentOnce() throws {
        let fleet = InMemoryFleet()
        let body = Spec.job("sched", tokens: [Spec.token(1)]).replacingOccurrences(
            of: #""payload""#, with: #""send_at":1700000000,"payload""#)
        let copy = fleet.deliver(body, properties: Self.copy)
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "sched"))
        let running = Spec.Running(fleet)
        #expect(fleet.wait { $0.acknowledged.contains(original) && $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "sent once")
        #expect(fleet.read { $0.published.count } == 1, "one summary")
        #expect(running.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1)
    }

    /// Marked by a header that is not text (a number, as many clients write an integer): a copy all the same.
    @Test func aCopyMarkedWithAHeaderThatIsNotTextIsACopy() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet)
        let body = Spec.job("dup", tokens: [Spec.token(1)])
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "dup"))
        #expect(fleet.wait { $0.acknowledged.contains(original) })
        var properties = MessageProperties(replyTo: "replies", messageID: "dup")
        properties.headers.all[Worker.republishedHeader] = .encoded([0x49, 0, 0, 0, 1])
        #expect(properties.headers[Worker.republishedHeader] == nil, "no text")
        let copy = fleet.deliver(body, properties: properties)
        #expect(fleet.wait { $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "sent once")
        #expect(running.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1)
    }

    /// A retry shares its job's id: delivered again after its session was lost (before it settled), it is sent, not
    /// taken for a redelivery of the attempt that settled before it (that lost it: acknowledged unsent).
    @Test func aRetryDeliveredAgainIsNotTakenForItsSettledFirstAttempt() throws {
        let fleet = InMemoryFleet()
        let busy = Spec.token(3)
        let pushes = Locked(0)
        let running = Spec.Running(fleet) { _ in
            pushes.withLock {
                $0 += 1
                return APNsResponse(status: $0 == 1 ? 503 : 200)
            }
        }
        let first = fleet.deliver(Spec.job("again", tokens: [busy]), properties: MessageProperties(messageID: "again"))
        #expect(fleet.wait { $0.acknowledged.contains(first) && $0.published.count == 1 })
        let retryBody = String(decoding: fleet.read { $0.published[0].body }, as: UTF8.self)
        let retry = fleet.deliver(retryBody, properties: MessageProperties(messageID: "again"), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(retry) })
        running.stop()
        #expect(pushes.withLock { $0 } == 2, "the retry was sent")
        #expect(running.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 0)
    }

    @Test func aRedeliveryAfterABrokerLossSkipsWhatWasAnsweredBeforeIt() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet)
        let body = Spec.job("lost", tokens: [Spec.token(1)])
        fleet.deliver(body, properties: MessageProperties(messageID: "lost"))
        #expect(fleet.wait { $0.sent.count == 1 })
        fleet.change { $0.brokerDown = true }
        fleet.brokerReadable.signal()
        #expect(fleet.wait { $0.sessionsLost == 1 }, "the session ended")
        // While the worker is away: APNs answers the notification, and the broker redelivers the job. The next
        // session reads the redelivery in the same turn as it finds the answer waiting.
        fleet.releaseAnswers()
        let redelivery = fleet.deliver(body, properties: MessageProperties(messageID: "lost"), redelivered: true)
        fleet.change { $0.brokerDown = false }
        #expect(fleet.wait { $0.acknowledged.contains(redelivery) })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "the answered notification is not sent again")
    }

    @Test func aCopyReadWithItsOriginalWaitsForIt() throws {
        let fleet = InMemoryFleet()
        let body = Spec.job("dup", tokens: [Spec.token(1)])
        // Both in the broker before the worker reads: they arrive in one batch.
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "dup"))
        let copy = fleet.deliver(body, properties: Self.copy)
        let running = Spec.Running(fleet)
        #expect(fleet.wait { Set($0.acknowledged) == [original, copy] })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "sent once")
        #expect(fleet.read { $0.published.count } == 1, "one summary")
    }
}
