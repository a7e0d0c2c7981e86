import AMQP
import Redis

/// A refusal at start that waiting cannot cure: the broker refused the user, password or vhost, Redis the password
/// or the database. The programs exit 78 (configuration) naming the setting; a broker or Redis that is merely down
/// is waited for instead.
public struct StartupError: Error, Sendable, CustomStringConvertible {
    public let description: String

    public init?(permanent error: any Error) {
        if let amqp = error as? AMQPError, amqp.isPermanent {
            description = "AMQP_URL: \(amqp.message)"
        } else if let redis = error as? RedisError, redis.kind == .refused || redis.kind == .badURL {
            description = "REDIS_URL: \(redis.message)"
        } else {
            return nil
        }
    }
}
