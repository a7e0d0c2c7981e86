import Testing

@testable import Redis

/// Addresses servers announce (a sentinel's master, MOVED and ASK, CLUSTER SLOTS) are dialled only when they are
/// addresses: a port out of range used to reach the C call as an Int32 and trap the worker.
@Suite struct AnnouncedAddressesTests {
    private let asked = RedisAddress(host: "10.0.0.1", port: 7000)

    private func sentinelAnswer(_ host: String, _ port: String) -> RedisReply {
        .array([.string(Array(host.utf8)), .string(Array(port.utf8))])
    }

    @Test func aSentinelNamesAMasterOnlyAtAPort() {
        #expect(
            RedisSentinels.namedMaster(in: sentinelAnswer("10.0.0.5", "6380"))
                == RedisAddress(host: "10.0.0.5", port: 6380))
        for port in ["99999999999", "70000", "0", "-1", "", "6380 "] {
            #expect(RedisSentinels.namedMaster(in: sentinelAnswer("10.0.0.5", port)) == nil, "port \(port)")
        }
        for host in ["", "10.0.0.5\0evil", "a b", "\u{1b}[31m"] {
            #expect(
                RedisSentinels.namedMaster(in: sentinelAnswer(host, "6380")) == nil, "host \(host.debugDescription)")
        }
        #expect(RedisSentinels.namedMaster(in: .array([sentinelAnswer("10.0.0.5", "6380")])) == nil)
    }

    @Test func redirectionsToNoAddressOrNoSlotAreNotFollowed() {
        #expect(Redirection(.error("MOVED 3999 10.0.0.2:99999999999"), from: asked) == nil)
        #expect(Redirection(.error("ASK 3999 10.0.0.2:65536"), from: asked) == nil)
        #expect(Redirection(.error("MOVED 16384 10.0.0.2:7001"), from: asked) == nil, "slots end at 16,383")
        #expect(Redirection(.error("MOVED -1 10.0.0.2:7001"), from: asked) == nil)
        #expect(Redirection(.error("MOVED 1 [:7001"), from: asked) == nil, "a host that is half a bracket")
        #expect(
            Redirection(.error("MOVED 16383 [::1]:65535"), from: asked)
                == .moved(slot: 16_383, to: RedisAddress(host: "::1", port: 65_535)))
    }

    @Test func aSlotRangeAtNoPortIsLeftOutOfTheMap() {
        func range(_ start: Int64, _ end: Int64, port: Int64) -> RedisReply {
            .array([.integer(start), .integer(end), .array([.string(Array("10.0.0.2".utf8)), .integer(port)])])
        }
        let map = RedisCluster.slotMap(
            .array([
                range(0, 99, port: 99_999_999_999), range(100, 199, port: 0),
                range(200, 299, port: 7001)
            ]), askedAt: asked)
        #expect(map.masters == [RedisAddress(host: "10.0.0.2", port: 7001)])
        #expect(map.owners[0] == -1 && map.owners[150] == -1 && map.owners[250] == 0)
    }

    /// The connection itself refuses a port C cannot take, whatever gave it.
    @Test func aConnectionToNoPortIsRefusedNotTrapped() {
        do {
            _ = try RedisConnection(url: RedisURL(host: "127.0.0.1", port: 99_999_999_999), timeout: 1)
            Issue.record("connected to port 99,999,999,999")
        } catch {
            #expect(error.kind == .badURL && error.message.contains("is not a port"), "\(error.message)")
        }
    }
}
