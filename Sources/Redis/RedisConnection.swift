import ServiceURLs
import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

public struct RedisError: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        case badURL
        /// The connection failed or broke: reconnect.
        case connectionLost
        /// Redis answered with an error reply (wrong type, unknown command, ...).
        case server
        /// Redis refused the connection's own settings (its password, its database, or it wants one that was not
        /// given): waiting will not help, the URL must change.
        case refused
    }

    /// What a refusal concerns: the data nodes (REDIS_URL's password or database), the sentinels (their password), or
    /// the master's name (no sentinel knows it), the cluster's nodes (one is no cluster node), or TLS (a certificate the
    /// CA file does not vouch for), a client certificate or its key that does not load. Where to look when waiting
    /// will not help.
    public enum Part: Sendable, Equatable {
        case dataNodes, sentinels, masterName, clusterNodes, tls, clientCertificate, clientKey
    }

    public let kind: Kind
    public let message: String
    public var part: Part
    public var description: String { message }

    public init(kind: Kind, _ message: String, part: Part = .dataNodes) {
        self.kind = kind
        self.message = message
        self.part = part
    }
}

/// `redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS. The password never appears in
/// `description`.
public struct RedisURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var user: String?
    public var password: String?
    public var database: Int
    /// nil: plain TCP (`redis://`).
    public var tls: RedisTLS?

    public init(
        host: String = "127.0.0.1", port: Int = 6379, user: String? = nil, password: String? = nil,
        database: Int = 0, tls: RedisTLS? = nil
    ) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// `requiringHost`: false for the credentials and database of nodes found otherwise (by Sentinel), as
    /// `redis://:password@/db`; the host is then empty.
    public init(_ text: String, requiringHost: Bool = true) throws(RedisError) {
        guard text.hasPrefix("redis://") || text.hasPrefix("rediss://") else {
            throw RedisError(kind: .badURL, "must start with redis:// or rediss:// (TLS)")
        }
        let parts: ServiceURL
        do { parts = try ServiceURL(text, loneCredential: .password, requiringHost: requiringHost) } catch {
            throw RedisError(kind: .badURL, error.description)
        }
        var database = 0
        if let path = parts.path, !path.isEmpty {
            guard let parsed = Int(path), parsed >= 0 else {
                throw RedisError(kind: .badURL, "database \(path) is not a number")
            }
            database = parsed
        }
        self.init(
            host: parts.host, port: parts.port ?? 6379, user: parts.user.flatMap { $0.isEmpty ? nil : $0 },
            password: parts.password, database: database, tls: text.hasPrefix("rediss://") ? RedisTLS() : nil)
    }

    public var description: String {
        let credentials = password == nil ? "" : "\(user ?? ""):***@"
        return "\(tls == nil ? "redis" : "rediss")://\(credentials)\(host):\(port)/\(database)"
    }
}

/// A reply, copied out of what the connection received.
public enum RedisReply: Sendable, Equatable {
    case string([UInt8])
    case integer(Int64)
    case array([RedisReply])
    case null
    case status(String)
    case error(String)

    public var text: String? {
        switch self {
        case .string(let bytes): String(decoding: bytes, as: UTF8.self)
        case .status(let text): text
        case .integer(let value): String(value)
        default: nil
        }
    }

    public var integer: Int64? {
        switch self {
        case .integer(let value): value
        case .string(let bytes): Int64(String(decoding: bytes, as: UTF8.self))
        default: nil
        }
    }

    public var elements: [RedisReply] { if case .array(let items) = self { items } else { [] } }
}

/// One Redis connection, owning its socket (`RedisChannel`). Blocking and not thread-safe: one owner thread. The client of a
/// single node (or of the master a Sentinel names).
public final class RedisConnection: RedisClient {
    public var isCluster: Bool { false }

    public func forEachMaster(_ body: (any RedisClient) throws(RedisError) -> Void) throws(RedisError) {
        try body(self)
    }

    public func location(ofKey key: String) -> String { url.description }

    public let url: RedisURL
    private let channel: RedisChannel

    public init(url: RedisURL, timeout: Double = 5) throws(RedisError) {
        self.url = url
        // Addresses also come from servers (a sentinel's answer, a cluster's redirection): checked where they are
        // read, and here again before they reach C.
        guard (1...65_535).contains(url.port) else {
            throw RedisError(kind: .badURL, "Redis \(url): \(url.port) is not a port (1 to 65535)")
        }
        channel = try RedisChannel(
            host: url.host, port: url.port, tls: url.tls, timeout: timeout, name: url.description)
        if let password = url.password {
            let reply = try command(url.user.map { ["AUTH", $0, password] } ?? ["AUTH", password])
            if case .error(let message) = reply {
                throw RedisError(kind: .refused, "Redis \(url) refused the password: \(message)")
            }
        }
        if url.database != 0 {
            let reply = try command(["SELECT", String(url.database)])
            if case .error(let message) = reply {
                throw RedisError(kind: .refused, "Redis \(url) refused database \(url.database): \(message)")
            }
        }
        // A round trip before anyone relies on the connection: accepting a TCP connection proves nothing (a frozen
        // server's kernel still does), and a server that wants a password says so here, not on every command.
        try ping()
    }

    /// Every later call times out after `timeout` seconds (a connection opened with a short timeout, to ask whether a
    /// node answers at all, then works with the usual one).
    func setTimeout(_ timeout: Double) { channel.setTimeout(timeout) }

    /// One round trip (within the connection's timeout); throws if Redis does not answer PONG.
    public func ping() throws(RedisError) {
        let reply = try command(["PING"])
        if case .error(let message) = reply {
            let refused = message.hasPrefix("NOAUTH") || message.hasPrefix("WRONGPASS")
            throw RedisError(kind: refused ? .refused : .server, "Redis \(url) refused PING: \(message)")
        }
    }

    /// One command, one round trip. Error replies come back as `.error`, not thrown.
    public func command(_ arguments: [String]) throws(RedisError) -> RedisReply {
        try pipeline([arguments])[0]
    }

    /// Many commands in one round trip: all are written, then all replies read, in order.
    public func pipeline(_ commands: [[String]]) throws(RedisError) -> [RedisReply] {
        append(commands)
        return try receive(commands.count)
    }

    /// Writes the commands without waiting for their replies (`receive` reads them), so that a cluster's nodes all
    /// work on their part of a pipeline at once.
    func send(_ commands: [[String]]) throws(RedisError) {
        append(commands)
        try channel.flush()
    }

    public func readHashesWhereReachable(
        _ keys: RedisKeyList,
        _ visit: (Int, UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void
    )
        throws(RedisError) -> [RedisHashRead?]
    {
        guard keys.count > 0 else { return [] }
        channel.appendHashReads(keys)
        var reads: [RedisHashRead?] = []
        reads.reserveCapacity(keys.count)
        for index in 0..<keys.count {
            switch try channel.readHash({ visit(index, $0, $1) }) {
            case .fields:
                reads.append(.read)
            case .other(let reply):
                try checkServing(reply)
                if case .error(let message) = reply {
                    reads.append(.failed(message))
                } else {
                    reads.append(.failed("not a hash: \(reply)"))
                }
            }
        }
        return reads
    }

    /// The next `count` replies, in order.
    func receive(_ count: Int) throws(RedisError) -> [RedisReply] {
        var replies: [RedisReply] = []
        replies.reserveCapacity(count)
        for _ in 0..<count {
            let reply = try channel.readReply()
            try checkServing(reply)
            replies.append(reply)
        }
        return replies
    }

    /// The node cannot serve now: it became a replica (a Sentinel failover, or an operator's REPLICAOF; the next
    /// connection asks where the master is now), it is loading its data after a restart, or it sees too little of its
    /// cluster to serve its slots. The connection is as good as lost: nothing it says now is an answer about the keys,
    /// and taken for one (a user's entry unreadable) it would cost that user's notifications.
    private func checkServing(_ reply: RedisReply) throws(RedisError) {
        if case .error(let message) = reply, let state = Self.notServing(message) {
            // The pipeline's other replies stay unread: nothing may be read from this connection again.
            throw channel.noteLost(RedisError(kind: .connectionLost, "Redis \(url) \(state): \(message)"))
        }
    }

    /// What an error reply says of a node that cannot serve now, or nil for an answer about the command or its keys.
    package static func notServing(_ message: String) -> String? {
        if message.hasPrefix("READONLY") { return "is a replica now" }
        if message.hasPrefix("LOADING") { return "is loading its data" }
        if message.hasPrefix("MASTERDOWN") { return "has lost its master" }
        if message.hasPrefix("CLUSTERDOWN") { return "does not serve its cluster's slots now" }
        return nil
    }

    /// The node's role (`ROLE`): "master", "slave" or "sentinel".
    public func role() throws(RedisError) -> String {
        let reply = try command(["ROLE"])
        guard let role = reply.elements.first?.text else {
            throw RedisError(kind: .server, "Redis \(url) did not say its role: \(reply)")
        }
        return role
    }

    /// Queues the commands for writing, all formatted into one buffer (`RESP`), handed over in one call.
    private func append(_ commands: [[String]]) {
        guard !commands.isEmpty else { return }
        channel.append(formatted: RESP.format(commands))
    }
}
