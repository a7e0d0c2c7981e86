import ServiceURLs
import Telemetry

/// `amqp[s]://user:password@host:port/vhost`, parsed with errors that name the part that is wrong.
/// The password never appears in `description`.
public struct AMQPURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var user: String
    public var password: String
    public var virtualHost: String
    public var usesTLS: Bool

    public init(
        host: String = "127.0.0.1", port: Int = 5672, user: String = "guest", password: String = "guest",
        virtualHost: String = "/", usesTLS: Bool = false
    ) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.virtualHost = virtualHost
        self.usesTLS = usesTLS
    }

    public init(_ text: String) throws(AMQPError) {
        guard text.hasPrefix("amqp://") || text.hasPrefix("amqps://") else {
            throw .badURL("must start with amqp:// or amqps://")
        }
        let parts: ServiceURL
        do { parts = try ServiceURL(text, loneCredential: .user) } catch { throw .badURL(error.description) }
        let usesTLS = parts.scheme == "amqps"
        var virtualHost = "/"
        if let path = parts.path {
            guard !path.isEmpty else {
                throw .badURL("a trailing / names the empty vhost; use /%2f for the default vhost \"/\"")
            }
            guard let decoded = PercentEncoding.decode(path) else { throw .badURL("bad percent-encoding in the vhost") }
            virtualHost = decoded
        }
        self.init(
            host: parts.host, port: parts.port ?? (usesTLS ? 5671 : 5672), user: parts.user ?? "guest",
            password: parts.password ?? "guest", virtualHost: virtualHost, usesTLS: usesTLS)
    }

    public var description: String {
        let vhost = virtualHost == "/" ? "%2f" : virtualHost
        return "\(usesTLS ? "amqps" : "amqp")://\(user):***@\(host):\(port)/\(vhost)"
    }
}

/// The broker's nodes: `AMQP_URL` as one URL or several, comma-separated (a cluster). A program connects to one of
/// them, starting at a random node so that a fleet spreads over the cluster, and moves to the next when one cannot be
/// reached. A comma inside a password must be percent-encoded (%2C).
public struct AMQPNodes: Sendable, Equatable, CustomStringConvertible {
    public var urls: [AMQPURL]

    public init(_ urls: [AMQPURL]) {
        precondition(!urls.isEmpty, "at least one broker URL")
        self.urls = urls
    }

    public init(_ url: AMQPURL) { self.init([url]) }

    /// Parses a comma-separated list; an error names the URL by its position, never by its text (which may hold a
    /// password).
    public init(_ text: String) throws(AMQPError) {
        let parts = text.split(separator: ",", omittingEmptySubsequences: false)
            .map { $0.trimmingCharacters(in: .whitespaces) }
        // A later part that is no URL is most likely the rest of a password with a raw comma: say so before any part
        // is parsed, since the part before it would otherwise be read as host:port and its error would show the
        // password's first half as a port.
        if let stray = parts.indices.dropFirst().first(where: { index in
            !parts[index].isEmpty && !parts[index].hasPrefix("amqp://") && !parts[index].hasPrefix("amqps://")
        }) {
            throw .badURL(
                "URL \(stray + 1) of \(parts.count): must start with amqp:// or amqps:// (a comma separates "
                    + "nodes; a comma in a password is written %2C)")
        }
        var urls: [AMQPURL] = []
        for (index, part) in parts.enumerated() {
            do { urls.append(try AMQPURL(part)) } catch {
                throw .badURL(parts.count == 1 ? error.message : "URL \(index + 1) of \(parts.count): \(error.message)")
            }
        }
        self.init(urls)
    }

    /// The nodes in the order a connection tries them: from `start` round the list, those found silent last.
    public func attemptOrder(startingAt start: Int, isSilent: (AMQPURL) -> Bool) -> [AMQPURL] {
        let round = (0..<urls.count).map { urls[(start % urls.count + $0) % urls.count] }
        let silent = round.map(isSilent)
        return zip(round, silent).filter { !$1 }.map(\.0) + zip(round, silent).filter { $1 }.map(\.0)
    }

    /// Every node, passwords hidden.
    public var description: String { urls.map(\.description).joined(separator: ",") }

    /// Connects to the first node that answers, from a random one on, each tried once (a round); nodes this process
    /// found silent in the last minute (`AMQPNodeHealth`) come last. A node that cannot be reached, or refuses, is
    /// passed over; if none answers, the error says what each node did, and is permanent only if every node refused
    /// for a reason waiting cannot cure (the credentials, the vhost).
    public func connect(
        heartbeat: Int = 30, connectTimeout: Double = 10,
        replyTimeout: Double = AMQPConnection.replyTimeout, caFile: String? = nil, verifyPeer: Bool = true,
        startingAt start: Int = .random(in: 0..<Int.max)
    ) throws(AMQPError) -> AMQPConnection {
        var failures: [AMQPError] = []
        for url in attemptOrder(startingAt: start, isSilent: AMQPNodeHealth.shared.isSilent) {
            do {
                return try AMQPConnection(
                    url: url, heartbeat: heartbeat, connectTimeout: connectTimeout,
                    replyTimeout: replyTimeout, caFile: caFile, verifyPeer: verifyPeer)
            } catch {
                failures.append(error)
            }
        }
        guard failures.count > 1 else { throw failures[0] }
        let permanent = failures.allSatisfy(\.isPermanent)
        throw AMQPError(
            kind: permanent ? failures[0].kind : .connectionLost, code: permanent ? failures[0].code : 0,
            "no broker node answered: " + failures.map(\.message).joined(separator: "; "))
    }
}
