import Redis
import Telemetry
import WorkerPipeline

/// The readiness probe of the worker's Redis: a PING of every node in use, within the connections' timeout. With
/// Sentinel, also whether the sentinels still name the node this connection is on as the master: one cut off from
/// them and the replica (a split brain) goes on answering its clients after the sentinels promoted the replica, and
/// what it takes then is lost when it rejoins as a replica. A different answer ends the session (reconnecting asks
/// the sentinels again); sentinels that do not answer say nothing.
public final class RedisProbe: Probing {
    let redis: any RedisClient
    let sentinels: RedisSentinels?
    let master: RedisAddress?

    public init(_ redis: any RedisClient, deployment: RedisDeployment? = nil) {
        self.redis = redis
        if case .sentinel(let sentinels)? = deployment, let connection = redis as? RedisConnection {
            self.sentinels = sentinels
            master = RedisAddress(host: connection.url.host, port: connection.url.port)
        } else {
            sentinels = nil
            master = nil
        }
    }

    public func probe() throws {
        try redis.ping()
        guard let sentinels, let master, let named = sentinels.namedMaster(timeout: 1), named != master else { return }
        throw RedisError(
            kind: .connectionLost,
            "the sentinels name \(named) as the master of \(sentinels.masterName), "
                + "not \(master), which this connection is on")
    }
}

/// Everything the worker keeps in Redis, over one connection owned by the broker thread: the token cache, the
/// idempotency record, the shared statistics, the shared rate limit, the invalidation guard's window, the cancelled
/// jobs and large jobs' progress.
public struct RedisStores {
    public let connection: any RedisClient
    /// The connection's readiness probe (a PING; with Sentinel, also the sentinels' view of the master).
    public let probe: RedisProbe
    public let tokens: TokenCache
    public let record: SentRecord
    public let statistics: SharedStatistics
    /// nil without a rate limit.
    public let rateLimiter: SharedRateLimit?
    public let invalidationWindow: SharedInvalidationWindow
    public let cancellations: SharedCancellations
    public let progress: SharedJobProgress

    /// Connects. Redis refusing what the URL says (a password, a database) is `ConnectionRefused`.
    public init(_ deployment: RedisDeployment, rateLimit: Int, urgentShare: Double = 0.2, logger: Logger) throws {
        let connection = try Self.connect(deployment, logger: logger)
        self.connection = connection
        probe = RedisProbe(connection, deployment: deployment)
        tokens = TokenCache(redis: connection, logger: logger)
        record = SentRecord(redis: connection)
        statistics = SharedStatistics(redis: connection)
        invalidationWindow = SharedInvalidationWindow(redis: connection)
        cancellations = SharedCancellations(redis: connection)
        progress = SharedJobProgress(redis: connection)
        rateLimiter =
            rateLimit > 0 ? SharedRateLimit(redis: connection, limit: rateLimit, urgentShare: urgentShare) : nil
    }

    /// The shared limiter of one rate group (a credential's own limit), on this connection.
    public func groupRateLimiter(urgentShare: Double) -> (RateGroup) -> any RateLimiter {
        let connection = self.connection
        return { group in
            SharedRateLimit(
                redis: connection, limit: group.perSecond, urgentShare: urgentShare,
                keyPrefix: RedisKeys(cluster: connection.isCluster).groupRatePrefix(group.name))
        }
    }

    /// A token cache and an idempotency record on a connection of their own, for a thread of its own (the worker's
    /// job preparer).
    public static func preparation(_ deployment: RedisDeployment, logger: Logger) throws -> (
        tokens: TokenCache, record: SentRecord
    ) {
        let connection = try connect(deployment, logger: logger)
        return (TokenCache(redis: connection, logger: logger), SentRecord(redis: connection))
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
