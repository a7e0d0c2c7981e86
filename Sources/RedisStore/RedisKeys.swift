import Redis
import ServiceURLs
import Telemetry

/// Every Redis key the fleet uses, built here and nowhere else (the schema is in docs/contract.md).
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
        return "{" + PercentEncoding.encode(user, reserving: [UInt8(ascii: "{"), UInt8(ascii: "}")]) + "}"
    }

    /// Hash: field = hex device token, value = what it serves (`TokenScope`). The worker reads only this.
    public func tokens(_ user: String) -> String { Self.tokensPrefix + self.user(user) }
    /// Hash: field = token, value = when the app last registered it (ms since epoch).
    public func registered(_ user: String) -> String { Self.registeredPrefix + self.user(user) }
    /// Hash: field = token, value = the device's metadata as JSON.
    public func devices(_ user: String) -> String { "apns:devices:" + self.user(user) }
    /// Hash: field = token, value = when a logout or a 410 took it out of the user's keys (ms since epoch); kept 7
    /// days after the last.
    public func unregistered(_ user: String) -> String { "apns:unregistered:" + self.user(user) }
    /// Hash: a Live Activity's update tokens, field = token, value = what it serves (`TokenScope`); expires a day
    /// after the last registration (an activity lives at most 12 hours).
    public func activity(_ id: String) -> String { Self.activityPrefix + self.user(id) }
    /// Hash: field = an activity's update token, value = when it was last registered (ms since epoch); lives as long
    /// as the activity's key. In a cluster, in the activity's slot.
    public func activityRegistered(_ id: String) -> String { "apns:activity-registered:" + self.user(id) }
    /// Never written: the third key the token scripts take (a user's devices), in the activity's slot.
    func activityDevices(_ id: String) -> String { "apns:activity-devices:" + self.user(id) }
    /// String: the user's time zone (an IANA name), from registrations that carry one; in the user's slot.
    public func timeZone(_ user: String) -> String { "apns:timezone:" + self.user(user) }
    /// String: the user a token belongs to now.
    public func owner(_ token: String) -> String { "apns:owner:" + token }

    static let tokensPrefix = "apns:tokens:"
    static let activityPrefix = "apns:activity:"
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
    /// Set while a worker runs a redelivered job: found on its next delivery, the worker that ran it died with it.
    public func running(_ key: String) -> String { "apns:running:" + key }
    /// Counter: deliveries given back by orderly stops.
    public func givenBack(_ key: String) -> String { "apns:givenback:" + key }
    /// String: a part of a windowed job that started (`<job id>:<opening>:<users' digest>`), so that a copy of it sends
    /// nothing; kept eight days.
    public func windowPart(_ key: String) -> String { "apns:window-part:" + key }
    /// String: a scheduled job that started at its `send_at` (`<job id>:<send_at>`), so that another delivery of it
    /// (its publisher's copy) sends nothing; kept eight days.
    public func scheduledStart(_ key: String) -> String { "apns:scheduled-start:" + key }
    /// Set: the jobs settled in one ten-second span.
    public func settled(inSpan span: Int) -> String { "apns:settled:\(span)" }

    /// The rate limit's slots are `<prefix>:<unix second>.<tenth>`.
    public var ratePrefix: String { isCluster ? "apns:{rate}" : "apns:rate" }
    /// A rate group's (one credential's `rate_limit`) slots: `apns:rate:<group>:<second>.<tenth>`, the group's name
    /// percent-encoded; in a cluster the group shares one hash tag.
    public func groupRatePrefix(_ group: String) -> String {
        let name = PercentEncoding.encode(group, reserving: Array(":{}/ ".utf8))
        return isCluster ? "apns:{rate:\(name)}" : "apns:rate:\(name)"
    }
    /// The guard's buckets are `<prefix>:<unix second>`.
    public var guardPrefix: String { isCluster ? "apns:{guard}" : "apns:guard" }

    /// The rate limit's slot at a time and the one before it: `<prefix>:<second>.<tenth>`.
    static func rateSlots(prefix: String, second: Int, tenth: Int) -> (current: String, previous: String) {
        return (
            "\(prefix):\(second).\(tenth)",
            tenth == 0 ? "\(prefix):\(second - 1).9" : "\(prefix):\(second).\(tenth - 1)"
        )
    }

    /// The guard's buckets of the `seconds` seconds ending at `second`, the newest first: `<prefix>:<second>`.
    static func guardBuckets(prefix: String, endingAt second: Int, seconds: Int) -> [String] {
        (0..<seconds).map { "\(prefix):\(second - $0)" }
    }

    /// The guard's hour window: `<prefix>:minute:<unix minute>`, the minute of `second` first.
    static func guardMinuteBuckets(prefix: String, endingAt second: Int, minutes: Int) -> [String] {
        let minute = second / 60
        return (0..<minutes).map { "\(prefix):minute:\(minute - $0)" }
    }

    /// String: a job cancelled with `apns-worker jobs cancel`, and why (JSON: `reason`, `at`); kept 7 days.
    public func cancelled(_ jobID: String) -> String { "apns:cancelled:" + jobID }
    /// Sorted set: the cancelled jobs' ids, scored by when they were cancelled (ms), for workers to learn of new
    /// cancellations in one read; kept as long as the cancellations.
    public var cancellations: String { "apns:cancellations" }
    /// Hash: a large job's progress, every worker's counts added (`SharedJobProgress`); kept 24 hours after the last.
    public func progress(_ jobID: String) -> String { "apns:job:" + jobID + ":progress" }
    /// Sorted set: the large jobs running, scored by their progress's last update (ms).
    public var runningJobs: String { "apns:jobs:running" }
    /// Sorted set: jobs waiting for their `send_at`, scored by it (ms).
    public var scheduledJobs: String { "apns:jobs:scheduled" }

    /// Sorted set: the credentials and environments the fleet sent with, and when a worker last reported it.
    public var sending: String { "apns:sending" }
    /// Sorted set: workers and when they last reported.
    public var workers: String { "apns:workers" }
    /// Hash: the fleet's counters of one minute.
    public func statistics(minute: Int64) -> String { "apns:stats:\(minute)" }
    /// Sorted set: the longest waits per lane in one minute.
    public func waited(minute: Int64) -> String { "apns:stats:\(minute):waited" }
}

/// Redis's clock as seen from here: the node's time (of the node that holds the rate limit's or the guard's keys)
/// estimated from the local clock and what the node last said, so that a script can be given the exact keys it will
/// touch (a cluster requires it) in the one round trip the call needs. The script compares them with its own `TIME`
/// and, when they differ (a slot boundary passed on the way, the clocks drifted), answers with its time instead:
/// `learn` it and call again. One owner thread, like the store that holds it.
final class RedisClock {
    /// Seconds since the epoch, locally.
    private let localNow: () -> Double
    /// The node's clock minus the local one, in seconds, as last learned.
    private var offset: Double = 0

    init(localNow: @escaping () -> Double) { self.localNow = localNow }

    /// The node's time now, as best known.
    func estimate() -> (second: Int, micros: Int) {
        let now = localNow() + offset
        let second = now.rounded(.down)
        return (Int(second), min(999_999, Int((now - second) * 1e6)))
    }

    /// What the node said its time was (`TIME`), just now.
    func learn(second: Int64, micros: Int64) {
        offset = Double(second) + Double(micros) / 1e6 - localNow()
    }

    /// Calls allowed before giving up on one reservation or guard update: only a clock that jumps on every call
    /// needs more than two.
    static let attempts = 3
}
