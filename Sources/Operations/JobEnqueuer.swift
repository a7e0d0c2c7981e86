import AMQP
import APNs
import Configuration
import Foundation
import Telemetry
import WorkerPipeline

/// Publishes jobs onto a lane's queue (PUSH_JOBS_QUEUE, or PUSH_BULK_QUEUE) for `apns-worker enqueue`: each job is
/// checked as the worker would check it first (a bad one is reported with its line and not published), published
/// persistent with publisher confirms and a timestamp (how long jobs wait in a lane), and given a message-id when it
/// has no `id`, so that a worker can recognise it if it is ever redelivered.
public final class JobEnqueuer {
    public struct Progress: Sendable {
        public var published = 0
        public var refused = 0
        /// Bytes of input read so far, and in all when known (a file, not a pipe).
        public var bytesRead = 0
        public var totalBytes: Int?
        public var elapsed = 0.0
    }

    /// A job that was not published, and why.
    public struct Refusal: Sendable, CustomStringConvertible {
        public var line: Int
        public var reason: String
        public var description: String { "line \(line): \(reason)" }
    }

    /// Jobs waiting for the broker's confirms at most: bounds memory, keeps the pipe to the broker full.
    static let confirmWindow = 1_000

    private let configuration: WorkerConfiguration
    private let amqp: AMQPConnection
    private let replyTo: String?
    /// The queue jobs go to.
    public let queue: String
    private var pending: [(line: Int, sequence: UInt64)] = []
    public private(set) var progress = Progress()
    public private(set) var refusals: [Refusal] = []

    public init(configuration: WorkerConfiguration, replyTo: String? = nil, lane: JobLane = .urgent) throws(AMQPError) {
        self.configuration = configuration
        self.replyTo = replyTo
        queue = configuration.broker.queues.jobs(lane)
        amqp = try configuration.broker.nodes.connect(heartbeat: configuration.broker.heartbeat,
                                                      caFile: configuration.broker.caFile)
        try amqp.declareQueue(queue)
        try amqp.enablePublisherConfirms()
    }

    deinit { amqp.close() }

    /// Checks and publishes one job (`line` names it in refusals).
    public func enqueue(_ body: [UInt8], line: Int) throws(AMQPError) {
        // A job without a topic may still be fine for workers that have APNS_TOPIC; only they can tell.
        let job: PushJob
        do {
            job = try PushJob.decode(body, defaultTopic: configuration.credential.defaultTopic
                                         ?? "apns-worker.enqueue.unknown-topic", fallbackID: "")
        } catch {
            refuse(line: line, error.description)
            return
        }
        let properties = AMQPProperties(replyTo: replyTo, correlationID: nil,
                                        messageID: job.idFromBody ? job.id : UUID().uuidString.lowercased(),
                                        persistent: true, timestamp: Int64(Date().timeIntervalSince1970))
        pending.append((line, try amqp.publish(to: queue, body: body, properties: properties)))
        if pending.count >= Self.confirmWindow { try settle() }
    }

    /// Waits for the broker to confirm everything published; a job the broker refused is reported.
    public func settle() throws(AMQPError) {
        guard let last = pending.last else { return }
        let nacked = Set(try amqp.waitForConfirms(through: last.sequence))
        for (line, sequence) in pending {
            if nacked.contains(sequence) {
                refuse(line: line, "the broker refused it (nack)")
            } else {
                progress.published += 1
            }
        }
        pending.removeAll(keepingCapacity: true)
    }

    /// Everything `reader` holds, then `settle()`; `report` sees the progress at most every `interval` seconds and
    /// once at the end.
    public func enqueueAll(from reader: inout JobReader, interval: Double = 0.2,
                           report: (Progress) -> Void) throws {
        let start = Date()
        var lastReport = start
        func update() {
            progress.bytesRead = reader.bytesRead
            progress.totalBytes = reader.totalBytes
            progress.elapsed = Date().timeIntervalSince(start)
        }
        while let (line, body) = try reader.next() {
            try enqueue(body, line: line)
            if Date().timeIntervalSince(lastReport) >= interval {
                update()
                report(progress)
                lastReport = Date()
            }
        }
        try settle()
        update()
        report(progress)
    }

    private func refuse(line: Int, _ reason: String) {
        progress.refused += 1
        refusals.append(Refusal(line: line, reason: reason))
    }
}
