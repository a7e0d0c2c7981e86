import APNsModel
import Redis
import Telemetry
import WorkerPipeline

/// The Redis token cache (the schema is part of the contract in docs/contract.md; keys from `RedisKeys`):
/// - `apns:tokens:<user>`: hash, field = hex device token, value = what it serves (`TokenScope`): production |
///   sandbox (the default app's device token) | `<environment>:<topic>`. The worker reads only this.
/// - `apns:registered:<user>`: hash, field = token, value = when the app last registered it (ms since epoch).
/// - `apns:devices:<user>`: hash, field = token, value = the device's metadata as JSON (from registration events).
/// - `apns:timezone:<user>`: string, the user's time zone (an IANA name), from the newest registration that named one.
/// - `apns:owner:<token>`: string, the user a token currently belongs to, so a device that changes accounts stops
///   receiving the previous account's notifications.
/// - `apns:unregistered:<user>`: hash, field = token, value = when the user's logout, or APNs (a 410), took it out
///   (ms since epoch); kept 7 days after the last, so that a registration older than that, arriving late, changes
///   nothing.
///
/// Every script touches one user's four keys, declared in KEYS (one hash slot in a cluster; a Live Activity's scripts
/// get its three, and keep no removals). What spans a user and a
/// token's owner key, or two users (a token moving between accounts), is ordered steps, each safe to repeat: an
/// event redelivered after a crash between two steps finishes the work.
public struct TokenCache: TokenStore {
    private let redis: any RedisClient
    private let keys: RedisKeys
    private let logger: Logger

    public init(redis: any RedisClient, logger: Logger) {
        self.redis = redis
        self.keys = RedisKeys(cluster: redis.isCluster)
        self.logger = logger
    }

    /// EVAL of one of the scripts (`TokenCacheScripts.swift`) on one user's keys.
    private func onUser(_ script: String, _ user: String, _ arguments: [String]) -> [String] {
        ["EVAL", script, "4", keys.tokens(user), keys.registered(user), keys.devices(user), keys.unregistered(user)]
            + arguments
    }

    /// EVAL of one of the scripts on a Live Activity's keys, which play a user's.
    private func onActivity(_ script: String, _ activity: String, _ arguments: [String]) -> [String] {
        [
            "EVAL", script, "3", keys.activity(activity), keys.activityRegistered(activity),
            keys.activityDevices(activity)
        ]
            + arguments
    }

    /// Takes tokens out of the cache, each only if what is known of it still says so (see `TokenRemoval`): a round
    /// trip for the owners of tokens sent directly, one for the removals, one to release the owner keys that named
    /// the users. Returns what each removal did; only a lost connection throws.
    @discardableResult
    public func remove(_ removals: [TokenRemoval]) throws(RedisError) -> [CacheChange] {
        guard !removals.isEmpty else { return [] }
        let ofActivities = removals.indices.filter { removals[$0].activity != nil }
        if !ofActivities.isEmpty {
            var changes = try remove(removals.filter { $0.activity == nil })
            let replies = try redis.pipelineWhereReachable(
                ofActivities.map { index in
                    let removal = removals[index]
                    return onActivity(
                        Self.removeUnlessRegisteredAfter, removal.activity!,
                        [removal.token, String(removal.unlessRegisteredAfter ?? -1)] + (removal.onlyIfValueIn ?? []))
                })
            for (index, reply) in zip(ofActivities, replies) { changes.insert(Self.change(reply), at: index) }
            return changes
        }
        var users = removals.map { $0.user.isEmpty ? nil : $0.user }
        // Tokens sent directly whose owner key's node did not answer: nothing is known of them.
        var ownerUnknown = Set<Int>()
        let direct = removals.indices.filter { users[$0] == nil }
        if !direct.isEmpty {
            let owners = try redis.pipelineWhereReachable(
                direct.flatMap { index in
                    [
                        ["GET", keys.owner(removals[index].token)],
                        ["GET", keys.owner(removals[index].token.lowercased())]
                    ]
                })
            for (position, index) in direct.enumerated() {
                guard let exact = owners[position * 2], let lowered = owners[position * 2 + 1] else {
                    ownerUnknown.insert(index)
                    continue
                }
                users[index] = exact.text ?? lowered.text
            }
        }
        var changes = removals.indices.map { ownerUnknown.contains($0) ? CacheChange.unavailable : .unchanged }
        let known = removals.indices.filter { users[$0] != nil }
        let replies = try redis.pipelineWhereReachable(
            known.map { index in
                let removal = removals[index]
                return onUser(
                    Self.removeUnlessRegisteredAfter, users[index]!,
                    [removal.token, String(removal.unlessRegisteredAfter ?? -1)] + (removal.onlyIfValueIn ?? []))
            })
        var releases: [[String]] = []
        for (index, reply) in zip(known, replies) {
            changes[index] = Self.change(reply)
            guard changes[index] == .applied || changes[index] == .unchanged, let reply else { continue }
            for token in reply.elements.dropFirst().compactMap(\.text) {
                releases.append(["EVAL", Self.releaseOwner, "1", keys.owner(token), users[index]!])
            }
        }
        // An owner key left naming the user (its node silent) costs nothing: the next registration of the token reads
        // and replaces it.
        if !releases.isEmpty { _ = try redis.pipelineWhereReachable(releases) }
        return changes
    }

    /// What `removeUnlessRegisteredAfter` did, from its reply (nil: the node did not answer).
    private static func change(_ reply: RedisReply?) -> CacheChange {
        guard let reply else { return .unavailable }
        if case .error(let message) = reply { return .failed(message) }
        return reply.elements.first?.integer == 1 ? .applied : .unchanged
    }

    /// Every user's tokens with what each serves, in one pipelined round trip. Entries that are not a hex token
    /// with a readable value (`TokenScope`) are skipped and logged (the cache is fed by other systems); so is a user
    /// whose key Redis cannot read as a hash. Only a lost connection throws.
    /// Seconds a Live Activity's update tokens are kept after their last registration.
    public static let activityLifetime = 86_400

    public func resolveActivities(_ activities: [String]) throws(RedisError) -> ResolvedUsers {
        try resolve(hashesOf: activities, prefix: RedisKeys.activityPrefix, what: "Live Activity")
    }

    /// One GET per user, in one round trip per node; a value that is not a time zone name is left out (the job's
    /// default zone serves the user).
    public func timeZones(of users: [String]) throws(RedisError) -> (zones: [String: String], unavailable: Set<String>)
    {
        var zones: [String: String] = [:]
        var unavailable = Set<String>()
        guard !users.isEmpty else { return (zones, unavailable) }
        let replies = try redis.pipelineWhereReachable(users.map { ["GET", keys.timeZone($0)] })
        for (user, reply) in zip(users, replies) {
            guard let reply else {
                unavailable.insert(user)
                continue
            }
            if let zone = reply.text, !zone.isEmpty { zones[user] = zone }
        }
        return (zones, unavailable)
    }

    /// Writes users' time zones copied from another cache, unless the user has one here already (it came from a
    /// registration, newer than the copy). Returns how many were written.
    public func copyTimeZones(_ zones: [(user: String, zone: String)]) throws(RedisError) -> Int {
        guard !zones.isEmpty else { return 0 }
        let replies = try redis.pipeline(zones.map { ["SET", keys.timeZone($0.user), $0.zone, "NX"] })
        for case .error(let message) in replies { throw RedisError(kind: .server, "writing a time zone: \(message)") }
        return replies.filter { $0.text == "OK" }.count
    }

    /// Users on a node that does not answer (a cluster master lost) come back as unavailable: their jobs wait.
    public func resolve(_ users: [String]) throws(RedisError) -> ResolvedUsers {
        try resolve(hashesOf: users, prefix: RedisKeys.tokensPrefix, what: "user")
    }

    /// One pipelined HGETALL per entry (a user's tokens, an activity's update tokens), each entry once, the replies
    /// read in place (`readHashesWhereReachable`).
    private func resolve(hashesOf entries: [String], prefix: String, what: String) throws(RedisError)
        -> ResolvedUsers
    {
        guard !entries.isEmpty else { return ResolvedUsers(tokens: [:]) }
        // Each entry once (a job seldom names a user twice, a batch of jobs may), found by its bytes
        // (`ResolvedTokens`): each entry's tokens go straight into one array, as their replies are read.
        var builder = ResolvedTokens.Builder(capacity: entries.count)
        for entry in entries { _ = builder.add(entry) }
        let unique = builder.uniqueNames
        let keyList = RedisKeyList(prefix: prefix, names: keys.isCluster ? unique.map(keys.user) : unique)
        let reads = try redis.readHashesWhereReachable(keyList) { index, field, value in
            if let cached = cachedToken(field, value, key: keyList.key(index)) { builder.append(cached, to: index) }
        }
        var unreadable: [String: String] = [:]
        var unavailable = Set<String>()
        for (index, read) in reads.enumerated() {
            switch read {
            case .read:
                builder.markRead(index)
            case .failed(let message):
                logger.warning(
                    "skipping a \(what) whose token cache entry cannot be read",
                    ["redis.key": keyList.key(index), "redis.error": message])
                unreadable[unique[index]] = message
            case nil:
                unavailable.insert(unique[index])
            }
        }
        return ResolvedUsers(tokens: builder.build(), unreadable: unreadable, unavailable: unavailable)
    }

    /// One field and value of a tokens hash (a user's or an activity's), read in place; a field that is no token, or a
    /// value that says nothing it serves, is skipped with a warning naming `key`.
    private func cachedToken(
        _ field: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer,
        key: @autoclosure () -> String
    ) -> CachedToken? {
        let (valid, hasUpperCase) = APNsNotification.scanDeviceToken(field)
        guard valid, let scope = TokenScope(cacheValue: value) else {
            let token = String(decoding: field, as: UTF8.self)
            logger.warning(
                "skipping a bad token cache entry",
                [
                    "redis.key": key(), "apns.token": Redact.token(token),
                    "redis.value": String(decoding: value.prefix(40), as: UTF8.self)
                ])
            return nil
        }
        let token = String(decoding: field, as: UTF8.self)
        return CachedToken(canonical: hasUpperCase ? token.lowercased() : token, scope: scope)
    }

    /// Applies registrations; returns, per registration, whether it changed the cache (`.unchanged` for one older
    /// than what is known, `.failed` where Redis refused its keys). Ordered steps, each a round trip for the whole
    /// batch and each safe to repeat: the tokens' owners are read; a token that belonged to another user leaves
    /// that user (unless the other registration is newer); the token is written under its user; its owner key names
    /// the user. Only a lost connection throws.
    /// A token named twice in one batch (a device that changed accounts twice) is applied in the batch's order: the
    /// batch goes in rounds, each holding a token at most once.
    /// A Live Activity's update token (`activity`) is written under its activity instead, with its lifetime.
    @discardableResult
    public func register(_ registrations: [TokenRegistration]) throws(RedisError) -> [CacheChange] {
        var changes = [CacheChange](repeating: .unchanged, count: registrations.count)
        let activityIndices = registrations.indices.filter { registrations[$0].activity != nil }
        if !activityIndices.isEmpty {
            // An update token lives as long as its activity: kept under the activity, with the activity's lifetime,
            // by the rules of a user's tokens (a registration older than what the activity knows changes nothing).
            let replies = try redis.pipeline(
                activityIndices.map { index in
                    let registration = registrations[index]
                    return onActivity(
                        Self.registerUnderActivity, registration.activity ?? "",
                        [
                            APNsNotification.canonicalToken(registration.token), registration.scope.cacheValue,
                            String(registration.registeredAt), "", String(Self.activityLifetime)
                        ])
                })
            for (position, index) in activityIndices.enumerated() {
                let reply = replies[position]
                if case .error(let message) = reply {
                    changes[index] = .failed(message)
                } else {
                    changes[index] = reply.integer == 1 ? .applied : .unchanged
                }
            }
            let others = registrations.indices.filter { registrations[$0].activity == nil }
            for (index, change) in zip(others, try register(others.map { registrations[$0] })) {
                changes[index] = change
            }
            return changes
        }
        var rounds: [[Int]] = []
        var seen: [String: Int] = [:]
        for (index, registration) in registrations.enumerated() {
            let round = seen[registration.token, default: 0]
            seen[registration.token] = round + 1
            if round == rounds.count { rounds.append([]) }
            rounds[round].append(index)
        }
        for round in rounds {
            for (index, change) in zip(round, try registerOnce(round.map { registrations[$0] })) {
                changes[index] = change
            }
        }
        return changes
    }

    /// `register` for a batch that names each token once.
    private func registerOnce(_ registrations: [TokenRegistration]) throws(RedisError) -> [CacheChange] {
        guard !registrations.isEmpty else { return [] }
        // The owner key of the token, or, where another system wrote the cache in upper case, of that spelling.
        let ownerReplies = try redis.pipeline(
            registrations.flatMap { [["GET", keys.owner($0.token)], ["GET", keys.owner($0.token.uppercased())]] })
        let owners = registrations.indices.map { ownerReplies[$0 * 2].text ?? ownerReplies[$0 * 2 + 1].text }
        var changes = [CacheChange?](repeating: nil, count: registrations.count)
        let moving = registrations.indices.filter { index in
            owners[index].map { $0 != registrations[index].user } ?? false
        }
        let left = try redis.pipeline(
            moving.map { index in
                onUser(
                    Self.leavePreviousOwner, owners[index]!,
                    [registrations[index].token, String(registrations[index].registeredAt)])
            })
        for (index, reply) in zip(moving, left) {
            if case .error(let message) = reply {
                changes[index] = .failed(message)
            } else if reply.integer == -1 {
                changes[index] = .unchanged
            }
        }
        let writing = registrations.indices.filter { changes[$0] == nil }
        let written = try redis.pipeline(
            writing.map { index in
                let registration = registrations[index]
                return onUser(
                    Self.register, registration.user,
                    [
                        registration.token, registration.scope.cacheValue,
                        String(registration.registeredAt), registration.deviceJSON ?? ""
                    ])
            })
        var owned: [[String]] = []
        for (index, reply) in zip(writing, written) {
            if case .error(let message) = reply {
                changes[index] = .failed(message)
                continue
            }
            changes[index] = reply.integer == 1 ? .applied : .unchanged
            if reply.integer == 1, let zone = registrations[index].timeZone {
                owned.append(["SET", keys.timeZone(registrations[index].user), zone])
            }
            // Even an older registration: the token left its previous owner above, so it is this user's now. An owner
            // key that already names the user (an app's launch re-registering its token) needs no write; one another
            // system wrote in upper case gives way to the lower-case one.
            let token = registrations[index].token
            if ownerReplies[index * 2].text != registrations[index].user {
                owned.append(["SET", keys.owner(token), registrations[index].user])
            }
            if ownerReplies[index * 2 + 1].text != nil && token.uppercased() != token {
                owned.append(["DEL", keys.owner(token.uppercased())])
            }
        }
        if !owned.isEmpty { _ = try redis.pipeline(owned) }
        return changes.map { $0 ?? .unchanged }
    }

    /// One user's tokens with what is known of them, sorted by token.
    public func entries(forUser user: String) throws(RedisError) -> [TokenEntry] {
        let (entries, unreadable) = try entries(forUsers: [user])
        if let message = unreadable[user] { throw RedisError(kind: .server, "reading \(user)'s tokens: \(message)") }
        return entries[user] ?? []
    }

    /// Users' tokens with what is known of them, sorted by token, in one round trip; and the users whose keys Redis
    /// cannot read (keys of the wrong type), with its error.
    public func entries(forUsers users: [String]) throws(RedisError)
        -> (entries: [String: [TokenEntry]], unreadable: [String: String])
    {
        let replies = try redis.pipeline(
            users.flatMap { user in
                [["HGETALL", keys.tokens(user)], ["HGETALL", keys.registered(user)], ["HGETALL", keys.devices(user)]]
            })
        func fields(_ reply: RedisReply) -> [String: String] {
            var result: [String: String] = [:]
            let items = reply.elements
            var index = 0
            while index + 1 < items.count {
                result[items[index].text ?? ""] = items[index + 1].text ?? ""
                index += 2
            }
            return result
        }
        var entries: [String: [TokenEntry]] = [:]
        var unreadable: [String: String] = [:]
        for (index, user) in users.enumerated() {
            let own = replies[(index * 3)..<(index * 3 + 3)]
            if let failure = own.first(where: { if case .error = $0 { true } else { false } }),
                case .error(let message) = failure
            {
                unreadable[user] = message
                continue
            }
            let values = fields(replies[index * 3])
            let registered = fields(replies[index * 3 + 1])
            let devices = fields(replies[index * 3 + 2])
            entries[user] = values.keys.sorted().map { token in
                TokenEntry(
                    token: token, value: values[token] ?? "",
                    registeredAt: registered[token].flatMap { Int64($0) }, deviceJSON: devices[token])
            }
        }
        return (entries, unreadable)
    }

    /// One user's keys (tokens, registration times, devices, time zone, removals) and where each lives, for people.
    public func keys(forUser user: String) -> [(key: String, location: String)] {
        let all = [
            keys.tokens(user), keys.registered(user), keys.devices(user), keys.timeZone(user), keys.unregistered(user)
        ]
        return all.map { ($0, redis.location(ofKey: $0)) }
    }

    /// Every user with a token entry, a page at a time, on every master.
    public func forEachUserPage(_ page: ([String]) throws(RedisError) -> Void) throws(RedisError) {
        try redis.scan(matching: keys.tokensPattern) { (found: [String]) throws(RedisError) in
            let users = found.compactMap { keys.user(fromTokensKey: $0) }
            if !users.isEmpty { try page(users) }
        }
    }

    /// Copies users' entries (from another cache: `tokens migrate`) without undoing anything newer here: a token this
    /// cache knows the same or a later registration of (or any registration, where the copy has none) is left as it
    /// is, so a second copy writes nothing; so is a token whose owner key here names another user. The
    /// owner key is written only where none exists. Tokens are written in lower case, as everything that enters the
    /// cache writes them (another system's upper case would keep a device with its previous account: the owner key
    /// and a registration name the lower-case spelling). Returns, per user, how many tokens were written.
    public func copy(_ copies: [(user: String, entries: [TokenEntry])]) throws(RedisError) -> [Int] {
        let copies = copies.map { item in
            (
                user: item.user,
                entries: item.entries.map { entry in
                    var lowered = entry
                    lowered.token = entry.token.lowercased()
                    return lowered
                }
            )
        }
        // A token this cache says belongs to another user now moved after the copy was taken: it stays there.
        let tokens = copies.flatMap { item in item.entries.map { (user: item.user, token: $0.token) } }
        let owners = try redis.pipeline(tokens.map { ["GET", keys.owner($0.token)] })
        let ownedElsewhere = Set(
            zip(tokens, owners).compactMap { item, owner in
                owner.text.map { $0 != item.user ? item.user + "\u{0}" + item.token : nil } ?? nil
            })
        let entries = copies.map { item in
            (user: item.user, entries: item.entries.filter { !ownedElsewhere.contains(item.user + "\u{0}" + $0.token) })
        }
        let replies = try redis.pipeline(
            entries.map { item in
                onUser(
                    Self.copyEntries, item.user,
                    item.entries.flatMap { entry in
                        [entry.token, entry.value, entry.registeredAt.map(String.init) ?? "", entry.deviceJSON ?? ""]
                    })
            })
        var ownerWrites: [[String]] = []
        var written: [Int] = []
        for (item, reply) in zip(entries, replies) {
            if case .error(let message) = reply {
                throw RedisError(kind: .server, "copying \(item.user)'s tokens: \(message)")
            }
            let tokens = reply.elements.compactMap(\.text)
            written.append(tokens.count)
            ownerWrites += tokens.map { ["SET", keys.owner($0), item.user, "NX"] }
        }
        if !ownerWrites.isEmpty { _ = try redis.pipeline(ownerWrites) }
        return written
    }

    /// Removes tokens last registered before `cutoff` (ms since epoch) from every user, a page of users at a time
    /// on every master (SCAN, so Redis is never blocked for long). Returns how many tokens went.
    public func sweep(registeredBefore cutoff: Int64) throws(RedisError) -> Int {
        var removed = 0
        try redis.scan(matching: keys.registeredPattern) { (page: [String]) throws(RedisError) in
            let users = page.compactMap { keys.user(fromRegisteredKey: $0) }
            guard !users.isEmpty else { return }
            let replies = try redis.pipeline(users.map { onUser(Self.sweepUser, $0, [String(cutoff)]) })
            var releases: [[String]] = []
            for (user, reply) in zip(users, replies) {
                if case .error(let message) = reply {
                    // One user's keys of the wrong type (written by another system) cost that user's sweep only.
                    logger.warning(
                        "inactivity sweep skipped a user whose keys cannot be read",
                        ["redis.key": keys.registered(user), "redis.error": message])
                    continue
                }
                let tokens = reply.elements.compactMap(\.text)
                removed += tokens.count
                releases += tokens.map { ["EVAL", Self.releaseOwner, "1", keys.owner($0), user] }
            }
            if !releases.isEmpty { _ = try redis.pipeline(releases) }
        }
        return removed
    }
}

/// What `tokens list` shows for one token.
public struct TokenEntry: Sendable, Equatable {
    public var token: String
    /// As stored: a `TokenScope` value, or whatever another system wrote.
    public var value: String
    public var registeredAt: Int64?
    public var deviceJSON: String?

    /// What the stored value says, if it is readable.
    public var scope: TokenScope? { TokenScope(cacheValue: value) }
}
