import Telemetry

/// Where Redis is, as the settings say, and the one way every program connects to it: the token cache, the rate
/// limit, the idempotency record and the statistics all take their connections from here, so that a deployment of
/// another kind is a case of this type and a branch of `connect`, not an edit of every store.
public enum RedisDeployment: Sendable, Equatable, CustomStringConvertible {
    /// One node (REDIS_URL).
    case node(RedisURL)
    /// A master and its replicas watched by sentinels (REDIS_SENTINELS, REDIS_MASTER_NAME): the sentinels say which
    /// node is the master, and after a failover, which is the new one.
    case sentinel(RedisSentinels)
    /// A Redis Cluster (REDIS_CLUSTER_NODES): keys spread over its masters by hash slot.
    case cluster(RedisClusterNodes)

    /// Opens a client of the nodes that serve this deployment's data, authenticated and on its database. A
    /// connection that breaks, or a node that answers READONLY (it became a replica), throws `connectionLost`: the
    /// caller connects again (with its back-off), which asks the sentinels, or the cluster's nodes, again.
    /// `logger`: where a cluster says that one of its masters stopped answering, or answers again.
    public func connect(timeout: Double = 5, logger: Logger? = nil) throws(RedisError) -> any RedisClient {
        switch self {
        case .node(let url): try RedisConnection(url: url, timeout: timeout)
        case .sentinel(let sentinels): try sentinels.connectToMaster(timeout: timeout)
        case .cluster(let nodes): try RedisCluster(nodes, timeout: timeout, logger: logger)
        }
    }

    /// Whether keys are written for a cluster (one user's keys in one hash slot).
    public var isCluster: Bool { if case .cluster = self { true } else { false } }

    /// For logs: no password.
    public var description: String {
        switch self {
        case .node(let url): url.description
        case .sentinel(let sentinels): sentinels.description
        case .cluster(let nodes): nodes.description
        }
    }
}

/// A host and port: a sentinel's, or a cluster node's.
public struct RedisAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// An address a server announced (a sentinel naming the master, a cluster's MOVED, ASK or CLUSTER SLOTS): nil
    /// unless the port is one (1 to 65535) and the host a name or an address (printable, no spaces, brackets, `/` or
    /// `@`), so that a broken or hostile answer is never dialled.
    init?(announcedHost host: some StringProtocol, port: Int64) {
        guard (1...65_535).contains(port), !host.isEmpty, host.utf8.count <= 255,
            host.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && !"[]/@".utf8.contains($0) })
        else { return nil }
        self.init(host: String(host), port: Int(port))
    }

    /// `host:port` (`[v6 address]:port`); the port is required: sentinels listen on 26379 by custom, not by rule.
    public init(_ text: Substring) throws(RedisError) {
        var trimmed = text
        while trimmed.first == " " { trimmed.removeFirst() }
        while trimmed.last == " " { trimmed.removeLast() }
        guard let colon = trimmed.lastIndex(of: ":"), let port = Int(trimmed[trimmed.index(after: colon)...]),
            (1...65_535).contains(port)
        else {
            throw RedisError(kind: .badURL, "'\(trimmed)' is not host:port (a port from 1 to 65535 is required)")
        }
        var host = trimmed[..<colon]
        if host.hasPrefix("[") && host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        guard !host.isEmpty, !host.contains(where: { $0 == "/" || $0 == "@" || $0 == " " }) else {
            throw RedisError(kind: .badURL, "'\(trimmed)' is not host:port")
        }
        self.init(host: String(host), port: port)
    }

    /// Comma-separated addresses, at least one, none twice.
    public static func list(_ text: String) throws(RedisError) -> [RedisAddress] {
        var addresses: [RedisAddress] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let address = try RedisAddress(part)
            guard !addresses.contains(address) else { throw RedisError(kind: .badURL, "\(address) is listed twice") }
            addresses.append(address)
        }
        return addresses
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// A Sentinel deployment: the sentinels to ask, the master's name, the sentinels' own password, and the data nodes'
/// user, password and database (their host and port are the master's, as the sentinels say).
public struct RedisSentinels: Sendable, Equatable, CustomStringConvertible {
    public var sentinels: [RedisAddress]
    public var masterName: String
    public var sentinelPassword: String?
    public var dataNodes: RedisURL

    public init(
        sentinels: [RedisAddress], masterName: String, sentinelPassword: String? = nil,
        dataNodes: RedisURL = RedisURL()
    ) {
        self.sentinels = sentinels
        self.masterName = masterName
        self.sentinelPassword = sentinelPassword
        self.dataNodes = dataNodes
    }

    public var description: String {
        "sentinels \(sentinels.map(\.description).joined(separator: ",")) master \(masterName) "
            + "database \(dataNodes.database)"
    }

    /// Asks the sentinels in turn for the master's address, connects to it, and checks with ROLE that it is the
    /// master (a sentinel that has not seen the latest failover yet names the old master, which may be back as a
    /// replica). A sentinel that does not answer, or names a node that is not the master, passes the question to
    /// the next. Throws `connectionLost` when none leads to the master (a failover under way: the caller tries again
    /// after its back-off); `refused` when waiting will not help (passwords, the database, a name no sentinel knows).
    func connectToMaster(timeout: Double) throws(RedisError) -> RedisConnection {
        var problems: [String] = []
        var unknownName = 0
        for sentinel in sentinels {
            let master: RedisAddress?
            do { master = try askForMaster(sentinel, timeout: timeout) } catch {
                if error.kind == .refused { throw error }
                problems.append(error.message)
                continue
            }
            guard let master else {
                unknownName += 1
                problems.append("sentinel \(sentinel) knows no master named \(masterName)")
                continue
            }
            var url = dataNodes
            url.host = master.host
            url.port = master.port
            let connection: RedisConnection
            do { connection = try RedisConnection(url: url, timeout: timeout) } catch {
                // The master just died and the sentinels have not promoted a replica yet: ask the next, then wait.
                if error.kind != .connectionLost { throw error }
                problems.append("sentinel \(sentinel) names \(master), which does not answer (\(error.message))")
                continue
            }
            let role = try connection.role()
            if role == "master" { return connection }
            problems.append("sentinel \(sentinel) names \(master) as the master, and it is a \(role)")
        }
        if unknownName == sentinels.count {
            throw RedisError(kind: .refused, "no sentinel knows a master named \(masterName)", part: .masterName)
        }
        throw RedisError(
            kind: .connectionLost,
            "no master reached for \(masterName): "
                + problems.joined(separator: "; "))
    }

    /// The master the first sentinel that answers names now; nil when none answers. What the worker checks its
    /// connection against every second: a master cut off from the sentinels (a split brain) still answers its
    /// clients after they promoted another.
    public func namedMaster(timeout: Double) -> RedisAddress? {
        for sentinel in sentinels {
            if let named = try? askForMaster(sentinel, timeout: timeout) { return named }
        }
        return nil
    }

    /// The address in a sentinel's answer to `SENTINEL get-master-addr-by-name`: [host, port].
    package static func namedMaster(in reply: RedisReply) -> RedisAddress? {
        guard case .array(let parts) = reply, parts.count == 2, let host = parts[0].text,
            let port = parts[1].text.flatMap({ Int64($0) })
        else { return nil }
        return RedisAddress(announcedHost: host, port: port)
    }

    /// What one sentinel says the master's address is; nil when it knows no master of that name.
    private func askForMaster(_ sentinel: RedisAddress, timeout: Double) throws(RedisError) -> RedisAddress? {
        let connection: RedisConnection
        do {
            // Sentinels speak TLS when the data nodes do (one tls-port configuration for both, as Redis sets them up).
            connection = try RedisConnection(
                url: RedisURL(
                    host: sentinel.host, port: sentinel.port,
                    password: sentinelPassword, tls: dataNodes.tls),
                timeout: timeout)
        } catch {
            throw RedisError(kind: error.kind, "sentinel \(sentinel): \(error.message)", part: .sentinels)
        }
        let reply = try connection.command(["SENTINEL", "get-master-addr-by-name", masterName])
        if case .null = reply { return nil }
        if let master = Self.namedMaster(in: reply) { return master }
        // An error reply (an unknown command: a data node listed as a sentinel) is a setting to fix.
        let kind: RedisError.Kind = if case .error = reply { .refused } else { .connectionLost }
        throw RedisError(
            kind: kind, "\(sentinel) is no sentinel: get-master-addr-by-name answered \(reply)",
            part: .sentinels)
    }
}
