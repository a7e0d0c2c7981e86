import Testing

@testable import Redis

/// Commands as Redis reads them (RESP 2 arrays of bulk strings), written in one pass.
struct RESPTests {
    @Test func argumentsAreCountedInBytes() {
        let command = RESP.format([["HSET", "apns:tokens:välue", ""]])
        #expect(
            String(decoding: command, as: UTF8.self) == "*3\r\n$4\r\nHSET\r\n$18\r\napns:tokens:välue\r\n$0\r\n\r\n")
        #expect(command.count <= RESP.maximumSize(of: ["HSET", "apns:tokens:välue", ""]))
    }

    @Test func commandsFollowOneAnotherAndCountsHaveEveryDigit() {
        let arguments = ["SADD", "key"] + (0..<110).map { String($0) }
        let command = RESP.format([arguments, ["PING"]])
        let text = String(decoding: command, as: UTF8.self)
        #expect(text.hasPrefix("*112\r\n$4\r\nSADD\r\n$3\r\nkey\r\n$1\r\n0\r\n"))
        #expect(text.contains("$2\r\n10\r\n$2\r\n11\r\n") && text.contains("$3\r\n109\r\n"))
        #expect(text.hasSuffix("$3\r\n109\r\n*1\r\n$4\r\nPING\r\n"))
        #expect(RESP.format([]).isEmpty && RESP.format([[]]) == Array("*0\r\n".utf8))
    }

    /// Reading many users' tokens writes the same commands as HGETALL of each whole key, without building the keys.
    @Test func hashReadsAreHGETALLOfEachKey() {
        let keys = RedisKeyList(prefix: "apns:tokens:", names: ["alice", "{b%7Db}", "", "välue"])
        #expect(RESP.hashReads(keys) == RESP.format((0..<keys.count).map { ["HGETALL", keys.key($0)] }))
        #expect(RESP.hashReads(RedisKeyList(prefix: "p:", names: [])).isEmpty)
    }
}
