import AMQP

/// The broker objects apns-worker relies on, declared the same way by every process that uses them (declaring is
/// idempotent, and whichever process starts first creates them).
public enum Topology {
    /// The dead-token queue, and the fanout exchange events are published to with the queue bound to it, so that
    /// other subscribers can bind queues of their own and each receive every event.
    public static func declareDeadTokens(on amqp: AMQPConnection, _ configuration: WorkerConfiguration) throws(AMQPError) {
        try amqp.declareQueue(configuration.deadTokensQueue)
        guard !configuration.deadTokensExchange.isEmpty else { return }
        try amqp.declareExchange(configuration.deadTokensExchange, type: "fanout")
        // Bound with the routing key events are published with (the queue's name): should someone have declared the
        // exchange as direct or topic already, the events still reach the queue.
        try amqp.bindQueue(configuration.deadTokensQueue, to: configuration.deadTokensExchange,
                           routingKey: configuration.deadTokensQueue)
    }
}
