import Redis
import WorkerPipeline

/// APNS_RATE_LIMIT notifications per second across every worker on the same Redis.
///
/// Tenth-of-a-second slots keyed by Redis's own clock (`apns:rate:<unix second>.<tenth>`), so workers with skewed
/// clocks share the same slot; each slot grants a tenth of the limit (the remainder spread so a second grants exactly
/// the limit). Small slots keep bursts small: any one-second span overlaps at most 11 slots, so it sees at most 10%
/// over the limit, where whole-second windows allow twice the limit across a boundary. A worker reserves permits for
/// a whole batch in one atomic script call: no round trip per notification. What a slot cannot grant waits for the
/// next one.
public struct SharedRateLimit: RateLimiter {
    public static let keyPrefix = "apns:rate"

    static let reserveScript = """
        local now = redis.call('TIME')
        local micros = tonumber(now[2])
        local slot = math.floor(micros / 100000)
        local key = KEYS[1] .. ':' .. now[1] .. '.' .. slot
        local limit = tonumber(ARGV[1])
        local allowed = math.floor((slot + 1) * limit / 10) - math.floor(slot * limit / 10)
        local used = tonumber(redis.call('GET', key) or '0')
        local grant = math.min(tonumber(ARGV[2]), allowed - used)
        if grant < 0 then grant = 0 end
        if grant > 0 then
            redis.call('INCRBY', key, grant)
            redis.call('EXPIRE', key, 10)
        end
        return {grant, 100000 - (micros % 100000)}
        """

    private let redis: RedisConnection
    public let limit: Int
    private let prefix: String

    public init(redis: RedisConnection, limit: Int, keyPrefix: String = SharedRateLimit.keyPrefix) {
        self.redis = redis
        self.limit = limit
        self.prefix = keyPrefix
    }

    /// Reserves up to `wanted` permits in the current slot: how many were granted and the seconds until the next
    /// slot opens. A script Redis refuses (a slot key of the wrong type) is `.refused`; only a lost connection throws.
    public func reserve(_ wanted: Int) throws -> RateReservation {
        let reply = try redis.command(["EVAL", Self.reserveScript, "1", prefix, String(limit), String(wanted)])
        if case .error(let message) = reply { return .refused("rate limit script: \(message)") }
        let values = reply.elements.compactMap(\.integer)
        guard values.count == 2 else { return .refused("rate limit script: unexpected reply \(reply)") }
        return .granted(Int(values[0]), nextWindowIn: Double(values[1]) / 1e6)
    }
}
