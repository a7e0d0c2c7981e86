import Redis
import RedisStore
import Telemetry

/// `apns-worker tokens migrate --from redis://...`: copies a single node's token cache (tokens, registration times,
/// device metadata, owners, time zones) into the configured Redis, usually a cluster, whose keys it writes in that Redis's form.
/// A page of users at a time (SCAN on the source, one pipelined read, one pipelined write); nothing newer in the
/// destination is undone, so it can run again (after an interruption, or to catch up before switching workers over).
public struct TokenMigration {
    /// How far it got.
    public struct Progress: Sendable, Equatable {
        public var users = 0
        /// Tokens read from the source.
        public var tokens = 0
        /// Tokens written to the destination.
        public var written = 0
        /// Users whose keys the source cannot read (keys of the wrong type), skipped.
        public var unreadableUsers = 0

        /// Tokens the destination already knew a newer registration of.
        public var kept: Int { tokens - written }
    }

    let source: TokenCache
    let destination: TokenCache

    public init(from source: RedisURL, to destination: RedisDeployment, logger: Logger) throws(RedisError) {
        guard !(destination == .node(source)) else {
            throw RedisError(kind: .badURL, "--from names the configured Redis itself: nothing to copy")
        }
        self.source = TokenCache(redis: try RedisDeployment.node(source).connect(), logger: logger)
        self.destination = TokenCache(redis: try destination.connect(), logger: logger)
    }

    /// Copies every user; `progress` after each page.
    public func run(progress: (Progress) -> Void) throws(RedisError) -> Progress {
        var done = Progress()
        try source.forEachUserPage { (users: [String]) throws(RedisError) in
            let (entries, unreadable) = try source.entries(forUsers: users)
            let copied = users.compactMap { user in entries[user].map { (user: user, entries: $0) } }
                .filter { !$0.entries.isEmpty }
            let written = try destination.copy(copied)
            let zones = try source.timeZones(of: copied.map(\.user)).zones
            _ = try destination.copyTimeZones(copied.compactMap { entry in zones[entry.user].map { (entry.user, $0) } })
            done.users += copied.count
            done.tokens += copied.reduce(0) { $0 + $1.entries.count }
            done.written += written.reduce(0, +)
            done.unreadableUsers += unreadable.count
            progress(done)
        }
        return done
    }
}
