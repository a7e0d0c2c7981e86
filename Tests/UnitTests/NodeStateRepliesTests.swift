import Testing

@testable import Redis

/// Error replies that say the node cannot serve now (not an answer about the keys): read as a lost connection.
@Suite struct NodeStateRepliesTests {
    @Test func repliesOfANodeThatCannotServeNowAreToldFromAnswers() {
        #expect(
            RedisConnection.notServing("READONLY You can't write against a read only replica.") == "is a replica now")
        #expect(RedisConnection.notServing("LOADING Redis is loading the dataset in memory") == "is loading its data")
        #expect(RedisConnection.notServing("MASTERDOWN Link with MASTER is down") == "has lost its master")
        #expect(
            RedisConnection.notServing("CLUSTERDOWN The cluster is down") == "does not serve its cluster's slots now")
        #expect(
            RedisConnection.notServing("WRONGTYPE Operation against a key holding the wrong kind of value") == nil,
            "a key of the wrong type is a data error about that key")
        #expect(RedisConnection.notServing("MOVED 3999 127.0.0.1:6381") == nil, "a redirection is followed")
    }
}
