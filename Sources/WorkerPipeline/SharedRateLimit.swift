import Redis

/// APNS_RATE_LIMIT notifications per second across every worker on the same Redis.
///
/// One-second windows keyed by Redis's own clock (`apns:rate:<unix second>`), so workers with skewed clocks share
/// the same window. A worker reserves permits for a whole batch in one atomic script call: no round trip per
/// notification. What a window cannot grant waits for the next one.
public struct SharedRateLimit {
    public static let keyPrefix = "apns:rate"

    static let reserveScript = """
        local now = redis.call('TIME')
        local key = KEYS[1] .. ':' .. now[1]
        local used = tonumber(redis.call('GET', key) or '0')
        local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
        if grant < 0 then grant = 0 end
        if grant > 0 then
            redis.call('INCRBY', key, grant)
            redis.call('EXPIRE', key, 10)
        end
        return {grant, 1000000 - tonumber(now[2])}
        """

    private let redis: RedisConnection
    public let limit: Int
    private let prefix: String

    public init(redis: RedisConnection, limit: Int, keyPrefix: String = SharedRateLimit.keyPrefix) {
        self.redis = redis
        self.limit = limit
        self.prefix = keyPrefix
    }

    /// Reserves up to `wanted` permits in the current window. Returns how many were granted and, when fewer than
    /// wanted, the seconds until the next window opens.
    public func reserve(_ wanted: Int) throws(RedisError) -> (granted: Int, nextWindowIn: Double) {
        let reply = try redis.command(["EVAL", Self.reserveScript, "1", prefix, String(limit), String(wanted)])
        if case .error(let message) = reply { throw RedisError(kind: .server, "rate limit script: \(message)") }
        let values = reply.elements.compactMap(\.integer)
        guard values.count == 2 else { throw RedisError(kind: .server, "rate limit script: unexpected reply \(reply)") }
        return (Int(values[0]), Double(values[1]) / 1e6)
    }
}
