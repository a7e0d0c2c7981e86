import Foundation
import Redis
import WorkerPipeline

/// APNS_RATE_LIMIT notifications per second across every worker on the same Redis, urgent work first.
///
/// Tenth-of-a-second slots keyed by Redis's own clock (`apns:rate:<unix second>.<tenth>`), so workers with skewed
/// clocks share the same slot; each slot grants a tenth of the limit (the remainder spread so a second grants exactly
/// the limit). Small slots keep bursts small: any one-second span overlaps at most 11 slots. A worker reserves
/// permits for a whole batch, both lanes at once, in one atomic script call: one round trip per batch (rarely two, when
/// a slot boundary passes on the way; see `RedisClock`), none per notification. What a slot cannot grant waits for
/// the next one.
///
/// Lanes: bulk work takes only what the slot has left, and urgent work is served first. Urgent work may also take
/// up to `urgentShare` of a slot beyond what is left, borrowed from the next slot (which starts with the debt, so
/// bulk work gets that much less there): however fast bulk work spends each slot, that share is always there for
/// urgent work at once, and no permit is set aside unused while no urgent work comes. Over any second the fleet sends
/// at most one slot's borrowing more than the rate (plus the slot overlap above).
///
/// While the node holding the slots does not answer (a cluster master lost), each worker keeps to its share of the
/// limit, counted locally (`LocalRateShare`): work goes on, and the fleet stays near the limit.
public struct SharedRateLimit: RateLimiter {
    /// KEYS: the current slot and the previous one, named by the caller's estimate of Redis's clock (a script names
    /// every key it touches, as a cluster requires); ARGV[5], ARGV[6]: the second and tenth they were named for. If
    /// Redis's own clock is in another slot, nothing is touched and the answer is {-1, seconds, microseconds}: the
    /// caller learns the time and calls again. Otherwise {urgent, bulk, microseconds to the next slot, seconds,
    /// microseconds}.
    static let reserveScript = """
        local now = redis.call('TIME')
        local second, micros = tonumber(now[1]), tonumber(now[2])
        local slot = math.floor(micros / 100000)
        if second ~= tonumber(ARGV[5]) or slot ~= tonumber(ARGV[6]) then return {-1, second, micros} end
        local previousSlot = (slot + 9) % 10
        local limit = tonumber(ARGV[1])
        local function allowedIn(tenth) return math.floor((tenth + 1) * limit / 10) - math.floor(tenth * limit / 10) end
        local allowed = allowedIn(slot)
        local used = redis.call('GET', KEYS[1])
        if used then
            used = tonumber(used)
        else
            local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
            used = math.max(0, previous - allowedIn(previousSlot))
        end
        local borrowable = math.ceil(allowed * tonumber(ARGV[4]) / 1000)
        local urgent = math.max(0, math.min(tonumber(ARGV[2]), allowed + borrowable - used))
        used = used + urgent
        local bulk = math.max(0, math.min(tonumber(ARGV[3]), allowed - used))
        used = used + bulk
        if urgent + bulk > 0 then redis.call('SET', KEYS[1], used, 'EX', 10) end
        return {urgent, bulk, 100000 - (micros % 100000), second, micros}
        """

    private let redis: any RedisClient
    public let limit: Int
    /// The share of each slot urgent work can always take at once (0...1).
    public let urgentShare: Double
    private let prefix: String
    private let clock: RedisClock
    private let workersKey: String
    private let fallback: LocalRateShare

    /// `keyPrefix`: the slots' (`RedisKeys.ratePrefix` unless a test keeps its own); in a cluster it holds a hash
    /// tag, so that the slots one call reads and writes share a node. `localNow`: the local clock (tests skew it).
    public init(
        redis: any RedisClient, limit: Int, urgentShare: Double = 0.2, keyPrefix: String? = nil,
        localNow: @escaping () -> Double = { Date().timeIntervalSince1970 }
    ) {
        self.redis = redis
        self.limit = limit
        self.urgentShare = urgentShare
        let keys = RedisKeys(cluster: redis.isCluster)
        self.prefix = keyPrefix ?? keys.ratePrefix
        workersKey = keys.workers
        clock = RedisClock(localNow: localNow)
        fallback = LocalRateShare(now: localNow)
    }

    /// Reserves up to `urgent` + `bulk` permits in the current slot: how many each lane was granted and the seconds
    /// until the next slot opens. A script Redis refuses (a slot key of the wrong type) is `.refused`; a node that does
    /// not answer grants this worker's share locally; only a lost connection throws.
    public func reserve(urgent: Int, bulk: Int) throws -> RateReservation {
        if fallback.fleetSizeDue { try readFleetSize() }
        let arguments = [String(limit), String(urgent), String(bulk), String(Int((urgentShare * 1000).rounded()))]
        for _ in 0..<RedisClock.attempts {
            let (second, micros) = clock.estimate()
            let tenth = micros / 100_000
            let slots = RedisKeys.rateSlots(prefix: prefix, second: second, tenth: tenth)
            let command: [String] =
                ["EVAL", Self.reserveScript, "2", slots.current, slots.previous] + arguments
                + [String(second), String(tenth)]
            guard let reply = try redis.commandWhereReachable(command) else {
                return fallback.reserve(urgent: urgent, bulk: bulk, limit: limit)
            }
            if case .error(let message) = reply { return .refused("rate limit script: \(message)") }
            let values = reply.elements.compactMap(\.integer)
            if values.count == 3, values[0] == -1 {
                clock.learn(second: values[1], micros: values[2])
                continue
            }
            guard values.count == 5 else { return .refused("rate limit script: unexpected reply \(reply)") }
            clock.learn(second: values[3], micros: values[4])
            return .granted(urgent: Int(values[0]), bulk: Int(values[1]), nextWindowIn: Double(values[2]) / 1e6)
        }
        // Redis's clock moved to another slot on every call: nothing granted now, ask again at once.
        return .granted(urgent: 0, bulk: 0, nextWindowIn: 0.001)
    }

    /// The workers that reported to the fleet's statistics in the last 30 s: what the limit is shared among when its
    /// node does not answer. Kept as it was when their node does not answer either.
    private func readFleetSize() throws {
        let since = Int64((Date().timeIntervalSince1970 - 30) * 1000)
        let reply = try redis.commandWhereReachable(["ZCOUNT", workersKey, String(since), "+inf"])
        fallback.learnFleetSize(reply?.integer.map(Int.init))
    }
}
