import AMQP
import APNsModel
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// The Redis token cache against a real Redis.
@Suite struct TokenCacheTests {
    /// A connection to the test Redis and a cache on it.
    static func connect() throws -> (RedisConnection, TokenCache) {
        let redis = try RedisConnection(url: TestServices.redisURL())
        return (redis, TokenCache(redis: redis, logger: .init(label: "cache", level: .critical)))
    }

    @Test func resolvesUsersInOneRoundTripAndSkipsBadEntries() throws {
        let (redis, cache) = try Self.connect()
        let dana = TestServices.unique("dana")
        let eve = TestServices.unique("eve")
        let good = String(repeating: "0d", count: 32)
        let voip = String(repeating: "0e", count: 32)
        let wrongType = TestServices.unique("flo")
        _ = try redis.pipeline([
            [
                "HSET", RedisKeys.node.tokens(dana), good, "sandbox", "not-hex", "production", "aa", "staging",
                voip, "production:com.example.app.voip", "0f0f", "production:", "0a0a", "test:com.example.app"
            ],
            ["SET", RedisKeys.node.tokens(wrongType), "hello"]
        ])
        let all = try cache.resolve([dana, eve, dana, wrongType])
        #expect(all.unreadable.keys.sorted() == [wrongType], "a key of the wrong type skips that user only")
        #expect(all.unreadable[wrongType]?.contains("WRONGTYPE") == true)
        #expect(all.tokens[wrongType] == nil, "an entry that could not be read has no tokens, not an empty list")
        let resolved = all.tokens
        #expect(Set(resolved[dana]?.map(\.token) ?? []) == [good, voip], "unreadable values are skipped")
        #expect(resolved[dana]?.first { $0.token == good }?.scope == TokenScope(environment: .sandbox))
        #expect(
            resolved[dana]?.first { $0.token == voip }?.scope
                == TokenScope(environment: .production, topic: "com.example.app.voip"))
        #expect(resolved[eve] == [])
    }

    /// A token another system wrote in upper case comes out lower-case, as the project keeps tokens: a device is one
    /// target however its entry spells it.
    @Test func aTokenWrittenInUpperCaseResolvesLowerCase() throws {
        let (redis, cache) = try Self.connect()
        let user = TestServices.unique("gus")
        let lower = String(repeating: "0b1c", count: 16)
        let mixed = String(repeating: "a9", count: 32)
        _ = try redis.pipeline([
            ["HSET", RedisKeys.node.tokens(user), lower.uppercased(), "production", mixed, "sandbox"]
        ])
        let tokens = try #require(try cache.resolve([user]).tokens[user])
        #expect(Set(tokens.map(\.token)) == [lower, mixed])
        #expect(tokens.first { $0.token == lower }?.scope == TokenScope(environment: .production))
    }

    /// A Live Activity's update tokens keep the rules of a user's: registrations apply in the order of their
    /// timestamps whatever order they arrive in (an older one changes nothing), and an unregistration removes the
    /// token from its activity unless it was registered again after it.
    @Test func activityTokensFollowTheirRegistrationsOrder() throws {
        let (redis, cache) = try Self.connect()
        let user = TestServices.unique("ivy")
        let activity = TestServices.unique("match")
        let token = String(repeating: "a7", count: 32)
        let topic = "com.example.app.push-type.liveactivity"
        func register(_ environment: APNsEnvironment, at time: Int64) throws -> CacheChange {
            try #require(
                try cache.register([
                    TokenRegistration(
                        user: user, token: token,
                        scope: TokenScope(environment: environment, topic: topic),
                        registeredAt: time, activity: activity)
                ]).first)
        }
        func scopes() throws -> [TokenScope] {
            try cache.resolveActivities([activity]).tokens[activity]?.map(\.scope) ?? []
        }
        #expect(try register(.sandbox, at: 2_000) == .applied)
        #expect(try register(.production, at: 1_000) == .unchanged, "an older registration arriving late")
        #expect(try scopes() == [TokenScope(environment: .sandbox, topic: topic)], "the newer registration stands")
        #expect(
            try redis.command(["TTL", RedisKeys.node.activityRegistered(activity)]).integer ?? -1 > 0,
            "the registration times leave with the activity")
        _ = try redis.command(["EXPIRE", RedisKeys.node.activity(activity), "100"])
        #expect(try register(.production, at: 1_500) == .unchanged)
        #expect(
            try redis.command(["TTL", RedisKeys.node.activity(activity)]).integer ?? 0 <= 100,
            "a stale registration gives the activity no more time")
        let logout = { (at: Int64) in
            TokenRemoval(user: user, token: token, unlessRegisteredAfter: at, activity: activity)
        }
        #expect(try cache.remove([logout(1_500)]) == [.unchanged], "an unregistration older than the registration")
        #expect(try scopes().count == 1)
        #expect(try cache.remove([logout(3_000)]) == [.applied])
        #expect(try scopes().isEmpty, "unregistered")
        #expect(try cache.entries(forUser: user).isEmpty, "an update token never was the user's")
    }

    /// A removal about one topic and environment leaves a token registered for another alone: an answer about a
    /// VoIP push never removes the user's device token, a production answer never removes a sandbox token.
    @Test func aRemovalForOneTopicKeepsTokensOfAnotherKind() throws {
        let (redis, cache) = try Self.connect()
        let user = TestServices.unique("gus")
        let device = String(repeating: "61", count: 32)
        let voip = String(repeating: "62", count: 32)
        let sandbox = String(repeating: "63", count: 32)
        try cache.register([
            TokenRegistration(user: user, token: device, scope: TokenScope(environment: .production), registeredAt: 1),
            TokenRegistration(
                user: user, token: voip, scope: TokenScope(environment: .production, topic: "com.example.app.voip"),
                registeredAt: 1),
            TokenRegistration(user: user, token: sandbox, scope: TokenScope(environment: .sandbox), registeredAt: 1)
        ])
        let voipTopic = TopicMatcher(topic: "com.example.app.voip", defaultTopic: "com.example.app")
        let alertTopic = TopicMatcher(topic: "com.example.app", defaultTopic: "com.example.app")
        let removed = try cache.remove([
            TokenRemoval(user: user, token: device, onlyIfValueIn: voipTopic.cacheValues(in: .production)),
            TokenRemoval(user: user, token: sandbox, onlyIfValueIn: alertTopic.cacheValues(in: .production)),
            TokenRemoval(user: user, token: voip, onlyIfValueIn: alertTopic.cacheValues(in: .production))
        ])
        #expect(removed == [.unchanged, .unchanged, .unchanged])
        #expect(Set(try cache.entries(forUser: user).map(\.token)) == [device, voip, sandbox])
        #expect(try redis.command(["GET", RedisKeys.node.owner(voip)]).text == user, "nothing else forgotten")

        let matching = try cache.remove([
            TokenRemoval(user: user, token: voip, onlyIfValueIn: voipTopic.cacheValues(in: .production)),
            TokenRemoval(user: user, token: sandbox, onlyIfValueIn: alertTopic.cacheValues(in: .sandbox))
        ])
        #expect(matching == [.applied, .applied])
        #expect(try cache.entries(forUser: user).map(\.token) == [device])
    }

    /// The inactivity sweep handles tokens of every kind alike, and keeps a token whose registration time is not in
    /// milliseconds (seconds, a negative number, text another system wrote): its age is unknown.
    @Test func theSweepRemovesOldTokensOfEveryKind() throws {
        // A database of its own: the sweep covers every user in it.
        let redis = try RedisConnection(url: TestServices.redisURL().withDatabase(12))
        let cache = TokenCache(redis: redis, logger: .init(label: "cache", level: .critical))
        let user = TestServices.unique("hal")
        let oldVoip = String(repeating: "71", count: 32)
        let freshActivity = String(repeating: "72", count: 32)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let cutoff = now - 30 * 86_400_000
        try cache.register([
            TokenRegistration(
                user: user, token: oldVoip, scope: TokenScope(environment: .production, topic: "com.example.app.voip"),
                registeredAt: cutoff - 86_400_000),
            TokenRegistration(
                user: user, token: freshActivity,
                scope: TokenScope(environment: .sandbox, topic: "com.example.app.push-type.liveactivity"),
                registeredAt: now)
        ])
        // A registration time another system wrote in its own format: its age is unknown, so the token stays.
        let otherFormat = String(repeating: "73", count: 32)
        try cache.register([
            TokenRegistration(
                user: user, token: otherFormat, scope: TokenScope(environment: .production), registeredAt: 1)
        ])
        _ = try redis.command(["HSET", RedisKeys.node.registered(user), otherFormat, "2025-12-01T10:00:00Z"])
        let (inSeconds, negative) = (String(repeating: "74", count: 32), String(repeating: "75", count: 32))
        for (token, time) in [(inSeconds, now / 1000), (negative, -1)] {
            _ = try redis.pipeline([
                ["HSET", RedisKeys.node.tokens(user), token, "production"],
                ["HSET", RedisKeys.node.registered(user), token, String(time)]
            ])
        }
        #expect(try cache.sweep(registeredBefore: cutoff) >= 1)
        let entries = try cache.entries(forUser: user)
        #expect(Set(entries.map(\.token)) == [freshActivity, otherFormat, inSeconds, negative])
        #expect(entries.first { $0.token == freshActivity }?.value == "sandbox:com.example.app.push-type.liveactivity")
    }

    @Test func deadTokensLeaveUnlessRegisteredAgainAfterTheyDied() throws {
        let (redis, cache) = try Self.connect()
        let user = TestServices.unique("frank")
        let stale = String(repeating: "51", count: 32)
        let reRegistered = String(repeating: "52", count: 32)
        let badToken = String(repeating: "53", count: 32)
        _ = try redis.pipeline([
            [
                "HSET", RedisKeys.node.tokens(user), stale, "production", reRegistered, "production", badToken,
                "production"
            ],
            ["HSET", RedisKeys.node.registered(user), stale, "1000", reRegistered, "5000", badToken, "9000"]
        ])
        let removed = try cache.remove([
            TokenRemoval(user: user, token: stale, unlessRegisteredAfter: 2000),
            TokenRemoval(user: user, token: reRegistered, unlessRegisteredAfter: 2000),
            TokenRemoval(user: user, token: badToken)
        ])
        #expect(removed == [.applied, .unchanged, .applied])
        let remaining = try redis.command(["HKEYS", RedisKeys.node.tokens(user)]).elements.compactMap(\.text)
        #expect(remaining == [reRegistered], "the token the app registered after APNs's 410 stays")
        #expect(try redis.command(["HEXISTS", RedisKeys.node.registered(user), stale]).integer == 0)
    }

    /// Events arrive out of order: a registration older than the logout, or than the 410, that took the token out
    /// brings nothing back (the removal is remembered a week), while a newer one registers it again.
    @Test func aLateRegistrationOlderThanItsRemovalBringsNothingBack() throws {
        let (redis, cache) = try Self.connect()
        let user = TestServices.unique("late")
        let (loggedOut, died) = (String(repeating: "54", count: 32), String(repeating: "55", count: 32))
        let scope = TokenScope(environment: .production)
        let t0: Int64 = 1_796_000_000_000
        func register(_ token: String, at time: Int64) throws -> [CacheChange] {
            try cache.register([TokenRegistration(user: user, token: token, scope: scope, registeredAt: time)])
        }
        _ = try register(loggedOut, at: t0)
        _ = try register(died, at: t0)
        let removed = try cache.remove([
            TokenRemoval(user: user, token: loggedOut, unlessRegisteredAfter: t0 + 1000),
            TokenRemoval(user: user, token: died, unlessRegisteredAfter: t0 + 2000)
        ])
        #expect(removed == [.applied, .applied])
        #expect(try register(loggedOut, at: t0 + 500) == [.unchanged], "older than the logout")
        #expect(try register(died, at: t0 + 1500) == [.unchanged], "older than the 410")
        #expect(try cache.entries(forUser: user).isEmpty)
        let lifetime = try redis.command(["TTL", RedisKeys.node.unregistered(user)]).integer ?? 0
        #expect(lifetime > 6 * 86_400, "remembered a week: \(lifetime) s")
        #expect(try register(loggedOut, at: t0 + 1001) == [.applied], "newer than the logout")
        #expect(try cache.entries(forUser: user).map(\.token) == [loggedOut])
        // A logout that comes before the registration it follows: the registration, older, arrives after it.
        let early = String(repeating: "56", count: 32)
        #expect(
            try cache.remove([TokenRemoval(user: user, token: early, unlessRegisteredAfter: t0 + 3000)]) == [
                .unchanged
            ],
            "nothing there to remove yet")
        #expect(try register(early, at: t0 + 2500) == [.unchanged])
        #expect(try cache.entries(forUser: user).map(\.token) == [loggedOut])
    }

    /// Another system wrote a device's token in upper case, with its owner key: the device registered by another
    /// account (in lower case, as every program writes it) leaves the first, whatever the spelling.
    @Test func aDeviceMovesAccountsFromAnUpperCaseEntry() throws {
        let (redis, cache) = try Self.connect()
        let (old, new) = (TestServices.unique("old"), TestServices.unique("new"))
        let token = String(repeating: "be", count: 32)
        _ = try redis.pipeline([
            ["HSET", RedisKeys.node.tokens(old), token.uppercased(), "production"],
            ["HSET", RedisKeys.node.registered(old), token.uppercased(), "1796000000000"],
            ["SET", RedisKeys.node.owner(token.uppercased()), old]
        ])
        let changes = try cache.register([
            TokenRegistration(
                user: new, token: token, scope: TokenScope(environment: .production), registeredAt: 1_796_000_001_000)
        ])
        #expect(changes == [.applied])
        #expect(try cache.entries(forUser: old).isEmpty, "the previous account lost the device")
        #expect(try cache.entries(forUser: new).map(\.token) == [token])
        #expect(try redis.command(["GET", RedisKeys.node.owner(token)]).text == new)
        #expect(try redis.command(["EXISTS", RedisKeys.node.owner(token.uppercased())]).integer == 0)
    }
}
