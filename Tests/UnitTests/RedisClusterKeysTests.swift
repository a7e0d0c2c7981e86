import Testing

@testable import Redis
@testable import RedisStore

/// How a Redis Cluster client finds a key's node, and how keys are written so that one user's keys share it.
@Suite struct RedisClusterKeysTests {
    /// Redis's own reference values (its cluster specification and `CLUSTER KEYSLOT`).
    @Test(arguments: [
        ("123456789", 12739), ("foo", 12182), ("bar", 5061), ("", 0),
        ("{user1000}.following", 3443), ("{user1000}.followers", 3443), ("foo{}{bar}", 8363),
        ("foo{{bar}}zap", 4015), ("foo{bar}{zap}", 5061)
    ])
    func slotsAreRedisClusters(key: String, slot: Int) {
        #expect(RedisCluster.slot(of: key) == slot, "\(key)")
    }

    @Test func oneUsersKeysShareASlotWhateverItsIDHolds() {
        for user in ["u1", "alice@example.com", "a{b}c", "{x}", "}{", "100%", "%7B", "ünïcødé"] {
            let keys = RedisKeys.cluster
            let slot = RedisCluster.slot(of: keys.tokens(user))
            #expect(
                RedisCluster.slot(of: keys.registered(user)) == slot
                    && RedisCluster.slot(of: keys.devices(user)) == slot,
                "\(user)")
            #expect(keys.user(fromRegisteredKey: keys.registered(user)) == user, "the user is read back: \(user)")
        }
        #expect(RedisKeys.cluster.tokens("u1") == "apns:tokens:{u1}")
        #expect(RedisKeys.cluster.registered("u1") == "apns:registered:{u1}")
        #expect(RedisKeys.cluster.tokens("a{b}c") == "apns:tokens:{a%7Bb%7Dc}", "a brace makes no other hash tag")
        #expect(RedisKeys.cluster.tokens("100%") == "apns:tokens:{100%25}")
        // Two users whose escaped forms could meet stay apart.
        #expect(RedisKeys.cluster.tokens("%7B") != RedisKeys.cluster.tokens("{"))
        // A single node keeps the keys it always had.
        #expect(RedisKeys.node.tokens("a{b}c") == "apns:tokens:a{b}c")
        #expect(RedisKeys.node.user(fromRegisteredKey: "apns:registered:a{b}c") == "a{b}c")
        #expect(RedisKeys.cluster.user(fromRegisteredKey: "apns:registered:plain") == nil, "not a cluster key")
    }

    @Test func aCommandsKeyIsFoundWhereverItSits() {
        #expect(RedisCluster.key(of: ["HGETALL", "apns:tokens:{u1}"]) == "apns:tokens:{u1}")
        #expect(RedisCluster.key(of: ["EVAL", "return 1", "2", "k1", "k2", "arg"]) == "k1")
        #expect(RedisCluster.key(of: ["EVAL", "return 1", "0", "arg"]) == nil)
        #expect(RedisCluster.key(of: ["PING"]) == nil)
        #expect(RedisCluster.key(of: ["SCAN", "0"]) == nil)
        #expect(RedisCluster.splitBySlot(["DEL", "a", "b", "c"]) == [["DEL", "a"], ["DEL", "b"], ["DEL", "c"]])
        #expect(RedisCluster.splitBySlot(["DEL", "{u}a", "{u}b"]) == nil, "one slot: one command")
        #expect(RedisCluster.splitBySlot(["DEL", "a"]) == nil)
    }

    @Test func redirectionsAreRead() {
        let node = RedisAddress(host: "10.0.0.1", port: 7000)
        #expect(
            Redirection(.error("MOVED 3999 127.0.0.1:6381"), from: node)
                == .moved(slot: 3999, to: RedisAddress(host: "127.0.0.1", port: 6381)))
        #expect(
            Redirection(.error("ASK 3999 127.0.0.1:6381"), from: node)
                == .ask(to: RedisAddress(host: "127.0.0.1", port: 6381)))
        #expect(
            Redirection(.error("MOVED 3999 :6381"), from: node)
                == .moved(slot: 3999, to: RedisAddress(host: "10.0.0.1", port: 6381)),
            "no host: the node that answered")
        #expect(Redirection(.error("TRYAGAIN Multiple keys request during rehashing of slot"), from: node) == .tryAgain)
        #expect(
            Redirection(.error("WRONGTYPE Operation against a key holding the wrong kind of value"), from: node) == nil)
        #expect(Redirection(.string(Array("MOVED 1 a:1".utf8)), from: node) == nil, "only an error reply redirects")
    }

    /// A CLUSTER SLOTS reply naming more masters than a cluster can have (40,000 one-slot ranges on as many ports,
    /// from a broken or hostile node): the map keeps the first 16,384 and stops there, instead of overflowing the
    /// owner index it keeps per slot.
    @Test func aSlotMapNamingMoreMastersThanSlotsKeepsOnePerSlot() {
        let asked = RedisAddress(host: "10.0.0.1", port: 7000)
        let host = RedisReply.string(Array("10.0.0.2".utf8))
        let ranges = (0..<40_000).map { (index: Int) -> RedisReply in
            let slot = RedisReply.integer(Int64(index % 16_384))
            return .array([slot, slot, .array([host, .integer(Int64(10_000 + index))])])
        }
        let map = RedisCluster.slotMap(.array(ranges), askedAt: asked)
        #expect(map.masters.count == 16_384)
        #expect(map.owners.allSatisfy { $0 >= 0 && Int($0) < map.masters.count })
        #expect(map.masters[Int(map.owners[5])] == RedisAddress(host: "10.0.0.2", port: 10_005))
    }
}
