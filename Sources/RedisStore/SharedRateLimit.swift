import Redis
import WorkerPipeline

/// APNS_RATE_LIMIT notifications per second across every worker on the same Redis, urgent work first.
///
/// Tenth-of-a-second slots keyed by Redis's own clock (`apns:rate:<unix second>.<tenth>`), so workers with skewed
/// clocks share the same slot; each slot grants a tenth of the limit (the remainder spread so a second grants exactly
/// the limit). Small slots keep bursts small: any one-second span overlaps at most 11 slots. A worker reserves
/// permits for a whole batch, both lanes at once, in one atomic script call: no round trip per notification. What a
/// slot cannot grant waits for the next one.
///
/// Lanes: bulk work takes only what the slot has left, and urgent work is served first. Urgent work may also take
/// up to `urgentShare` of a slot beyond what is left, borrowed from the next slot (which starts with the debt, so
/// bulk work gets that much less there): however fast bulk work spends each slot, that share is always there for
/// urgent work at once, and no permit is set aside unused while no urgent work comes. Over any second the fleet sends
/// at most one slot's borrowing more than the rate (plus the slot overlap above).
public struct SharedRateLimit: RateLimiter {
    /// KEYS[1] is the prefix, and the script finds the slots by Redis's clock (one node); or, in a cluster, where a
    /// script must name every key it touches, KEYS[1] and KEYS[2] are the current and the previous slot and ARGV[5]
    /// and ARGV[6] the time they were chosen by (the slots' node's clock, asked just before).
    static let reserveScript = """
        local second, micros
        if #KEYS == 2 then
            second, micros = tonumber(ARGV[5]), tonumber(ARGV[6])
        else
            local now = redis.call('TIME')
            second, micros = tonumber(now[1]), tonumber(now[2])
        end
        local slot = math.floor(micros / 100000)
        local previousSecond, previousSlot = second, slot - 1
        if previousSlot < 0 then previousSecond, previousSlot = second - 1, 9 end
        local key, previousKey = KEYS[1], KEYS[2]
        if #KEYS == 1 then
            key = KEYS[1] .. ':' .. second .. '.' .. slot
            previousKey = KEYS[1] .. ':' .. previousSecond .. '.' .. previousSlot
        end
        local limit = tonumber(ARGV[1])
        local function allowedIn(tenth) return math.floor((tenth + 1) * limit / 10) - math.floor(tenth * limit / 10) end
        local allowed = allowedIn(slot)
        local used = redis.call('GET', key)
        if used then
            used = tonumber(used)
        else
            local previous = tonumber(redis.call('GET', previousKey) or '0')
            used = math.max(0, previous - allowedIn(previousSlot))
        end
        local borrowable = math.ceil(allowed * tonumber(ARGV[4]) / 1000)
        local urgent = math.max(0, math.min(tonumber(ARGV[2]), allowed + borrowable - used))
        used = used + urgent
        local bulk = math.max(0, math.min(tonumber(ARGV[3]), allowed - used))
        used = used + bulk
        if urgent + bulk > 0 then redis.call('SET', key, used, 'EX', 10) end
        return {urgent, bulk, 100000 - (micros % 100000)}
        """

    private let redis: any RedisClient
    public let limit: Int
    /// The share of each slot urgent work can always take at once (0...1).
    public let urgentShare: Double
    private let prefix: String

    /// `keyPrefix`: the slots' (`RedisKeys.ratePrefix` unless a test keeps its own); in a cluster it holds a hash
    /// tag, so that the slots one call reads and writes share a node.
    public init(redis: any RedisClient, limit: Int, urgentShare: Double = 0.2, keyPrefix: String? = nil) {
        self.redis = redis
        self.limit = limit
        self.urgentShare = urgentShare
        self.prefix = keyPrefix ?? RedisKeys(cluster: redis.isCluster).ratePrefix
    }

    /// Reserves up to `urgent` + `bulk` permits in the current slot: how many each lane was granted and the seconds
    /// until the next slot opens. A script Redis refuses (a slot key of the wrong type) is `.refused`; only a lost
    /// connection throws.
    public func reserve(urgent: Int, bulk: Int) throws -> RateReservation {
        let arguments = [String(limit), String(urgent), String(bulk), String(Int((urgentShare * 1000).rounded()))]
        let reply: RedisReply
        if redis.isCluster {
            guard let (second, micros) = try RedisClock.now(redis, at: prefix) else {
                return .refused("rate limit: the node of \(prefix) did not say the time")
            }
            let slot = micros / 100_000
            let previous = slot == 0 ? "\(second - 1).9" : "\(second).\(slot - 1)"
            let slots: [String] = ["\(prefix):\(second).\(slot)", "\(prefix):\(previous)"]
            let command: [String] = ["EVAL", Self.reserveScript, "2"] + slots + arguments + [String(second), String(micros)]
            reply = try redis.command(command)
        } else {
            reply = try redis.command(["EVAL", Self.reserveScript, "1", prefix] + arguments)
        }
        if case .error(let message) = reply { return .refused("rate limit script: \(message)") }
        let values = reply.elements.compactMap(\.integer)
        guard values.count == 3 else { return .refused("rate limit script: unexpected reply \(reply)") }
        return .granted(urgent: Int(values[0]), bulk: Int(values[1]), nextWindowIn: Double(values[2]) / 1e6)
    }
}
