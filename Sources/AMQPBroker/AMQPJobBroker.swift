import AMQP
import APNsModel
import Foundation
import Telemetry
import Threads
import WorkerPipeline

/// The pipeline's broker over one RabbitMQ (AMQP 0-9-1) connection: consumes the jobs queue, publishes what jobs
/// produce with publisher confirms (mandatory, so that a deleted queue is noticed), settles deliveries.
///
/// Owned by the worker's broker thread, like the connection it owns.
public final class AMQPJobBroker: JobBroker {
    /// Everything this broker needs to know, in its own words.
    public struct Settings: Sendable {
        /// The broker's nodes (one, or a cluster's): a session starts on a random one that answers.
        public var nodes: AMQPNodes
        public var caFile: String?
        /// Seconds (0: none): how fast a dead connection is noticed.
        public var heartbeat: Int
        /// A call that waits for the broker's reply (the readiness round trip every second, a declaration) gives up
        /// after one heartbeat interval (at least 5 s, at most 10; 10 without heartbeats), and so does a connection
        /// attempt: a node that stops answering (frozen, cut off) is left within seconds for one that answers.
        public var replyTimeout: Double { heartbeat > 0 ? min(10, max(5, Double(heartbeat))) : 10 }
        public var queues: QueueNames
        /// One delay queue per value, dead-lettering back to the jobs queue.
        public var retryDelays: [Double]
        /// Every delay queue's TTL: the retry tiers, and the tiers jobs wait in for their `send_at` (`JobSchedule`),
        /// each once.
        public var delayQueues: [Double] {
            var seen = Set<Int>()
            return (retryDelays + JobSchedule.tiers).filter { seen.insert(Int(($0 * 1000).rounded())).inserted }
        }
        /// Unacknowledged urgent jobs the broker may hand over at once (basic.qos, per consumer).
        public var prefetch: Int
        /// The same for bulk jobs: what the bulk lane may hold unacknowledged.
        public var bulkPrefetch: Int
        /// Bytes of bulk bodies the bulk lane holds unacknowledged, which its prefetch follows (`BulkPrefetch`).
        public var bulkPrefetchBytes: Int

        public init(
            nodes: AMQPNodes, caFile: String? = nil, heartbeat: Int = 5, queues: QueueNames = QueueNames(),
            retryDelays: [Double] = [1, 15, 60, 300], prefetch: Int = 500, bulkPrefetch: Int = 100,
            bulkPrefetchBytes: Int = 2 << 20
        ) {
            self.nodes = nodes
            self.caFile = caFile
            self.heartbeat = heartbeat
            self.queues = queues
            self.retryDelays = retryDelays
            self.prefetch = prefetch
            self.bulkPrefetch = bulkPrefetch
            self.bulkPrefetchBytes = bulkPrefetchBytes
        }
    }

    private let settings: Settings
    private let amqp: AMQPConnection
    private let acknowledgements: Acknowledgements
    private let logger: Logger
    /// The consumer tag of the urgent lane's consumer: deliveries to any other are the bulk lane's (the bulk
    /// consumer is replaced as its prefetch follows the bodies' size, and a replaced one's deliveries may still come).
    private let urgentConsumerTag: String
    /// The bulk lane's consumer, while one runs.
    private var bulkConsumerTag: String?
    private var bulkIntake: BulkPrefetch

    /// Connects, declares the worker's queues (unless `topology` says this process did already) and starts
    /// consuming. The broker refusing what the URL says (ACCESS_REFUSED, an unknown vhost) is `ConnectionRefused`.
    public init(settings: Settings, topology: DeclaredTopology = DeclaredTopology(), logger: Logger) throws {
        self.settings = settings
        self.logger = logger
        do {
            amqp = try settings.nodes.connect(
                heartbeat: settings.heartbeat, connectTimeout: settings.replyTimeout,
                replyTimeout: settings.replyTimeout, caFile: settings.caFile)
        } catch {
            if error.isPermanent { throw ConnectionRefused(.broker, error.message, cause: error) }
            throw error
        }
        // A queue or exchange found missing (the broker closed the channel NOT_FOUND, whichever call met it: a publish
        // to the deleted dead-token exchange, a consume, a read): the next session declares everything again. It
        // declared nothing, and met the same refusal, for ever.
        amqp.onChannelClose = { code in if code == 404 { topology.isDeclared = false } }
        // Half the urgent prefetch may wait for an older delivery's ack: the broker keeps handing over jobs.
        acknowledgements = Acknowledgements(amqp: amqp, holdingLimit: settings.prefetch / 2)
        bulkIntake = BulkPrefetch(maximumCount: settings.bulkPrefetch, maximumBytes: settings.bulkPrefetchBytes)
        // A reconnect consumes at once: a declaration that changes the cluster's topology (a binding) waits for every
        // node, a silent one included, while consuming a queue whose leader answers waits for nothing. A queue found
        // missing later is declared again then (a publish handed back, or a consume refused, which ends the session).
        if !topology.isDeclared {
            do {
                try Topology.declareWorkerQueues(on: amqp, settings.queues, retryDelays: settings.delayQueues)
            } catch {
                // A user without the permission to declare (ACCESS_REFUSED): a setting to fix, not a broker to wait for.
                amqp.close()
                if error.isPermanent { throw ConnectionRefused(.broker, error.message, cause: error) }
                throw error
            }
            topology.isDeclared = true
        }
        try amqp.enablePublisherConfirms()
        // One channel, two consumers: RabbitMQ applies a basic.qos without `global` to each consumer created after
        // it, so each lane has its own prefetch and a full bulk lane never stops urgent deliveries.
        try amqp.setPrefetch(settings.prefetch)
        urgentConsumerTag = try amqp.consume(settings.queues.jobs)
        try startBulkConsumer(prefetch: bulkIntake.initialPrefetch)
    }

    public var logMetadata: [String: String] {
        [
            "amqp.queue": settings.queues.jobs, "amqp.bulk_queue": settings.queues.bulk,
            "amqp.url": amqp.url.description,
            "amqp.nodes": String(settings.nodes.urls.count),
            "amqp.local_port": String(amqp.localPort), "amqp.prefetch": String(settings.prefetch),
            "amqp.bulk_prefetch": String(settings.bulkPrefetch),
            "amqp.bulk_prefetch_bytes": String(settings.bulkPrefetchBytes)
        ]
    }

    public var hasBufferedInput: Bool { amqp.hasBufferedInput }
    public var readableDescriptor: Int32 { amqp.socketDescriptor }

    public func receive(limit: Int) throws -> [BrokerNotice] {
        var notices: [BrokerNotice] = []
        var deliveries = 0
        while deliveries < limit, let event = try amqp.nextEvent(timeout: 0) {
            switch consume event {
            case .delivery(var delivery):
                deliveries += 1
                let lane: JobLane = delivery.consumerTag == urgentConsumerTag ? .urgent : .bulk
                acknowledgements.received(delivery.deliveryTag, bulkBytes: lane == .bulk ? delivery.body.count : nil)
                if lane == .bulk { bulkIntake.seen(bytes: delivery.body.count) }
                // The body and properties move into the job's delivery rather than being copied out of the event
                // (a reference counted on and off for each of them, on every job's path).
                var body: [UInt8] = []
                swap(&body, &delivery.body)
                notices.append(
                    .delivery(
                        JobDelivery(
                            tag: delivery.deliveryTag, redelivered: delivery.redelivered, body: body,
                            properties: MessageProperties(taking: &delivery.properties), lane: lane)))
            case .blocked(let blocked):
                notices.append(.publishingBlocked(blocked))
            case .confirm:
                break
            }
        }
        try followBulkPrefetch()
        return notices
    }

    /// Replaces the bulk consumer when its prefetch no longer suits the bodies (`BulkPrefetch`). Only where
    /// deliveries are read: a worker that stops reads none, and starts no consumer while it gives jobs back.
    private func followBulkPrefetch() throws(AMQPError) {
        guard let prefetch = bulkIntake.replacement(holding: acknowledgements.bulkHeld) else { return }
        if let tag = bulkConsumerTag {
            try amqp.cancel(tag)
            bulkConsumerTag = nil
        }
        try startBulkConsumer(prefetch: prefetch)
    }

    private func startBulkConsumer(prefetch: Int) throws(AMQPError) {
        // A basic.qos without `global` applies to the consumers created after it, on this channel the bulk one only.
        try amqp.setPrefetch(prefetch)
        bulkConsumerTag = try amqp.consume(settings.queues.bulk)
        bulkIntake.started(prefetch: prefetch)
    }

    /// Where a destination is on the broker: the exchange and the routing key, as a returned message names them.
    private struct Route: Hashable {
        var exchange: String
        var routingKey: String
    }

    private func route(_ destination: Publication.Destination) -> Route {
        switch destination {
        case .deadTokens: Route(exchange: settings.queues.deadTokensExchange, routingKey: settings.queues.deadTokens)
        case .failed: Route(exchange: "", routingKey: settings.queues.failed)
        case .retry(let delay, let lane):
            Route(exchange: "", routingKey: settings.queues.retry(delay: delay, lane: lane))
        case .reply(let queue): Route(exchange: "", routingKey: queue)
        }
    }

    /// The routes the worker declared itself, which it declares again when one went missing.
    private var ownRoutes: Set<Route> {
        Set(
            [.deadTokens, .failed].map(route)
                + JobLane.allCases.flatMap { lane in
                    settings.delayQueues.map { route(.retry(delay: $0, lane: lane)) }
                })
    }

    public func publish(_ publications: [Publication]) throws -> [PublicationOutcome] {
        guard !publications.isEmpty else { return [] }
        var sequences: [UInt64] = []
        sequences.reserveCapacity(publications.count)
        for publication in publications {
            let route = route(publication.destination)
            // Direct reply-to (`amq.rabbitmq.reply-to.*`) is no queue: the broker delivers a summary there and hands
            // it back as unroutable as well, so it goes without `mandatory` (a requester gone drops it, as intended).
            let directReply = route.exchange.isEmpty && route.routingKey.hasPrefix("amq.rabbitmq.reply-to.")
            var properties = AMQPProperties(publication.properties)
            if case .retry(let delay, _) = publication.destination {
                // A copy through a delay queue (a retry, a job waiting for its send_at or for Redis) is stamped with
                // when it comes back to its lane: the lane's longest wait counts its time there, not the delay.
                properties.timestamp = Int64((Date().timeIntervalSince1970 + delay).rounded(.up))
            }
            sequences.append(
                try amqp.publishKeepingWorkerHeaders(
                    to: route.routingKey, exchange: route.exchange, body: publication.body,
                    properties: properties, mandatory: !directReply, logger: logger))
        }
        let nacked = Set(try amqp.waitForConfirms(through: sequences.last!))
        // A return precedes its publish's confirm: after the wait every return of this batch is in. A route handed
        // back counts for every publication to it in the batch (returns do not say which publication they were).
        let returns = amqp.takeReturns()
        guard !returns.isEmpty else { return sequences.map { nacked.contains($0) ? .refused : .taken } }
        let returned = Set(returns.map { Route(exchange: $0.exchange, routingKey: $0.routingKey) })
        let lost = returned.intersection(ownRoutes)
        for route in lost {
            logger.error(
                "the broker handed back a publish: no queue took it; declaring the worker's queues again",
                [
                    "amqp.exchange": route.exchange, "amqp.routing_key": route.routingKey,
                    "amqp.reply": returns.first { $0.routingKey == route.routingKey }?.replyText ?? ""
                ])
        }
        if !lost.isEmpty { try declareQueuesAgain() }
        return zip(publications, sequences).map { publication, sequence in
            if nacked.contains(sequence) { return .refused }
            return returned.contains(route(publication.destination)) ? .noQueue : .taken
        }
    }

    /// Declares the worker's queues on a connection of its own: a declaration the broker refuses (a queue declared
    /// meanwhile with other arguments) closes the channel it was made on, and on the consuming channel that would
    /// drop both consumers and every unsettled delivery and confirm.
    private func declareQueuesAgain() throws {
        let declaring = try settings.nodes.connect(heartbeat: 0, caFile: settings.caFile)
        defer { declaring.close() }
        try Topology.declareWorkerQueues(on: declaring, settings.queues, retryDelays: settings.delayQueues)
    }

    public func acknowledge(_ tags: [UInt64]) throws { try acknowledgements.acknowledge(tags) }

    public var acknowledgementsDue: Date? { acknowledgements.due }

    public func acknowledgeHeld(dueBy now: Date) throws { try acknowledgements.acknowledgeHeld(dueBy: now) }

    public func takeAcknowledgementFrames() -> AcknowledgementFrames { acknowledgements.takeFrames() }

    public func requeue(_ tag: UInt64) throws { try acknowledgements.requeue(tag) }

    /// A passive declare of the jobs queue: one round trip, within the connection's reply timeout.
    public func probe() throws { _ = try amqp.queueStatus(settings.queues.jobs) }

    /// A passive declare of each lane's queue (the worker declared both, so a missing one reads as empty).
    public func laneQueues() throws -> LaneQueues {
        var queues = LaneQueues(messages: LaneCounts(), consumers: LaneCounts())
        for lane in JobLane.allCases {
            let status = try amqp.queueStatus(lane == .urgent ? settings.queues.jobs : settings.queues.bulk)
            queues.messages[lane] = status?.messages ?? 0
            queues.consumers[lane] = status?.consumers ?? 0
        }
        return queues
    }

    /// Acknowledges what was held back, then closes: an orderly stop leaves no finished job to be delivered again.
    public func close() {
        try? acknowledgements.acknowledgeHeld(dueBy: nil)
        amqp.close()
    }
}

/// Whether this process declared the worker's queues already (one per worker, shared by its sessions).
public final class DeclaredTopology: Sendable {
    private let declared = Locked(false)

    public init() {}

    public var isDeclared: Bool {
        get { declared.withLock { $0 } }
        set { declared.withLock { $0 = newValue } }
    }
}

extension MessageProperties {
    /// What the pipeline reads of a delivery's properties, moved out of them: `amqp` is left without them.
    @inline(__always)
    init(taking amqp: inout AMQPProperties) {
        // Most jobs say nothing more, or `application/json` alone: nothing is made for them. Passed to the
        // initializer, not set after it: a value changed after it is made was copied (its strings counted again).
        var publisherProperties: PublisherProperties?
        if let more = amqp.more {
            publisherProperties = PublisherProperties(
                contentType: amqp.contentType, contentEncoding: more.contentEncoding, type: more.type,
                appID: more.appID, priority: more.priority)
        } else if let contentType = amqp.contentType, contentType != AMQPProperties.jsonContentType {
            publisherProperties = PublisherProperties(contentType: contentType)
        }
        self.init(
            replyTo: amqp.replyTo.take(), correlationID: amqp.correlationID.take(), messageID: amqp.messageID.take(),
            persistent: amqp.persistent, timestamp: amqp.timestamp,
            headers: amqp.headers.isEmpty && amqp.otherHeaders.isEmpty ? MessageHeaders() : Self.headers(of: amqp),
            deliveryCount: amqp.deliveryCount, publisherProperties: publisherProperties)
    }

    /// Text headers as text, the others as the broker encoded them (a name given both ways is text).
    private static func headers(of amqp: AMQPProperties) -> MessageHeaders {
        var headers = MessageHeaders(amqp.headers)
        for other in amqp.otherHeaders where headers.all[other.name] == nil {
            headers.all[other.name] = .encoded(other.entry)
        }
        return headers
    }
}

extension AMQPProperties {
    /// What the worker publishes (a delivery count is the broker's to set, never published).
    init(_ message: MessageProperties) {
        var text: [String: String] = [:]
        var others: [AMQPEncodedHeader] = []
        for (name, value) in message.headers.all {
            switch value {
            case .text(let value): text[name] = value
            case .encoded(let entry): others.append(AMQPEncodedHeader(name: name, entry: entry))
            }
        }
        var more: AMQPMoreProperties?
        if let carried = message.publisherProperties,
            carried.contentEncoding != nil || carried.type != nil || carried.appID != nil || carried.priority != nil
        {
            more = AMQPMoreProperties(
                contentEncoding: carried.contentEncoding, type: carried.type, appID: carried.appID,
                priority: carried.priority)
        }
        self.init(
            contentType: PublisherProperties.contentType(of: message.publisherProperties), replyTo: message.replyTo,
            correlationID: message.correlationID,
            messageID: message.messageID, persistent: message.persistent, timestamp: message.timestamp,
            headers: text, otherHeaders: others, more: more)
    }
}

extension AMQPJobBroker.Settings {
    /// A connection to a node that answers, made ready by `prepare` (declarations, confirms, a consumer). One that
    /// fails to be made ready is closed before the error is thrown: an attempt that fails leaves no connection open.
    public func connect(preparing prepare: (AMQPConnection) throws(AMQPError) -> Void) throws(AMQPError)
        -> AMQPConnection
    {
        let amqp = try nodes.connect(heartbeat: heartbeat, caFile: caFile)
        do {
            try prepare(amqp)
        } catch {
            amqp.close()
            throw error
        }
        return amqp
    }
}
