import APNs
import Redis
import Telemetry

/// A device token to send to, and whom it belongs to.
public struct DeviceTarget: Sendable, Equatable {
    public var token: String
    public var environment: APNsEnvironment
    /// nil for tokens a job named directly.
    public var user: String?

    public init(token: String, environment: APNsEnvironment, user: String?) {
        self.token = token
        self.environment = environment
        self.user = user
    }
}

/// The Redis token cache: a hash `apns:tokens:<user>`, field = hex device token, value = production | sandbox;
/// beside it a hash `apns:registered:<user>`, field = token, value = when the app last registered it (ms since epoch).
public struct TokenCache {
    public static func key(forUser user: String) -> String { "apns:tokens:" + user }
    public static func registeredKey(forUser user: String) -> String { "apns:registered:" + user }

    /// Atomic, so a registration landing between the check and the delete cannot be lost.
    static let removeUnlessRegisteredAfter = """
        local registered = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') or 0
        local died = tonumber(ARGV[2])
        if died >= 0 and registered > died then return 0 end
        redis.call('HDEL', KEYS[1], ARGV[1])
        redis.call('HDEL', KEYS[2], ARGV[1])
        return 1
        """

    private let redis: RedisConnection
    private let logger: Logger

    public init(redis: RedisConnection, logger: Logger) {
        self.redis = redis
        self.logger = logger
    }

    /// Takes dead tokens out of their users' hashes in one round trip, except those registered again after APNs
    /// learned they died (`diedAt`, ms; nil, as for BadDeviceToken, removes unconditionally).
    /// Returns, per entry, whether it was removed.
    @discardableResult
    public func removeDead(_ entries: [(user: String, token: String, diedAt: Int64?)]) throws(RedisError) -> [Bool] {
        guard !entries.isEmpty else { return [] }
        let replies = try redis.pipeline(entries.map { entry in
            ["EVAL", Self.removeUnlessRegisteredAfter, "2", Self.key(forUser: entry.user),
             Self.registeredKey(forUser: entry.user), entry.token, String(entry.diedAt ?? -1)]
        })
        return try replies.map { reply throws(RedisError) -> Bool in
            if case .error(let message) = reply { throw RedisError(kind: .server, "removing a dead token: \(message)") }
            return reply.integer == 1
        }
    }

    /// Every user's tokens, in one pipelined round trip. Entries that are not a hex token with a known
    /// environment are skipped and logged (the cache is fed by other systems).
    public func resolve(_ users: [String]) throws(RedisError) -> [String: [DeviceTarget]] {
        let unique = Array(Set(users))
        guard !unique.isEmpty else { return [:] }
        let replies = try redis.pipeline(unique.map { ["HGETALL", Self.key(forUser: $0)] })
        var result: [String: [DeviceTarget]] = [:]
        for (user, reply) in zip(unique, replies) {
            if case .error(let message) = reply {
                throw RedisError(kind: .server, "HGETALL \(Self.key(forUser: user)): \(message)")
            }
            let fields = reply.elements
            var targets: [DeviceTarget] = []
            targets.reserveCapacity(fields.count / 2)
            var index = 0
            while index + 1 < fields.count {
                let token = fields[index].text ?? ""
                let environmentText = fields[index + 1].text ?? ""
                index += 2
                guard (try? APNsNotification.validateDeviceToken(token)) != nil,
                      let environment = APNsEnvironment(rawValue: environmentText) else {
                    logger.warning("skipping a bad token cache entry", ["redis.key": Self.key(forUser: user),
                                                                        "apns.token": Redact.token(token),
                                                                        "redis.value": String(environmentText.prefix(20))])
                    continue
                }
                targets.append(DeviceTarget(token: token, environment: environment, user: user))
            }
            result[user] = targets
        }
        return result
    }
}
