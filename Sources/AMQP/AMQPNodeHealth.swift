import Dispatch
import Telemetry
import Threads

/// The broker nodes this process found silent (a connection that timed out, broke, or could not be opened), shared by
/// every connection it opens: a program that connects again tries the nodes that answered first, and a silent node
/// last, for `memory` seconds. A node frozen or cut off accepts TCP connections and answers nothing, and each attempt
/// on it would cost a whole handshake timeout before another node is tried.
public final class AMQPNodeHealth: Sendable {
    public static let shared = AMQPNodeHealth()

    /// How long a node stays last in line after it was found silent.
    static let memory = 60.0

    /// host:port -> when it was last found silent (monotonic nanoseconds).
    private let silentSince = Locked<[String: UInt64]>([:])

    static func key(_ url: AMQPURL) -> String { "\(url.host):\(url.port)" }

    func noteSilent(_ url: AMQPURL) {
        let now = DispatchTime.now().uptimeNanoseconds
        silentSince.withLock { $0[Self.key(url)] = now }
    }

    func noteAnswered(_ url: AMQPURL) { _ = silentSince.withLock { $0.removeValue(forKey: Self.key(url)) } }

    /// Whether the node was found silent in the last `memory` seconds.
    public func isSilent(_ url: AMQPURL) -> Bool {
        let now = DispatchTime.now().uptimeNanoseconds
        return silentSince.withLock { known in
            guard let since = known[Self.key(url)] else { return false }
            return Double(now &- since) / 1e9 < Self.memory
        }
    }
}
