import Foundation
import Redis
import WorkerPipeline

/// The fleet's token-judging answers over the last `seconds` seconds, in one-second buckets keyed by Redis's own clock
/// (`apns:guard:<unix second>`, `apns:{guard}:...` in a cluster; a hash of `mismatches` and `judged`, kept a little
/// longer than the window), and over the last hour in one-minute buckets (`apns:guard:minute:<unix minute>`, the
/// same hash): every worker adds its answers and reads both totals in one atomic script call (see `RedisClock`).
public struct SharedInvalidationWindow: InvalidationWindow {
    public static let seconds = 60
    /// The longer window, in minutes: a wave slower than the threshold a minute still trips the guard within it.
    public static let minutes = 60

    /// KEYS: the minute window's `seconds` buckets, then the hour window's `minutes` buckets, each the current one
    /// first, named by the caller's estimate of Redis's clock (a script names every key it touches, as a cluster
    /// requires); ARGV[4]: the second they end at; ARGV[5]: how long a minute bucket is kept (s). If Redis's own
    /// clock is in another second, nothing is touched and
    /// the answer is {-1, seconds, microseconds}: the caller learns the time and calls again. Otherwise
    /// {mismatches, judged (last minute), mismatches, judged (last hour), seconds, microseconds}.
    static let script = """
        local now = redis.call('TIME')
        if tonumber(now[1]) ~= tonumber(ARGV[4]) then return {-1, tonumber(now[1]), tonumber(now[2])} end
        local window = tonumber(ARGV[3])
        local first_minute = window + 1
        if tonumber(ARGV[2]) > 0 then
            for _, at in ipairs({{1, window + 5}, {first_minute, tonumber(ARGV[5])}}) do
                redis.call('HINCRBY', KEYS[at[1]], 'mismatches', ARGV[1])
                redis.call('HINCRBY', KEYS[at[1]], 'judged', ARGV[2])
                redis.call('EXPIRE', KEYS[at[1]], at[2])
            end
        end
        local totals = {0, 0, 0, 0}
        for index, key in ipairs(KEYS) do
            local bucket = redis.call('HMGET', key, 'mismatches', 'judged')
            local offset = index < first_minute and 0 or 2
            totals[offset + 1] = totals[offset + 1] + tonumber(bucket[1] or '0')
            totals[offset + 2] = totals[offset + 2] + tonumber(bucket[2] or '0')
        end
        return {totals[1], totals[2], totals[3], totals[4], tonumber(now[1]), tonumber(now[2])}
        """

    private let redis: any RedisClient
    private let prefix: String
    private let clock = RedisClock(localNow: { Date().timeIntervalSince1970 })

    /// `keyPrefix`: the buckets' (`RedisKeys.guardPrefix` unless a test keeps its own); in a cluster it holds a hash
    /// tag, so that the whole window is on one node.
    public init(redis: any RedisClient, keyPrefix: String? = nil) {
        self.redis = redis
        self.prefix = keyPrefix ?? RedisKeys(cluster: redis.isCluster).guardPrefix
    }

    /// Adds `counts` (nothing when it judged nothing) and returns the window's totals; refused when Redis refused the
    /// script (a bucket of the wrong type), unavailable when the window's node does not answer. Only a lost
    /// connection throws.
    public func add(_ counts: InvalidationCounts) throws -> StoreAnswer<FleetInvalidationCounts> {
        let arguments = [String(counts.mismatches), String(counts.judged), String(Self.seconds)]
        for _ in 0..<RedisClock.attempts {
            let second = clock.estimate().second
            let buckets =
                RedisKeys.guardBuckets(prefix: prefix, endingAt: second, seconds: Self.seconds)
                + RedisKeys.guardMinuteBuckets(prefix: prefix, endingAt: second, minutes: Self.minutes)
            guard
                let reply = try redis.commandWhereReachable(
                    ["EVAL", Self.script, String(buckets.count)] + buckets
                        + arguments + [String(second), String(Self.minutes * 60 + 120)])
            else { return .unavailable }
            let values = reply.elements.compactMap(\.integer)
            if values.count == 3, values[0] == -1 {
                clock.learn(second: values[1], micros: values[2])
                continue
            }
            guard values.count == 6 else { return .refused("guard window script: \(reply)") }
            clock.learn(second: values[4], micros: values[5])
            return .answered(
                FleetInvalidationCounts(
                    lastMinute: InvalidationCounts(mismatches: Int(values[0]), judged: Int(values[1])),
                    lastHour: InvalidationCounts(mismatches: Int(values[2]), judged: Int(values[3]))))
        }
        return .refused("guard window: Redis's clock moved to another second on every call")
    }

    /// The window's totals, adding nothing; nil when refused or unavailable.
    public func totals() throws -> FleetInvalidationCounts? {
        if case .answered(let totals) = try add(InvalidationCounts()) { return totals }
        return nil
    }
}
