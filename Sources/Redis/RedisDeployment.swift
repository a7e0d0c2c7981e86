/// Where Redis is, as the settings say, and the one way every program connects to it: the token cache, the rate
/// limit, the idempotency record and the statistics all take their connections from here, so that a deployment of
/// another kind (Sentinel, Cluster) is a case of this type and a branch of `connect`, not an edit of every store.
public enum RedisDeployment: Sendable, Equatable, CustomStringConvertible {
    /// One node (REDIS_URL).
    case node(RedisURL)

    /// Opens a connection to the node that serves this deployment's data, authenticated and on its database.
    public func connect(timeout: Double = 5) throws(RedisError) -> RedisConnection {
        switch self {
        case .node(let url): try RedisConnection(url: url, timeout: timeout)
        }
    }

    /// For logs: no password.
    public var description: String {
        switch self {
        case .node(let url): url.description
        }
    }
}
