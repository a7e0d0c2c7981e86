import Dispatch
import Telemetry
import Threads

/// The cluster nodes this process found silent (a master frozen, cut off or gone), shared by every `RedisCluster` it
/// opens: the worker's broker thread, its preparer, the next session's. A node that stopped answering costs one
/// timeout per process, not one per client and per reconnect; meanwhile its commands fail at once and every other
/// node's go on. It is asked again (a new connection and a PING within `probeTimeout`) after a pause that grows
/// from one to five seconds while it stays silent, and is used again as soon as it answers.
public final class RedisNodeHealth: Sendable {
    public static let shared = RedisNodeHealth()

    /// How long a silent node's probe waits: short, as it runs on a thread that has other nodes' work to do.
    static let probeTimeout = 0.5

    struct Silence: Sendable {
        var failures: Int
        /// Monotonic nanoseconds.
        var nextProbe: UInt64
    }

    private let silent = Locked<[RedisAddress: Silence]>([:])
    private let now: @Sendable () -> UInt64

    init(now: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }) {
        self.now = now
    }

    /// The pause before a silent node is asked again, after `failures` probes in a row found it silent.
    static func pause(afterFailures failures: Int) -> Double { min(5, Double(1 << min(max(failures - 1, 0), 3))) }

    /// The nodes found silent and not answering since.
    public var silentNodes: [RedisAddress] { silent.withLock { Array($0.keys) } }

    func isSilent(_ node: RedisAddress) -> Bool { silent.withLock { $0[node] != nil } }

    /// Whether the caller should ask a silent node again now. The first caller to ask takes the probe: others see the
    /// node as silent until the next pause has passed.
    func takeProbe(of node: RedisAddress) -> Bool {
        let now = now()
        return silent.withLock { nodes in
            guard var silence = nodes[node], silence.nextProbe <= now else { return false }
            silence.nextProbe = now + UInt64(Self.pause(afterFailures: silence.failures + 1) * 1e9)
            nodes[node] = silence
            return true
        }
    }

    /// The node did not answer (a timeout, a refused or broken connection, a probe that failed). Returns true when it
    /// was answering until now (worth a log line).
    @discardableResult
    func noteSilent(_ node: RedisAddress) -> Bool {
        let now = now()
        return silent.withLock { nodes in
            let failures = (nodes[node]?.failures ?? 0) + 1
            let first = nodes[node] == nil
            nodes[node] = Silence(
                failures: failures, nextProbe: now + UInt64(Self.pause(afterFailures: failures) * 1e9))
            return first
        }
    }

    /// The node answered. Returns true when it had been silent (worth a log line).
    @discardableResult
    func noteAnswered(_ node: RedisAddress) -> Bool {
        silent.withLock { $0.removeValue(forKey: node) != nil }
    }
}
