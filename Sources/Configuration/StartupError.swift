import AMQP
import AMQPBroker
import Redis
import WorkerPipeline

extension ConfigurationError {
    /// A lower module's refusal of what a setting made it do, named by that setting; nil for any other error.
    public init?(naming error: any Error) {
        switch error {
        case let missing as NoDeadTokensExchange:
            self.init(
                \.pushDeadTokensExchange,
                "empty: events go straight to \(missing.queue), so there is nothing to "
                    + "watch without taking them")
        default:
            return nil
        }
    }
}

/// A refusal that waiting cannot cure, named by the setting to fix: the broker refused the user, password or vhost
/// in AMQP_URL, Redis the password or database in REDIS_URL. The programs exit 78 with it; a broker or Redis that is
/// merely down is waited for instead.
public struct StartupError: Error, Sendable, CustomStringConvertible {
    public let description: String

    /// nil for anything else (a broker or Redis that is down, a broken connection).
    public init?(permanent error: any Error) {
        switch error {
        case let refused as ConnectionRefused:
            if let redis = refused.cause as? RedisError {
                description = Self.naming(redis).description
            } else if let amqp = refused.cause as? AMQPError {
                description = Self.naming(amqp).description
            } else {
                description =
                    (refused.system == .broker
                    ? ConfigurationError(\.amqpURL, refused.message)
                    : ConfigurationError(\.redisURL, refused.message)).description
            }
        case let amqp as AMQPError where amqp.isPermanent:
            description = Self.naming(amqp).description
        case let redis as RedisError where redis.kind == .refused || redis.kind == .badURL:
            description = Self.naming(redis).description
        default:
            return nil
        }
    }

    /// The broker's refusal, named by the setting it concerns: its certificate, or the user, password or vhost.
    private static func naming(_ amqp: AMQPError) -> ConfigurationError {
        amqp.isCertificateRefused
            ? ConfigurationError(\.amqpCAFile, amqp.message) : ConfigurationError(\.amqpURL, amqp.message)
    }

    /// Redis's refusal, named by the setting it concerns.
    private static func naming(_ redis: RedisError) -> ConfigurationError {
        switch redis.part {
        case .dataNodes: ConfigurationError(\.redisURL, redis.message)
        case .sentinels: ConfigurationError(\.redisSentinelPassword, redis.message)
        case .masterName: ConfigurationError(\.redisMasterName, redis.message)
        case .clusterNodes: ConfigurationError(\.redisClusterNodes, redis.message)
        case .tls: ConfigurationError(\.redisCAFile, redis.message)
        case .clientCertificate: ConfigurationError(\.redisCertFile, redis.message)
        case .clientKey: ConfigurationError(\.redisCertKeyFile, redis.message)
        }
    }
}
