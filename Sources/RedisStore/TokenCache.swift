import APNs
import Redis
import Telemetry
import WorkerPipeline

/// The Redis token cache (the schema is part of the contract in README.md):
/// - `apns:tokens:<user>`: hash, field = hex device token, value = what it serves (`TokenScope`): production |
///   sandbox (the default app's device token) | `<environment>:<topic>`. The worker reads only this.
/// - `apns:registered:<user>`: hash, field = token, value = when the app last registered it (ms since epoch).
/// - `apns:devices:<user>`: hash, field = token, value = the device's metadata as JSON (from registration events).
/// - `apns:owner:<token>`: string, the user a token currently belongs to, so a device that changes accounts stops
///   receiving the previous account's notifications.
public struct TokenCache: TokenStore {
    public static func key(forUser user: String) -> String { "apns:tokens:" + user }
    public static func registeredKey(forUser user: String) -> String { "apns:registered:" + user }
    public static func devicesKey(forUser user: String) -> String { "apns:devices:" + user }
    public static func ownerKey(forToken token: String) -> String { "apns:owner:" + token }
    static let registeredPrefix = "apns:registered:"

    /// Forgets one token of one user everywhere. Lua, shared by the scripts below; KEYS are never built here
    /// except from the fixed prefixes above.
    private static let forgetFunction = """
        local function forget(user, token)
          redis.call('HDEL', 'apns:tokens:' .. user, token)
          redis.call('HDEL', 'apns:registered:' .. user, token)
          redis.call('HDEL', 'apns:devices:' .. user, token)
          if redis.call('GET', 'apns:owner:' .. token) == user then redis.call('DEL', 'apns:owner:' .. token) end
        end

        """

    /// Atomic, so a registration landing between the check and the delete cannot be lost. Every spelling of the
    /// token in the user's entry goes (other systems may have written one in upper case): each is judged as one.
    /// ARGV: user ("" for a token sent directly: its owner, if known), token, died-at ms (-1: unconditionally), then
    /// the cache values the entry must hold to be removed (none: any).
    static let removeUnlessRegisteredAfter = forgetFunction + """
        local user = ARGV[1]
        local wanted = string.lower(ARGV[2])
        if user == '' then user = redis.call('GET', 'apns:owner:' .. ARGV[2]) or redis.call('GET', 'apns:owner:' .. wanted) end
        if not user then return 0 end
        local died = tonumber(ARGV[3])
        local function removeOne(token)
          local registered = tonumber(redis.call('HGET', 'apns:registered:' .. user, token) or '0') or 0
          if died >= 0 and registered > died then return 0 end
          local value = redis.call('HGET', 'apns:tokens:' .. user, token)
          if not value then forget(user, token) return 0 end
          if #ARGV > 3 then
            local serves = false
            for index = 4, #ARGV do if ARGV[index] == value then serves = true end end
            if not serves then return 0 end
          end
          forget(user, token)
          return 1
        end
        local spellings = {}
        for _, field in ipairs(redis.call('HKEYS', 'apns:tokens:' .. user)) do
          if string.lower(field) == wanted then table.insert(spellings, field) end
        end
        if #spellings == 0 then spellings = {ARGV[2]} end
        local removed = 0
        for _, token in ipairs(spellings) do removed = removed + removeOne(token) end
        if removed > 0 then return 1 end
        return 0
        """

    /// A registration: newer than what is known, it (re)writes the token under its user and moves it away from
    /// a previous owner; older (events can arrive out of order), it changes nothing. Returns 1 if applied.
    /// ARGV: user, token, cache value (`TokenScope`), registered-at ms, device JSON or "".
    static let register = forgetFunction + """
        local user, token, at = ARGV[1], ARGV[2], tonumber(ARGV[4])
        local owner = redis.call('GET', 'apns:owner:' .. token) or user
        local known = tonumber(redis.call('HGET', 'apns:registered:' .. owner, token) or '0') or 0
        if known > at then return 0 end
        if owner ~= user then forget(owner, token) end
        redis.call('HSET', 'apns:tokens:' .. user, token, ARGV[3])
        redis.call('HSET', 'apns:registered:' .. user, token, ARGV[4])
        if ARGV[5] ~= '' then redis.call('HSET', 'apns:devices:' .. user, token, ARGV[5]) end
        redis.call('SET', 'apns:owner:' .. token, user)
        return 1
        """

    /// Removes every token of one user last registered before a cutoff. ARGV: user, cutoff ms.
    /// Tokens with no registration time are kept: their age is unknown.
    static let sweepUser = forgetFunction + """
        local user, cutoff = ARGV[1], tonumber(ARGV[2])
        local entries = redis.call('HGETALL', 'apns:registered:' .. user)
        local removed = 0
        for index = 1, #entries, 2 do
          if (tonumber(entries[index + 1]) or 0) < cutoff then
            forget(user, entries[index])
            removed = removed + 1
          end
        end
        return removed
        """

    private let redis: RedisConnection
    private let logger: Logger

    public init(redis: RedisConnection, logger: Logger) {
        self.redis = redis
        self.logger = logger
    }

    /// Takes tokens out of the cache in one round trip, each only if what is known of it still says so (see
    /// `TokenRemoval`). Returns what each removal did; only a lost connection throws.
    @discardableResult
    public func remove(_ removals: [TokenRemoval]) throws(RedisError) -> [CacheChange] {
        guard !removals.isEmpty else { return [] }
        let replies = try redis.pipeline(removals.map { removal in
            ["EVAL", Self.removeUnlessRegisteredAfter, "0", removal.user, removal.token,
             String(removal.unlessRegisteredAfter ?? -1)] + (removal.onlyIfValueIn ?? [])
        })
        return replies.map { reply in
            if case .error(let message) = reply { return .failed(message) }
            return reply.integer == 1 ? .applied : .unchanged
        }
    }

    /// Every user's tokens with what each serves, in one pipelined round trip. Entries that are not a hex token
    /// with a readable value (`TokenScope`) are skipped and logged (the cache is fed by other systems); so is a user
    /// whose key Redis cannot read as a hash. Only a lost connection throws.
    public func resolve(_ users: [String]) throws(RedisError) -> ResolvedUsers {
        let unique = Array(Set(users))
        guard !unique.isEmpty else { return ResolvedUsers(tokens: [:], unreadable: [:]) }
        let replies = try redis.pipeline(unique.map { ["HGETALL", Self.key(forUser: $0)] })
        var result: [String: [CachedToken]] = [:]
        var unreadable: [String: String] = [:]
        for (user, reply) in zip(unique, replies) {
            if case .error(let message) = reply {
                logger.warning("skipping a user whose token cache entry cannot be read",
                               ["redis.key": Self.key(forUser: user), "redis.error": message])
                unreadable[user] = message
                continue
            }
            let fields = reply.elements
            var tokens: [CachedToken] = []
            tokens.reserveCapacity(fields.count / 2)
            var index = 0
            while index + 1 < fields.count {
                let token = fields[index].text ?? ""
                let value = fields[index + 1].text ?? ""
                index += 2
                guard (try? APNsNotification.validateDeviceToken(token)) != nil,
                      let scope = TokenScope(cacheValue: value) else {
                    logger.warning("skipping a bad token cache entry", ["redis.key": Self.key(forUser: user),
                                                                        "apns.token": Redact.token(token),
                                                                        "redis.value": String(value.prefix(40))])
                    continue
                }
                tokens.append(CachedToken(token: token, scope: scope))
            }
            result[user] = tokens
        }
        return ResolvedUsers(tokens: result, unreadable: unreadable)
    }

    /// Applies registrations in one round trip; returns, per registration, whether it changed the cache (`.unchanged`
    /// for one older than what is known, `.failed` where Redis refused its keys). Only a lost connection throws.
    @discardableResult
    public func register(_ registrations: [TokenRegistration]) throws(RedisError) -> [CacheChange] {
        guard !registrations.isEmpty else { return [] }
        let replies = try redis.pipeline(registrations.map { registration in
            ["EVAL", Self.register, "0", registration.user, registration.token, registration.scope.cacheValue,
             String(registration.registeredAt), registration.deviceJSON ?? ""]
        })
        return replies.map { reply in
            if case .error(let message) = reply { return .failed(message) }
            return reply.integer == 1 ? .applied : .unchanged
        }
    }

    /// One user's tokens with what is known of them, sorted by token.
    public func entries(forUser user: String) throws(RedisError) -> [TokenEntry] {
        let replies = try redis.pipeline([["HGETALL", Self.key(forUser: user)],
                                          ["HGETALL", Self.registeredKey(forUser: user)],
                                          ["HGETALL", Self.devicesKey(forUser: user)]])
        func fields(_ reply: RedisReply) throws(RedisError) -> [String: String] {
            if case .error(let message) = reply { throw RedisError(kind: .server, "reading \(user)'s tokens: \(message)") }
            var result: [String: String] = [:]
            let items = reply.elements
            var index = 0
            while index + 1 < items.count {
                result[items[index].text ?? ""] = items[index + 1].text ?? ""
                index += 2
            }
            return result
        }
        let values = try fields(replies[0])
        let registered = try fields(replies[1])
        let devices = try fields(replies[2])
        return values.keys.sorted().map { token in
            TokenEntry(token: token, value: values[token] ?? "",
                       registeredAt: registered[token].flatMap { Int64($0) }, deviceJSON: devices[token])
        }
    }

    /// Removes tokens last registered before `cutoff` (ms since epoch) from every user, a page of users at a time
    /// (SCAN, so Redis is never blocked for long). Returns how many tokens went.
    public func sweep(registeredBefore cutoff: Int64) throws(RedisError) -> Int {
        var cursor = "0"
        var removed = 0
        repeat {
            let page = try redis.command(["SCAN", cursor, "MATCH", Self.registeredPrefix + "*", "COUNT", "500"])
            if case .error(let message) = page { throw RedisError(kind: .server, "SCAN: \(message)") }
            let parts = page.elements
            guard parts.count == 2 else { throw RedisError(kind: .server, "SCAN: unexpected reply") }
            cursor = parts[0].text ?? "0"
            let users = parts[1].elements.compactMap { $0.text.map { String($0.dropFirst(Self.registeredPrefix.count)) } }
            guard !users.isEmpty else { continue }
            let replies = try redis.pipeline(users.map { ["EVAL", Self.sweepUser, "0", $0, String(cutoff)] })
            for (user, reply) in zip(users, replies) {
                if case .error(let message) = reply {
                    // One user's keys of the wrong type (written by another system) cost that user's sweep only.
                    logger.warning("inactivity sweep skipped a user whose keys cannot be read",
                                   ["redis.key": Self.registeredKey(forUser: user), "redis.error": message])
                    continue
                }
                removed += Int(reply.integer ?? 0)
            }
        } while cursor != "0"
        return removed
    }
}

/// What `tokens list` shows for one token.
public struct TokenEntry: Sendable, Equatable {
    public var token: String
    /// As stored: a `TokenScope` value, or whatever another system wrote.
    public var value: String
    public var registeredAt: Int64?
    public var deviceJSON: String?

    /// What the stored value says, if it is readable.
    public var scope: TokenScope? { TokenScope(cacheValue: value) }
}
