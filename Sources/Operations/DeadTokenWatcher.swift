import AMQP
import AMQPBroker
import Configuration
import Foundation
import Telemetry
import WorkerPipeline

/// `apns-worker dead-tokens tail`: shows dead-token events as workers publish them, without taking them from the
/// cleanup consumers: a temporary queue of its own, bound to the dead-token exchange, gone when it exits. When its
/// node goes away it moves to another (events published while it had no queue are not shown: it is a window on the
/// exchange, the cleanup consumers' queue keeps every event).
public final class DeadTokenWatcher {
    private let configuration: WorkerConfiguration
    private let logger: Logger?
    private var amqp: AMQPConnection

    /// Throws `NoDeadTokensExchange` (before connecting) when events go straight to their queue.
    public init(configuration: WorkerConfiguration, logger: Logger? = nil) throws {
        let exchange = try configuration.broker.queues.watchableDeadTokensExchange()
        self.configuration = configuration
        self.logger = logger
        amqp = try Self.watch(configuration)
        logger?.info("watching", ["amqp.url": amqp.url.description, "amqp.exchange": exchange])
    }

    deinit { amqp.close() }

    private static func watch(_ configuration: WorkerConfiguration) throws(AMQPError) -> AMQPConnection {
        let names = configuration.broker.queues
        return try configuration.broker.connect { amqp throws(AMQPError) in
            try Topology.declareDeadTokens(on: amqp, names)
            let queue = try amqp.declareTemporaryQueue()
            try amqp.bindQueue(queue, to: names.deadTokensExchange, routingKey: names.deadTokens)
            try amqp.consume(queue, acknowledging: false)
        }
    }

    /// The next event's body, or nil if none came within `timeout` seconds (nil: wait for ever).
    public func next(timeout: Double?) throws -> [UInt8]? {
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        var failures = 0
        while true {
            let remaining = deadline.map { max(0, $0.timeIntervalSinceNow) }
            let event: AMQPEvent?
            do {
                event = try amqp.nextEvent(timeout: remaining)
            } catch {
                guard !error.isPermanent else { throw error }
                failures += 1
                moveToAnotherNode(after: error, failures: failures, within: deadline)
                if let deadline, Date() >= deadline { return nil }
                continue
            }
            guard let event else { return nil }
            failures = 0
            if case .delivery(let delivery) = event { return delivery.body }
            if let deadline, Date() >= deadline { return nil }
        }
    }

    /// Waits the back-off (the workers', never past `deadline`), then watches from a node that answers; when none
    /// does, the next call tries again.
    private func moveToAnotherNode(after error: AMQPError, failures: Int, within deadline: Date?) {
        let delay = min(
            reconnectDelay(afterFailures: failures), deadline.map { max(0, $0.timeIntervalSinceNow) } ?? .infinity)
        logger?.warning(
            "broker connection lost; watching again on another node",
            [
                "amqp.url": amqp.url.description, "error": error.message,
                "retry_in_s": String(format: "%.2f", delay)
            ])
        amqp.close()
        Thread.sleep(forTimeInterval: delay)
        guard let connection = try? Self.watch(configuration) else { return }
        amqp = connection
        logger?.info("watching", ["amqp.url": amqp.url.description])
    }
}
