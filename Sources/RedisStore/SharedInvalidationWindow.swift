import Redis
import WorkerPipeline

/// The fleet's token-judging answers over the last `seconds` seconds, in one-second buckets keyed by Redis's own clock
/// (`apns:guard:<unix second>`, `apns:{guard}:...` in a cluster; a hash of `mismatches` and `judged`, kept a little longer than the window): every
/// worker adds its answers and reads the totals in one atomic script call (after asking the buckets' node its time).
public struct SharedInvalidationWindow: InvalidationWindow {
    public static let seconds = 60

    /// KEYS: the window's buckets, the current second's first, chosen by the buckets' node's clock (asked just before:
    /// a script names every key it touches, as a cluster requires).
    static let script = """
        local window = tonumber(ARGV[3])
        local buckets = KEYS
        if tonumber(ARGV[2]) > 0 then
            redis.call('HINCRBY', buckets[1], 'mismatches', ARGV[1])
            redis.call('HINCRBY', buckets[1], 'judged', ARGV[2])
            redis.call('EXPIRE', buckets[1], window + 5)
        end
        local mismatches, judged = 0, 0
        for _, key in ipairs(buckets) do
            local bucket = redis.call('HMGET', key, 'mismatches', 'judged')
            mismatches = mismatches + tonumber(bucket[1] or '0')
            judged = judged + tonumber(bucket[2] or '0')
        end
        return {mismatches, judged}
        """

    private let redis: any RedisClient
    private let prefix: String

    /// `keyPrefix`: the buckets' (`RedisKeys.guardPrefix` unless a test keeps its own); in a cluster it holds a hash
    /// tag, so that the whole window is on one node.
    public init(redis: any RedisClient, keyPrefix: String? = nil) {
        self.redis = redis
        self.prefix = keyPrefix ?? RedisKeys(cluster: redis.isCluster).guardPrefix
    }

    /// Adds `counts` (nothing when it judged nothing) and returns the window's totals; nil when Redis refused the
    /// script (a bucket of the wrong type). Only a lost connection throws.
    public func add(_ counts: InvalidationCounts) throws -> InvalidationCounts? {
        let arguments = [String(counts.mismatches), String(counts.judged), String(Self.seconds)]
        guard let (now, _) = try RedisClock.now(redis, at: prefix) else { return nil }
        let buckets = RedisKeys.guardBuckets(prefix: prefix, endingAt: now, seconds: Self.seconds)
        let reply = try redis.command(["EVAL", Self.script, String(buckets.count)] + buckets + arguments)
        let values = reply.elements.compactMap(\.integer)
        guard values.count == 2 else { return nil }
        return InvalidationCounts(mismatches: Int(values[0]), judged: Int(values[1]))
    }

    /// The window's totals, adding nothing.
    public func totals() throws -> InvalidationCounts? { try add(InvalidationCounts()) }
}
