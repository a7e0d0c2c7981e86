import Dispatch
import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

/// A Redis Cluster's seed nodes (REDIS_CLUSTER_NODES) and the data nodes' user and password (REDIS_URL's; a
/// cluster has database 0 only).
public struct RedisClusterNodes: Sendable, Equatable, CustomStringConvertible {
    public var seeds: [RedisAddress]
    public var dataNodes: RedisURL

    public init(seeds: [RedisAddress], dataNodes: RedisURL = RedisURL()) {
        self.seeds = seeds
        self.dataNodes = dataNodes
    }

    public var description: String { "cluster \(seeds.map(\.description).joined(separator: ","))" }
}

/// A Redis Cluster client: learns which master serves which of the 16,384 hash slots (`CLUSTER SLOTS`), sends each
/// command to the master of its key's slot, follows `MOVED` (the slot moved for good: the map is learned again) and
/// `ASK` (the slot is being moved: this one command goes to the new node after `ASKING`), and splits a pipeline by
/// node: every node's part is written before any reply is read, so a pipeline costs one round trip of the slowest
/// node, not one per node. One connection per master, opened when first needed. Not thread-safe: one owner thread.
///
/// A master that does not answer (frozen, cut off, gone) costs only its own keys: its connection is dropped after one
/// timeout, the node is noted silent for the whole process (`RedisNodeHealth`), and from then on its commands come back
/// unanswered at once (`pipelineWhereReachable`) while the other masters' are served. While a master is silent the
/// slot map is asked for again every second (a replica may have taken its slots over) and the node itself is probed
/// with a short timeout; it is used again as soon as it answers.
public final class RedisCluster: RedisClient {
    public static let slotCount = 16_384
    /// Redirections followed for one command before giving up (a map that keeps changing under us).
    static let redirectionLimit = 5
    /// While a master in the map is silent, the map is asked for this often at most (seconds).
    static let mapRefreshInterval = 1.0

    public let nodes: RedisClusterNodes
    private let timeout: Double
    private let health: RedisNodeHealth
    private let logger: Logger?
    /// Per slot, an index into `masters`; -1 while no master serves it.
    private var slotOwners: [Int16]
    private var masters: [RedisAddress] = []
    private var connections: [RedisAddress: RedisConnection] = [:]
    /// When the map was last asked for because a master in it is silent (monotonic nanoseconds).
    private var mapRefreshedAt: UInt64 = 0

    public var isCluster: Bool { true }

    /// Connects to a seed and learns the slot map. Throws `refused` when a node refuses the password or is no cluster
    /// node (a setting to fix), `connectionLost` when no seed answers.
    public init(
        _ nodes: RedisClusterNodes, timeout: Double = 5, health: RedisNodeHealth = .shared,
        logger: Logger? = nil
    ) throws(RedisError) {
        self.nodes = nodes
        self.timeout = timeout
        self.health = health
        self.logger = logger
        slotOwners = Array(repeating: -1, count: Self.slotCount)
        try learnSlots()
    }

    public func command(_ arguments: [String]) throws(RedisError) -> RedisReply {
        try pipeline([arguments])[0]
    }

    public func pipeline(_ commands: [[String]]) throws(RedisError) -> [RedisReply] {
        let replies = try pipelineWhereReachable(commands)
        var answered: [RedisReply] = []
        answered.reserveCapacity(replies.count)
        for (index, reply) in replies.enumerated() {
            guard let reply else {
                let key = Self.key(of: commands[index]) ?? ""
                throw RedisError(
                    kind: .connectionLost, "\(nodes): the master of \(location(ofKey: key)) does not answer")
            }
            answered.append(reply)
        }
        return answered
    }

    public func pipelineWhereReachable(_ commands: [[String]]) throws(RedisError) -> [RedisReply?] {
        // A command whose keys span slots (a multi-key DEL) goes out as one command per key; the replies are summed.
        var parts: [[String]] = []
        var partsOf: [Range<Int>] = []
        parts.reserveCapacity(commands.count)
        partsOf.reserveCapacity(commands.count)
        for command in commands {
            let start = parts.count
            if let split = Self.splitBySlot(command) { parts += split } else { parts.append(command) }
            partsOf.append(start..<parts.count)
        }
        let replies = try send(parts)
        return partsOf.map { range -> RedisReply? in
            guard range.count != 1 else { return replies[range.lowerBound] }
            var total: Int64 = 0
            for reply in replies[range] {
                guard let reply else { return nil }
                if case .error = reply { return reply }
                total += reply.integer ?? 0
            }
            return .integer(total)
        }
    }

    /// A round trip to every master that answers; throws when none does.
    public func ping() throws(RedisError) {
        var answered = 0
        var problems: [String] = []
        for master in masters {
            guard let node = try usableConnection(to: master) else {
                problems.append("\(master) does not answer")
                continue
            }
            do {
                try node.ping()
                answered += 1
            } catch {
                if error.kind != .connectionLost { throw error }
                silenced(master, error)
                problems.append(error.message)
            }
        }
        if answered == 0 {
            throw RedisError(kind: .connectionLost, "\(nodes): no master answers: " + problems.joined(separator: "; "))
        }
    }

    public func forEachMaster(_ body: (any RedisClient) throws(RedisError) -> Void) throws(RedisError) {
        for master in masters {
            guard let node = try usableConnection(to: master) else {
                throw RedisError(kind: .connectionLost, "\(nodes): master \(master) does not answer")
            }
            try body(node)
        }
    }

    /// The masters serving slots, as last learned.
    public var masterAddresses: [RedisAddress] { masters }

    /// The master serving a slot, as last learned.
    public func master(ofSlot slot: Int) -> RedisAddress? {
        let owner = slotOwners[slot]
        return owner >= 0 ? masters[Int(owner)] : nil
    }

    public func location(ofKey key: String) -> String {
        let slot = Self.slot(of: key)
        return "slot \(slot) on \(master(ofSlot: slot)?.description ?? "no master")"
    }

    /// `MOVED` and `ASK` answers followed so far (how often the map was out of date, or a slot was moving).
    public private(set) var redirectionsFollowed = 0

    // MARK: - Routing

    /// One command on the wire: its index among the pipeline's commands, and for an `ASK` redirection the node to
    /// send it to after `ASKING`.
    private struct Routed {
        var index: Int
        var asking: RedisAddress?
    }

    /// The replies, nil for every command whose master did not answer (or whose slot no master serves).
    private func send(_ commands: [[String]]) throws(RedisError) -> [RedisReply?] {
        refreshMapIfAMasterIsSilent()
        var replies = [RedisReply?](repeating: nil, count: commands.count)
        var pending = commands.indices.map { Routed(index: $0) }
        for attempt in 0...Self.redirectionLimit {
            var byNode: [RedisAddress: [Routed]] = [:]
            for routed in pending {
                guard let address = address(for: commands[routed.index], routed) else { continue }
                byNode[address, default: []].append(routed)
            }
            let written = try write(byNode, commands)
            var redirected: [Routed] = []
            var moved: [(slot: Int, owner: RedisAddress)] = []
            var mustWait = false
            for (address, node, routed) in written {
                let received: [RedisReply]
                do { received = try node.receive(routed.reduce(0) { $0 + ($1.asking == nil ? 1 : 2) }) } catch {
                    if error.kind != .connectionLost { throw error }
                    // Its replies are out of step with its commands now: the connection goes, its commands unanswered.
                    silenced(address, error)
                    continue
                }
                var next = 0
                for item in routed {
                    if item.asking != nil { next += 1 }  // ASKING's +OK
                    let reply = received[next]
                    next += 1
                    switch Redirection(reply, from: address) {
                    case .moved(let slot, let owner)?:
                        redirectionsFollowed += 1
                        moved.append((slot, owner))
                        redirected.append(Routed(index: item.index))
                    case .ask(let owner)?:
                        redirectionsFollowed += 1
                        redirected.append(Routed(index: item.index, asking: owner))
                    case .tryAgain?:
                        mustWait = true
                        redirected.append(item)
                    case nil:
                        replies[item.index] = reply
                    }
                }
            }
            if redirected.isEmpty { return replies }
            // MOVED: the map changed (a resharding, a failover); learn all of it rather than one slot per reply. The
            // node asked may not have heard of the change yet: what the MOVED replies said wins over its answer.
            if !moved.isEmpty {
                try? learnSlots()
                for (slot, owner) in moved { setOwner(owner, of: slot) }
            }
            // TRYAGAIN: a slot's keys are half moved; the move finishes in milliseconds.
            if mustWait { usleep(UInt32(10_000 << attempt)) }
            pending = redirected
        }
        throw RedisError(
            kind: .connectionLost,
            "\(nodes): still redirected after \(Self.redirectionLimit) tries "
                + "(the cluster's slots keep moving)")
    }

    /// Writes every node's part before any reply is read; a node whose connection cannot be had or breaks is silenced
    /// and left out (its commands unanswered). Returns the nodes written to, with their commands.
    private func write(_ byNode: [RedisAddress: [Routed]], _ commands: [[String]]) throws(RedisError)
        -> [(RedisAddress, RedisConnection, [Routed])]
    {
        var written: [(RedisAddress, RedisConnection, [Routed])] = []
        for (address, routed) in byNode {
            guard let node = try usableConnection(to: address) else { continue }
            do {
                try node.send(
                    routed.flatMap { item in
                        item.asking == nil ? [commands[item.index]] : [["ASKING"], commands[item.index]]
                    })
            } catch {
                if error.kind != .connectionLost { throw error }
                silenced(address, error)
                continue
            }
            written.append((address, node, routed))
        }
        return written
    }

    /// Where a command goes; nil when no master serves its slot (CLUSTERDOWN), which leaves it unanswered.
    private func address(for command: [String], _ routed: Routed) -> RedisAddress? {
        if let asking = routed.asking { return asking }
        guard let key = Self.key(of: command) else { return masters.first { !health.isSilent($0) } ?? masters.first }
        let owner = slotOwners[Self.slot(of: key)]
        return owner >= 0 ? masters[Int(owner)] : nil
    }

    private func setOwner(_ owner: RedisAddress, of slot: Int) {
        guard (0..<Self.slotCount).contains(slot) else { return }
        if let index = masters.firstIndex(of: owner) {
            slotOwners[slot] = Int16(index)
        } else {
            guard masters.count < Self.slotCount else { return }
            masters.append(owner)
            slotOwners[slot] = Int16(masters.count - 1)
        }
    }

    /// The open connection to a node, or a new one; nil while the node is silent (but for its probe, when due). A node
    /// that refuses the connection's settings (a password) throws: waiting will not help.
    private func usableConnection(to address: RedisAddress) throws(RedisError) -> RedisConnection? {
        if !health.isSilent(address) {
            if let open = connections[address] { return open }
            do { return try openConnection(to: address, timeout: timeout) } catch {
                if error.kind != .connectionLost { throw error }
                silenced(address, error)
                return nil
            }
        }
        connections[address] = nil
        guard health.takeProbe(of: address) else { return nil }
        do {
            let connection = try openConnection(to: address, timeout: RedisNodeHealth.probeTimeout)
            connection.setTimeout(timeout)
            if health.noteAnswered(address) {
                logger?.warning("Redis Cluster master answers again", ["redis.node": address.description])
            }
            return connection
        } catch {
            if error.kind != .connectionLost { throw error }
            connections[address] = nil
            health.noteSilent(address)
            return nil
        }
    }

    private func openConnection(to address: RedisAddress, timeout: Double) throws(RedisError) -> RedisConnection {
        var url = nodes.dataNodes
        url.host = address.host
        url.port = address.port
        url.database = 0
        let connection = try RedisConnection(url: url, timeout: timeout)
        connections[address] = connection
        return connection
    }

    /// A node did not answer in time, or its connection broke: dropped, and silent for the process until it answers.
    private func silenced(_ address: RedisAddress, _ error: RedisError) {
        connections[address] = nil
        if health.noteSilent(address) {
            logger?.error(
                "Redis Cluster master does not answer: its keys wait, the other masters' are served",
                ["redis.node": address.description, "redis.error": error.message])
        }
    }

    /// While a master in the map is silent, the map is asked for again (a replica may have been promoted in its place),
    /// at most every `mapRefreshInterval`.
    private func refreshMapIfAMasterIsSilent() {
        guard masters.contains(where: health.isSilent) else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        guard Double(now &- mapRefreshedAt) / 1e9 >= Self.mapRefreshInterval else { return }
        mapRefreshedAt = now
        try? learnSlots()
    }

    /// Asks the masters already known, then the seeds, for the slot map (`CLUSTER SLOTS`), and keeps the first answer.
    /// Silent nodes are passed over, but for their probe when it is due.
    private func learnSlots() throws(RedisError) {
        var problems: [String] = []
        var asked = Set<RedisAddress>()
        for address in masters + nodes.seeds where asked.insert(address).inserted {
            let reply: RedisReply
            do {
                guard let node = try usableConnection(to: address) else {
                    problems.append("\(address) does not answer")
                    continue
                }
                reply = try node.command(["CLUSTER", "SLOTS"])
            } catch {
                if error.kind == .refused { throw error }
                silenced(address, error)
                problems.append(error.message)
                continue
            }
            if case .error(let message) = reply {
                // A node that is no cluster node (cluster-enabled no) will not become one by waiting.
                throw RedisError(
                    kind: .refused, "\(address) is not a Redis Cluster node: CLUSTER SLOTS answered \(message)",
                    part: .clusterNodes)
            }
            apply(slotMap: reply, askedAt: address)
            return
        }
        throw RedisError(kind: .connectionLost, "no Redis Cluster node answered: " + problems.joined(separator: "; "))
    }

    private func apply(slotMap reply: RedisReply, askedAt asked: RedisAddress) {
        let map = Self.slotMap(reply, askedAt: asked)
        // Connections to nodes that no longer serve slots are closed.
        for (address, _) in connections where !map.masters.contains(address) { connections[address] = nil }
        masters = map.masters
        slotOwners = map.owners
    }

    /// `CLUSTER SLOTS`: per range, [start, end, [host, port, id, ...], replicas...]. A master that does not know its
    /// own address is listed with an empty host: the one asked. Ranges out of bounds, or naming a master past the
    /// 16,384 a cluster can have (one slot each), are left out: a broken or hostile reply maps fewer slots, never more
    /// masters than an owner index holds.
    package static func slotMap(_ reply: RedisReply, askedAt asked: RedisAddress) -> (
        owners: [Int16], masters: [RedisAddress]
    ) {
        var owners = [Int16](repeating: -1, count: Self.slotCount)
        var addresses: [RedisAddress] = []
        var indexes: [RedisAddress: Int] = [:]
        for range in reply.elements {
            let fields = range.elements
            guard fields.count >= 3, let start = fields[0].integer, let end = fields[1].integer,
                let port = fields[2].elements.dropFirst().first?.integer,
                0 <= start, start <= end, end < Self.slotCount
            else { continue }
            let host = fields[2].elements.first?.text ?? ""
            guard
                let master = RedisAddress(
                    announcedHost: host.isEmpty || host == "?" ? asked.host : host,
                    port: port)
            else { continue }
            let index: Int
            if let known = indexes[master] {
                index = known
            } else {
                guard addresses.count < Self.slotCount else { continue }
                addresses.append(master)
                index = addresses.count - 1
                indexes[master] = index
            }
            owners.withUnsafeMutableBufferPointer { $0[Int(start)...Int(end)].update(repeating: Int16(index)) }
        }
        return (owners, addresses)
    }

    // MARK: - Keys and slots

    /// Where a command's key is: after the command's name, or for a script the first of its KEYS. nil for a command
    /// that names no key (PING, SCAN, a script with no KEYS). Command names as the project writes them: upper case.
    static func key(of command: [String]) -> String? {
        guard command.count >= 2 else { return nil }
        switch command[0] {
        case "EVAL", "EVALSHA", "FCALL":
            guard command.count > 3, let count = Int(command[2]), count > 0 else { return nil }
            return command[3]
        case "PING", "SCAN", "TIME", "ROLE", "INFO", "CLUSTER", "WAIT", "FLUSHDB", "DBSIZE", "SCRIPT", "ASKING":
            return nil
        default:
            return command[1]
        }
    }

    /// A DEL, UNLINK or EXISTS of keys in different slots as one command per key; nil when it need not be split.
    static func splitBySlot(_ command: [String]) -> [[String]]? {
        guard command.count > 2, command[0] == "DEL" || command[0] == "UNLINK" || command[0] == "EXISTS" else {
            return nil
        }
        let keys = command.dropFirst()
        let first = slot(of: keys.first!)
        guard keys.contains(where: { slot(of: $0) != first }) else { return nil }
        return keys.map { [command[0], $0] }
    }

    /// The key's hash slot: CRC16 (XMODEM) of the key, or of its hash tag (the text between the first `{` and the
    /// next `}`, if not empty), modulo 16,384.
    public static func slot(of key: String) -> Int {
        var bytes = Substring(key).utf8[...]
        if let open = bytes.firstIndex(of: UInt8(ascii: "{")),
            let close = bytes[bytes.index(after: open)...].firstIndex(of: UInt8(ascii: "}")),
            close > bytes.index(after: open)
        {
            bytes = bytes[bytes.index(after: open)..<close]
        }
        var crc: UInt16 = 0
        for byte in bytes {
            crc ^= UInt16(byte) << 8
            for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        }
        return Int(crc) % slotCount
    }
}

/// A reply that says the command belongs elsewhere.
package enum Redirection: Equatable {
    case moved(slot: Int, to: RedisAddress)
    case ask(to: RedisAddress)
    /// A multi-key command during a slot's move: the same command again.
    case tryAgain

    /// `MOVED 3999 127.0.0.1:6381`, `ASK 3999 127.0.0.1:6381` (`:6381`: the host of the node that answered).
    package init?(_ reply: RedisReply, from answering: RedisAddress) {
        guard case .error(let message) = reply else { return nil }
        if message.hasPrefix("TRYAGAIN") {
            self = .tryAgain
            return
        }
        let words = message.split(separator: " ")
        guard words.count == 3, words[0] == "MOVED" || words[0] == "ASK", let slot = Int(words[1]),
            (0..<RedisCluster.slotCount).contains(slot), let colon = words[2].lastIndex(of: ":"),
            let port = Int64(words[2][words[2].index(after: colon)...])
        else {
            return nil
        }
        var host = words[2][..<colon]
        if host.isEmpty { host = Substring(answering.host) }
        if host.count >= 2 && host.hasPrefix("[") && host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        guard let target = RedisAddress(announcedHost: host, port: port) else { return nil }
        self = words[0] == "MOVED" ? .moved(slot: slot, to: target) : .ask(to: target)
    }
}
