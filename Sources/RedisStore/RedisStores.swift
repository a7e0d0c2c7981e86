import Redis
import Telemetry
import WorkerPipeline

/// The readiness probe of the worker's Redis: a PING of every node in use, within the connections' timeout.
public final class RedisProbe: Probing {
    let redis: any RedisClient

    public init(_ redis: any RedisClient) { self.redis = redis }

    public func probe() throws { try redis.ping() }
}

/// Everything the worker keeps in Redis, over one connection owned by the broker thread: the token cache, the
/// idempotency record, the shared statistics, the shared rate limit and the invalidation guard's window.
public struct RedisStores {
    public let connection: any RedisClient
    public let tokens: TokenCache
    public let record: SentRecord
    public let statistics: SharedStatistics
    /// nil without a rate limit.
    public let rateLimiter: SharedRateLimit?
    public let invalidationWindow: SharedInvalidationWindow

    /// Connects. Redis refusing what the URL says (a password, a database) is `ConnectionRefused`.
    public init(_ deployment: RedisDeployment, rateLimit: Int, urgentShare: Double = 0.2, logger: Logger) throws {
        let connection = try Self.connect(deployment, logger: logger)
        self.connection = connection
        tokens = TokenCache(redis: connection, logger: logger)
        record = SentRecord(redis: connection)
        statistics = SharedStatistics(redis: connection)
        invalidationWindow = SharedInvalidationWindow(redis: connection)
        rateLimiter = rateLimit > 0 ? SharedRateLimit(redis: connection, limit: rateLimit, urgentShare: urgentShare) : nil
    }

    /// A token cache on a connection of its own, for a thread of its own (the worker's job preparer).
    /// The shared limiter of one rate group (a credential's own limit), on this connection.
    public func groupRateLimiter(urgentShare: Double) -> (RateGroup) -> any RateLimiter {
        let connection = self.connection
        return { group in
            SharedRateLimit(redis: connection, limit: group.perSecond, urgentShare: urgentShare,
                            keyPrefix: RedisKeys(cluster: connection.isCluster).groupRatePrefix(group.name))
        }
    }

    public static func tokenCache(_ deployment: RedisDeployment, logger: Logger) throws -> TokenCache {
        TokenCache(redis: try connect(deployment, logger: logger), logger: logger)
    }

    private static func connect(_ deployment: RedisDeployment, logger: Logger) throws -> any RedisClient {
        do { return try deployment.connect(logger: logger) } catch {
            if error.kind == .refused || error.kind == .badURL {
                throw ConnectionRefused(.store, error.message, cause: error)
            }
            throw error
        }
    }
}
