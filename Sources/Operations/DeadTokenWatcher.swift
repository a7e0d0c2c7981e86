import AMQP
import AMQPBroker
import Configuration
import Foundation
import WorkerPipeline

/// `apns-worker dead-tokens tail`: shows dead-token events as workers publish them, without taking them from the
/// cleanup consumers: a temporary queue of its own, bound to the dead-token exchange, gone when it exits.
public final class DeadTokenWatcher {
    private let amqp: AMQPConnection

    public init(configuration: WorkerConfiguration) throws {
        let names = configuration.broker.queues
        guard !names.deadTokensExchange.isEmpty else {
            throw ConfigurationError(key: "PUSH_DEAD_TOKENS_EXCHANGE", "empty: events go straight to "
                                     + "\(names.deadTokens), so there is nothing to watch without taking them")
        }
        amqp = try configuration.broker.nodes.connect(heartbeat: configuration.broker.heartbeat,
                                                      caFile: configuration.broker.caFile)
        try Topology.declareDeadTokens(on: amqp, names)
        let queue = try amqp.declareTemporaryQueue()
        try amqp.bindQueue(queue, to: names.deadTokensExchange, routingKey: names.deadTokens)
        try amqp.consume(queue, acknowledging: false)
    }

    deinit { amqp.close() }

    /// The next event's body, or nil if none came within `timeout` seconds (nil: wait for ever).
    public func next(timeout: Double?) throws -> [UInt8]? {
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        while true {
            let remaining = deadline.map { max(0, $0.timeIntervalSinceNow) }
            guard let event = try amqp.nextEvent(timeout: remaining) else { return nil }
            if case .delivery(let delivery) = event { return delivery.body }
            if let deadline, Date() >= deadline { return nil }
        }
    }
}
