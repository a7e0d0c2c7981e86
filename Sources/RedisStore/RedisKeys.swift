import Redis
import Telemetry

/// Every Redis key the fleet uses, built here and nowhere else (the schema is in README.md).
///
/// On a single node (and behind Sentinel) a user's keys are `apns:tokens:<user>`, `apns:registered:<user>` and
/// `apns:devices:<user>`. In a Redis Cluster the user goes in braces, `apns:tokens:{<user>}`, so that all of one
/// user's keys hash to one slot (a script may touch them together); inside the braces `%`, `{` and `}` are written
/// `%25`, `%7B` and `%7D`, so that a brace in a user id never makes a different hash tag. Keys of one job or one
/// message carry no tag and spread over the cluster; the rate limit's slots and the guard's window each share one tag
/// (`apns:{rate}:...`, `apns:{guard}:...`), because one script call reads and writes neighbouring ones together.
public struct RedisKeys: Sendable, Equatable {
    public let isCluster: Bool

    public static let node = RedisKeys(cluster: false)
    public static let cluster = RedisKeys(cluster: true)

    public init(cluster: Bool) { isCluster = cluster }

    /// How a user appears in its keys.
    public func user(_ user: String) -> String {
        guard isCluster else { return user }
        guard user.utf8.contains(where: { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "{") || $0 == UInt8(ascii: "}") })
        else { return "{" + user + "}" }
        var escaped = ""
        escaped.reserveCapacity(user.utf8.count + 8)
        for character in user.unicodeScalars {
            switch character {
            case "%": escaped += "%25"
            case "{": escaped += "%7B"
            case "}": escaped += "%7D"
            default: escaped.unicodeScalars.append(character)
            }
        }
        return "{" + escaped + "}"
    }

    /// Hash: field = hex device token, value = what it serves (`TokenScope`). The worker reads only this.
    public func tokens(_ user: String) -> String { Self.tokensPrefix + self.user(user) }
    /// Hash: field = token, value = when the app last registered it (ms since epoch).
    public func registered(_ user: String) -> String { Self.registeredPrefix + self.user(user) }
    /// Hash: field = token, value = the device's metadata as JSON.
    public func devices(_ user: String) -> String { "apns:devices:" + self.user(user) }
    /// String: the user a token belongs to now.
    public func owner(_ token: String) -> String { "apns:owner:" + token }

    static let tokensPrefix = "apns:tokens:"
    static let registeredPrefix = "apns:registered:"
    /// SCAN's patterns for every user's `tokens` and `registered` keys.
    var tokensPattern: String { Self.tokensPrefix + (isCluster ? "{*}" : "*") }
    var registeredPattern: String { Self.registeredPrefix + (isCluster ? "{*}" : "*") }

    /// The user a `tokens` or `registered` key belongs to; nil for a key not written by these rules.
    func user(fromTokensKey key: String) -> String? { user(fromKey: key, prefix: Self.tokensPrefix) }
    func user(fromRegisteredKey key: String) -> String? { user(fromKey: key, prefix: Self.registeredPrefix) }

    private func user(fromKey key: String, prefix: String) -> String? {
        guard key.hasPrefix(prefix) else { return nil }
        let written = key.dropFirst(prefix.count)
        guard isCluster else { return String(written) }
        guard written.hasPrefix("{"), written.hasSuffix("}"), written.count >= 3 else { return nil }
        return PercentEncoding.decode(written.dropFirst().dropLast())
    }

    /// Set: per job, the tokens already answered (the idempotency record).
    public func job(_ id: String) -> String { "apns:job:" + id + ":done" }
    /// Counter: deliveries of a message the broker does not count.
    public func deliveries(_ key: String) -> String { "apns:deliveries:" + key }
    /// Set while a worker runs a suspect job alone.
    public func alone(_ key: String) -> String { "apns:alone:" + key }
    /// Counter: deliveries given back by orderly stops.
    public func givenBack(_ key: String) -> String { "apns:givenback:" + key }
    /// Set: the jobs settled in one ten-second span.
    public func settled(inSpan span: Int) -> String { "apns:settled:\(span)" }

    /// The rate limit's slots are `<prefix>:<unix second>.<tenth>`.
    public var ratePrefix: String { isCluster ? "apns:{rate}" : "apns:rate" }
    /// The guard's buckets are `<prefix>:<unix second>`.
    public var guardPrefix: String { isCluster ? "apns:{guard}" : "apns:guard" }

    /// The rate limit's slot at a time and the one before it: `<prefix>:<second>.<tenth>`.
    static func rateSlots(prefix: String, second: Int, micros: Int) -> (current: String, previous: String) {
        let tenth = micros / 100_000
        return ("\(prefix):\(second).\(tenth)", tenth == 0 ? "\(prefix):\(second - 1).9" : "\(prefix):\(second).\(tenth - 1)")
    }

    /// The guard's buckets of the `seconds` seconds ending at `second`, the newest first: `<prefix>:<second>`.
    static func guardBuckets(prefix: String, endingAt second: Int, seconds: Int) -> [String] {
        (0..<seconds).map { "\(prefix):\(second - $0)" }
    }

    /// Sorted set: workers and when they last reported.
    public var workers: String { "apns:workers" }
    /// Hash: the fleet's counters of one minute.
    public func statistics(minute: Int64) -> String { "apns:stats:\(minute)" }
    /// Sorted set: the longest waits per lane in one minute.
    public func waited(minute: Int64) -> String { "apns:stats:\(minute):waited" }
}

/// The clock of the node that holds a key's slot (`TIME`, through a script on that key, so that a cluster answers
/// from that node): what the rate limit and the guard's window key their slots by, as every worker asks the same node.
enum RedisClock {
    static let script = "return redis.call('TIME')"

    /// Seconds and microseconds; nil when the node answered something else.
    static func now(_ redis: any RedisClient, at key: String) throws(RedisError) -> (second: Int, micros: Int)? {
        let reply = try redis.command(["EVAL", script, "1", key])
        let parts = reply.elements.compactMap(\.integer)
        guard parts.count == 2 else { return nil }
        return (Int(parts[0]), Int(parts[1]))
    }
}
