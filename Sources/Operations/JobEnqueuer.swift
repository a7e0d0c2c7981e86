import AMQP
import AMQPBroker
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
    /// Rounds over every node without a connection, in a row, before giving up (the workers' reconnect back-off:
    /// at most about a minute in all).
    static let reconnectRounds = 8

    /// A job published and not confirmed yet: kept whole, so that it can be published again on another node.
    private struct Unconfirmed {
        var line: Int
        var body: [UInt8]
        var properties: AMQPProperties
    }

    private let configuration: WorkerConfiguration
    private var amqp: AMQPConnection
    private let replyTo: String?
    private let logger: Logger?
    /// The queue jobs go to.
    public let queue: String
    private var pending: [Unconfirmed] = []
    /// The publish sequence numbers of the first `sequences.count` pending jobs on the current connection; the
    /// others are not published on it yet (a new connection starts with none).
    private var sequences: [UInt64] = []
    public private(set) var progress = Progress()
    public private(set) var refusals: [Refusal] = []

    public init(
        configuration: WorkerConfiguration, replyTo: String? = nil, lane: JobLane = .urgent,
        logger: Logger? = nil
    ) throws(AMQPError) {
        self.configuration = configuration
        self.replyTo = replyTo
        self.logger = logger
        queue = configuration.broker.queues.jobs(lane)
        amqp = try Self.open(configuration, queue: queue)
        logger?.debug(
            "publishing",
            [
                "amqp.url": amqp.url.description, "amqp.queue": queue,
                "amqp.nodes": String(configuration.broker.nodes.urls.count)
            ])
    }

    deinit { amqp.close() }

    private static func open(_ configuration: WorkerConfiguration, queue: String) throws(AMQPError) -> AMQPConnection {
        try configuration.broker.connect { amqp throws(AMQPError) in
            try Topology.declare(queue, on: amqp, configuration.broker.queues)
            try amqp.enablePublisherConfirms()
        }
    }

    /// Checks and publishes one job (`line` names it in refusals).
    public func enqueue(_ body: [UInt8], line: Int) throws(AMQPError) {
        // A job without a topic may still be fine for workers that have APNS_TOPIC; only they can tell.
        let job: PushJob
        switch Self.check(body, defaultTopic: configuration.credential.defaultTopic) {
        case .success(let checked): job = checked
        case .failure(let refusal):
            refuse(line: line, refusal.description)
            return
        }
        // The message-id is chosen once: a job published again after a failover carries the same one.
        let properties = AMQPProperties(
            replyTo: replyTo, correlationID: nil,
            messageID: job.idFromBody ? PushJob.shortString(of: job.id) : UUID().uuidString.lowercased(),
            persistent: true, timestamp: Int64(Date().timeIntervalSince1970))
        pending.append(Unconfirmed(line: line, body: body, properties: properties))
        try withFailover { () throws(AMQPError) in try publishUnsent() }
        if pending.count >= Self.confirmWindow { try settle() }
    }

    /// A job as a worker would read it, or why a worker would refuse it. A job without a topic may still be fine
    /// for workers that have APNS_TOPIC (`defaultTopic` nil): only they can tell, so it is not refused here.
    public static func check(_ body: [UInt8], defaultTopic: String?) -> Result<PushJob, JobError> {
        Result { () throws(JobError) in
            try PushJob.decode(body, defaultTopic: defaultTopic ?? "apns-worker.enqueue.unknown-topic", fallbackID: "")
        }
    }

    /// `enqueue --check`: every job `reader` holds checked as `enqueue` checks it, nothing published and no broker
    /// reached. Returns how many were read and the refusals, by line.
    public static func checkAll(from reader: inout JobReader, defaultTopic: String?) throws
        -> (jobs: Int, refusals: [Refusal])
    {
        var jobs = 0
        var refusals: [Refusal] = []
        while let entry = try reader.next() {
            jobs += 1
            switch entry {
            case .job(let line, let body):
                if case .failure(let error) = check(body, defaultTopic: defaultTopic) {
                    refusals.append(Refusal(line: line, reason: error.description))
                }
            case .overLimit(let line):
                refusals.append(Refusal(line: line, reason: overLimitReason(reader.lineLimit)))
            }
        }
        return (jobs, refusals)
    }

    static func overLimitReason(_ limit: Int) -> String {
        "over the \(limit)-byte message limit: refused as it passed it, the rest of the line skipped"
    }

    /// Waits for the broker to confirm everything published; a job the broker refused is reported. Across a lost
    /// connection, what was not confirmed is published again on another node: at least once, never lost.
    public func settle() throws(AMQPError) {
        guard !pending.isEmpty else { return }
        try withFailover { () throws(AMQPError) in
            try publishUnsent()
            let nacked = Set(try amqp.waitForConfirms(through: sequences.last!))
            for (job, sequence) in zip(pending, sequences) {
                if nacked.contains(sequence) {
                    refuse(line: job.line, "the broker refused it (nack)")
                } else {
                    progress.published += 1
                }
            }
            pending.removeAll(keepingCapacity: true)
            sequences.removeAll(keepingCapacity: true)
        }
    }

    private func publishUnsent() throws(AMQPError) {
        while sequences.count < pending.count {
            let job = pending[sequences.count]
            sequences.append(try amqp.publish(to: queue, body: job.body, properties: job.properties))
        }
    }

    /// Runs `step`; when the connection fails (its node went away), connects to a node that answers, with the
    /// jittered back-off between rounds, marks every unconfirmed job unpublished and runs `step` again.
    private func withFailover(_ step: () throws(AMQPError) -> Void) throws(AMQPError) {
        var failovers = 0
        while true {
            do {
                return try step()
            } catch  where !error.isPermanent {
                // A node that takes the connection but never confirms (a queue without its majority) is left after
                // as many tries as there are rounds of reconnection, not published to for ever.
                failovers += 1
                if failovers > Self.reconnectRounds { throw error }
                logger?.warning(
                    "broker connection lost; publishing the unconfirmed jobs again on another node",
                    [
                        "amqp.url": amqp.url.description, "error": error.message,
                        "jobs.unconfirmed": String(pending.count)
                    ])
                amqp.close()
                amqp = try reconnect(after: error)
                sequences.removeAll(keepingCapacity: true)
                // The old node may have taken some of them before it went: the copies say they may be copies, and
                // the workers send nothing a copy's original already sent.
                for index in pending.indices { pending[index].properties.headers[Worker.republishedHeader] = "1" }
                logger?.warning(
                    "publishing again",
                    [
                        "amqp.url": amqp.url.description, "amqp.queue": queue,
                        "jobs.unconfirmed": String(pending.count)
                    ])
            }
        }
    }

    private func reconnect(after lost: AMQPError) throws(AMQPError) -> AMQPConnection {
        var last = lost
        for round in 1...Self.reconnectRounds {
            do {
                return try Self.open(configuration, queue: queue)
            } catch  where !error.isPermanent {
                last = error
                if round < Self.reconnectRounds { Thread.sleep(forTimeInterval: reconnectDelay(afterFailures: round)) }
            }
        }
        throw last
    }

    /// Everything `reader` holds, then `settle()`; `report` sees the progress at most every `interval` seconds and
    /// once at the end.
    public func enqueueAll(
        from reader: inout JobReader, interval: Double = 0.2,
        report: (Progress) -> Void
    ) throws {
        let start = Date()
        var lastReport = start
        func update() {
            progress.bytesRead = reader.bytesRead
            progress.totalBytes = reader.totalBytes
            progress.elapsed = Date().timeIntervalSince(start)
        }
        while let entry = try nextEntry(&reader) {
            switch entry {
            case .job(let line, let body):
                try enqueue(body, line: line)
            case .overLimit(let line):
                refuse(line: line, Self.overLimitReason(reader.lineLimit))
            }
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

    /// The reader's next entry; when the input cannot be read on, what was published is confirmed first.
    private func nextEntry(_ reader: inout JobReader) throws -> JobReader.Entry? {
        do {
            return try reader.next()
        } catch let error as JobReaderError {
            try settle()
            throw error
        }
    }

    private func refuse(line: Int, _ reason: String) {
        progress.refused += 1
        refusals.append(Refusal(line: line, reason: reason))
    }
}
