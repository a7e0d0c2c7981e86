import Foundation
import Redis
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A Redis Cluster of a test's own (its masters may be frozen or killed without touching the cluster other tests
/// share), started with scripts/lib/redis-cluster.sh's `start-node` in the foreground (a daemonizing redis-server
/// would keep the output pipe of whatever started it open), its pid files where the services' teardown finds them.
/// `cluster-require-full-coverage no`: the masters that answer keep serving their slots while one does not, as a
/// deployment that wants one node's loss to cost only its keys is set up.
final class PrivateRedisCluster {
    let masters: [RedisAddress]
    private var nodes: [RedisAddress: TestServices.Daemon] = [:]

    init(masters count: Int = 3) throws {
        let directory = try TestServices.value("CLUSTER_REDIS_DIR")
        var masters: [RedisAddress] = []
        for _ in 0..<count {
            let port = Self.portWithFreeBusPort()
            let address = RedisAddress(host: "127.0.0.1", port: port)
            nodes[address] = try TestServices.Daemon(
                directory + "/start-node",
                [
                    String(port), "--cluster-require-full-coverage", "no", "--daemonize", "no"
                ])
            masters.append(address)
        }
        self.masters = masters
        let started = masters.allSatisfy { address in
            TestServices.waitUntil(timeout: 20) {
                (try? RedisConnection(url: RedisURL(host: address.host, port: address.port))) != nil
            }
        }
        try #require(started, "the cluster's nodes answer")
        let create = ["--cluster", "create"] + masters.map(\.description) + ["--cluster-replicas", "0", "--cluster-yes"]
        try #require(
            TestServices.waitUntil(timeout: 30) { (try? TestServices.run("/usr/bin/redis-cli", create)) != nil },
            "redis-cli --cluster create")
        let ready = TestServices.waitUntil(timeout: 30) {
            masters.allSatisfy { address in
                let info = try? TestServices.run("/usr/bin/redis-cli", ["-p", String(address.port), "cluster", "info"])
                return info?.contains("cluster_state:ok") == true
            }
        }
        try #require(ready, "cluster_state:ok on every master")
    }

    deinit { stop() }

    /// REDIS_CLUSTER_NODES and REDIS_URL for the programs.
    var environment: [String: String] {
        ["REDIS_CLUSTER_NODES": masters.map(\.description).joined(separator: ","), "REDIS_URL": "redis://"]
    }

    func pid(_ master: RedisAddress) throws -> pid_t { try #require(nodes[master]).pid }

    /// SIGSTOP: its connections stay open and nothing is answered, the way a node that hangs or is cut off looks.
    func freeze(_ master: RedisAddress) throws { kill(try pid(master), SIGSTOP) }

    func thaw(_ master: RedisAddress) throws { kill(try pid(master), SIGCONT) }

    /// Idempotent.
    func stop() {
        for (_, node) in nodes {
            kill(node.pid, SIGCONT)
            node.stop()
        }
    }

    /// A free port whose cluster bus port (port + 10000) is free too.
    private static func portWithFreeBusPort() -> Int {
        while true {
            let port = TestServices.freePort()
            if port + 10_000 < 65_536 && isFree(port + 10_000) { return port }
        }
    }

    private static func isFree(_ port: Int) -> Bool {
        guard let (descriptor, _) = try? ListeningSocket.open(host: "127.0.0.1", port: port, backlog: 1) else {
            return false
        }
        close(descriptor)
        return true
    }
}
