import APNsModel
import Foundation
import Redis
import WorkerPipeline

/// Counters every worker adds to in Redis, so that `apns-worker stats` can show rates for the whole fleet without
/// asking each process (the schema is in docs/contract.md):
/// - `apns:stats:<unix minute>`: hash, field = counter name (as in `WorkerStatistics.Snapshot.fields`), value = how
///   many in that minute, all workers together; kept 26 hours.
/// - `apns:stats:<unix minute>:waited`: sorted set, member = lane (`urgent`, `bulk`), score = the longest a job taken
///   from that lane in that minute had waited in its queue (ms, from the message's timestamp), all workers together;
///   kept 26 hours.
/// - `apns:workers`: sorted set, member = `<host>:<pid>`, score = when it last reported (ms).
/// - `apns:sending`: sorted set, member = `<environment> <credential name>`, score = when a worker last reported
///   sending with it (ms); kept an hour, for the workers that start meanwhile to open those connections first.
public struct SharedStatistics: StatisticsSink {
    static let retention = 26 * 3600

    private let redis: any RedisClient
    private let keys: RedisKeys

    public init(redis: any RedisClient) {
        self.redis = redis
        keys = RedisKeys(cluster: redis.isCluster)
    }

    /// Adds what happened since the last report (`delta`) to the current minute and marks `worker` alive, in one
    /// round trip. Refused (a key of the wrong type), statistics are worth a warning, never a reconnect. Unavailable
    /// (the minute's node does not answer), nothing was added: the caller reports the counts again later. Only a lost
    /// connection throws.
    @discardableResult
    public func report(_ delta: WorkerStatistics.Snapshot, longestWait: LaneCounts, worker: String) throws
        -> StoreAnswer<Void>
    {
        try report(delta, longestWait: longestWait, worker: worker, now: Date())
    }

    public func report(
        _ delta: WorkerStatistics.Snapshot, longestWait: LaneCounts = LaneCounts(), worker: String,
        now: Date
    ) throws(RedisError) -> StoreAnswer<Void> {
        let milliseconds = Int64(now.timeIntervalSince1970 * 1000)
        let key = keys.statistics(minute: milliseconds / 60_000)
        var commands: [[String]] = delta.fields.filter { $0.value != 0 }.map {
            ["HINCRBY", key, $0.name, String($0.value)]
        }
        if !commands.isEmpty { commands.append(["EXPIRE", key, String(Self.retention)]) }
        let waitedKey = keys.waited(minute: milliseconds / 60_000)
        let waits = JobLane.allCases.filter { longestWait[$0] > 0 }
        // GT: a score only grows, so the minute keeps the longest wait any worker saw.
        for lane in waits { commands.append(["ZADD", waitedKey, "GT", String(longestWait[lane]), lane.rawValue]) }
        if !waits.isEmpty { commands.append(["EXPIRE", waitedKey, String(Self.retention)]) }
        commands.append(["ZADD", keys.workers, String(milliseconds), worker])
        commands.append(["ZREMRANGEBYSCORE", keys.workers, "-inf", String(milliseconds - 3_600_000)])
        let replies = try redis.pipelineWhereReachable(commands)
        // The counters' own node decides: a minute added twice would count twice, so unavailable means none of it.
        let counters = delta.fields.contains { $0.value != 0 } ? replies.prefix(1) : []
        if counters.contains(where: { $0 == nil }) { return .unavailable }
        for case .error(let message)? in replies { return .refused(message) }
        return .answered(())
    }

    /// Notes that `pools` sent now; what no worker reported within the last `SharedStatistics.sendingRetention` goes.
    public func recordSending(_ pools: Set<SendingPool>) throws -> StoreAnswer<Void> {
        try recordSending(pools, now: Date())
    }

    public func recordSending(_ pools: Set<SendingPool>, now: Date) throws(RedisError) -> StoreAnswer<Void> {
        let milliseconds = Int64(now.timeIntervalSince1970 * 1000)
        var add = ["ZADD", keys.sending]
        for pool in pools { add += [String(milliseconds), pool.environment.rawValue + " " + pool.credential] }
        let replies = try redis.pipelineWhereReachable([
            add, ["ZREMRANGEBYSCORE", keys.sending, "-inf", String(milliseconds - Int64(Self.sendingRetention * 1000))]
        ])
        if replies.contains(where: { $0 == nil }) { return .unavailable }
        for case .error(let message)? in replies { return .refused(message) }
        return .answered(())
    }

    /// The pools any worker reported sending with in the last `seconds`.
    public func sentRecently(within seconds: Double) throws -> StoreAnswer<[SendingPool]> {
        try sentRecently(within: seconds, now: Date())
    }

    public func sentRecently(within seconds: Double, now: Date) throws(RedisError) -> StoreAnswer<[SendingPool]> {
        let since = Int64((now.timeIntervalSince1970 - seconds) * 1000)
        guard let reply = try redis.commandWhereReachable(["ZRANGEBYSCORE", keys.sending, String(since), "+inf"]) else {
            return .unavailable
        }
        if case .error(let message) = reply { return .refused(message) }
        return .answered(
            reply.elements.compactMap { member in
                guard let text = member.text, let space = text.firstIndex(of: " "),
                    let environment = APNsEnvironment(rawValue: String(text[..<space]))
                else { return nil }
                return SendingPool(credential: String(text[text.index(after: space)...]), environment: environment)
            })
    }

    /// How long a pool that sent stays in `apns:sending` (seconds).
    static let sendingRetention: Double = 3600

    /// The counters of the last `minutes` minutes (the current one included), summed; per lane the longest wait
    /// (ms) a worker reported in them, if any; and the workers that reported within `aliveWithin` seconds.
    public func read(minutes: Int, aliveWithin: Double = 30, now: Date = Date()) throws(RedisError)
        -> (totals: [String: Int], perMinute: [Int64: [String: Int]], longestWait: [JobLane: Int], workers: [String])
    {
        let milliseconds = Int64(now.timeIntervalSince1970 * 1000)
        let current = milliseconds / 60_000
        let minuteNumbers = (0..<Int64(max(1, minutes))).map { current - $0 }
        var commands = minuteNumbers.map { ["HGETALL", keys.statistics(minute: $0)] }
        commands += minuteNumbers.map { ["ZRANGE", keys.waited(minute: $0), "0", "-1", "WITHSCORES"] }
        commands.append(["ZRANGEBYSCORE", keys.workers, String(milliseconds - Int64(aliveWithin * 1000)), "+inf"])
        let replies = try redis.pipeline(commands)
        var longestWait: [JobLane: Int] = [:]
        for reply in replies[minuteNumbers.count..<(2 * minuteNumbers.count)] {
            if case .error(let message) = reply { throw RedisError(kind: .server, "reading statistics: \(message)") }
            let items = reply.elements
            var index = 0
            while index + 1 < items.count {
                if let lane = JobLane(rawValue: items[index].text ?? ""), let wait = Double(items[index + 1].text ?? "")
                {
                    longestWait[lane] = max(longestWait[lane] ?? 0, Int(wait))
                }
                index += 2
            }
        }
        var totals: [String: Int] = [:]
        var perMinute: [Int64: [String: Int]] = [:]
        for (minute, reply) in zip(minuteNumbers, replies.prefix(minuteNumbers.count)) {
            if case .error(let message) = reply { throw RedisError(kind: .server, "reading statistics: \(message)") }
            let items = reply.elements
            var index = 0
            while index + 1 < items.count {
                let name = items[index].text ?? ""
                let count = Int(items[index + 1].text ?? "") ?? 0
                totals[name, default: 0] += count
                perMinute[minute, default: [:]][name, default: 0] += count
                index += 2
            }
        }
        return (totals, perMinute, longestWait, replies.last?.elements.compactMap(\.text) ?? [])
    }
}
