import AMQP

/// The queues and exchange names apns-worker's programs share (the contract in README.md).
public struct QueueNames: Sendable, Equatable {
    public var jobs: String
    public var failed: String
    public var deadTokens: String
    /// Fanout exchange dead-token events are published to, with `deadTokens` bound to it; empty: straight to the
    /// queue.
    public var deadTokensExchange: String
    public var registrations: String

    public init(jobs: String = "push.jobs", failed: String = "push.failed", deadTokens: String = "push.dead-tokens",
                deadTokensExchange: String? = nil, registrations: String = "push.registrations") {
        self.jobs = jobs
        self.failed = failed
        self.deadTokens = deadTokens
        self.deadTokensExchange = deadTokensExchange ?? deadTokens
        self.registrations = registrations
    }

    /// `<jobs>.retry.<ms>ms`: messages wait there `ms` milliseconds, then dead-letter back to the jobs queue.
    public func retry(delay: Double) -> String { "\(jobs).retry.\(Int((delay * 1000).rounded()))ms" }
}

/// The broker objects apns-worker relies on, declared the same way by every process that uses them (declaring is
/// idempotent, and whichever process starts first creates them).
public enum Topology {
    /// The dead-token queue, and the fanout exchange events are published to with the queue bound to it, so that
    /// other subscribers can bind queues of their own and each receive every event.
    public static func declareDeadTokens(on amqp: AMQPConnection, _ names: QueueNames) throws(AMQPError) {
        try amqp.declareQueue(names.deadTokens)
        guard !names.deadTokensExchange.isEmpty else { return }
        try amqp.declareExchange(names.deadTokensExchange, type: "fanout")
        // Bound with the routing key events are published with (the queue's name): should someone have declared the
        // exchange as direct or topic already, the events still reach the queue.
        try amqp.bindQueue(names.deadTokens, to: names.deadTokensExchange, routingKey: names.deadTokens)
    }

    /// Everything a worker uses: the jobs and failed queues, the dead tokens, and one delay queue per retry delay
    /// that dead-letters back to the jobs queue.
    public static func declareWorkerQueues(on amqp: AMQPConnection, _ names: QueueNames,
                                           retryDelays: [Double]) throws(AMQPError) {
        for queue in [names.jobs, names.failed] { try amqp.declareQueue(queue) }
        try declareDeadTokens(on: amqp, names)
        for delay in retryDelays {
            try amqp.declareQueue(names.retry(delay: delay), arguments: [
                "x-message-ttl": .integer(Int64((delay * 1000).rounded())),
                "x-dead-letter-exchange": .string(""),
                "x-dead-letter-routing-key": .string(names.jobs),
            ])
        }
    }
}
