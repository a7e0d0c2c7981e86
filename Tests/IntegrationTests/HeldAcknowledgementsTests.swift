import AMQP
import AMQPBroker
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// Jobs that finish before an older one wait for it, to go with its `multiple` ack in one frame, as the broker itself
/// counts them (messages unacknowledged), and the frames they took (what `apns_worker_acknowledgement_frames_total`
/// adds up): within a time and a number, at once while a bulk job is under way, and before the connection closes.
@Suite struct HeldAcknowledgementsTests {
    let logger = Logger(label: "held-acks", level: .critical)

    /// A broker session on queues of the test's own, consuming `jobs` with `prefetch`.
    func broker(jobs: String, bulk: String, prefetch: Int) throws -> AMQPJobBroker {
        let queues = QueueNames(
            jobs: jobs, bulk: bulk, failed: jobs + ".failed", deadTokens: jobs + ".dead",
            registrations: jobs + ".registrations")
        return try AMQPJobBroker(
            settings: .init(
                nodes: AMQPNodes(TestServices.amqpURL()), queues: queues, retryDelays: [1], prefetch: prefetch),
            logger: logger)
    }

    /// `count` jobs published on a queue of the test's own, and a broker session that has read them all.
    func delivered(_ count: Int, prefetch: Int = 500) throws -> (AMQPJobBroker, jobs: String, [UInt64]) {
        let jobs = TestServices.unique("held")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        defer { publisher.close() }
        try publisher.declareQueue(jobs)
        for job in 0..<count { try publisher.publish(to: jobs, body: Array(#"{"id": "\#(job)"}"#.utf8)) }
        let broker = try broker(jobs: jobs, bulk: jobs + ".bulk", prefetch: prefetch)
        var deliveries: [JobDelivery] = []
        try BulkLaneBytesTests.read(broker, into: &deliveries, until: count)
        return (broker, jobs, deliveries.map(\.tag).sorted())
    }

    /// The broker's messages unacknowledged on `queue` once it has read what this connection sent (a round trip on
    /// the same channel first: frames are handled in order).
    static func unacknowledged(_ queue: String, after broker: AMQPJobBroker) throws -> Int {
        try broker.probe()
        return try BulkLaneBytesTests.brokerView(queue).unacknowledged
    }

    @Test func laterJobsWaitForTheOldestAndGoWithItsAck() throws {
        let (broker, jobs, tags) = try delivered(3)
        defer { broker.close() }
        let finished = Date()
        try broker.acknowledge([tags[1], tags[2]])
        let due = try #require(broker.acknowledgementsDue)
        #expect(due > finished && due < finished.addingTimeInterval(1))
        #expect(try Self.unacknowledged(jobs, after: broker) == 3, "held back, not acknowledged one by one")

        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames())
        try broker.acknowledge([tags[0]])
        #expect(broker.acknowledgementsDue == nil)
        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames(multiple: 1), "one frame for the three")
        #expect(try TestServices.waitUntil(timeout: 10) { try Self.unacknowledged(jobs, after: broker) == 0 })
    }

    @Test func heldJobsGoOnceDue() throws {
        let (broker, jobs, tags) = try delivered(3)
        defer { broker.close() }
        try broker.acknowledge([tags[1], tags[2]])
        let due = try #require(broker.acknowledgementsDue)
        try broker.acknowledgeHeld(dueBy: due.addingTimeInterval(-0.001))
        #expect(try Self.unacknowledged(jobs, after: broker) == 3, "not due yet")

        try broker.acknowledgeHeld(dueBy: due)
        #expect(broker.acknowledgementsDue == nil)
        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames(single: 2))
        #expect(try TestServices.waitUntil(timeout: 10) { try Self.unacknowledged(jobs, after: broker) == 1 })
    }

    @Test func noMoreThanHalfThePrefetchIsHeld() throws {
        // A prefetch of 4 holds at most 2: of three that finished before the oldest, the first goes at once.
        let (broker, jobs, tags) = try delivered(4, prefetch: 4)
        defer { broker.close() }
        try broker.acknowledge([tags[1], tags[2], tags[3]])
        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames(single: 1))
        #expect(try TestServices.waitUntil(timeout: 10) { try Self.unacknowledged(jobs, after: broker) == 3 })
    }

    @Test func closingAcknowledgesWhatWasHeld() throws {
        let (broker, jobs, tags) = try delivered(3)
        try broker.acknowledge([tags[1], tags[2]])
        broker.close()
        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames(single: 2))
        // Only the job still under way goes back to the queue.
        #expect(
            try TestServices.waitUntil(timeout: 10) {
                let view = try BulkLaneBytesTests.brokerView(jobs)
                return view.ready == 1 && view.unacknowledged == 0
            })
    }

    @Test func nothingWaitsWhileABulkJobIsUnderWay() throws {
        let jobs = TestServices.unique("held")
        let bulk = jobs + ".bulk"
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        defer { publisher.close() }
        try publisher.declareQueue(jobs)
        try publisher.declareQueue(bulk)
        try publisher.publish(to: bulk, body: Array(#"{"id": "campaign"}"#.utf8))
        let broker = try broker(jobs: jobs, bulk: bulk, prefetch: 500)
        defer { broker.close() }
        var deliveries: [JobDelivery] = []
        try BulkLaneBytesTests.read(broker, into: &deliveries, until: 1)
        for job in 0..<2 { try publisher.publish(to: jobs, body: Array(#"{"id": "\#(job)"}"#.utf8)) }
        try BulkLaneBytesTests.read(broker, into: &deliveries, until: 3)
        let urgent = deliveries.filter { $0.lane == .urgent }.map(\.tag)
        #expect(urgent.count == 2 && deliveries.first?.lane == .bulk)

        try broker.acknowledge(urgent)
        #expect(broker.acknowledgementsDue == nil)
        #expect(broker.takeAcknowledgementFrames() == AcknowledgementFrames(single: 2))
        #expect(try TestServices.waitUntil(timeout: 10) { try Self.unacknowledged(jobs, after: broker) == 0 })
        #expect(try Self.unacknowledged(bulk, after: broker) == 1)
    }
}
