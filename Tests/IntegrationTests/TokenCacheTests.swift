import Foundation
import Redis
import Testing
import WorkerPipeline

/// The Redis token cache against a real Redis.
@Suite struct TokenCacheTests {
    @Test func resolvesUsersInOneRoundTripAndSkipsBadEntries() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let cache = TokenCache(redis: redis, logger: .init(label: "cache", level: .critical))
        let dana = TestServices.unique("dana")
        let eve = TestServices.unique("eve")
        let good = String(repeating: "0d", count: 32)
        _ = try redis.pipeline([
            ["HSET", TokenCache.key(forUser: dana), good, "sandbox", "not-hex", "production", "aa", "staging"],
        ])
        let resolved = try cache.resolve([dana, eve, dana])
        #expect(resolved[dana] == [DeviceTarget(token: good, environment: .sandbox, user: dana)])
        #expect(resolved[eve] == [])
    }

    @Test func deadTokensLeaveUnlessRegisteredAgainAfterTheyDied() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let cache = TokenCache(redis: redis, logger: .init(label: "cache", level: .critical))
        let user = TestServices.unique("frank")
        let stale = String(repeating: "51", count: 32)
        let reRegistered = String(repeating: "52", count: 32)
        let badToken = String(repeating: "53", count: 32)
        _ = try redis.pipeline([
            ["HSET", TokenCache.key(forUser: user), stale, "production", reRegistered, "production", badToken, "production"],
            ["HSET", TokenCache.registeredKey(forUser: user), stale, "1000", reRegistered, "5000", badToken, "9000"],
        ])
        let removed = try cache.removeDead([(user, stale, 2000), (user, reRegistered, 2000), (user, badToken, nil)])
        #expect(removed == [true, false, true])
        let remaining = try redis.command(["HKEYS", TokenCache.key(forUser: user)]).elements.compactMap(\.text)
        #expect(remaining == [reRegistered], "the token the app registered after APNs's 410 stays")
        #expect(try redis.command(["HEXISTS", TokenCache.registeredKey(forUser: user), stale]).integer == 0)
    }
}
