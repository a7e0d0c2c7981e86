/// What the stores (token cache, idempotency record, rate limit, statistics) talk to, whatever the deployment: one
/// node's connection (`RedisConnection`, also the master a Sentinel names) or a Redis Cluster (`RedisCluster`), which
/// routes each command to the node that owns its key. No store knows which it has; the one thing that differs for
/// them is how keys are written (`isCluster`: one user's keys must share a hash slot). Blocking and not thread-safe:
/// one owner thread, like the connections inside.
public protocol RedisClient: AnyObject {
    /// A Redis Cluster: every command carries its key (Lua scripts declare theirs in KEYS), and the keys one command
    /// or script touches share one hash slot.
    var isCluster: Bool { get }

    /// One command, one round trip. Error replies come back as `.error`, not thrown; only a lost connection throws.
    func command(_ arguments: [String]) throws(RedisError) -> RedisReply

    /// Many commands in one round trip per node, replies in the commands' order. In a cluster, a master that does not
    /// answer makes the whole call throw `connectionLost`, as one node's lost connection does.
    func pipeline(_ commands: [[String]]) throws(RedisError) -> [RedisReply]

    /// The same, where a node that does not answer (a cluster master frozen, cut off or gone) costs only its own
    /// commands: nil in their places, and every other node's replies as usual. One node's connection throws
    /// `connectionLost` when it is lost, as `pipeline` does; a cluster throws only when no master answers.
    func pipelineWhereReachable(_ commands: [[String]]) throws(RedisError) -> [RedisReply?]

    /// HGETALL of every key, in one round trip per node, each hash's fields and values handed to `visit` with the
    /// key's index, in place (the bytes live only during the call): no reply object per field. Per key, `.read` (its
    /// pairs visited), `.failed` with Redis's error (a key of another type), or nil where its node does not answer
    /// (as `pipelineWhereReachable`).
    func readHashesWhereReachable(
        _ keys: RedisKeyList,
        _ visit: (Int, UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void
    )
        throws(RedisError) -> [RedisHashRead?]

    /// A round trip to every node in use; throws if one does not answer PONG.
    func ping() throws(RedisError)

    /// Every master's connection in turn (the one connection of a single node): for what concerns a node rather
    /// than a key, such as SCAN.
    func forEachMaster(_ body: (any RedisClient) throws(RedisError) -> Void) throws(RedisError)

    /// The node that holds `key`, for people: its URL, or in a cluster the key's slot and its master.
    func location(ofKey key: String) -> String
}

/// What reading one hash found (`readHashesWhereReachable`).
public enum RedisHashRead: Sendable, Equatable {
    case read
    case failed(String)
}

extension RedisClient {
    /// Through `pipelineWhereReachable`, each field copied out (a Redis Cluster's routing works on whole commands).
    public func readHashesWhereReachable(
        _ keys: RedisKeyList,
        _ visit: (Int, UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void
    )
        throws(RedisError) -> [RedisHashRead?]
    {
        let replies = try pipelineWhereReachable((0..<keys.count).map { ["HGETALL", keys.key($0)] })
        return replies.enumerated().map { index, reply -> RedisHashRead? in
            guard let reply else { return nil }
            guard case .array(let fields) = reply, fields.count % 2 == 0,
                fields.allSatisfy({ if case .string = $0 { true } else { false } })
            else {
                if case .error(let message) = reply { return .failed(message) }
                return .failed("not a hash: \(reply)")
            }
            for pair in stride(from: 0, to: fields.count, by: 2) {
                guard case .string(let field) = fields[pair], case .string(let value) = fields[pair + 1] else {
                    continue
                }
                field.withUnsafeBytes { field in value.withUnsafeBytes { value in visit(index, field, value) } }
            }
            return .read
        }
    }

    public func pipelineWhereReachable(_ commands: [[String]]) throws(RedisError) -> [RedisReply?] {
        try pipeline(commands).map { $0 }
    }

    /// One command, nil when its node does not answer (see `pipelineWhereReachable`).
    public func commandWhereReachable(_ arguments: [String]) throws(RedisError) -> RedisReply? {
        try pipelineWhereReachable([arguments])[0]
    }

    /// Every key matching `pattern` on every master, a page at a time (SCAN: Redis is never blocked for long).
    /// A page Redis refuses throws `.server`.
    public func scan(
        matching pattern: String, count: Int = 500,
        _ page: ([String]) throws(RedisError) -> Void
    ) throws(RedisError) {
        try forEachMaster { (node: any RedisClient) throws(RedisError) in
            var cursor = "0"
            repeat {
                let reply = try node.command(["SCAN", cursor, "MATCH", pattern, "COUNT", String(count)])
                if case .error(let message) = reply { throw RedisError(kind: .server, "SCAN: \(message)") }
                let parts = reply.elements
                guard parts.count == 2 else { throw RedisError(kind: .server, "SCAN: unexpected reply \(reply)") }
                cursor = parts[0].text ?? "0"
                let keys = parts[1].elements.compactMap(\.text)
                if !keys.isEmpty { try page(keys) }
            } while cursor != "0"
        }
    }
}
