import AMQP
import APNsModel
import WorkerPipeline

/// The kind of queue the programs declare (PUSH_QUEUE_TYPE): classic, or quorum (replicated over a cluster's nodes
/// with Raft; what RabbitMQ 4 offers for replication).
public enum QueueType: String, Sendable, Equatable, CaseIterable {
    case classic, quorum
}

/// The queues and exchange names apns-worker's programs share (the contract in docs/contract.md), and the type they are
/// declared as.
public struct QueueNames: Sendable, Equatable {
    /// The urgent lane (PUSH_JOBS_QUEUE).
    public var jobs: String
    /// The bulk lane (PUSH_BULK_QUEUE): same job format, taken only while urgent work leaves room.
    public var bulk: String
    public var failed: String
    public var deadTokens: String
    /// Fanout exchange dead-token events are published to, with `deadTokens` bound to it; empty: straight to the
    /// queue.
    public var deadTokensExchange: String
    public var registrations: String
    /// What queues the programs declare are; a queue someone declared before with other arguments is used as it is.
    public var type: QueueType

    public init(
        jobs: String = "push.jobs", bulk: String = "push.bulk", failed: String = "push.failed",
        deadTokens: String = "push.dead-tokens", deadTokensExchange: String? = nil,
        registrations: String = "push.registrations", type: QueueType = .classic
    ) {
        self.type = type
        self.jobs = jobs
        self.bulk = bulk
        self.failed = failed
        self.deadTokens = deadTokens
        self.deadTokensExchange = deadTokensExchange ?? deadTokens
        self.registrations = registrations
    }

    /// The exchange a watcher of dead-token events binds a queue of its own to: there is none when events go straight
    /// to their queue, and a watcher consuming that queue would take them from the consumers that apply them.
    public func watchableDeadTokensExchange() throws(NoDeadTokensExchange) -> String {
        guard !deadTokensExchange.isEmpty else { throw NoDeadTokensExchange(queue: deadTokens) }
        return deadTokensExchange
    }

    /// The queue of a lane.
    public func jobs(_ lane: JobLane) -> String { lane == .urgent ? jobs : bulk }

    /// `<lane's queue>.retry.<ms>ms`: messages wait there `ms` milliseconds, then dead-letter back to the lane's
    /// queue (so a retry stays in its lane).
    public func retry(delay: Double, lane: JobLane = .urgent) -> String {
        "\(jobs(lane)).retry.\(Int((delay * 1000).rounded()))ms"
    }
}

/// Dead-token events are published straight to their queue, with no exchange: nothing can watch them without taking
/// them.
public struct NoDeadTokensExchange: Error, Sendable, Equatable, CustomStringConvertible {
    public let queue: String
    public var description: String {
        "no dead-token exchange: events go straight to \(queue), so there is nothing to watch without taking them"
    }
}

/// The broker objects apns-worker relies on, declared the same way by every process that uses them (declaring is
/// idempotent, and whichever process starts first creates them).
public enum Topology {
    /// Declares one of the programs' queues as `names.type` says (`extra`: arguments of its own, a TTL). Quorum
    /// queues dead-letter at least once (a message leaves only once the target queue confirmed it), which needs
    /// publishes refused rather than old messages dropped when a queue is full.
    public static func declare(
        _ queue: String, on amqp: AMQPConnection, _ names: QueueNames,
        deadLettering: Bool = false,
        extra: [String: AMQPArgument] = [:]
    ) throws(AMQPError) {
        try amqp.declareQueue(queue, arguments: arguments(names, deadLettering: deadLettering, extra: extra))
    }

    /// A queue's arguments as `declare` gives them.
    private static func arguments(_ names: QueueNames, deadLettering: Bool, extra: [String: AMQPArgument])
        -> [String: AMQPArgument]
    {
        var arguments = extra
        if names.type == .quorum {
            arguments["x-queue-type"] = .string("quorum")
            if deadLettering {
                arguments["x-dead-letter-strategy"] = .string("at-least-once")
                arguments["x-overflow"] = .string("reject-publish")
            }
        }
        return arguments
    }

    /// The dead-token queue, and the fanout exchange events are published to with the queue bound to it, so that
    /// other subscribers can bind queues of their own and each receive every event.
    public static func declareDeadTokens(on amqp: AMQPConnection, _ names: QueueNames) throws(AMQPError) {
        try declare(names.deadTokens, on: amqp, names)
        guard !names.deadTokensExchange.isEmpty else { return }
        try amqp.declareExchange(names.deadTokensExchange, type: "fanout")
        // Bound with the routing key events are published with (the queue's name): should someone have declared the
        // exchange as direct or topic already, the events still reach the queue.
        try amqp.bindQueue(names.deadTokens, to: names.deadTokensExchange, routingKey: names.deadTokens)
    }

    /// Everything a worker uses: both lanes' queues, the failed queue, the dead tokens, and per lane one delay queue
    /// per retry delay that dead-letters back to that lane's queue.
    public static func declareWorkerQueues(
        on amqp: AMQPConnection, _ names: QueueNames,
        retryDelays: [Double]
    ) throws(AMQPError) {
        // In bursts (`declareQueues`), one round trip for ten: a worker declares about sixty queues (each lane's retry
        // and schedule tiers) before it consumes.
        var queues = [names.jobs, names.bulk, names.failed].map { queue in
            (name: queue, arguments: arguments(names, deadLettering: false, extra: [:]))
        }
        for lane in JobLane.allCases {
            for delay in retryDelays {
                let extra: [String: AMQPArgument] = [
                    "x-message-ttl": .integer(Int64((delay * 1000).rounded())),
                    "x-dead-letter-exchange": .string(""),
                    "x-dead-letter-routing-key": .string(names.jobs(lane))
                ]
                queues.append(
                    (
                        name: names.retry(delay: delay, lane: lane),
                        arguments: arguments(names, deadLettering: true, extra: extra)
                    ))
            }
        }
        try amqp.declareQueues(queues)
        try declareDeadTokens(on: amqp, names)
    }
}
